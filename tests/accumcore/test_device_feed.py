"""Device memory does not grow with N: a window is read ahead on the host, and only the
micro-batch about to run is on the device.

No GPU here, so the device is a CPU stand-in (``accumcore.peak_memory.ResidentBytes``): the
trainer's ``DeviceFeed`` copies through it, and it counts the bytes and samples of the copies
that are alive. Checked: samples loaded before the first forward (a window, on the host)
against samples on the device then (one micro-batch); peak device bytes for N = 1, 2, 8; the
update is the one of a plain run; a ``CudaPrefetcher`` in front of the trainer is not
iterated (it would copy the whole window while the trainer reads it ahead).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import Dataset
from trainer_reference import class_dataset, class_model

from accumcore import Trainer, fast_path
from accumcore.data import make_loader
from accumcore.device_feed import DeviceFeed
from accumcore.fast_path import host_loader
from accumcore.peak_memory import ResidentBytes

M = 4


class Counted(Dataset):
    """A map-style dataset that counts the samples read from it (no ``targets`` attribute,
    so the trainer reads each window ahead, as it does with the fast path's worker loader)."""

    def __init__(self, n: int) -> None:
        self.data = class_dataset(n, torch.float32)
        self.loaded = 0

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int):
        self.loaded += 1
        return self.data[index]


def _train(n_acc: int, stand_in: bool = True, samples: int = 64) -> tuple[Trainer, Counted, ResidentBytes, dict[str, int]]:
    dataset = Counted(samples)
    model = class_model(torch.float32)
    trainer = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), loss_fn=nn.CrossEntropyLoss(),
                      accumulation_steps=n_acc)
    resident = ResidentBytes()
    if stand_in:
        trainer._runner.feed = DeviceFeed(torch.device("cpu"), copy=resident.copy)
    first: dict[str, int] = {}

    def at_forward(_module, _inputs) -> None:
        if not first:
            first.update(loaded=dataset.loaded, on_device=resident.samples)

    model.register_forward_pre_hook(at_forward)
    trainer.fit(make_loader(dataset, M, seed=3, collate_fn=lambda rows: torch.utils.data.default_collate(rows)),
                epochs=1)
    return trainer, dataset, resident, first


def test_window_is_read_on_the_host_and_one_micro_batch_is_on_the_device() -> None:
    _trainer, _dataset, resident, first = _train(8)
    assert first["loaded"] == 8 * M  # the window, read ahead for its item count
    assert first["on_device"] == M  # its first micro-batch only
    assert resident.peak_samples == M
    assert resident.samples == 0 and resident.bytes == 0  # nothing left on the device


def test_peak_device_bytes_do_not_depend_on_n() -> None:
    peaks = {n: _train(n)[2].peak for n in (1, 2, 8)}
    assert peaks[1] > 0
    assert peaks[8] == peaks[2] == peaks[1]


def test_the_copying_feed_keeps_the_update_bitwise() -> None:
    plain, _, _, _ = _train(4, stand_in=False)
    copied, _, _, _ = _train(4)
    for a, b in zip(plain.model.parameters(), copied.model.parameters(), strict=True):
        assert torch.equal(a, b)


def test_a_prefetcher_in_front_of_the_trainer_is_not_iterated(monkeypatch: pytest.MonkeyPatch) -> None:
    def copies_the_window(_self):
        raise AssertionError("the trainer iterated the prefetcher: every batch of a window on the device")
        yield  # pragma: no cover

    monkeypatch.setattr(fast_path.CudaPrefetcher, "__iter__", copies_the_window)
    model = class_model(torch.float32)
    trainer = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), loss_fn=nn.CrossEntropyLoss(),
                      accumulation_steps=4)
    loader = make_loader(class_dataset(32, torch.float32), M, seed=1)
    prefetched = fast_path.CudaPrefetcher(loader, "cpu")
    assert host_loader(prefetched) is loader and host_loader(loader) is loader
    history = trainer.fit(prefetched, epochs=1)
    assert len(history.steps) == 2


def test_feed_hands_out_each_micro_batch_once_in_order() -> None:
    class Loaded:
        def __init__(self, value: int) -> None:
            self.value = value

        def load(self):
            return torch.full((2, 1), float(self.value)), torch.tensor([self.value, self.value])

    resident = ResidentBytes()
    feed = DeviceFeed(torch.device("cpu"), copy=resident.copy)
    seen = []
    for host, inputs, targets in feed.window([Loaded(i) for i in range(5)]):
        assert torch.equal(host, inputs) and host is not inputs  # a copy, of this micro-batch
        seen.append(int(targets[0]))
        host = inputs = targets = None
    assert seen == [0, 1, 2, 3, 4]
    assert resident.peak_samples == 2 and resident.samples == 0
    assert list(feed.window([])) == []
