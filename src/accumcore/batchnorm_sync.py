"""BatchNorm running statistics that do not depend on the number of ranks (issue 41 item 2).

In train mode a BatchNorm layer normalises each micro-batch by that micro-batch's own mean and
variance, and folds them into its running statistics, an exponential moving average (or, with
``momentum=None``, a cumulative one) in the order the micro-batches run. With
``make_loader(rank=, world=)`` a global micro-batch holds the same samples on any number of
ranks, so its forward, and the gradients, are the same; but each rank folds only its own
micro-batches into its own buffers (and DDP then broadcasts rank 0's at every forward), so the
running statistics, evaluation and the checkpoint change with the world size.

``BatchNormReplay`` keeps them the one-process ones: during a window each BatchNorm layer's
batch mean and unbiased variance are recorded per micro-batch (a forward pre-hook, the same
statistics the layer computes), with the micro-batch's global position; at the window's end
one object all-gather brings every rank's records (two vectors of C numbers per layer and
micro-batch) to every rank, and each rank puts the window-start buffers back and applies the
updates in global order, as one process does. Every rank then holds the same buffers.

The records travel in one all-reduce of a float64 table, a row per global micro-batch of the
window (a flag, then each layer's mean and variance), each rank writing its own rows, on the
collectives' device (no host copy of the statistics under NCCL); one read of the row flags
orders the replay. A layer called other than once per forward (a shared module) falls back to
an object all-gather of the records.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.nn.modules.batchnorm import _BatchNorm

from accumcore import distributed

Record = tuple[int, list[tuple[int, torch.Tensor, torch.Tensor]]]


class BatchNormReplay:
    """Records each micro-batch's BatchNorm statistics and replays them in global order."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.layers = [m for m in distributed.unwrap(model).modules()
                       if isinstance(m, _BatchNorm) and m.track_running_stats]
        self._handles: list[Any] = []
        self._saved: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] | None = None
        self._records: list[Record] = []
        self._current: list[tuple[int, torch.Tensor, torch.Tensor]] | None = None
        self._positions: list[int] = []
        self._first = 0  # the window's first global position (x the OOM split)
        self._rows = 0  # ... and its global micro-batches

    def active(self) -> bool:
        """Any BatchNorm layer in train mode that tracks running statistics."""
        return any(layer.training for layer in self.layers)

    def start_window(self, positions: list[int], first: int = 0, rows: int = 0) -> None:
        """Before a window's (or a backed-off window's) first forward: the window-start
        buffers (kept from the first try), each micro-batch's global position, and the
        window's global positions ``first`` .. ``first + rows - 1``. The hooks are registered
        here and removed by ``close`` at the window's end (the trainer's), so a model saved
        with ``torch.save(model)`` between windows carries none."""
        if not self._handles:
            self._handles = [layer.register_forward_pre_hook(self._record(i)) for i, layer in enumerate(self.layers)]
        if self._saved is None:
            self._saved = [(layer.running_mean.detach().clone(),  # type: ignore[union-attr]
                            layer.running_var.detach().clone(),  # type: ignore[union-attr]
                            layer.num_batches_tracked.detach().clone())  # type: ignore[union-attr]
                           for layer in self.layers]
        self._records = []
        self._positions = positions
        self._first, self._rows = first, rows

    def begin(self, index: int) -> None:
        """Micro-batch ``index`` of this rank's window runs its forward now."""
        self._current = []
        self._index = index

    def end(self) -> None:
        if self._current is not None:
            position = self._positions[self._index] if self._index < len(self._positions) else self._index
            self._records.append((position, self._current))
        self._current = None

    def _record(self, number: int) -> Any:
        def hook(layer: _BatchNorm, args: tuple[Any, ...]) -> None:
            if self._current is None or not layer.training:
                return
            x = args[0].detach()
            dims = [0, *range(2, x.dim())]
            with torch.no_grad():
                var, mean = torch.var_mean(x, dim=dims, correction=1)
            self._current.append((number, mean, var))  # on the device: moved once per window
        return hook

    def finish_window(self, device: torch.device) -> None:
        """Every rank (a collective): bring every rank's records here, put the window-start
        buffers back and apply every micro-batch's update in global order."""
        saved, self._saved = self._saved, None
        records = self._reduced(device)
        self._records = []
        if saved is None:
            return
        with torch.no_grad():
            for layer, (mean, var, tracked) in zip(self.layers, saved, strict=True):
                layer.running_mean.copy_(mean)  # type: ignore[union-attr]
                layer.running_var.copy_(var)  # type: ignore[union-attr]
                layer.num_batches_tracked.copy_(tracked)  # type: ignore[union-attr]
            for _, stats in records:
                for number, mean, var in stats:
                    _update(self.layers[number], mean, var)

    def _reduced(self, device: torch.device) -> list[Record]:
        """Every rank's records in global order: one all-reduce of the window's table (or,
        when a layer ran other than once per forward on some rank, an object all-gather)."""
        sizes = [layer.num_features for layer in self.layers]
        width = 1 + 2 * sum(sizes)
        table = torch.zeros(self._rows + 1, width, dtype=torch.float64, device=device)
        irregular = False
        expected = list(range(len(self.layers)))
        for position, stats in self._records:
            row = position - self._first
            if [n for n, _, _ in stats] != expected or not 0 <= row < self._rows:
                irregular = True
                continue
            table[row, 0] = 1.0
            table[row, 1:] = torch.cat([t.reshape(-1).to(device, torch.float64) for _, m, v in stats for t in (m, v)])
        table[self._rows, 0] = 1.0 if irregular else 0.0
        torch.distributed.all_reduce(table)
        flags = table[:, 0].tolist()  # the window's one read: which rows to replay
        if flags[-1] > 0:
            local = [(p, [(n, m.cpu(), v.cpu()) for n, m, v in stats]) for p, stats in self._records]
            gathered = distributed.gather_objects(local) or [local]
            return sorted((record for rank in gathered for record in rank), key=lambda record: record[0])
        records: list[Record] = []
        for row, flag in enumerate(flags[:-1]):
            if flag > 0:
                parts = torch.split(table[row, 1:], [c for size in sizes for c in (size, size)])
                records.append((row, [(n, parts[2 * n], parts[2 * n + 1]) for n in range(len(sizes))]))
        return records

    def discard(self) -> None:
        """The window did not run (every rank stopped, or the epoch is over): nothing to apply."""
        self._saved, self._records, self._current = None, [], None

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []


def _update(layer: _BatchNorm, mean: torch.Tensor, var: torch.Tensor) -> None:
    """What the layer's train-mode forward does to its buffers, with this batch's statistics."""
    assert layer.running_mean is not None and layer.running_var is not None and layer.num_batches_tracked is not None
    layer.num_batches_tracked.add_(1)
    factor = 1.0 / float(layer.num_batches_tracked) if layer.momentum is None else layer.momentum
    mean = mean.to(layer.running_mean.device, layer.running_mean.dtype)
    var = var.to(layer.running_var.device, layer.running_var.dtype)
    layer.running_mean.mul_(1 - factor).add_(mean, alpha=factor)
    layer.running_var.mul_(1 - factor).add_(var, alpha=factor)
