"""Out-of-memory back-off state: halve the micro-batch, double the micro-batches per window.

Rule 10 of docs/accumulation.md. Each loaded batch is split into ``split`` chunks, so m x N
(and the window's samples) stay the same and the update stays exact. Under DDP every rank
backs off together (the window's flags say whether any rank ran out of memory).
"""

from __future__ import annotations

import gc

import torch

# torch.cuda.OutOfMemoryError is an alias of torch.OutOfMemoryError in recent versions.
OOM_ERRORS: tuple[type[BaseException], ...] = tuple(
    {getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError), torch.cuda.OutOfMemoryError}
)


class MicroBatchTooSmall(RuntimeError):
    """Out of memory even with one sample per micro-batch."""


def release_memory() -> None:
    """Return the failed attempt's blocks to the device (an injected OOM on the CPU has none)."""
    if torch.cuda.is_initialized():
        gc.collect()  # tensors still referenced by reference cycles of the failed attempt
        torch.cuda.empty_cache()


def next_split(split: int, largest_chunk: int) -> int:
    """The split after one more back-off, or raise when chunks are already one sample."""
    if largest_chunk <= 1:
        raise MicroBatchTooSmall(
            "out of memory with a micro-batch of 1 sample; the model does not fit this device. "
            "Use precision='bf16' or 'fp16', a smaller model, or a device with more memory"
        )
    return split * 2
