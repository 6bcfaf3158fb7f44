"""Activation checkpointing: blocks that keep no activations and recompute their forward in
the backward (``torch.utils.checkpoint``, non-reentrant), exact as the plain run.

    from accumcore import checkpoint_activations
    checkpoint_activations(model)            # every block; every=2: every other block
    checkpoint_activations(model, every=2)   # before shard(model): FSDP wraps the wrapped blocks

Blocks are the transformer layers of a Hugging Face or timm model (the same paths as
``sharding.blocks``: ``transformer.h``, ``model.layers``, ``encoder.layer``, ``blocks``, ...,
found under wrappers such as peft's or the catalog's ``Logits``), else the top-level children
that hold parameters. Each is wrapped by torch's ``checkpoint_wrapper`` (state-dict keys are
the plain model's, so checkpoints load either way), as torchtitan does before ``fully_shard``.

Exactness (rule 16 of docs/accumulation.md): the recompute runs on the RNG state the first
forward had (``preserve_rng_state``: the CPU generator and the inputs' CUDA devices'), which
under the trainer is the micro-batch's keyed stream (``rng.KeyedRng`` covers the backward too),
so dropout draws the same masks; a normalisation layer's running statistics are put back after
the recompute (it would otherwise update them twice). On CPU in float64 a checkpointed run ends
bitwise equal to the plain run (``tests/accumcore/test_activation_checkpointing.py``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    CheckpointWrapper,
    checkpoint_wrapper,
)
from torch.nn.modules.batchnorm import _NormBase
from torch.utils.checkpoint import checkpoint

from accumcore.sharding import BLOCK_PATHS


def checkpoint_activations(model: nn.Module, every: int = 1) -> nn.Module:
    """Wrap every ``every``-th block of ``model`` (the ``every``-th, ``2 x every``-th, ...:
    torchtitan's ``ac_freq``) so its activations are recomputed in the backward; returns ``model``.

    Apply it before ``shard`` or DDP; the parameters stay the same objects, so an optimizer
    built before still steps them. A Hugging Face model's KV cache is turned off
    (``config.use_cache = False``, as its own ``gradient_checkpointing_enable`` does): a
    recomputed attention would append to it twice.

    Raises:
        ValueError: ``every`` below 1, or blocks already wrapped.
    """
    if not isinstance(every, int) or isinstance(every, bool) or every < 1:
        raise ValueError(f"every must be an integer >= 1 (checkpoint every k-th block); got {every!r}")
    if checkpointed_blocks(model):
        raise ValueError("the model's blocks are checkpointed already (checkpoint_activations was applied)")
    for position, (parent, name) in enumerate(block_slots(model), start=1):
        if position % every == 0:
            block = parent[int(name)] if name.isdigit() else getattr(parent, name)
            wrapped = checkpoint_wrapper(block, checkpoint_fn=_recompute_exactly)
            if name.isdigit():
                parent[int(name)] = wrapped
            else:
                setattr(parent, name, wrapped)
    for module in model.modules():
        config = getattr(module, "config", None)
        if config is not None and getattr(config, "use_cache", None):
            config.use_cache = False
    return model


def checkpointed_blocks(model: nn.Module) -> int:
    """How many blocks of ``model`` recompute their activations."""
    return sum(isinstance(module, CheckpointWrapper) for module in model.modules())


def block_slots(model: nn.Module) -> list[tuple[Any, str]]:
    """(parent, attribute or index) of each block of ``model``, in order."""
    named = dict(model.named_modules())
    for path in BLOCK_PATHS:
        for name, module in named.items():
            if (name == path or name.endswith("." + path)) and isinstance(module, nn.ModuleList | nn.Sequential) \
                    and len(module) > 0:
                return [(module, str(index)) for index in range(len(module))]
    owner = model
    while len(children := list(owner.named_children())) == 1:  # wrappers: Logits.inner, peft's
        owner = children[0][1]
    return [(owner, name) for name, child in owner.named_children() if any(True for _ in child.parameters())]


def _recompute_exactly(module: nn.Module, *args: Any, **kwargs: Any) -> Any:
    """``checkpoint(module)`` that puts back the running statistics its recompute updates."""
    norms = [m for m in module.modules() if isinstance(m, _NormBase) and m.track_running_stats]
    calls = 0

    def run(*inner_args: Any, **inner_kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 1 or not norms:
            return module(*inner_args, **inner_kwargs)
        saved = [(buffer, buffer.clone()) for norm in norms for buffer in norm.buffers()]
        try:
            return module(*inner_args, **inner_kwargs)
        finally:
            with torch.no_grad():
                for buffer, copy in saved:
                    buffer.copy_(copy)

    return checkpoint(run, *args, use_reentrant=False, preserve_rng_state=True, **kwargs)
