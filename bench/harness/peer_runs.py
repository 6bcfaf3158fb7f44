"""One epoch of training through Lightning and through Accelerate, as their docs teach it.

Imported only where the peers are installed (bench/.venv-peers, see _peers.py).
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

MakeOptimizer = Callable[[Any], torch.optim.Optimizer]


def _quiet() -> None:
    warnings.filterwarnings("ignore")
    for name in ("lightning", "lightning.pytorch", "lightning.fabric", "pytorch_lightning", "accelerate"):
        logging.getLogger(name).setLevel(logging.ERROR)


def lightning_fit(
    model: nn.Module,
    make_optimizer: MakeOptimizer,
    loader: Any,
    accumulation_steps: int,
    loss_fn: Callable[[Any, Any], torch.Tensor],
    device: str = "cpu",
) -> None:
    """`L.Trainer(accumulate_grad_batches=N).fit(...)` for one epoch, everything extra off."""
    import lightning as L

    _quiet()

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            inputs, targets = batch
            return loss_fn(self.model(inputs), targets)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return make_optimizer(self.model.parameters())

    trainer = L.Trainer(
        accelerator="gpu" if device.startswith("cuda") else "cpu", devices=1, max_epochs=1,
        accumulate_grad_batches=accumulation_steps, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
        precision="32-true",
    )
    trainer.fit(Module(), train_dataloaders=loader)


def accelerate_fit(
    model: nn.Module,
    make_optimizer: MakeOptimizer,
    loader: Any,
    accumulation_steps: int,
    loss_fn: Callable[[Any, Any], torch.Tensor],
    device: str = "cpu",
) -> None:
    """The `with accelerator.accumulate(model):` loop of Accelerate's docs, for one epoch."""
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, GradientState

    _quiet()
    # Accelerate keeps process-wide singletons; reset them so each run starts clean.
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    accelerator = Accelerator(
        gradient_accumulation_steps=accumulation_steps, cpu=not device.startswith("cuda")
    )
    optimizer = make_optimizer(model.parameters())
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    model.train()
    for inputs, targets in loader:
        with accelerator.accumulate(model):
            loss = loss_fn(model(inputs), targets)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
