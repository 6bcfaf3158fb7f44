"""DDP helpers: skip the gradient all-reduce inside a window, sum item counts across ranks.

Rule 7 of ACCUMULATION.md. DDP averages gradients over ranks, so a micro-batch's loss is
scaled by n_i * world_size / W_global to make the averaged result the global window mean.
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
        return next(unwrap(model).parameters()).device
    return torch.device("cpu")


def all_reduce_sum(values: Sequence[float | int | torch.Tensor], device: torch.device) -> torch.Tensor:
    """One all-reduce for several scalars; returns a float64 tensor on ``device``."""
    tensor = torch.stack(
        [torch.as_tensor(v, dtype=torch.float64).to(device).reshape(()) for v in values]
    )
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor
