"""Out-of-memory back-off (injected OOM on the CPU) and the automatic micro-batch size.

On OOM the trainer halves m and doubles N, restarts the window, and the update still equals
the big batch; at m=1 it fails with a clear error. find_micro_batch_size returns the largest
divisor of B that fits an injected memory limit.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from trainer_reference import (
    big_batch_training,
    class_dataset,
    class_loss_sum,
    class_model,
    max_abs_diff,
)

from accumcore import Callback, Trainer
from accumcore.auto_batch import accumulation_for, find_micro_batch_size, measure_footprint
from accumcore.data import make_loader
from accumcore.oom import MicroBatchTooSmall
from accumcore.schedule import AccumulationSchedule


class InjectedOOM(nn.Module):
    """Raises CUDA's OOM error for batches above ``limit`` samples, or once on call ``once_at``."""

    def __init__(self, inner: nn.Module, limit: int, once_at: int | None = None) -> None:
        super().__init__()
        self.inner = inner
        self.limit = limit
        self.once_at = once_at
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if x.shape[0] > self.limit or self.calls == self.once_at:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (injected)")
        return self.inner(x)


class Events(Callback):
    def __init__(self) -> None:
        self.events: list[tuple[str, dict]] = []

    def on_event(self, trainer, kind, message, data) -> None:
        self.events.append((kind, data))


def _run(limit: int, once_at: int | None = None, samples: int = 10, m: int = 4, n: int = 2):
    base = class_model(torch.float64)
    dataset = class_dataset(samples, torch.float64)
    reference, _ = big_batch_training(base, make_loader(dataset, m, seed=3), class_loss_sum,
                                      AccumulationSchedule(n), epochs=2)
    model = InjectedOOM(copy.deepcopy(base), limit, once_at)
    events = Events()
    trainer = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5),
                      loss_fn=nn.CrossEntropyLoss(), accumulation_steps=n, callbacks=[events])
    history = trainer.fit(make_loader(dataset, m, seed=3), epochs=2)
    return trainer, model, reference, events, history


def test_oom_halves_m_doubles_n_and_stays_exact() -> None:
    trainer, model, reference, events, history = _run(limit=2)
    assert max_abs_diff(model.inner, reference) <= 1e-12
    assert [kind for kind, _ in events.events] == ["oom_backoff"]
    data = events.events[0][1]
    # m x N is kept: 4 x 2 before, 2 x 4 after.
    assert data["micro_batch_size"] * data["accumulation_steps"] == 4 * 2
    assert (data["micro_batch_size"], data["accumulation_steps"]) == (2, 4)
    assert trainer.state_dict()["accumulation"]["oom_split"] == 2  # persisted for resume
    assert len(history.steps) == 4


def test_oom_in_the_middle_of_a_window_restarts_it_from_its_start() -> None:
    # The 2nd forward fails after the 1st micro-batch already accumulated gradients.
    _, model, reference, events, _ = _run(limit=100, once_at=2)
    assert max_abs_diff(model.inner, reference) <= 1e-12
    assert [kind for kind, _ in events.events] == ["oom_backoff"]


def test_oom_at_one_sample_per_micro_batch_fails_clearly() -> None:
    with pytest.raises(MicroBatchTooSmall, match="micro-batch of 1 sample"):
        _run(limit=0)


def test_auto_micro_batch_is_the_largest_fitting_divisor() -> None:
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.BatchNorm1d(64), nn.Linear(64, 3))
    stats = model[2].running_mean.clone()
    probes: list[int] = []

    def sample(m: int):
        probes.append(m)
        return torch.randn(m, 16), torch.randint(0, 3, (m,))

    assert find_micro_batch_size(model, sample, 24) == 24
    footprint = {m: measure_footprint(model, sample, m) for m in (6, 8)}
    assert footprint[6] < footprint[8]
    # A limit between the footprints of m=6 and m=8 picks 6 (divides 24; 7 would not).
    probes.clear()
    chosen = find_micro_batch_size(model, sample, 24, memory_limit_bytes=(footprint[6] + footprint[8]) // 2)
    assert chosen == 6 and accumulation_for(24, chosen) * chosen == 24
    assert len(probes) <= 4 and set(probes) <= {2, 3, 4, 6, 8, 12, 24}  # binary search, divisors only
    assert torch.equal(model[2].running_mean, stats)  # probing left BatchNorm alone
    assert all(p.grad is None for p in model.parameters())


def test_auto_micro_batch_fails_clearly_when_nothing_fits() -> None:
    model = nn.Linear(16, 3)
    with pytest.raises(RuntimeError, match="not even a micro-batch of 1 sample fits"):
        find_micro_batch_size(model, lambda m: (torch.randn(m, 16), torch.zeros(m, dtype=torch.long)), 24,
                              memory_limit_bytes=1)


def test_accumulation_for_refuses_non_divisors() -> None:
    assert accumulation_for(32, 8) == 4
    with pytest.raises(ValueError, match=r"pick one of \[1, 2, 4, 8, 16, 32\]"):
        accumulation_for(32, 6)


def test_the_backed_off_split_is_resumed_exactly() -> None:
    """After an OOM back-off, a resumed run keeps the smaller micro-batches (no new OOM) and
    ends bitwise equal to the uninterrupted run."""
    full_trainer, full_model, _, _, _ = _run(limit=2)
    base = class_model(torch.float64)
    dataset = class_dataset(10, torch.float64)

    def fresh(events: Events) -> Trainer:
        model = InjectedOOM(copy.deepcopy(base), limit=2)
        return Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5),
                       loss_fn=nn.CrossEntropyLoss(), accumulation_steps=2, callbacks=[events])

    first_events, resumed_events = Events(), Events()
    first = fresh(first_events)
    first.fit(make_loader(dataset, 4, seed=3), epochs=2, max_steps=1)
    resumed = fresh(resumed_events)
    resumed.load_state_dict(first.state_dict())
    resumed.fit(make_loader(dataset, 4, seed=3), epochs=2)
    assert [kind for kind, _ in first_events.events] == ["oom_backoff"] and resumed_events.events == []
    for p, q in zip(resumed.model.parameters(), full_model.parameters(), strict=True):
        assert torch.equal(p, q)
