"""Capture and restore every RNG a training step can draw on (torch, CUDA, numpy, python).

``capture_rng_state`` is cheap (it runs at every window boundary); ``serialise_rng_state``
turns a capture into tensors and plain Python values so checkpoints load with
``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch


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
    return state


def serialise_rng_state(state: dict[str, Any]) -> dict[str, Any]:
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
    }


def restore_rng_state(state: dict[str, Any]) -> None:
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
        torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda"]])
