"""DDP helpers: skip the gradient all-reduce inside a window, sum item counts across ranks.

Rule 7 of docs/accumulation.md. DDP averages gradients over ranks, so a micro-batch's loss is
scaled by n_i * world_size / W_global to make the averaged result the global window mean. A
window that some rank has no micro-batch for runs without DDP's hooks and is averaged by
``all_reduce_grads`` at the step, the way DDP would have averaged it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def ddp_wrapped(model: torch.nn.Module) -> bool:
    """True when ``model`` is DDP-wrapped inside an initialised process group."""
    return (
        isinstance(model, DistributedDataParallel)
        and dist.is_available()
        and dist.is_initialized()
    )


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    return model.module if isinstance(model, DistributedDataParallel) else model


def world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def gather_objects(value: Any) -> list[Any] | None:
    """Every rank's ``value``, in rank order (a collective: call it on every rank); None
    outside DDP."""
    if world_size() == 1:
        return None
    gathered: list[Any] = [None] * world_size()
    dist.all_gather_object(gathered, value)
    return gathered


def is_main_process() -> bool:
    return not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0


_NULL = contextlib.nullcontext()


def no_sync(model: torch.nn.Module, skip: bool) -> Any:
    """``model.no_sync()`` when ``skip`` (forward and backward must both run inside it)."""
    if skip:
        return model.no_sync()  # type: ignore[operator]
    return _NULL


def comm_device(model: torch.nn.Module) -> torch.device:
    """Where collectives need their tensors: CUDA for NCCL, CPU for gloo."""
    backend = dist.get_backend()
    if backend == "nccl":
        device = next(unwrap(model).parameters()).device
        # FSDP with CPU offload keeps its parameter shards in host memory: the rank's GPU.
        return device if device.type == "cuda" else torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def all_reduce_grads(params: Sequence[torch.Tensor], device: torch.device) -> None:
    """Average gradients over ranks as DDP does (divide by world size, sum), for a window
    run without DDP's hooks; a missing gradient counts as zeros. One call per dtype."""
    world = world_size()
    for param in params:
        if param.grad is None:
            param.grad = torch.zeros_like(param)
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for param in params:
        assert param.grad is not None
        by_dtype.setdefault(param.grad.dtype, []).append(param.grad)
    for grads in by_dtype.values():
        flat = torch.cat([g.reshape(-1) for g in grads]).to(device)
        flat.div_(world)
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        offset = 0
        for grad in grads:
            grad.copy_(flat[offset : offset + grad.numel()].view_as(grad))
            offset += grad.numel()


def all_reduce_sum(values: Sequence[float | int | torch.Tensor], device: torch.device) -> torch.Tensor:
    """One all-reduce for several scalars; returns a float64 tensor on ``device``."""
    tensor = torch.stack(
        [torch.as_tensor(v, dtype=torch.float64).to(device).reshape(()) for v in values]
    )
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


class RankFailed(RuntimeError):
    """One rank's error, raised on every rank (issue 41 item 4): a refusal or an error that
    can differ by rank (a bad batch, a loss check, label-shift detection, an error in a
    micro-batch's forward) is agreed by all ranks at their next collective, so none waits in
    one the failing rank never joins. ``rank``: the first rank that failed; ``kind``: its
    exception's class name. The failing rank's own error is the ``__cause__``."""

    def __init__(self, message: str, *, rank: int, kind: str) -> None:
        super().__init__(message)
        self.rank = rank
        self.kind = kind


def raise_agreed(error: BaseException | None) -> None:
    """Every rank calls this once some collective told them that a rank failed: one object
    all-gather of each rank's error (None where it did not fail), then every rank raises the
    first failing rank's as ``RankFailed``, the same message everywhere."""
    local = None if error is None else (type(error).__name__, str(error))
    gathered = gather_objects(local) or [local]
    failed = [(r, value) for r, value in enumerate(gathered) if value is not None]
    if not failed:
        raise RuntimeError("raise_agreed: no rank reported an error")  # a caller's bug
    first, (kind, message) = failed[0]
    others = f" (and on rank {', '.join(str(r) for r, _ in failed[1:])})" if len(failed) > 1 else ""
    raise RankFailed(f"rank {first} of {len(gathered)} failed{others}: {kind}: {message}",
                     rank=first, kind=kind) from error


def agree_on_error(error: BaseException | None, device: torch.device) -> None:
    """An all-reduced flag before a collective the ranks may not all reach: returns when no
    rank failed, else every rank raises the first failing rank's error (``raise_agreed``)."""
    if float(all_reduce_sum([1.0 if error is not None else 0.0], device)[0]) > 0:
        raise_agreed(error)
