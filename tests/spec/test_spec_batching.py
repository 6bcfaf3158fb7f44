"""Effective batch and optimizer-step counts, checked against a literal simulation of the loop.

The oracle walks an epoch the way the trainer does: micro-batches of m (the last one short),
grouped into windows of N (the last one short), one optimizer step per window.
"""

from __future__ import annotations

from typing import Any

import pytest

from services.catalog import DATASETS
from services.spec import (
    accumulation_at,
    effective_batch_size,
    parse_spec,
    steps_per_epoch,
    total_optimizer_steps,
)

BASE: dict[str, Any] = {
    "model": "mlp",
    "dataset": "digits",
    "optimizer": {"name": "sgd", "lr": 0.1},
}


def simulated_steps(
    samples: int, micro: int, schedule: dict[int, int], epochs: int, world: int = 1
) -> int:
    """Count optimizer steps by walking the samples one micro-batch at a time."""
    steps = 0
    per_rank = -(-samples // world)
    for epoch in range(epochs):
        n = schedule[max(e for e in schedule if e <= epoch)]
        seen, in_window = 0, 0
        while seen < per_rank:
            seen += min(micro, per_rank - seen)
            in_window += 1
            if in_window == n:
                steps, in_window = steps + 1, 0
        steps += in_window > 0  # the short last window still steps
    return steps


def spec(**fields: Any) -> Any:
    return parse_spec({**BASE, **fields})


@pytest.mark.parametrize(
    ("size", "micro", "n"),
    [(64, 16, 4), (64, 8, 2), (100, 16, 4), (101, 10, 3), (7, 16, 4), (1, 1, 1), (1000, 1, 65536)],
)
def test_steps_per_epoch_even_and_short_windows(size: int, micro: int, n: int) -> None:
    s = spec(micro_batch_size=micro, accumulation_steps=n, epochs=3)
    assert steps_per_epoch(s, 0, train_size=size) == simulated_steps(size, micro, {0: n}, 1)
    assert total_optimizer_steps(s, train_size=size) == simulated_steps(size, micro, {0: n}, 3)


def test_default_train_size_comes_from_the_catalog() -> None:
    s = spec(micro_batch_size=16, accumulation_steps=4, epochs=2)
    size = DATASETS["digits"].train_size
    assert total_optimizer_steps(s) == simulated_steps(size, 16, {0: 4}, 2)


def test_epoch_schedule_changes_n_at_its_epochs() -> None:
    schedule = {0: 8, 2: 2, 5: 1}
    s = spec(
        micro_batch_size=10, accumulation_steps={str(k): v for k, v in schedule.items()}, epochs=7
    )
    assert [accumulation_at(s, e) for e in range(7)] == [8, 8, 2, 2, 2, 1, 1]
    assert [effective_batch_size(s, e) for e in (0, 2, 6)] == [80, 20, 10]
    assert total_optimizer_steps(s, train_size=257) == simulated_steps(257, 10, schedule, 7)


def test_schedule_entries_after_the_last_epoch_do_not_count() -> None:
    s = spec(micro_batch_size=10, accumulation_steps={"0": 4, "9": 1}, epochs=2)
    assert total_optimizer_steps(s, train_size=95) == simulated_steps(95, 10, {0: 4}, 2)


def test_max_steps_is_the_total() -> None:
    s = spec(micro_batch_size=16, accumulation_steps={"0": 4, "1": 2}, max_steps=37)
    assert total_optimizer_steps(s) == 37


def test_effective_batch_gives_n_and_counts_like_m_times_n() -> None:
    s = spec(micro_batch_size=8, effective_batch_size=32, epochs=2)
    assert accumulation_at(s, 0) == 4
    assert effective_batch_size(s) == 32
    assert total_optimizer_steps(s, train_size=70) == simulated_steps(70, 8, {0: 4}, 2)


def test_auto_micro_batch_step_count_does_not_depend_on_the_m_chosen() -> None:
    s = spec(micro_batch_size="auto", effective_batch_size=24, epochs=2)
    assert accumulation_at(s, 0) is None
    for micro in (1, 2, 3, 4, 6, 8, 12, 24):
        assert total_optimizer_steps(s, train_size=50) == simulated_steps(
            50, micro, {0: 24 // micro}, 2
        )


def test_several_gpus_split_the_epoch_and_multiply_the_batch() -> None:
    s = spec(micro_batch_size=4, accumulation_steps=3, epochs=1, gpus=2)
    assert effective_batch_size(s) == 24
    assert total_optimizer_steps(s, train_size=101) == simulated_steps(101, 4, {0: 3}, 1, world=2)


def test_cpu_counts_as_one_process() -> None:
    s = spec(micro_batch_size=4, accumulation_steps=3, epochs=1, gpus=0)
    assert effective_batch_size(s) == 12


def test_dataset_options_that_resize_the_epoch_are_honoured() -> None:
    from services.catalog.text_corpus import split

    fake = spec(
        dataset={"name": "fake", "size": 37}, micro_batch_size=4, accumulation_steps=2, epochs=1
    )
    assert total_optimizer_steps(fake) == simulated_steps(37, 4, {0: 2}, 1)
    text = spec(
        model="tiny_transformer",
        dataset={"name": "text", "max_len": 16},
        micro_batch_size=4,
        accumulation_steps=2,
        epochs=1,
    )
    # The text dataset's training split is `split(max_len)[0]` (services.catalog.builders.datasets.text).
    assert total_optimizer_steps(text) == simulated_steps(len(split(16)[0]), 4, {0: 2}, 1)
