"""Counting W from targets alone: a window's inputs are loaded one micro-batch at a time.

For a single-process DataLoader over a dataset whose targets can be read without its inputs,
the trainer counts the window's items from the targets and loads each micro-batch just before
its forward (``accumcore.window_source``). Checked here: which loaders take that path; its
update is bitwise the read-ahead's and equals the big batch in float64; resume stays bitwise
exact; at most one micro-batch of inputs is alive at once (the read-ahead holds N, which shows
the check can fail); a ``targets_for`` hook that disagrees with the data is a clear error.
"""

from __future__ import annotations

import copy
import random
import weakref

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset, default_collate
from trainer_reference import (
    TokenCrossEntropy,
    big_batch_training,
    max_abs_diff,
    seed_everything,
    token_dataset,
    token_loss_sum,
    token_model,
)

from accumcore import Trainer
from accumcore.data import make_loader
from accumcore.device_feed import DeviceFeed
from accumcore.schedule import AccumulationSchedule
from accumcore.window_source import reads_window_ahead, target_source


class WithTargets(Dataset):
    """Map-style dataset exposing its targets as an attribute (as torchvision datasets do)."""

    def __init__(self, inputs: torch.Tensor, targets: torch.Tensor, noisy: bool = False) -> None:
        self.inputs, self.targets, self.noisy = inputs, targets, noisy

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index: int):
        x = self.inputs[index]
        if self.noisy:  # numpy and python RNG augmentation: resume must restore both
            noise = torch.from_numpy(np.random.normal(size=x.shape).astype(np.float32)) * 0.1
            x = x * (1 + random.random() * 0.1) + noise
        return x, self.targets[index]


class Hidden(WithTargets):
    """The same data with no way to read targets alone: the trainer must read ahead."""

    def __init__(self, inputs: torch.Tensor, targets: torch.Tensor, noisy: bool = False) -> None:
        super().__init__(inputs, targets, noisy)
        self.labels = self.__dict__.pop("targets")

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int):
        x, _ = WithTargets(self.inputs, self.labels, self.noisy)[index]
        return x, self.labels[index]


def test_the_targets_path_is_taken_only_where_targets_can_be_read_alone() -> None:
    x, y = torch.randn(6, 2), torch.tensor([0, 1, 2, 0, 1, 2])
    with_targets = WithTargets(x, y)
    assert target_source(make_loader(TensorDataset(x, y), 2), custom_counter=False) is not None
    assert target_source(DataLoader(TensorDataset(x, y), batch_size=2), custom_counter=False) is not None
    assert target_source(make_loader(with_targets, 2), custom_counter=False) is not None
    assert not reads_window_ahead(make_loader(with_targets, 2))
    # Anything else reads ahead: hidden targets, a target transform, a custom counter,
    # worker processes, a custom collate function without a hook, a plain iterable.
    assert reads_window_ahead(make_loader(Hidden(x, y), 2))
    transformed = WithTargets(x, y)
    transformed.target_transform = lambda t: t  # type: ignore[attr-defined]
    assert reads_window_ahead(make_loader(transformed, 2))
    assert reads_window_ahead(make_loader(with_targets, 2), count_items=lambda i, t: 1)
    assert reads_window_ahead(make_loader(with_targets, 2, num_workers=1))
    collated = make_loader(with_targets, 2, collate_fn=lambda batch: default_collate(batch))
    assert reads_window_ahead(collated)
    collated.targets_for = lambda indices: y[indices]  # type: ignore[attr-defined]
    assert not reads_window_ahead(collated)
    assert reads_window_ahead([(x, y)])


def _token_fit(dataset: Dataset, m: int, n: int, epochs: int, split_at: int | None = None) -> nn.Module:
    model = token_model(torch.float64)
    trainer = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5),
                      loss_fn=TokenCrossEntropy(), accumulation_steps=n)
    trainer.oom_split = split_at or 1  # the OOM back-off's split, applied to pending batches too
    trainer.fit(make_loader(dataset, m, seed=5), epochs=epochs)
    return model


