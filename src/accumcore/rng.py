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

Randomness keyed by the micro-batch (docs/accumulation.md, "Randomness keyed by the
micro-batch"): ``micro_batch_seed(seed, epoch, position)`` names a global micro-batch, and
``KeyedRng`` runs its forward and backward on the default CPU generator (and the generator of
the CUDA device the model is on) seeded from it, putting the previous states back after. So
the same micro-batch draws the same dropout masks on whichever rank runs it, two micro-batches
never share a stream, and the process's own streams (data transforms) do not move. The swap is
a generator state copy, a seed and a copy back: ~3.4 us a micro-batch on the CPU with the key
(the first draw after a seed adds ~1.3 us), where ``torch.random.fork_rng`` with
``torch.manual_seed`` (every device) costs ~180 us.
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


_MASK = (1 << 64) - 1


def _mix(value: int) -> int:
    """splitmix64's finaliser: a 64-bit bijection in which every input bit moves every output bit."""
    value = (value + 0x9E3779B97F4A7C15) & _MASK
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & _MASK
    return value ^ (value >> 31)


def epoch_key(seed: int, epoch: int) -> int:
    """The part of every micro-batch seed of ``epoch`` that ``micro_batch_seed`` shares."""
    return _mix(_mix(seed & _MASK) ^ (epoch & _MASK))


def micro_batch_seed(base: int, position: int, stream: int = 0, part: int = 0) -> int:
    """The seed of global micro-batch ``position`` of the epoch whose ``epoch_key`` is
    ``base``; ``stream``: the rank, for a loader that numbers each rank's own batches (0 for
    a global order); ``part``: the piece of a batch split by the OOM back-off (0: unsplit).
    63 bits, which ``manual_seed`` takes on every device."""
    key = _mix(base ^ position)
    if stream or part:
        key = _mix(key ^ ((stream << 32) | part))
    return key >> 1


class KeyedRng:
    """Runs code on generators seeded by a micro-batch's key, then puts the previous states back.

    ``enter(key)`` saves the default CPU generator's state (and, for a CUDA ``device``, that
    device's generator's), seeds them with ``key`` and returns what ``exit`` needs to restore
    them. The other CUDA devices, numpy and Python's ``random`` are not touched (dropout and
    ``torch.rand*`` in a forward draw from the generator of the tensors' device).
    ``enter(None)`` changes nothing."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._cuda: torch.Generator | None = None  # resolved at first use (CUDA is initialised then)

    def enter(self, key: int | None) -> tuple[torch.Tensor, torch.Tensor | None] | None:
        if key is None:
            return None
        cpu = torch.default_generator
        saved = cpu.get_state()
        cpu.manual_seed(key)
        cuda = self._cuda_generator()
        saved_cuda = None
        if cuda is not None:
            saved_cuda = cuda.get_state()
            cuda.manual_seed(key)
        return saved, saved_cuda

    def exit(self, saved: tuple[torch.Tensor, torch.Tensor | None] | None) -> None:
        if saved is None:
            return
        torch.default_generator.set_state(saved[0])
        if saved[1] is not None and self._cuda is not None:
            self._cuda.set_state(saved[1])

    def _cuda_generator(self) -> torch.Generator | None:
        if self._cuda is None and self.device.type == "cuda":
            torch.cuda.init()  # (a no-op once the model is on the device)
            index = self.device.index if self.device.index is not None else torch.cuda.current_device()
            self._cuda = torch.cuda.default_generators[index]
        return self._cuda


def restore_cuda(saved: list[torch.Tensor], saved_device: int | None) -> None:
    """Device i's generator from ``saved[i]`` for the devices both sides have; then the one
    the saving process trained on (``saved_device``) onto the device this process uses."""
    for index, device_state in enumerate(saved[: torch.cuda.device_count()]):
        torch.cuda.set_rng_state(device_state.cpu(), index)
    if saved_device is not None and saved_device < len(saved):
        torch.cuda.set_rng_state(saved[saved_device].cpu(), torch.cuda.current_device())
