"""Accumulated windows update the model exactly as the same samples taken as one batch.

Checked against ``trainer_reference.big_batch_training`` in float64 (max abs diff <= 1e-12)
and float32 (relative <= 1e-5): even windows, the short last window (10 samples, m=3, N=2),
padded token batches with varying valid counts, and an epoch schedule changing N. The naive
loss/N recipe run on the same cases misses by orders of magnitude more than the tolerance.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import pytest
import torch
from trainer_reference import (
    TokenCrossEntropy,
    big_batch_training,
    class_dataset,
    class_loss_sum,
    class_model,
    max_abs_diff,
    naive_training,
    relative_diff,
    steps_in,
    token_dataset,
    token_loss_sum,
    token_model,
)

from accumcore import Trainer
from accumcore.data import make_loader
from accumcore.schedule import AccumulationSchedule

TOLERANCE = {torch.float64: 1e-12, torch.float32: 1e-5}


@dataclass(frozen=True)
class Case:
    samples: int
    micro_batch: int
    accumulation: int | dict[int, int]
    epochs: int
    tokens: bool = False


CASES = {
    "even": Case(samples=12, micro_batch=3, accumulation=2, epochs=2),
    "short_last_window": Case(samples=10, micro_batch=3, accumulation=2, epochs=2),
    "padded_tokens": Case(samples=11, micro_batch=3, accumulation=2, epochs=2, tokens=True),
    "schedule": Case(samples=10, micro_batch=2, accumulation={0: 3, 1: 2}, epochs=2),
}


def _setup(case: Case, dtype: torch.dtype):
    if case.tokens:
        return token_model(dtype), token_dataset(case.samples), TokenCrossEntropy(), token_loss_sum
    return class_model(dtype), class_dataset(case.samples, dtype), torch.nn.CrossEntropyLoss(), class_loss_sum


def _fit(case: Case, dtype: torch.dtype):
    model, dataset, loss_fn, loss_sum = _setup(case, dtype)
    initial = model
    reference, reference_losses = big_batch_training(
        initial, make_loader(dataset, case.micro_batch, seed=5), loss_sum,
        AccumulationSchedule(case.accumulation), case.epochs,
    )
    trained = copy.deepcopy(initial)
    optimizer = torch.optim.SGD(trained.parameters(), lr=0.1, momentum=0.5)
    trainer = Trainer(trained, optimizer, loss_fn=loss_fn, accumulation_steps=case.accumulation)
    history = trainer.fit(make_loader(dataset, case.micro_batch, seed=5), epochs=case.epochs)
    return initial, dataset, loss_fn, trained, reference, reference_losses, history


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("name", list(CASES))
def test_accumulated_update_equals_big_batch(name: str, dtype: torch.dtype) -> None:
    case = CASES[name]
    _, _, _, trained, reference, reference_losses, history = _fit(case, dtype)
    if dtype == torch.float64:
        assert max_abs_diff(trained, reference) <= TOLERANCE[dtype]
    else:
        assert relative_diff(trained, reference) <= TOLERANCE[dtype]
    # The logged loss of every step is the exact window mean.
    logged = [step["loss"] for step in history.steps]
    assert len(logged) == len(reference_losses)
    tolerance = 1e-12 if dtype == torch.float64 else 1e-5
    for got, want in zip(logged, reference_losses, strict=True):
        assert abs(got - want) <= tolerance * max(1.0, abs(want))


@pytest.mark.parametrize("name", ["short_last_window", "padded_tokens"])
def test_naive_loss_over_n_recipe_misses_the_big_batch(name: str) -> None:
    case = CASES[name]
    initial, dataset, loss_fn, trained, reference, _, _ = _fit(case, torch.float64)
    naive = naive_training(
        initial, make_loader(dataset, case.micro_batch, seed=5), loss_fn,
        AccumulationSchedule(case.accumulation), case.epochs,
    )
    exact_error = max_abs_diff(trained, reference)
    naive_error = max_abs_diff(naive, reference)
    assert exact_error <= TOLERANCE[torch.float64]
    # Not a rounding difference: a million times the tolerance, at least.
    assert naive_error > 1e6 * TOLERANCE[torch.float64]


def test_the_short_last_window_has_its_own_size() -> None:
    """10 samples, m=3, N=2: micro-batches 3,3,3,1 make windows of 6 and 4 samples."""
    case = CASES["short_last_window"]
    *_, history = _fit(case, torch.float64)
    samples = [round(s["samples_per_s"] * s["step_time_s"]) for s in history.steps]
    assert samples == [6, 4] * case.epochs


class _CountingScheduler(torch.optim.lr_scheduler.StepLR):
    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.calls = 0
        super().__init__(optimizer, step_size=2, gamma=0.5)

    def step(self, epoch=None) -> None:  # noqa: ANN001 - torch's signature
        self.calls += 1
        super().step()


class _CountingSGD(torch.optim.SGD):
    def __init__(self, params, lr: float) -> None:  # noqa: ANN001
        super().__init__(params, lr=lr)
        self.steps = 0
        self.zero_grad_calls_with_grads = 0

    def step(self, closure=None):  # noqa: ANN001, ANN201
        self.steps += 1
        return super().step(closure)


@pytest.mark.parametrize("name", list(CASES))
def test_one_scheduler_step_per_optimizer_step(name: str) -> None:
    case = CASES[name]
    model, dataset, loss_fn, _ = _setup(case, torch.float32)
    optimizer = _CountingSGD(model.parameters(), lr=0.1)
    scheduler = _CountingScheduler(optimizer)
    scheduler.calls = 0  # StepLR's constructor steps once; count only training steps
    trainer = Trainer(model, optimizer, loss_fn=loss_fn, accumulation_steps=case.accumulation, scheduler=scheduler)
    loader = make_loader(dataset, case.micro_batch, seed=5)
    history = trainer.fit(loader, epochs=case.epochs)
    expected = steps_in(len(loader), AccumulationSchedule(case.accumulation), case.epochs)
    assert optimizer.steps == scheduler.calls == len(history.steps) == expected
    # lr logged per step follows the scheduler: halved every 2 optimizer steps.
    assert [s["lr"] for s in history.steps] == [0.1 * 0.5 ** (i // 2) for i in range(expected)]
    # Gradients are released after each step (zero_grad(set_to_none=True)).
    assert all(p.grad is None for p in model.parameters())


def test_count_items_override_weights_by_class_weights() -> None:
    """A class-weighted mean averages over summed weights: count_items says so, and it is exact."""
    weights = torch.tensor([0.5, 2.0, 1.25], dtype=torch.float64)
    loss_fn = torch.nn.CrossEntropyLoss(weight=weights)
    model = class_model(torch.float64)
    dataset = class_dataset(10, torch.float64)

    def weighted_sum(m, x, y):
        return torch.nn.functional.cross_entropy(m(x), y, weight=weights, reduction="sum"), float(weights[y].sum())

    reference, _ = big_batch_training(model, make_loader(dataset, 3, seed=5), weighted_sum, AccumulationSchedule(2), 2)
    trainer = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5), loss_fn=loss_fn,
                      accumulation_steps=2, count_items=lambda _x, y: weights[y].sum())
    trainer.fit(make_loader(dataset, 3, seed=5), epochs=2)
    assert max_abs_diff(model, reference) <= TOLERANCE[torch.float64]


def test_a_micro_batch_with_every_target_ignored_adds_nothing() -> None:
    """Its mean loss is 0/0 = nan; the window must still be the mean over the other items."""
    model = token_model(torch.float64)
    tokens, targets = token_dataset(8).tensors
    targets = targets.clone()
    targets[2:4] = -100  # the second micro-batch (m=2) has no items at all
    dataset = torch.utils.data.TensorDataset(tokens, targets)
    reference, _ = big_batch_training(model, make_loader(dataset, 2, shuffle=False), token_loss_sum,
                                      AccumulationSchedule(4), 1)
    trainer = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5),
                      loss_fn=TokenCrossEntropy(), accumulation_steps=4)
    history = trainer.fit(make_loader(dataset, 2, shuffle=False), epochs=1)
    assert max_abs_diff(model, reference) <= TOLERANCE[torch.float64]
    assert history.steps[0]["loss"] == history.steps[0]["loss"]  # not nan
