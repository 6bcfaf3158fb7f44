"""``peak_memory_bytes`` is each optimizer step's own peak, and an evaluation's peak is
reported apart (``val_peak_memory_bytes``), not a running maximum since ``fit`` started.

No GPU here: the CUDA allocator's peak counter is stood in for by one that keeps the bytes of
the largest input a forward saw (``accumcore.metrics.peak_memory_bytes`` and
``reset_peak_memory``, the two calls to the allocator, are replaced). One big batch in the
middle of the epoch must show in its step only.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from accumcore import Trainer, metrics


class Allocator:
    """A peak counter: the largest input (bytes) a forward saw since the last reset."""

    def __init__(self) -> None:
        self.peak = 0

    def see(self, _module, inputs) -> None:
        self.peak = max(self.peak, inputs[0].nbytes)

    def reset(self, device=None) -> None:
        self.peak = 0


def test_each_step_and_each_evaluation_report_their_own_peak(monkeypatch: pytest.MonkeyPatch) -> None:
    allocator = Allocator()
    monkeypatch.setattr(metrics, "peak_memory_bytes", lambda device: float(allocator.peak))
    monkeypatch.setattr(metrics, "reset_peak_memory", allocator.reset)
    model = nn.Linear(4, 3)
    model.register_forward_pre_hook(allocator.see)
    # Batches of 2, 2, 8, 2 rows, one step each; the validation set is one batch of 16 rows.
    train = [(torch.randn(rows, 4), torch.randint(0, 3, (rows,))) for rows in (2, 2, 8, 2)]
    val = [(torch.randn(16, 4), torch.randint(0, 3, (16,)))]
    trainer = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), loss_fn=nn.CrossEntropyLoss())
    history = trainer.fit(train, epochs=1, val_loader=val)
    row = 4 * 4  # bytes of one float32 row of 4 features
    assert [s["peak_memory_bytes"] for s in history.steps] == [2 * row, 2 * row, 8 * row, 2 * row]
    assert history.evals[0]["val_peak_memory_bytes"] == 16 * row
