"""One window: the forward/backward passes between two optimizer steps.

The window's micro-batches have already been read (rule 2 of ACCUMULATION.md), so their item
counts n_i and the window total W are known before the first backward. Micro-batch i is
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


@dataclass
class WindowResult:
    loss_sum: float | torch.Tensor | None  # sum over local items of the per-item loss
    items: float | torch.Tensor  # W over all ranks
    samples: float | torch.Tensor  # samples over all ranks
    micro_batches: int


@dataclass
class MicroBatch:
    inputs: Any
    targets: Any
    items: int | float | torch.Tensor


def make_micro_batches(
    window: list[Any], split: int, counter: Callable[[Any, Any], int | torch.Tensor]
) -> list[MicroBatch]:
    """Unpack loaded batches, split each into ``split`` chunks (OOM back-off), count items."""
    result = []
    for batch in window:
        inputs, targets = items.unpack(batch)
        if split == 1:
            pieces = [(inputs, targets)]
        else:
            pieces = list(zip(items.split(inputs, split), items.split(targets, split), strict=True))
        for chunk_inputs, chunk_targets in pieces:
            if items.first_dim(chunk_inputs) == 0:
                continue  # a batch smaller than the split leaves empty chunks
            count = items.normalise_count(counter(chunk_inputs, chunk_targets))
            result.append(MicroBatch(chunk_inputs, chunk_targets, count))
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
        local_samples = sum(items.first_dim(mb.inputs) for mb in micro_batches)
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
        for index, mb in enumerate(micro_batches):
            if self.should_stop is not None and self.should_stop():
                return None
            inputs = items.to_device(mb.inputs, self.device)
            targets = items.to_device(mb.targets, self.device)
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
