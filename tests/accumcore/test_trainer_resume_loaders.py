"""Exact resume with plain DataLoaders, not only ``accumcore.data.make_loader``.

Creating a DataLoader's iterator draws its base seed (from ``loader.generator``, else from the
global torch RNG), and a ``RandomSampler`` draws its permutation at the first batch (from its
generator, else a seed from the global RNG). The trainer records those RNG states at each
epoch's start and, on resume, restores them before re-creating the iterator, so that a run
stopped after k steps and resumed in fresh objects (after the process drew other numbers)
ends bitwise equal to the uninterrupted run: with a sequential or a random sampler, with or
without generators, with dropout in the model and numpy/python/torch randomness in the
dataset's transforms. Loaders whose position cannot be restored (an IterableDataset, a custom
sampler) are named at ``fit`` by a ``resume_inexact`` event and flagged in the checkpoint.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import (
    DataLoader,
    Dataset,
    IterableDataset,
    RandomSampler,
    Sampler,
    TensorDataset,
)
from trainer_reference import seed_everything

from accumcore import Callback, Trainer, load_checkpoint, save_checkpoint
from accumcore.data import make_loader

SAMPLES = 11
EPOCHS = 3  # 6 batches of 2 per epoch, N=2: 3 windows per epoch, 9 steps


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    return torch.randn(SAMPLES, 4, generator=g), torch.randint(0, 3, (SAMPLES,), generator=g)


class Augmented(Dataset):
    """Transforms drawing on torch, numpy and python RNGs; targets readable alone or not."""

    def __init__(self, expose_targets: bool) -> None:
        self.x, y = _data()
        if expose_targets:
            self.targets = y
        self.y = y

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, index: int):
        noise = torch.randn(4) * 0.05 + torch.from_numpy(np.random.normal(size=4).astype(np.float32)) * 0.05
        return self.x[index] * (1 + random.random() * 0.1) + noise, self.y[index]


def _tensors() -> TensorDataset:
    return TensorDataset(*_data())


LOADERS: dict[str, Callable[[], DataLoader]] = {
    "sequential": lambda: DataLoader(_tensors(), batch_size=2, shuffle=False),
    "shuffled": lambda: DataLoader(_tensors(), batch_size=2, shuffle=True),
    "shuffled_generator": lambda: DataLoader(_tensors(), batch_size=2, shuffle=True,
                                             generator=torch.Generator().manual_seed(0)),
    "sampler_generator": lambda: DataLoader(
        _tensors(), batch_size=2, sampler=RandomSampler(range(SAMPLES), generator=torch.Generator().manual_seed(5))),
    "transforms_targets_path": lambda: DataLoader(Augmented(expose_targets=True), batch_size=2, shuffle=True),
    "transforms_read_ahead": lambda: DataLoader(Augmented(expose_targets=False), batch_size=2, shuffle=True),
    "transforms_generator": lambda: DataLoader(Augmented(expose_targets=False), batch_size=2, shuffle=True,
                                               generator=torch.Generator().manual_seed(1)),
    "make_loader": lambda: make_loader(Augmented(expose_targets=True), 2, seed=7),
}


class Events(Callback):
    def __init__(self) -> None:
        self.kinds: list[str] = []
        self.data: list[dict] = []

    def on_event(self, trainer, kind, message, data) -> None:
        self.kinds.append(kind)
        self.data.append(data)


def _trainer(callbacks=()) -> Trainer:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Dropout(0.3), nn.Linear(8, 3))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.5)
    return Trainer(model, optimizer, loss_fn=nn.CrossEntropyLoss(), accumulation_steps=2, scheduler=scheduler,
                   callbacks=callbacks)


def _full(name: str):
    seed_everything(1)
    trainer = _trainer()
    history = trainer.fit(LOADERS[name](), epochs=EPOCHS)
    return trainer, [s["loss"] for s in history.steps]


@pytest.mark.parametrize("stop_after", [1, 3, 5])  # mid-epoch 0, epoch 0's end, mid-epoch 1
@pytest.mark.parametrize("name", list(LOADERS))
def test_resume_with_a_plain_data_loader_is_bitwise_equal(name: str, stop_after: int, tmp_path) -> None:
    full, full_losses = _full(name)
    seed_everything(1)
    first = _trainer()
    events = Events()
    first.callbacks.callbacks.append(events)
    first_history = first.fit(LOADERS[name](), epochs=EPOCHS, max_steps=stop_after)
    assert "resume_inexact" not in events.kinds
    save_checkpoint(first.state_dict(), tmp_path / "state.pt")
    seed_everything(12345)  # whatever the process drew meanwhile must not matter
    torch.randn(17)
    resumed = _trainer()
    resumed.load_state_dict(load_checkpoint(tmp_path / "state.pt"))
    resumed_history = resumed.fit(LOADERS[name](), epochs=EPOCHS)
    for (key, p), q in zip(full.model.state_dict().items(), resumed.model.state_dict().values(), strict=True):
        assert torch.equal(p, q), key
    losses = [s["loss"] for s in first_history.steps + resumed_history.steps]
    assert losses == full_losses


class StopAfterPolls(Callback):
    def __init__(self, polls: int) -> None:
        self.polls, self.seen = polls, 0

    def should_stop(self) -> bool:
        self.seen += 1
        return self.seen > self.polls


@pytest.mark.parametrize("polls", [1, 7])  # inside the first window of epoch 0 / of epoch 1
@pytest.mark.parametrize("name", ["shuffled", "transforms_read_ahead", "transforms_targets_path"])
def test_a_stop_inside_an_epochs_first_window_resumes_exactly(name: str, polls: int) -> None:
    full, _ = _full(name)
    seed_everything(1)
    first = _trainer([StopAfterPolls(polls)])
    assert first.fit(LOADERS[name](), epochs=EPOCHS).stopped
    seed_everything(99)
    resumed = _trainer()
    resumed.load_state_dict(first.state_dict())
    resumed.fit(LOADERS[name](), epochs=EPOCHS)
    for p, q in zip(full.model.parameters(), resumed.model.parameters(), strict=True):
        assert torch.equal(p, q)


# ------------------------------------------------------- an IterableDataset with state
class Positioned(IterableDataset):
    """A stream that saves its position, with random noise. As torchdata's Stateful protocol
    says: after load_state_dict the next __iter__ continues from there; any other starts over."""

    def __init__(self) -> None:
        self.next = 0
        self.resume_from: int | None = None

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        x, y = _data()
        start, self.resume_from = self.resume_from or 0, None
        for index in range(start, SAMPLES):
            self.next = index + 1
            yield x[index] + torch.randn(4) * 0.05, y[index]

    def state_dict(self) -> dict:
        return {"next": self.next}

    def load_state_dict(self, state: dict) -> None:
        self.resume_from = int(state["next"])


@pytest.mark.parametrize("stop_after", [1, 3, 5])
def test_an_iterable_dataset_with_state_resumes_exactly(stop_after: int, tmp_path) -> None:
    LOADERS["positioned"] = lambda: DataLoader(Positioned(), batch_size=2)
    try:
        test_resume_with_a_plain_data_loader_is_bitwise_equal("positioned", stop_after, tmp_path)
    finally:
        del LOADERS["positioned"]


def test_an_iterable_dataset_with_state_resumes_exactly_after_a_stop() -> None:
    LOADERS["positioned"] = lambda: DataLoader(Positioned(), batch_size=2)
    try:
        test_a_stop_inside_an_epochs_first_window_resumes_exactly("positioned", 7)
        test_a_stop_inside_an_epochs_first_window_resumes_exactly("positioned", 4)
    finally:
        del LOADERS["positioned"]


# ------------------------------------------------------------------ inexact loaders
class Stream(IterableDataset):
    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        x, y = _data()
        yield from zip(x, y, strict=True)


class EveryOther(Sampler[int]):
    def __iter__(self) -> Iterator[int]:
        return iter(list(range(0, SAMPLES, 2)) + list(range(1, SAMPLES, 2)))

    def __len__(self) -> int:
        return SAMPLES


@pytest.mark.parametrize(
    ("loader", "reason"),
    [
        (lambda: DataLoader(Stream(), batch_size=2), "IterableDataset"),
        (lambda: DataLoader(_tensors(), batch_size=2, sampler=EveryOther()), "EveryOther"),
    ],
    ids=["iterable_dataset", "custom_sampler"],
)
def test_loaders_that_cannot_resume_exactly_say_so(loader, reason: str) -> None:
    events = Events()
    trainer = _trainer([events])
    trainer.fit(loader(), epochs=1)
    assert events.kinds == ["resume_inexact"] and reason in events.data[0]["reason"]
    assert trainer.state_dict()["loader"]["exact"] is False


@pytest.mark.parametrize("loader", [lambda: [next(iter(LOADERS["sequential"]()))] * 3, LOADERS["sequential"]],
                         ids=["list_of_batches", "data_loader"])
def test_exact_loaders_raise_no_warning(loader) -> None:
    events = Events()
    trainer = _trainer([events])
    trainer.fit(loader(), epochs=1)
    assert events.kinds == [] and trainer.state_dict()["loader"]["exact"] is True


# ------------------------------------------------------------------ earlier format
def test_a_checkpoint_of_the_previous_format_still_resumes(tmp_path) -> None:
    """accumcore.trainer/1 had no loader state: exact for make_loader, which it required."""
    full, _ = _full("make_loader")
    seed_everything(1)
    first = _trainer()
    first.fit(LOADERS["make_loader"](), epochs=EPOCHS, max_steps=4)
    state = first.state_dict()
    old = {k: v for k, v in state.items() if k != "loader"}
    old["format"] = "accumcore.trainer/1"
    old["progress"] = {k: v for k, v in state["progress"].items() if k != "consecutive_skips"}
    save_checkpoint(old, tmp_path / "old.pt")
    resumed = _trainer()
    resumed.load_state_dict(load_checkpoint(tmp_path / "old.pt"))
    resumed.fit(LOADERS["make_loader"](), epochs=EPOCHS)
    for p, q in zip(full.model.parameters(), resumed.model.parameters(), strict=True):
        assert torch.equal(p, q)


def test_an_unknown_format_is_refused_with_the_formats_it_knows() -> None:
    state = _trainer().state_dict()
    state["format"] = "accumcore.trainer/9"
    with pytest.raises(ValueError, match=r"format 'accumcore.trainer/9'.*accumcore.trainer/2"):
        _trainer().load_state_dict(state)


# ------------------------------------------------------------ worker processes
def test_persistent_workers_are_refused_where_checkpoints_promise_a_resume(tmp_path) -> None:
    """Their RNG states outlive the epoch and are not saved: refused with the fix, not warned."""
    def loader(persistent: bool) -> DataLoader:
        return DataLoader(Augmented(expose_targets=False), batch_size=2, shuffle=True, num_workers=1,
                          persistent_workers=persistent)

    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    trainer = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), loss_fn=nn.CrossEntropyLoss(),
                      accumulation_steps=2, checkpoint_dir=tmp_path)
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(ValueError, match="persistent_workers=True and this fit writes checkpoints.*"
                                         "Pass persistent_workers=False"):
        trainer.fit(loader(True), epochs=2)
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), before, strict=True))
    trainer.fit(loader(False), epochs=1)  # the fix trains, and resumes (below)
    resumed = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), loss_fn=nn.CrossEntropyLoss(),
                      accumulation_steps=2)
    resumed.load_state_dict(trainer.state_dict())
    with pytest.raises(ValueError, match="resumes from a checkpoint"):
        resumed.fit(loader(True), epochs=2)


def test_resume_with_worker_processes_started_each_epoch_is_bitwise_equal(tmp_path) -> None:
    def loader() -> DataLoader:
        return DataLoader(Augmented(expose_targets=False), batch_size=2, shuffle=True, num_workers=1)

    seed_everything(1)
    full = _trainer()
    full_losses = [s["loss"] for s in full.fit(loader(), epochs=EPOCHS).steps]
    seed_everything(1)
    first = _trainer()
    first_losses = [s["loss"] for s in first.fit(loader(), epochs=EPOCHS, max_steps=4).steps]  # mid-epoch 1
    save_checkpoint(first.state_dict(), tmp_path / "state.pt")
    seed_everything(777)
    resumed = _trainer()
    resumed.load_state_dict(load_checkpoint(tmp_path / "state.pt"))
    resumed_losses = [s["loss"] for s in resumed.fit(loader(), epochs=EPOCHS).steps]
    assert first_losses + resumed_losses == full_losses
    assert all(torch.equal(p, q) for p, q in zip(full.model.parameters(), resumed.model.parameters(), strict=True))
