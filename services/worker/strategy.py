"""How the ranks of an attempt share its model: the wrapping ``build_run`` applies before the
optimizer is built (FSDP2 replaces the parameters with sharded DTensors, so the optimizer
must be built on the wrapped model's parameters; DDP keeps the same parameter objects).

A world of 1 trains the plain model, unless it shards (fsdp with ``cpu_offload`` on one GPU,
in a process group of one rank). k ranks under ``strategy: "ddp"`` wrap it in
``DistributedDataParallel`` (every rank a full replica, gradients all-reduced at the window's
last micro-batch: accumcore's ``no_backward_sync``); under ``strategy: "fsdp"`` every rank
holds a shard of the parameters, gradients and optimizer states (``accumcore.shard`` with the
spec's ``fsdp`` options; the sync mode is the Trainer's ``fsdp_sync``: ``trainer_options``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from services.spec import JobSpec
from services.worker.place import Place

Wrap = Callable[[torch.nn.Module], torch.nn.Module]


def model_wrapper(spec: JobSpec, place: Place) -> Wrap | None:
    """The wrapping for ``spec`` at ``place``; None: the model as built (a world of 1)."""
    if sharded(spec):
        return fsdp(spec)
    if not place.grouped:
        return None
    return ddp(place)


def sharded(spec: JobSpec) -> bool:
    """Whether the job's ranks shard the model (FSDP) rather than replicate it: every fsdp
    job, a world of 1 too (``gpus: 1`` with ``fsdp.cpu_offload``, which the spec requires
    there), in a process group of its own (``services.worker.single_group``)."""
    return spec.strategy == "fsdp"


def trainer_options(spec: JobSpec, model: torch.nn.Module) -> dict[str, Any]:
    """The Trainer arguments the strategy decides for ``model`` (as wrapped): FSDP's
    gradient-sync mode, and no ``verify_window`` on a sharded model (the big-batch comparison
    needs the whole model in one process; the sharded window's exactness is tested in
    accumcore's FSDP tests: docs/multi-gpu.md). ``verify_window_skipped`` says so as an event."""
    from accumcore.sharding import is_sharded

    if not is_sharded(model):
        return {"verify_window": spec.verify_window}
    sync = spec.fsdp.sync if spec.fsdp is not None else None
    return {"verify_window": False, **({"fsdp_sync": sync} if sync is not None else {})}


def notes(spec: JobSpec, model: torch.nn.Module) -> list[tuple[str, str, dict[str, Any]]]:
    """What the strategy decided that the spec did not say, as the job's events: the skipped
    ``verify_window`` of a sharded model."""
    from accumcore.sharding import is_sharded

    if spec.strategy != "fsdp" or not is_sharded(model) or not spec.verify_window:
        return []
    return [("verify_window_skipped",
             "verify_window is skipped for strategy fsdp: the big-batch comparison needs the "
             "whole model in one process; the sharded window's exactness is tested in "
             "accumcore (docs/multi-gpu.md)", {"strategy": spec.strategy})]


def ddp(place: Place) -> Wrap:
    # Lazy: torch.distributed stays out of a prefork worker's parent (services.worker.launch).
    from torch.nn.parallel import DistributedDataParallel

    cuda = place.device is not None and place.device.startswith("cuda")
    return lambda model: DistributedDataParallel(model, device_ids=[place.local_rank] if cuda else None)


def fsdp(spec: JobSpec) -> Wrap:
    """``accumcore.shard`` over every rank of the attempt's process group."""
    from accumcore import shard

    options = spec.fsdp
    assert options is not None
    return lambda model: shard(model, reshard_after_forward=options.reshard_after_forward,
                               mixed_precision=options.mixed_precision, cpu_offload=options.cpu_offload)
