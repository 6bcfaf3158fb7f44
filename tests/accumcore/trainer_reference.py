"""Oracles for the trainer tests: the big-batch update, the naive loss/N recipe, tiny models.

The reference computes each window's loss as (sum of item losses over the whole window) /
(item count of the window) in one backward, which is the definition of the big-batch mean.
"""

from __future__ import annotations

import copy
import math
import random
from collections.abc import Callable

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import TensorDataset

from accumcore.schedule import AccumulationSchedule

VOCAB = 7


class TokenCrossEntropy(nn.Module):
    """Cross-entropy over (B, T, V) logits and (B, T) targets, mean over non-ignored tokens."""

    def __init__(self, reduction: str = "mean") -> None:
        super().__init__()
        self.reduction = reduction
        self.ignore_index = -100

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
            ignore_index=-100, reduction=self.reduction,
        )


class TokenModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 5)
        self.head = nn.Linear(5, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.embed(tokens)))


class BadOnCalls(nn.Module):
    """Mean cross-entropy, times ``factor`` (inf, nan) on the chosen calls (1-based): an
    overflow or a diverged step at a known micro-batch."""

    reduction = "mean"

    def __init__(self, factor: float, calls: set[int]) -> None:
        super().__init__()
        self.factor = factor
        self.bad_calls = calls
        self.calls = 0

    def forward(self, out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        loss = F.cross_entropy(out, target)
        return loss * self.factor if self.calls in self.bad_calls else loss


def full_batch_gradients(model: nn.Module, dataset: TensorDataset) -> tuple[list[torch.Tensor], float]:
    """Gradients of the mean cross-entropy over the whole dataset at ``model``'s weights, and
    their total norm (the model itself is not touched)."""
    reference = copy.deepcopy(model)
    x, y = dataset.tensors
    F.cross_entropy(reference(x), y).backward()
    grads = [p.grad.clone() for p in reference.parameters()]
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
    return grads, float(norm)


def class_model(dtype: torch.dtype, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 3)).to(dtype)


def token_model(dtype: torch.dtype, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return TokenModel().to(dtype)


def class_dataset(n: int, dtype: torch.dtype, seed: int = 1) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    return TensorDataset(torch.randn(n, 4, generator=g).to(dtype), torch.randint(0, 3, (n,), generator=g))


def token_dataset(n: int, length: int = 6, seed: int = 2) -> TensorDataset:
    """Sequences padded with -100 after a random valid length (1..length): counts vary."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, VOCAB, (n, length), generator=g)
    targets = torch.randint(0, VOCAB, (n, length), generator=g)
    valid = torch.randint(1, length + 1, (n,), generator=g)
    targets[torch.arange(length)[None, :] >= valid[:, None]] = -100
    return TensorDataset(tokens, targets)


def epoch_windows(loader, epoch: int, steps: int) -> list[list[tuple[torch.Tensor, torch.Tensor]]]:
    """The loader's batches of ``epoch``, grouped into windows of ``steps`` (last may be short)."""
    loader.batch_sampler.set_epoch(epoch)
    batches = list(loader)
    return [batches[i : i + steps] for i in range(0, len(batches), steps)]


def big_batch_training(
    model: nn.Module,
    loader,
    loss_sum_fn: Callable[[nn.Module, torch.Tensor, torch.Tensor], tuple[torch.Tensor, int]],
    schedule: AccumulationSchedule,
    epochs: int,
    lr: float = 0.1,
) -> tuple[nn.Module, list[float]]:
    """SGD where each window is one batch: grad of (sum of item losses / window items)."""
    model = copy.deepcopy(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.5)
    losses = []
    for epoch in range(epochs):
        for window in epoch_windows(loader, epoch, schedule.at(epoch)):
            total = torch.zeros((), dtype=torch.float64)
            count = 0
            for x, y in window:
                s, n = loss_sum_fn(model, x, y)
                total = total + s
                count += n
            (total / count).backward()
            losses.append(float(total.detach()) / count)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    return model, losses


def naive_training(
    model: nn.Module, loader, loss_fn: nn.Module, schedule: AccumulationSchedule, epochs: int, lr: float = 0.1
) -> nn.Module:
    """The tutorial recipe: loss / N per micro-batch, whatever the window's real size."""
    model = copy.deepcopy(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.5)
    for epoch in range(epochs):
        n = schedule.at(epoch)
        for window in epoch_windows(loader, epoch, n):
            for x, y in window:
                (loss_fn(model(x), y) / n).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    return model


def class_loss_sum(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, int]:
    return F.cross_entropy(model(x), y, reduction="sum").to(torch.float64), len(y)


def token_loss_sum(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, int]:
    total = TokenCrossEntropy("sum")(model(x), y).to(torch.float64)
    return total, int((y != -100).sum())


def max_abs_diff(a: nn.Module, b: nn.Module) -> float:
    return max(float((p - q).detach().abs().max()) for p, q in zip(a.parameters(), b.parameters(), strict=True))


def relative_diff(a: nn.Module, b: nn.Module) -> float:
    """max |a - b| / max |b| over all parameters."""
    scale = max(float(q.detach().abs().max()) for q in b.parameters())
    return max_abs_diff(a, b) / scale


def steps_in(batches_per_epoch: int, schedule: AccumulationSchedule, epochs: int) -> int:
    return sum(math.ceil(batches_per_epoch / schedule.at(e)) for e in range(epochs))


def seed_everything(seed: int) -> None:
    """Seed the torch, numpy and python RNGs (the ones a resumed run must restore)."""
    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)
