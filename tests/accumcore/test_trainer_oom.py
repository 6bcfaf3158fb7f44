"""Out-of-memory back-off (injected OOM on the CPU) and the automatic micro-batch size.

On OOM the trainer halves m and doubles N, restarts the window, and the update still equals
the big batch; at m=1 it fails with a clear error. find_micro_batch_size returns the largest
divisor of B that fits an injected memory limit, and a Trainer window at that m really runs
within the limit (measured as the benchmarks measure it).
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset
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
from accumcore.peak_memory import cpu_peak_added, tensor_bytes
from accumcore.schedule import AccumulationSchedule
from accumcore.window_source import reads_window_ahead


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


def _activation_heavy_model() -> nn.Module:
    """Activations outweigh parameters (as in real training), so memory grows with m."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv1d(4, 16, 3, padding=1), nn.ReLU(), nn.BatchNorm1d(16), nn.Flatten(),
                         nn.Linear(16 * 64, 3))


def test_auto_micro_batch_is_the_largest_fitting_divisor() -> None:
    model = _activation_heavy_model()
    stats = model[2].running_mean.clone()
    weights = [p.detach().clone() for p in model.parameters()]
    probes: list[int] = []

    def sample(m: int):
        probes.append(m)
        return torch.randn(m, 4, 64), torch.randint(0, 3, (m,))

    assert find_micro_batch_size(model, sample, 24) == 24
    footprint = {m: measure_footprint(model, sample, m) for m in (6, 8)}
    assert footprint[6] < footprint[8]
    # A limit between the footprints of m=6 and m=8 picks 6 (divides 24; 7 would not).
    probes.clear()
    chosen = find_micro_batch_size(model, sample, 24, memory_limit_bytes=(footprint[6] + footprint[8]) // 2,
                                   read_ahead=False)  # the footprints above hold no read-ahead
    assert chosen == 6 and accumulation_for(24, chosen) * chosen == 24
    assert len(probes) <= 4 and set(probes) <= {2, 3, 4, 6, 8, 12, 24}  # binary search, divisors only
    assert torch.equal(model[2].running_mean, stats)  # probing left BatchNorm alone
    assert all(p.grad is None for p in model.parameters())
    # The probes' optimizer steps did not train the model.
    assert all(torch.equal(p, w) for p, w in zip(model.parameters(), weights, strict=True))


def _trainer_peak(dataset: TensorDataset, m: int, effective: int) -> int:
    """The real peak of a Trainer window of m x N == effective samples, measured as the
    benchmarks do: live state (parameters, buffers, Adam state) + the CPU allocator peak."""
    model = _activation_heavy_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    trainer = Trainer(model, optimizer, accumulation_steps=accumulation_for(effective, m))
    loader = make_loader(dataset, m, shuffle=False)
    trainer.fit(loader, max_steps=1)  # warm-up: the optimizer state exists, as in a long run
    alive = tensor_bytes(list(model.parameters()) + list(model.buffers()) + list(optimizer.state.values()))
    return alive + cpu_peak_added(lambda: trainer.fit(loader, max_steps=2) and None)


@pytest.mark.parametrize("hide_targets", [False, True], ids=["targets_path", "read_ahead"])
def test_auto_micro_batch_pick_runs_a_full_trainer_window_within_the_limit(hide_targets: bool) -> None:
    effective = 24
    g = torch.Generator().manual_seed(0)
    inputs, targets = torch.randn(2 * effective, 4, 64, generator=g), torch.randint(0, 3, (2 * effective,), generator=g)
    dataset = TensorDataset(inputs, targets)
    if hide_targets:  # a dataset the trainer cannot count from targets alone: it reads ahead
        dataset = _NoTargets(dataset)
    assert reads_window_ahead(make_loader(dataset, 4)) is hide_targets
    peaks = {m: _trainer_peak(dataset, m, effective) for m in (2, 4, 6, 8)}
    assert peaks[2] < peaks[4] < peaks[6] < peaks[8]
    for m, peak in peaks.items():  # the probe never believes less than the real window needs
        believed = measure_footprint(
            _activation_heavy_model(), lambda k: (inputs[:k].clone(), targets[:k].clone()), m,
            optimizer=torch.optim.Adam, accumulation_steps=effective // m, read_ahead=hide_targets,
        )
        assert believed is not None and peak <= believed <= 1.05 * peak, m
    limit = (peaks[6] + peaks[8]) // 2  # 6 truly fits, 8 does not
    chosen = find_micro_batch_size(
        _activation_heavy_model(), lambda m: (inputs[:m].clone(), targets[:m].clone()), effective,
        memory_limit_bytes=limit, optimizer=torch.optim.Adam, read_ahead=hide_targets,
    )
    assert chosen == 6 and peaks[chosen] <= limit


class _NoTargets(torch.utils.data.Dataset):
    def __init__(self, inner: TensorDataset) -> None:
        self.inner = inner

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, index: int):
        return self.inner[index]


@pytest.mark.parametrize("limit", [6, 0])
def test_auto_micro_batch_treats_a_real_out_of_memory_error_as_not_fitting(limit: int) -> None:
    # The probe runs a Trainer window, whose OOM back-off must not turn "does not fit" into
    # "fits after splitting".
    model = InjectedOOM(class_model(torch.float32), limit)
    weights = [p.detach().clone() for p in model.parameters()]

    def sample(m: int):
        return torch.randn(m, 4), torch.randint(0, 3, (m,))

    if limit:
        assert find_micro_batch_size(model, sample, 24) == 6
    else:
        with pytest.raises(RuntimeError, match="not even a micro-batch of 1 sample fits"):
            find_micro_batch_size(model, sample, 24)
    assert all(torch.equal(p, w) for p, w in zip(model.parameters(), weights, strict=True))
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


def test_auto_micro_batch_leaves_module_modes_and_rngs_as_they_were() -> None:
    """A frozen BatchNorm stays in eval mode (each module keeps its own mode, not the model's),
    and the probes' draws (dropout, the sampled batches) do not move any RNG."""
    import random

    import numpy as np

    from accumcore.rng import capture_rng_state

    model = nn.Sequential(_activation_heavy_model(), nn.Dropout(0.2))
    model.train()
    model[0][2].eval()  # a frozen BatchNorm inside a training model
    modes = [m.training for m in model.modules()]
    before = capture_rng_state()

    def sample(m: int):
        return torch.randn(m, 4, 64), torch.from_numpy(np.random.randint(0, 3, m)) + random.randint(0, 0)

    find_micro_batch_size(model, sample, 8)
    measure_footprint(model, sample, 4)
    assert [m.training for m in model.modules()] == modes
    after = capture_rng_state()
    assert torch.equal(before["torch"], after["torch"])
    assert all(np.array_equal(a, b) for a, b in zip(before["numpy"][1:2], after["numpy"][1:2], strict=True))
    assert before["numpy"][2] == after["numpy"][2] and before["python"] == after["python"]
