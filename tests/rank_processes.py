"""How the tests start their gloo ranks.

Fork where it is safe: the children need not re-import torch, which costs seconds each on a
shared 2-core machine. Spawn where CUDA is available: there the first backward of a process,
even on the CPU, starts autograd's device threads, and a forked child of such a process
fails its own first backward ("Unable to handle autograd's threading in combination with
fork-based multiprocessing"; seen on an H100 machine, where an earlier test in the same
pytest worker had trained). The service itself always spawns (services/worker/distributed.py).
"""

from __future__ import annotations

import torch


def start_method() -> str:
    return "spawn" if torch.cuda.is_available() else "fork"