@pytest.mark.parametrize("split", [1, 2])
def test_targets_path_is_bitwise_the_read_ahead_and_exact_in_float64(split: int) -> None:
    tokens, targets = token_dataset(11).tensors  # padded: valid-token counts vary per batch
    lazy = _token_fit(WithTargets(tokens, targets), 3, 2, 2, split)
    ahead = _token_fit(Hidden(tokens, targets), 3, 2, 2, split)
    for p, q in zip(lazy.parameters(), ahead.parameters(), strict=True):
        assert torch.equal(p, q)
    reference, _ = big_batch_training(
        token_model(torch.float64), make_loader(TensorDataset(tokens, targets), 3, seed=5),
        token_loss_sum, AccumulationSchedule(2), epochs=2,
    )
    assert max_abs_diff(lazy, reference) <= 1e-12


def _noisy_trainer() -> Trainer:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Dropout(0.3), nn.Linear(8, 3))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.5)
    return Trainer(model, optimizer, accumulation_steps={0: 3, 1: 2}, scheduler=scheduler)


def _noisy_loader() -> DataLoader:
    g = torch.Generator().manual_seed(3)
    dataset = WithTargets(torch.randn(11, 4, generator=g), torch.randint(0, 3, (11,), generator=g), noisy=True)
    loader = make_loader(dataset, 2, seed=7)
    assert not reads_window_ahead(loader)
    return loader


@pytest.mark.parametrize("stop_after", [1, 3])  # mid-epoch 0; mid-epoch 1
def test_resume_on_the_targets_path_is_bitwise_equal(stop_after: int) -> None:
    seed_everything(1)
    full = _noisy_trainer()
    full.fit(_noisy_loader(), epochs=3)
    seed_everything(1)
    first = _noisy_trainer()
    first.fit(_noisy_loader(), epochs=3, max_steps=stop_after)
    state = copy.deepcopy(first.state_dict())
    seed_everything(12345)  # whatever the process did meanwhile must not matter
    resumed = _noisy_trainer()
    resumed.load_state_dict(state)
    resumed.fit(_noisy_loader(), epochs=3)
    assert resumed.global_step == full.global_step
    for p, q in zip(full.model.parameters(), resumed.model.parameters(), strict=True):
        assert torch.equal(p, q)


class LiveInputs:
    """Counts collated input tensors still alive, and the most alive at once."""

    def __init__(self) -> None:
        self.live = 0
        self.most = 0

    def collate(self, samples):
        inputs, targets = default_collate(samples)
        self.live += 1
        self.most = max(self.most, self.live)  # a batch loaded while the previous one is alive
        weakref.finalize(inputs, self._freed)
        return inputs, targets

    def _freed(self) -> None:
        self.live -= 1


class Watching(nn.Module):
    def __init__(self, counter: LiveInputs) -> None:
        super().__init__()
        self.counter = counter
        self.linear = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.counter.most = max(self.counter.most, self.counter.live)
        return self.linear(x)


@pytest.mark.parametrize("hook", [True, False], ids=["targets_for", "read_ahead"])
def test_at_most_one_micro_batch_of_inputs_is_alive(hook: bool) -> None:
    x, y = torch.randn(16, 4), torch.randint(0, 3, (16,))
    counter = LiveInputs()
    loader = make_loader(TensorDataset(x, y), 2, seed=0, collate_fn=counter.collate)
    if hook:
        loader.targets_for = lambda indices: y[indices]  # type: ignore[attr-defined]
    model = Watching(counter)
    history = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), accumulation_steps=4).fit(loader)
    assert len(history.steps) == 2
    # The read-ahead holds the window's 4 micro-batches; the targets path only the current one.
    assert counter.most == (1 if hook else 4)


def test_a_targets_for_hook_that_disagrees_with_the_data_is_a_clear_error() -> None:
    x, y = torch.randn(8, 4), torch.randint(0, 3, (8,))
    loader = make_loader(TensorDataset(x, y), 2, seed=0, collate_fn=lambda batch: default_collate(batch))
    loader.targets_for = lambda indices: torch.full((len(indices),), -100)  # type: ignore[attr-defined]
    model = nn.Linear(4, 3)
    with pytest.raises(RuntimeError, match="targets_for"):
        Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), accumulation_steps=2).fit(loader)


