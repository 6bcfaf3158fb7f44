"""make_loader's order over ranks (accumcore.world_order): global window w holds the same
samples for any world size, each rank a contiguous slice of its micro-batches."""

from __future__ import annotations

import pytest

from accumcore.data import EpochBatchSampler
from accumcore.world_order import WindowLayout, rank_share

SAMPLES = 35
MICRO = 2


def _windows_by_rank(world: int, window: int, epoch: int = 1, drop_last: bool = False) -> list[list[list[list[int]]]]:
    """[rank][window] -> that rank's index batches, grouped by the rank's layout."""
    result = []
    for rank in range(world):
        sampler = EpochBatchSampler(SAMPLES, MICRO, seed=4, drop_last=drop_last, rank=rank, world=world)
        sampler.set_window(window)
        sampler.set_epoch(epoch)
        batches = iter(list(sampler))
        assert len(sampler) == sum(sampler.layout().sizes())
        result.append([[next(batches) for _ in range(size)] for size in sampler.layout().sizes()])
        assert next(batches, None) is None
    return result


def test_rank_shares_are_contiguous_and_uneven_by_at_most_one() -> None:
    assert [len(rank_share(8, r, 3)) for r in range(3)] == [3, 3, 2]
    assert [list(rank_share(2, r, 3)) for r in range(3)] == [[0], [1], []]
    assert [x for r in range(4) for x in rank_share(10, r, 4)] == list(range(10))


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("window", [1, 3, 8])
def test_every_world_size_gives_each_global_window_the_same_samples(window: int, drop_last: bool) -> None:
    (single,) = _windows_by_rank(1, window, drop_last=drop_last)
    for world in (2, 3, 5):
        ranks = _windows_by_rank(world, window, drop_last=drop_last)
        for w, expected in enumerate(single):
            assert [b for rank in ranks for b in rank[w]] == expected, (world, w)
    seen = [i for batches in single for batch in batches for i in batch]
    # Each sample once; drop_last leaves out the permutation's last (short) micro-batch.
    assert len(set(seen)) == len(seen) == SAMPLES - (SAMPLES % MICRO if drop_last else 0)


def test_the_order_depends_on_the_epoch_and_not_on_the_world() -> None:
    epoch0 = [b for w in _windows_by_rank(1, 8, epoch=0)[0] for b in w]
    epoch1 = [b for w in _windows_by_rank(1, 8, epoch=1)[0] for b in w]
    assert epoch0 != epoch1


def test_a_rank_skips_its_own_batches() -> None:
    sampler = EpochBatchSampler(SAMPLES, MICRO, seed=4, rank=1, world=3)
    sampler.set_window(8)
    everything = list(sampler)
    sampler.skip_batches(4)
    assert list(sampler) == everything[4:]
    sampler.skip_batches(2)
    sampler.set_epoch(0)  # a skip belongs to the epoch it was asked in
    assert list(sampler) == everything


def test_before_set_window_each_window_holds_one_micro_batch_per_rank() -> None:
    sampler = EpochBatchSampler(SAMPLES, MICRO, seed=4, rank=2, world=3)
    assert sampler.layout().sizes() == [1] * 6  # 18 micro-batches: 6 windows of 3


def test_a_position_that_is_no_window_boundary_is_refused() -> None:
    layout = WindowLayout(SAMPLES, MICRO, per_window=8, rank=0, world=2)
    assert [layout.window_at(s) for s in (0, 16, 32, 35)] == [0, 1, 2, 3]
    with pytest.raises(ValueError, match=r"10 samples into the epoch is not a window boundary .*16 samples"):
        layout.window_at(10)
