"""CUDA-only behaviour: one device sync per optimizer step, and the peak-memory metric.

These cannot run on a CPU-only machine (there is no device to synchronise with and no CUDA
allocator); they skip there with that reason and run wherever a GPU is present.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn
from trainer_reference import class_dataset, class_model

from accumcore import Trainer
from accumcore.data import make_loader

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="CUDA-only: device syncs and CUDA peak memory need a GPU"
)


def test_at_most_one_device_sync_per_window_and_peak_memory_reported() -> None:
    model = class_model(torch.float32)
    trainer = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), loss_fn=nn.CrossEntropyLoss(),
                      accumulation_steps=4, device="cuda")
    loader = make_loader(class_dataset(64, torch.float32), 4)
    trainer.fit(loader, epochs=1)  # warm-up: CUDA context, kernels, allocator
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            history = trainer.fit(loader, epochs=2)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    syncs = [w for w in caught if "synchroniz" in str(w.message).lower()]
    # 16 micro-batches, 4 windows in the epoch: one sync per window, none per micro-batch.
    assert len(history.steps) == 4
    assert len(syncs) <= len(history.steps), [str(w.message) for w in syncs]
    assert all(s["peak_memory_bytes"] > 0 for s in history.steps)
