"""Out-of-memory back-off state: halve the micro-batch, double the micro-batches per window.

Rule 10 of docs/accumulation.md. Each loaded batch is split into ``split`` chunks, so m x N
(and the window's samples) stay the same and the update stays exact. Under DDP every rank
backs off together (the window's flags say whether any rank ran out of memory).
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any

import torch

# torch.cuda.OutOfMemoryError is an alias of torch.OutOfMemoryError in recent versions.
OOM_ERRORS: tuple[type[BaseException], ...] = tuple(
    {getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError), torch.cuda.OutOfMemoryError}
)


# What CUDA libraries say when an allocation of theirs fails: they raise a plain RuntimeError
# (cuBLAS "CUBLAS_STATUS_ALLOC_FAILED", cuDNN "CUDNN_STATUS_ALLOC_FAILED", cuFFT/cuSPARSE
# "..._ALLOC_FAILED", NCCL "Cuda failure 'out of memory'", "CUDA error: out of memory").
OOM_MESSAGES = ("out of memory", "ALLOC_FAILED")


class MicroBatchTooSmall(RuntimeError):
    """Out of memory even with one sample per micro-batch."""


class OptimizerStepOutOfMemory(MicroBatchTooSmall):
    """Out of memory inside an optimizer step that may have changed state: no exact retry."""


def is_oom(exc: BaseException) -> bool:
    """Whether ``exc`` is a device out-of-memory error: ``torch.OutOfMemoryError``, or a
    RuntimeError whose message is a CUDA library's allocation failure (the one place the
    trainer and the micro-batch probe classify errors). Our own ``MicroBatchTooSmall``, which
    says "out of memory" to the user, is the end of the back-off, not one more reason for it."""
    if isinstance(exc, OOM_ERRORS):
        return True
    if not isinstance(exc, RuntimeError) or isinstance(exc, MicroBatchTooSmall):
        return False
    text = str(exc)
    return any(marker in text for marker in OOM_MESSAGES[1:]) or OOM_MESSAGES[0] in text.lower()


def optimizer_step_or_oom(optimizer: torch.optim.Optimizer, step: Callable[[], None]) -> bool:
    """Run ``step`` (the optimizer step); False when it ran out of memory allocating the
    optimizer's state on its first step, which is undone so the window can be run again.

    torch's optimizers allocate a group's state before they update it, so on the first step
    (no state yet) an out-of-memory error with every new state still at step 0 changed
    nothing: the new state is dropped and the step can be retried after a back-off. Later, an
    update may be half applied, which no retry can make exact: that raises with what to do.
    """
    first = not optimizer.state
    try:
        step()
        return True
    except RuntimeError as exc:
        if not is_oom(exc):
            raise
        if first and all(_step_count(state) == 0 for state in optimizer.state.values()):
            optimizer.state.clear()
            return False
        raise OptimizerStepOutOfMemory(
            "out of memory inside optimizer.step, after the optimizer's state existed: the "
            "update may be half applied, so the window cannot be retried exactly. Resume from "
            "the last checkpoint with a smaller micro_batch_size, precision='bf16', or an "
            "optimizer with less state (sgd)"
        ) from exc


def _step_count(state: dict[str, Any]) -> float:
    step = state.get("step", 0)
    return float(step.item() if isinstance(step, torch.Tensor) else step)


def release_memory() -> None:
    """Return the failed attempt's blocks to the device after a caught out-of-memory error, so
    the retry does not find the cache fragmented (an injected OOM on the CPU has none)."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
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
