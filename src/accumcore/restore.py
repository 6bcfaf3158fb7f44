"""``load_checkpoint``: a checkpoint, single-file or sharded, into a plain or a sharded model.

    state = accumcore.load_checkpoint(path)                                 # the state only
    state = accumcore.load_checkpoint(path, model=model, optimizer=optimizer)
    trainer.load_state_dict(state)                                          # continues exactly

A directory is a sharded checkpoint (``accumcore.sharded_checkpoint``: DCP reshards it to
this world size, or to a plain model); a file is a ``Trainer`` checkpoint (its model and
optimizer are full tensors, loaded into either kind of model), or a consolidated sharded one.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from accumcore import checkpoint, distributed, sharded_checkpoint, sharding
from accumcore.frozen import load_model_state

FULL = StateDictOptions(full_state_dict=True)


def load_checkpoint(
    path: str | os.PathLike[str],
    *,
    model: torch.nn.Module | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    map_location: str | torch.device = "cpu",
) -> dict[str, Any]:
    """The trainer state of a checkpoint; with ``model`` (and ``optimizer``), their weights and
    state are loaded in place first, and the state's ``model``/``optimizer`` entries are
    theirs, ready for ``Trainer.load_state_dict``.

    Raises:
        FileNotFoundError: ``path`` is neither a checkpoint file nor a checkpoint directory.

    A ``DistributedDataParallel`` model is loaded through its ``module`` (the trainer saves the
    bare module's state, without the ``module.`` prefix), and the state's ``model`` entry is
    the bare module's too, as ``Trainer.load_state_dict`` expects.
    """
    if model is not None:
        model = distributed.unwrap(model)
    if Path(path).is_dir():
        return sharded_checkpoint.load(path, model, optimizer)
    state = checkpoint.load_checkpoint(path, map_location=map_location)
    if model is None:
        return state
    if sharding.is_sharded(model):
        set_model_state_dict(model, state["model"], options=FULL)
    else:
        load_model_state(model, state["model"])  # may lack frozen parameters (checkpoint_frozen=False)
    if optimizer is not None:
        _load_optimizer(model, optimizer, state["optimizer"])
    state["model"] = model.state_dict()
    state["optimizer"] = optimizer.state_dict() if optimizer is not None else None
    return state


def _load_optimizer(model: torch.nn.Module, optimizer: torch.optim.Optimizer, saved: dict[str, Any]) -> None:
    """A full optimizer state: keyed by parameter names (consolidated from shards) or by
    position (``optimizer.state_dict()`` of a plain model)."""
    by_name = any(isinstance(p, str) for group in saved["param_groups"] for p in group["params"])
    if not by_name and not sharding.is_sharded(model):
        optimizer.load_state_dict(saved)
        return
    if not by_name:
        saved = _keyed_by_name(model, optimizer, saved)
    set_optimizer_state_dict(model, optimizer, saved, options=FULL)


def _keyed_by_name(model: torch.nn.Module, optimizer: torch.optim.Optimizer, saved: dict[str, Any]) -> dict[str, Any]:
    """A positional optimizer state keyed by the names of this optimizer's parameters (the
    saved optimizer was built on the same model the same way, as ``load_state_dict`` needs)."""
    names = {id(p): name for name, p in model.named_parameters()}
    state: dict[str, Any] = {}
    groups = []
    for group, saved_group in zip(optimizer.param_groups, saved["param_groups"], strict=True):
        if len(group["params"]) != len(saved_group["params"]):
            raise ValueError("the checkpoint's optimizer has other parameter groups than this optimizer")
        fqns = [names[id(p)] for p in group["params"]]
        for fqn, index in zip(fqns, saved_group["params"], strict=True):
            if index in saved["state"]:
                state[fqn] = saved["state"][index]
        groups.append({**saved_group, "params": fqns})
    return {"state": state, "param_groups": groups}
