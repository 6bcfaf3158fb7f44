"""Models, data and training loops shared by the bench scripts.

`tutorial_loop` is the loop every gradient-accumulation tutorial teaches (loss / N, step
every N micro-batches): the baseline users would write by hand. `run_trainer` is the same
work through `accumcore.Trainer`. Both are fed the same loader and the same model.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn
from torch.utils.data import TensorDataset

from accumcore import Trainer


def mlp(d_in: int = 784, hidden: int = 256, classes: int = 10) -> nn.Module:
    return nn.Sequential(
        nn.Flatten(), nn.Linear(d_in, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
        nn.Linear(hidden, classes),
    )


def small_cnn(channels: int = 3, classes: int = 10, width: int = 16) -> nn.Module:
    """A conv net whose memory is mostly activations (no BatchNorm: exact accumulation)."""
    return nn.Sequential(
        nn.Conv2d(channels, width, 3, padding=1), nn.ReLU(),
        nn.Conv2d(width, 2 * width, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(2 * width, 2 * width, 3, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2 * width, classes),
    )


def image_data(n: int, shape: tuple[int, ...] = (1, 28, 28), classes: int = 10, seed: int = 0) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    return TensorDataset(
        torch.randn(n, *shape, generator=generator),
        torch.randint(0, classes, (n,), generator=generator),
    )


def clone(model: nn.Module) -> nn.Module:
    return copy.deepcopy(model)


def tutorial_loop(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    loader: Iterable[Any],
    accumulation_steps: int,
    loss_fn: Callable[[Any, Any], torch.Tensor],
    device: torch.device | str = "cpu",
    flush_last: bool = False,
) -> None:
    """One epoch of the textbook loop. flush_last=False is the tutorial as written: a short
    last window is never stepped (its gradients leak into the next epoch)."""
    model.train()
    index = -1
    for index, (inputs, targets) in enumerate(loader):
        inputs = inputs.to(device, non_blocking=True)
        targets = targets.to(device, non_blocking=True)
        loss = loss_fn(model(inputs), targets) / accumulation_steps
        loss.backward()
        if (index + 1) % accumulation_steps == 0:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    if flush_last and (index + 1) % accumulation_steps != 0:
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def run_trainer(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    loader: Iterable[Any],
    accumulation_steps: int,
    loss_fn: Callable[[Any, Any], torch.Tensor],
    device: torch.device | str = "cpu",
    precision: str = "fp32",
    **trainer_options: Any,
) -> Trainer:
    """One epoch through accumcore.Trainer (a fresh trainer: epoch 0 of the loader's order)."""
    trainer = Trainer(
        model, optimizer, loss_fn=loss_fn, accumulation_steps=accumulation_steps,
        precision=precision, device=device, **trainer_options,
    )
    trainer.fit(loader, epochs=1)
    return trainer
