"""Start an attempt's ranks and tell how it ended: ``launch``.

    outcome = launch(settings, spec, attempt, heartbeat)          # what ``runner.train`` calls
    outcome = launch(settings, spec, attempt, flags, gang_place)  # a node of a multi-node job

The node is made ready first (``resume.prepare_resume``: stale metrics and orphan objects
removed, the checkpoint fetched into this node's cache; on a node other than 0 of a gang only
the fetch, node 0 prepares the store). Then a world of 1 runs ``rank.run_attempt`` here, in the
worker's process, with the heartbeat, in a thread that this one watches (``pulse.run_here``: a
rank that stops beating is ended as hung, as a spawned one is); ``gpus: k`` spawns k ranks that
run it in a process group and watches them (``services.worker.distributed``); a ``nodes: n``
job spawns ``gpus`` ranks (at least one process) on each node, global ranks
``node_rank * gpus + r`` of ``nnodes * gpus``, at node 0's rendezvous (``services.worker.gang``).
"""

from __future__ import annotations

import contextlib
from typing import Any

from services.jobdb.sessions import session_factory
from services.settings import Settings
from services.spec import JobSpec
from services.worker.attempt import Attempt, Outcome, outcome
from services.worker.build import pick_device
from services.worker.checkpoints.resume import fetch_resume_checkpoint, prepare_resume
from services.worker.checkpoints.stores import artifact_store, node_cache
from services.worker.gang import GangPlace
from services.worker.heartbeat import Heartbeat
from services.worker.place import Place
from services.worker.pulse import RankLink, run_here
from services.worker.rank import run_attempt
from services.worker.strategy import sharded


def launch(settings: Settings, spec: JobSpec, attempt: Attempt, heartbeat: Heartbeat | Any,
           gang: GangPlace | None = None) -> Outcome:
    """Train the attempt on this node; returns ``SUCCEEDED``, ``CANCELLED``, ``HANDED_BACK``
    (the worker is shutting down), ``TIMED_OUT`` (the last three checkpointed where they
    stopped) or ``LEASE_LOST``. A gang's node raises ``NodeLost`` when it loses its peers."""
    stores = session_factory(settings), attempt, artifact_store(settings), node_cache(settings)
    follower = gang is not None and gang.node_rank > 0
    checkpoint = fetch_resume_checkpoint(*stores) if follower else prepare_resume(*stores)
    if gang is not None:
        from services.worker.gang_ranks import spawn_node_ranks  # lazy: see below

        return spawn_node_ranks(settings, spec, attempt, heartbeat, checkpoint, gang)
    if spec.gpus > 1:
        # Lazy: torch.distributed must stay out of a prefork worker's parent (the runner is
        # preloaded there); with it imported, the forked child hung before its first job on
        # Redis (tests/integration/test_worker_prefork.py).
        from services.worker.distributed import spawn_ranks

        return spawn_ranks(settings, spec, attempt, heartbeat, checkpoint)
    place = Place(device=pick_device(spec))

    def rank_0(link: RankLink) -> bool:  # in a thread of its own, watched from this one
        with group_of_one(spec, place):
            return run_attempt(place, settings, spec, attempt, checkpoint=checkpoint, heartbeat=heartbeat,
                               stop=link)

    return outcome(run_here(rank_0, settings, spec), heartbeat)


def group_of_one(spec: JobSpec, place: Place) -> contextlib.AbstractContextManager[None]:
    """A process group of one rank where the strategy shards a world of 1 (fsdp with
    cpu_offload on one GPU), else nothing."""
    if not sharded(spec):
        return contextlib.nullcontext()
    from services.worker.single_group import single_rank_group  # lazy: see spawn_ranks above

    return single_rank_group(place.device)
