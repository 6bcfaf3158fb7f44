"""A process group of one rank, for a world of 1 whose strategy needs one: ``strategy: "fsdp"``
with ``gpus: 1`` and ``fsdp.cpu_offload`` (the Gemini pattern on one GPU: the parameter,
gradient and optimizer-state shards live in host memory and stream to the GPU block by block).

FSDP2's ``fully_shard`` works on a device mesh, which needs a process group; a single-process
job runs in the worker's own process, so the group is made here around the attempt, on an
in-memory store (no port, no rendezvous), and destroyed after it whatever happened, so the
worker's next job starts with none. Imported lazily by ``services.worker.launch``:
torch.distributed stays out of a prefork worker's parent.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch.distributed as dist


@contextlib.contextmanager
def single_rank_group(device: str | None) -> Iterator[None]:
    """Rank 0 of a world of 1 for the duration of the block (NCCL on a GPU, else gloo)."""
    if dist.is_initialized():  # an earlier attempt of this process did not tear down
        dist.destroy_process_group()
    backend = "nccl" if device is not None and device.startswith("cuda") else "gloo"
    dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()
