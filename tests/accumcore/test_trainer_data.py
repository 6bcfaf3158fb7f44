"""make_loader: the order of each epoch is a function of (seed, epoch), and resumable."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import TensorDataset

from accumcore.data import EpochBatchSampler, make_loader


def _targets(loader) -> list[list[int]]:
    return [y.tolist() for _, y in loader]


def test_order_depends_only_on_seed_and_epoch() -> None:
    dataset = TensorDataset(torch.zeros(10, 1), torch.arange(10))
    a, b, other = make_loader(dataset, 3, seed=1), make_loader(dataset, 3, seed=1), make_loader(dataset, 3, seed=2)
    epochs = []
    for epoch in (0, 1):
        for loader in (a, b, other):
            loader.batch_sampler.set_epoch(epoch)
        assert _targets(a) == _targets(b) != _targets(other)
        assert _targets(a) == _targets(a)  # re-iterating an epoch repeats it
        assert [len(t) for t in _targets(a)] == [3, 3, 3, 1]
        epochs.append(sum(_targets(a), []))
    assert sorted(epochs[0]) == list(range(10)) and epochs[0] != epochs[1]


def test_skip_batches_resumes_mid_epoch_once() -> None:
    loader = make_loader(TensorDataset(torch.zeros(10, 1), torch.arange(10)), 3, seed=4)
    loader.batch_sampler.set_epoch(3)
    full = _targets(loader)
    fresh = make_loader(TensorDataset(torch.zeros(10, 1), torch.arange(10)), 3, seed=0)
    fresh.batch_sampler.load_state_dict(loader.batch_sampler.state_dict())
    fresh.batch_sampler.skip_batches(2)
    assert _targets(fresh) == full[2:]
    assert _targets(fresh) == full


def test_unshuffled_and_drop_last() -> None:
    loader = make_loader(TensorDataset(torch.zeros(7, 1), torch.arange(7)), 3, shuffle=False, drop_last=True)
    assert _targets(loader) == [[0, 1, 2], [3, 4, 5]] and len(loader) == 2


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        EpochBatchSampler(5, 0)
    sampler = EpochBatchSampler(5, 2)
    with pytest.raises(ValueError, match="resume with the same dataset"):
        sampler.load_state_dict(EpochBatchSampler(6, 2).state_dict())
