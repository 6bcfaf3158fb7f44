"""Capture and restore every RNG a training step can draw on (torch, CUDA, numpy, python).

``capture_rng_state`` is cheap (it runs at every window boundary); ``serialise_rng_state``
turns a capture into tensors and plain Python values so checkpoints load with
``torch.load(weights_only=True)``.

Under DDP each rank draws from its own generators (dropout on its own GPU), and rank 0 alone
writes the checkpoint: the trainer gathers every rank's states into it (``ranks``, one
collective per checkpoint, ``accumcore.distributed.gather_objects``), and ``restore_rng_state`` gives each rank its own back.
CUDA states are restored per device index for the devices both sides have (a worker that
sees fewer GPUs than the one that saved resumes instead of failing), and the generator of
the device the saving process trained on goes to the device this one trains on.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch
import torch.distributed as dist


def capture_rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": np.random.get_state(),
        "python": random.getstate(),
        "cuda": [],
    }
    # Only read CUDA states when CUDA is already in use: reading them would initialise it.
    if torch.cuda.is_initialized():  # cheap, unlike is_available()
        state["cuda"] = torch.cuda.get_rng_state_all()
        state["cuda_device"] = torch.cuda.current_device()
    return state


def serialise_rng_state(state: dict[str, Any], ranks: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """``state`` as tensors and plain values; ``ranks``: every DDP rank's (serialised)."""
    np_state = state["numpy"]
    if isinstance(np_state, tuple):
        np_state = {
            "name": str(np_state[0]),
            "keys": torch.from_numpy(np.asarray(np_state[1], dtype=np.int64)),
            "pos": int(np_state[2]),
            "has_gauss": int(np_state[3]),
            "cached_gaussian": float(np_state[4]),
        }
    return {
        "torch": state["torch"].clone(),
        "numpy": np_state,
        "python": [state["python"][0], list(state["python"][1]), state["python"][2]],
        "cuda": list(state["cuda"]),
        "cuda_device": state.get("cuda_device"),
        **({"ranks": ranks} if ranks else {}),
    }


def restore_rng_state(state: dict[str, Any]) -> None:
    """Restore a capture; under DDP, this rank's own states when the checkpoint has them."""
    ranks = state.get("ranks")
    rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
    if ranks and rank < len(ranks):
        state = ranks[rank]
    torch.set_rng_state(state["torch"].cpu())
    np_state = state["numpy"]
    if isinstance(np_state, dict):
        np_state = (
            np_state["name"],
            np_state["keys"].cpu().numpy().astype(np.uint32),
            np_state["pos"],
            np_state["has_gauss"],
            np_state["cached_gaussian"],
        )
    np.random.set_state(np_state)
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))
    if state.get("cuda") and torch.cuda.is_available():
        restore_cuda(list(state["cuda"]), state.get("cuda_device"))


def restore_cuda(saved: list[torch.Tensor], saved_device: int | None) -> None:
    """Device i's generator from ``saved[i]`` for the devices both sides have; then the one
    the saving process trained on (``saved_device``) onto the device this process uses."""
    for index, device_state in enumerate(saved[: torch.cuda.device_count()]):
        torch.cuda.set_rng_state(device_state.cpu(), index)
    if saved_device is not None and saved_device < len(saved):
        torch.cuda.set_rng_state(saved[saved_device].cpu(), torch.cuda.current_device())
