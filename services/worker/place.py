"""Where one rank of an attempt trains: ``Place`` (its global and local rank, the world size,
its device, and the rendezvous endpoint of its process group).

A leaf of the worker, like ``attempt``: the launcher (``services.worker.launch``) makes the
places, ``services.worker.rank.run_attempt`` trains at one. A single-process job is rank 0 of a
world of 1, with no process group; k ranks on this node are ranks ``offset`` ...
``offset + k - 1`` of the world, and ranks on several nodes differ only in the offset, the
world size and the master address the launcher is given.
"""

from __future__ import annotations

from dataclasses import dataclass, field

LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class Place:
    """One rank's place in its attempt's world."""

    rank: int = 0  # global rank: 0 writes metrics, progress and checkpoints
    local_rank: int = 0  # its index on this node: the GPU it uses
    world: int = 1  # ranks taking part in each optimizer step, over every node
    device: str | None = None  # None: the build picks (``build.pick_device``)
    master_addr: str = LOOPBACK  # the process group's rendezvous (rank 0's node)
    master_port: int | None = None  # None: no process group (a world of 1)
    # What a rank presents to join the rendezvous (``services.worker.rendezvous``): never shown.
    master_secret: str = field(default="", repr=False)

    @property
    def writes(self) -> bool:
        """The one rank that records the attempt (the metrics are all-reduced: the same on
        every rank)."""
        return self.rank == 0

    @property
    def grouped(self) -> bool:
        """Whether this rank joins a process group (k > 1 ranks)."""
        return self.world > 1
