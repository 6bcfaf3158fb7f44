"""A multi-node job's ranks on this node: ``spawn_node_ranks`` (called by
``services.worker.launch``). This node's ``gpus`` ranks (one process when ``gpus`` is 0 or 1)
are global ranks ``node_rank * gpus + r`` of a world of ``nnodes * gpus``; their process group
meets at node 0's rendezvous (the TCPStore node 0's worker serves; every rank is its client).
A peer that dies or hangs ends the attempt on every node: its collective fails, or times out after
``ACCUM_COLLECTIVE_TIMEOUT_S``; that is ``NodeLost`` (told by the error's type, not its words:
``services.worker.peer_loss``), and the job resumes from its last checkpoint on the nodes that
can take it, a restart counted against ``max_restarts``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from services.settings import Settings
from services.spec import JobSpec
from services.spec.world import ranks_per_node, world_of
from services.worker.attempt import Attempt, Outcome
from services.worker.distributed import spawn_ranks
from services.worker.gang import GangPlace


def spawn_node_ranks(settings: Settings, spec: JobSpec, attempt: Attempt, flags: Any,
                     checkpoint: Path | None, gang: GangPlace) -> Outcome:
    """Run this node's ranks of the gang's world; raises ``NodeLost`` when a peer was lost (a
    rank died of its process group failing, or was killed: ``services.worker.peer_loss``)."""
    here = ranks_per_node(spec.gpus)
    return spawn_ranks(settings, spec, attempt, flags, checkpoint, rank_offset=gang.node_rank * here,
                       world=world_of(spec.gpus, gang.nnodes), master=(gang.master_addr, gang.master_port, gang.master_secret))