@pytest.mark.parametrize("hook", [True, False], ids=["targets_for", "read_ahead"])
def test_only_the_current_micro_batch_is_moved_to_the_device(hook: bool) -> None:
    # On CUDA each micro-batch is copied to the device just before its forward; read-ahead
    # batches stay on the host. Stand in for the device copy (the trainer's feed on the CPU
    # leaves host tensors as they are) with a clone, and count live copies.
    copies = LiveInputs()

    def to_device(pair):
        copy_ = pair[0].clone()
        copies.live += 1
        copies.most = max(copies.most, copies.live)
        weakref.finalize(copy_, copies._freed)
        return copy_, pair[1]

    x, y = torch.randn(16, 4), torch.randint(0, 3, (16,))
    loader = make_loader(TensorDataset(x, y), 2, seed=0, collate_fn=lambda batch: default_collate(batch))
    if hook:
        loader.targets_for = lambda indices: y[indices]  # type: ignore[attr-defined]
    model = nn.Linear(4, 3)
    trainer = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), accumulation_steps=4)
    trainer._runner.feed = DeviceFeed(torch.device("cpu"), copy=to_device)
    trainer.fit(loader)
    assert copies.most == 1


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8, torch.bool, torch.float32,
                                   torch.float64, torch.bfloat16])
def test_targets_read_by_index_are_torch_indexing_exactly(dtype: torch.dtype) -> None:
    """``rows_of`` reads targets through numpy where it can (a fifth of torch's list indexing
    cost per micro-batch); values, dtype and shape must be torch's own ``targets[indices]``,
    for dtypes numpy lacks (bfloat16: torch's indexing) and rows of several positions."""
    from accumcore.window_source import rows_of

    for shape in ((50,), (50, 7)):
        targets = (torch.arange(int(np.prod(shape))).reshape(shape) % 5 - 1).to(dtype)
        read = rows_of(targets)
        for indices in ([3], [49, 0, 7, 7, 12], list(range(50))[::-3]):
            got, want = read(indices), targets[indices]
            assert got.dtype == want.dtype and got.shape == want.shape
            assert torch.equal(got, want)
        targets[3] = 1  # in-place changes to the dataset's targets are seen, as by torch's indexing
        assert torch.equal(read([3]), targets[[3]])
    grad = torch.ones(4, requires_grad=True)  # numpy refuses it: torch's indexing
    assert torch.equal(rows_of(grad)([1, 2]), grad[[1, 2]])


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8, torch.bool, torch.float32,
                                   torch.float64, torch.bfloat16])
@pytest.mark.parametrize("mode", [None, "tokens", "rows"])
def test_counts_from_indices_are_the_counters_own(dtype: torch.dtype, mode: str | None) -> None:
    """``indexed_count`` counts a micro-batch from its indices (no targets tensor made): the
    same n_i as the trainer's ``ItemCounter`` on ``targets[indices]``, ignored targets
    (-100, and 255 for uint8) and in-place changes included; None where it cannot tell."""
    from accumcore.items import ItemCounter
    from accumcore.window_source import indexed_count

    ignore = 255 if dtype == torch.uint8 else -100
    for shape in ((50,), (50, 7)):
        targets = (torch.arange(int(np.prod(shape))).reshape(shape) % 5).to(dtype)
        if not (dtype.is_floating_point or dtype == torch.bool):
            targets[::4] = ignore
        counter = ItemCounter(mode, ignore, False, nn.CrossEntropyLoss())
        count = indexed_count(targets, counter)
        if len(shape) > 1 or dtype == torch.bfloat16:
            assert count is None  # counted from its targets
            continue
        assert count is not None
        for indices in ([3], [4, 8], [49, 0, 7, 7, 12], list(range(50))[::-3]):
            assert count(indices) == counter(None, targets[indices])
        targets[3] = ignore if not (dtype.is_floating_point or dtype == torch.bool) else targets[3]
        assert count([3, 5]) == counter(None, targets[[3, 5]])
    assert indexed_count(torch.arange(4), lambda _inputs, targets: len(targets)) is None  # a user's counter
