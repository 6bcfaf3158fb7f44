"""One window: the forward/backward passes between two optimizer steps.

The window's micro-batches have already been read (rule 2 of ACCUMULATION.md), or at least
their targets (``window_source``: the inputs are then loaded one micro-batch at a time), so
their item counts n_i and the window total W are known before the first backward. Micro-batch i is
backpropagated with weight n_i / W, which makes the summed gradient exactly the gradient of
the window's mean loss, whatever the sizes and padding of the micro-batches (rule 1).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from accumcore import distributed, items
from accumcore.precision import Precision
from accumcore.window_source import PendingBatch, split_indices


@dataclass
class WindowResult:
    loss_sum: float | torch.Tensor | None  # sum over local items of the per-item loss
    items: float | torch.Tensor  # W over all ranks
    samples: float | torch.Tensor  # samples over all ranks
    micro_batches: int


@dataclass
class MicroBatch:
    inputs: Any  # None while ``pending`` is set: loaded just before the forward
    targets: Any
    items: int | float | torch.Tensor
    samples: int
    pending: PendingBatch | None = None

    def load(self) -> tuple[Any, Any]:
        """(inputs, targets) of this micro-batch, loading them now if they are pending."""
        if self.pending is None:
            return self.inputs, self.targets
        inputs, targets = items.unpack(self.pending.source.load(self.pending.indices))
        if self.pending.source.verify:
            loaded = items.normalise_count(items.count_items(targets, self.pending.source.ignore_index))
            if not _same_count(loaded, self.items):
                raise RuntimeError(
                    f"the window was weighted with {self.items} items for this micro-batch, but its "
                    f"loaded targets hold {loaded}: the loader's targets_for / the dataset's "
                    "targets attribute must return the targets the loader yields"
                )
        return inputs, targets


def _same_count(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return True  # device counts: checking would be a sync per micro-batch
    return bool(a == b)


def make_micro_batches(
    window: list[Any], split: int, counter: Callable[[Any, Any], int | torch.Tensor]
) -> list[MicroBatch]:
    """Unpack loaded batches, split each into ``split`` chunks (OOM back-off), count items."""
    result = []
    for batch in window:
        if isinstance(batch, PendingBatch):
            result += _pending_micro_batches(batch, split, counter)
            continue
        inputs, targets = items.unpack(batch)
        if split == 1:
            pieces = [(inputs, targets)]
        else:
            pieces = list(zip(items.split(inputs, split), items.split(targets, split), strict=True))
        for chunk_inputs, chunk_targets in pieces:
            if items.first_dim(chunk_inputs) == 0:
                continue  # a batch smaller than the split leaves empty chunks
            count = items.normalise_count(counter(chunk_inputs, chunk_targets))
            result.append(MicroBatch(chunk_inputs, chunk_targets, count, items.first_dim(chunk_inputs)))
    return result


def _pending_micro_batches(
    batch: PendingBatch, split: int, counter: Callable[[Any, Any], int | torch.Tensor]
) -> list[MicroBatch]:
    """Micro-batches counted from targets alone; each loads its own indices when it runs."""
    index_chunks = split_indices(batch.indices, split)
    target_chunks = [batch.targets] if split == 1 else items.split(batch.targets, split)
    result = []
    for indices, targets in zip(index_chunks, target_chunks, strict=True):
        if not indices:
            continue
        count = items.normalise_count(counter(None, targets))
        pending = PendingBatch(indices, targets, batch.source)
        result.append(MicroBatch(None, None, count, len(indices), pending))
    return result


class WindowRunner:
    """Runs a window's forward and backward passes; stepping is the trainer's job."""

    def __init__(
        self,
        model: torch.nn.Module,
        loss_fn: Callable[[Any, Any], torch.Tensor],
        precision: Precision,
        device: torch.device,
        should_stop: Callable[[], bool] | None,
    ) -> None:
        self.model = model
        self.loss_fn = loss_fn
        self.precision = precision
        self.device = device
        self.should_stop = should_stop
        self.ddp = distributed.ddp_wrapped(model)

    def run(self, micro_batches: list[MicroBatch]) -> WindowResult | None:
        """Forward+backward every micro-batch; None when ``should_stop`` asked to stop."""
        local_items: float | torch.Tensor = sum(mb.items for mb in micro_batches)
        local_samples = sum(mb.samples for mb in micro_batches)
        total_items: float | torch.Tensor = local_items
        total_samples: int | torch.Tensor = local_samples
        weight_factor = 1
        if self.ddp:
            # One small all-reduce per window; DDP then averages gradients over ranks, which
            # the world_size factor undoes.
            reduced = distributed.all_reduce_sum(
                [local_items, local_samples], distributed.comm_device(self.model)
            )
            total_items, total_samples = reduced[0], reduced[1]
            weight_factor = distributed.world_size()
        # W == 0 only when every micro-batch is empty too; then every weight is 0 anyway.
        divisor: float | torch.Tensor = (
            torch.where(total_items > 0, total_items, 1)
            if isinstance(total_items, torch.Tensor)
            else (total_items if total_items > 0 else 1)
        )

        losses: list[torch.Tensor] = []
        counts: list[int | float | torch.Tensor] = []
        last = len(micro_batches) - 1
        inputs: Any = None
        targets: Any = None
        outputs: Any = None
        loss: Any = None
        for index, mb in enumerate(micro_batches):
            # Drop the previous micro-batch's tensors before loading the next, so that only
            # the current micro-batch's inputs are alive (on the device, on CUDA).
            inputs = targets = outputs = loss = None
            if self.should_stop is not None and self.should_stop():
                return None
            inputs, targets = mb.load()
            inputs = items.to_device(inputs, self.device)
            targets = items.to_device(targets, self.device)
            with distributed.no_sync(self.model, self.ddp and index < last):
                with self.precision.autocast():
                    outputs = self.model(inputs)
                    loss = self.loss_fn(outputs, targets)
                if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
                    raise ValueError(
                        "loss_fn must return a scalar mean over the micro-batch's items; got "
                        f"{type(loss).__name__} of shape {getattr(loss, 'shape', None)}. "
                        "Use reduction='mean'"
                    )
                if not isinstance(mb.items, torch.Tensor) and mb.items == 0:
                    # All targets ignored: the mean loss is 0/0. Backpropagate an exact zero
                    # through the outputs so DDP still sees every parameter used.
                    self.precision.backward(_zero_through(outputs))
                    continue
                losses.append(loss.detach())
                counts.append(mb.items)
                self.precision.backward(loss * (mb.items * weight_factor / divisor))
        return WindowResult(_weighted_sum(losses, counts), total_items, total_samples, len(micro_batches))


def _weighted_sum(
    losses: list[torch.Tensor], counts: list[int | float | torch.Tensor]
) -> float | torch.Tensor | None:
    """sum(loss_i * n_i), in a few ops per window rather than two per micro-batch."""
    if not losses:
        return None
    numbers = not any(isinstance(c, torch.Tensor) for c in counts)
    if losses[0].device.type == "cpu" and numbers:
        # On the CPU reading a value is no device sync, and cheaper than tensor ops.
        return sum(loss.item() * count for loss, count in zip(losses, counts, strict=True))
    if numbers:
        scalars = [float(c) for c in counts]
        return torch.stack(torch._foreach_mul(losses, scalars)).sum()
    return torch.stack([loss * count for loss, count in zip(losses, counts, strict=True)]).sum()


def _zero_through(outputs: Any) -> torch.Tensor:
    if isinstance(outputs, torch.Tensor):
        return outputs.float().sum() * 0.0
    if isinstance(outputs, dict):
        outputs = list(outputs.values())
    tensors = [t for t in outputs if isinstance(t, torch.Tensor) and t.requires_grad]
    return sum((t.float().sum() * 0.0 for t in tensors), torch.zeros(()))
