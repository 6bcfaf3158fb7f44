"""Sharded models (PyTorch FSDP2, ``fully_shard``): applying it, and the window's gradient sync.

Rule 13 of docs/accumulation.md. The trainer accepts a model to which ``fully_shard`` was
applied (``shard`` below does it per block); its forward all-gathers and backward
reduce-scatters are collectives, so every rank runs the same number of passes per window
(``window.WindowRunner`` adds zero-weight passes on ranks with fewer micro-batches). FSDP
averages reduced gradients over ranks, as DDP does: the runner weights each micro-batch by
n_i x world / W, which undoes it.

Two exact gradient-sync modes (``Trainer(fsdp_sync=...)``):

- ``"micro_batch"``: reduce-scatter after every micro-batch; each rank holds only its shard of
  the gradients (the memory FSDP is for). The default (docs/benchmarks.md, "FSDP").
- ``"window"``: ``set_requires_gradient_sync(False)`` before all passes but the window's last;
  one reduce-scatter per window, but unsharded gradients are held through the window.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.distributed.fsdp import (
    CPUOffloadPolicy,
    FSDPModule,
    MixedPrecisionPolicy,
    OffloadPolicy,
    fully_shard,
)

from accumcore import distributed, items

SYNC_MODES = ("micro_batch", "window")
DEFAULT_SYNC = "micro_batch"
# Where Hugging Face models keep their transformer blocks (GPT-2 and kin; Llama, Mistral, Qwen;
# BERT; OPT/BART decoders): each becomes its own FSDP unit.
BLOCK_PATHS = ("transformer.h", "model.layers", "model.decoder.layers", "encoder.layer", "bert.encoder.layer",
               "gpt_neox.layers", "layers", "blocks", "h")


def is_sharded(model: nn.Module) -> bool:
    """True for a model to which ``fully_shard`` was applied (at its root)."""
    return isinstance(model, FSDPModule)


def check_sync_mode(mode: str) -> str:
    if mode not in SYNC_MODES:
        raise ValueError(f"fsdp_sync must be one of {', '.join(SYNC_MODES)}; got {mode!r}")
    return mode


def shard(
    model: nn.Module,
    *,
    mesh: Any | None = None,
    reshard_after_forward: bool = True,
    mixed_precision: MixedPrecisionPolicy | bool | None = None,
    cpu_offload: bool = False,
) -> nn.Module:
    """Apply ``fully_shard`` to each block of ``model`` and to its root; returns ``model``.

    Blocks: the transformer layers of a Hugging Face model (``model.transformer.h``,
    ``model.model.layers``, ...), otherwise the top-level children that hold parameters.
    Needs an initialised process group (``torch.distributed.init_process_group``), or ``mesh``.

    Args:
        mesh: a 1-D ``DeviceMesh`` to shard over; None: every rank of the default group.
        reshard_after_forward: free the gathered parameters after each block's forward (less
            memory, one more all-gather in the backward).
        mixed_precision: a ``MixedPrecisionPolicy``, or True for parameters in bf16 and
            gradient reductions in fp32.
        cpu_offload: keep the parameter, gradient and optimizer-state shards in host memory
            (``CPUOffloadPolicy``): a model bigger than device memory trains.
    """
    if is_sharded(model):
        raise ValueError("the model is sharded already (fully_shard was applied to its root)")
    if mixed_precision is True:
        mixed_precision = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    options: dict[str, Any] = {
        "mesh": mesh,
        "reshard_after_forward": reshard_after_forward,
        "mp_policy": mixed_precision or MixedPrecisionPolicy(),
        # Pinned host memory speeds the copies to a GPU; without CUDA it cannot be allocated.
        "offload_policy": CPUOffloadPolicy(pin_memory=torch.cuda.is_available()) if cpu_offload else OffloadPolicy(),
    }
    for block in blocks(model):
        fully_shard(block, **options)
    fully_shard(model, **options)
    return model


def blocks(model: nn.Module) -> list[nn.Module]:
    """The modules ``shard`` wraps one by one before the root."""
    for path in BLOCK_PATHS:
        found = _attribute(model, path)
        if isinstance(found, nn.ModuleList) and len(found) > 0:
            return list(found)
    return [child for child in model.children() if any(True for _ in child.parameters())]


def _attribute(model: nn.Module, path: str) -> Any:
    value: Any = model
    for name in path.split("."):
        value = getattr(value, name, None)
        if value is None:
            return None
    return value


def defer_gradient_sync(model: nn.Module, defer: bool) -> None:
    """Before a pass: skip (``defer``) or run the reduce-scatter in its backward."""
    assert isinstance(model, FSDPModule)
    model.set_requires_gradient_sync(not defer)


def low_precision_compute(model: nn.Module) -> torch.dtype | None:
    """The parameter dtype a ``MixedPrecisionPolicy`` computes in, where it is not the
    parameters' own (bf16 of ``shard(mixed_precision=True)``); None otherwise."""
    for module in model.modules():
        state = getattr(module, "_get_fsdp_state", None)
        policy = getattr(state(), "_mp_policy", None) if callable(state) else None
        dtype = getattr(policy, "param_dtype", None)
        if dtype is not None and any(p.dtype != dtype for p in module.parameters()):
            return dtype
    return None


def shared_empty_rows(own: Any) -> Any:
    """0 rows of some rank's batch, for a rank that has seen none yet (its zero-weight
    passes need the inputs' structure): every rank offers ``own`` (its 0-row batch, or None)
    and every rank gets the first offer. A collective: every rank calls it."""
    offers = distributed.gather_objects(items.to_device(own, torch.device("cpu"))) or [own]
    return next((offer for offer in offers if offer is not None), None)
