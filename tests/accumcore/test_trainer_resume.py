"""Exact resume: stop after k steps, restore into fresh objects, finish; bitwise equal on CPU.

The run draws on every RNG the trainer saves: dropout (torch), a dataset augmenting with
numpy and python's random, a shuffled loader, Adam, a StepLR scheduler, an epoch schedule
that changes N, and per-epoch evaluation on a plain DataLoader (which draws on torch's RNG).
"""

from __future__ import annotations

import functools
import random

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset
from trainer_reference import seed_everything

from accumcore import Callback, Trainer, load_checkpoint, save_checkpoint
from accumcore.data import make_loader

EPOCHS = 3
SAMPLES = 11
MICRO_BATCH = 2  # 6 batches per epoch
SCHEDULE = {0: 4, 1: 2}  # windows per epoch: 2, then 3, then 3 -> 8 steps


class NoisyDataset(Dataset):
    """Augments with numpy and python RNGs, so resume must restore both."""

    def __init__(self) -> None:
        g = torch.Generator().manual_seed(3)
        self.x = torch.randn(SAMPLES, 4, generator=g)
        self.y = torch.randint(0, 3, (SAMPLES,), generator=g)

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, index: int):
        noise = torch.from_numpy(np.random.normal(size=4).astype(np.float32)) * 0.1
        return self.x[index] * (1 + random.random() * 0.1) + noise, self.y[index]


def _trainer(callbacks=(), **kwargs) -> Trainer:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Dropout(0.3), nn.Linear(8, 3))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.5)
    return Trainer(model, optimizer, loss_fn=nn.CrossEntropyLoss(), accumulation_steps=SCHEDULE,
                   scheduler=scheduler, callbacks=callbacks, **kwargs)


def _loaders():
    dataset = NoisyDataset()
    val = DataLoader(dataset, batch_size=4)
    return make_loader(dataset, MICRO_BATCH, seed=7), val


@functools.cache
def _uninterrupted():
    seed_everything(1)
    trainer = _trainer()
    train, val = _loaders()
    history = trainer.fit(train, epochs=EPOCHS, val_loader=val)
    return trainer, history


def _resume_and_finish(state, tmp_path):
    path = tmp_path / "state.pt"
    save_checkpoint(state, path)
    seed_everything(12345)  # whatever the process did meanwhile must not matter
    trainer = _trainer()
    trainer.load_state_dict(load_checkpoint(path))
    train, val = _loaders()
    history = trainer.fit(train, epochs=EPOCHS, val_loader=val)
    return trainer, history


def _assert_bitwise_equal(a: Trainer, b: Trainer) -> None:
    for (name, p), q in zip(a.model.state_dict().items(), b.model.state_dict().values(), strict=True):
        assert torch.equal(p, q), name
    assert a.global_step == b.global_step
    assert a.scheduler.state_dict() == b.scheduler.state_dict()


@pytest.mark.parametrize("stop_after", [1, 2, 4, 7])  # mid-epoch 0, epoch end, mid-epoch 1, ...
def test_resume_after_max_steps_is_bitwise_equal(stop_after: int, tmp_path) -> None:
    full, full_history = _uninterrupted()
    seed_everything(1)
    first = _trainer()
    train, val = _loaders()
    first_history = first.fit(train, epochs=EPOCHS, val_loader=val, max_steps=stop_after)
    assert first.global_step == stop_after and not first_history.stopped
    resumed, resumed_history = _resume_and_finish(first.state_dict(), tmp_path)
    _assert_bitwise_equal(full, resumed)
    losses = [s["loss"] for s in first_history.steps + resumed_history.steps]
    assert losses == [s["loss"] for s in full_history.steps]
    # Per-epoch evaluations are neither lost nor repeated across the interruption.
    epochs_evaluated = [e["epoch"] for e in resumed_history.evals]
    assert epochs_evaluated[-1] == EPOCHS - 1 and len(set(epochs_evaluated)) == len(epochs_evaluated)
    assert resumed_history.evals[-1] == full_history.evals[-1]


class StopAfterPolls(Callback):
    def __init__(self, polls: int) -> None:
        self.polls = polls
        self.seen = 0

    def should_stop(self) -> bool:
        self.seen += 1
        return self.seen > self.polls


@pytest.mark.parametrize("polls", [6, 9])  # the 2nd window of epoch 0; the 1st of epoch 1  # stop inside a window: it is discarded
def test_resume_after_should_stop_mid_window_is_bitwise_equal(polls: int, tmp_path) -> None:
    full, _ = _uninterrupted()
    seed_everything(1)
    first = _trainer(callbacks=[StopAfterPolls(polls)])
    train, val = _loaders()
    history = first.fit(train, epochs=EPOCHS, val_loader=val)
    assert history.stopped and 0 < first.global_step < full.global_step
    assert all(p.grad is None for p in first.model.parameters())  # the partial window is gone
    resumed, _ = _resume_and_finish(first.state_dict(), tmp_path)
    _assert_bitwise_equal(full, resumed)


def test_periodic_checkpoints_resume_exactly(tmp_path) -> None:
    full, _ = _uninterrupted()
    seed_everything(1)
    writer = _trainer(checkpoint_every=3, checkpoint_dir=tmp_path / "ckpt")
    train, val = _loaders()
    history = writer.fit(train, epochs=EPOCHS, val_loader=val)
    # Every 3 steps, and at the end of fit: 3.pt, 6.pt, 8.pt.
    assert sorted(p.name for p in (tmp_path / "ckpt").glob("*.pt")) == ["3.pt", "6.pt", "8.pt"]
    assert [c.step for c in history.checkpoints] == [3, 6, 8]
    _assert_bitwise_equal(full, writer)
    resumed = _trainer()
    resumed.load_state_dict(load_checkpoint(tmp_path / "ckpt" / "3.pt"))
    seed_everything(99)
    train, val = _loaders()
    resumed.fit(train, epochs=EPOCHS, val_loader=val)
    _assert_bitwise_equal(full, resumed)


def test_load_state_dict_refuses_other_states_with_the_fix() -> None:
    trainer = _trainer()
    state = trainer.state_dict()
    with pytest.raises(ValueError, match="not an accumcore trainer state"):
        trainer.load_state_dict({"model": state["model"]})
    linear = nn.Linear(4, 3)
    other = Trainer(linear, torch.optim.SGD(linear.parameters(), lr=0.1),
                    loss_fn=nn.CrossEntropyLoss(), accumulation_steps=3)
    with pytest.raises(ValueError, match="resume with the same accumulation_steps"):
        other.load_state_dict(state)
