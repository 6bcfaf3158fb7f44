"""Submit checks against the fleet: can a registered worker run this spec at all?

    refusals = fleet_refusals(session, spec, settings)   # the API turns each into a 422 item

A spec is refused when its queue has had no registered worker within ``ACCUM_QUEUE_GRACE_S``
(unless ``ACCUM_ALLOW_EMPTY_QUEUES``: an autoscaled fleet starts workers for queued jobs),
when it asks for more ranks (``gpus``) than any worker of its queue offers (GPUs, or CPU
ranks of ``--cpu-ranks``), or names a model or dataset none of them advertises. With no
worker registered in that time at all (a fresh deployment whose workers are not up yet, an
API tested alone), nothing is checked: there is no fleet to check against, and refusing every
submit would be worse than a job that waits.

One rule from the first second: a ``gpus: k`` job trains only on a worker that registered k
ranks. The API applies it at submit against the registered fleet; the worker that takes a job
applies it again against its own ranks (a job accepted before any worker registered fails
there, naming ``--cpu-ranks``, unless a worker of its queue registered enough: then it waits
for that one), and ``accum up`` answers only once its worker is registered.

Torch-free: the API imports it. The answers come from the workers' own registry rows
(``services.jobdb.workers``), so a queue, a GPU count or a model name is what the fleet
says it has, not what a configuration file claims.
"""

from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.orm import Session

from services.jobdb.types import utcnow
from services.jobdb.workers import QueueOffer, queue_offers
from services.spec import JobSpec
from services.spec.refusal import Refusal
from services.spec.world import enough_ranks

# How long the API keeps what the fleet offers before reading it again. A fresh read on every
# submit cost 2.0 ms of CPU with no worker registered and 6.0 ms with 64 (a query and every
# worker's model and dataset lists; PostgreSQL, 2-core machine): as much as the rest of
# POST /v1/jobs. Kept, the check costs 0.04-0.06 ms, 0.009 of a fresh read at 64 workers
# (bench/service/fleet_check.py, docs/benchmarks.md). A worker that just registered is seen
# by submits this much later at most.
FLEET_REFRESH_S = 2.0


def _period(seconds: float) -> str:
    hours = seconds / 3600
    return f"{hours:g} h" if hours >= 1 else f"{seconds:g} s"


class FleetView:
    """What each queue's workers offer, read from the registry at most every ``refresh_s``
    (one per API app; its route threads share it)."""

    def __init__(self, refresh_s: float = FLEET_REFRESH_S) -> None:
        self.refresh_s = refresh_s
        self._lock = threading.Lock()
        self._read_at = -float("inf")
        self._offers: dict[str, QueueOffer] = {}

    def offers(self, session: Session, grace_s: float, now: datetime | None = None) -> dict[str, QueueOffer]:
        with self._lock:
            if time.monotonic() - self._read_at >= self.refresh_s or now is not None:
                self._offers = queue_offers(session, (now or utcnow()) - timedelta(seconds=grace_s))
                self._read_at = time.monotonic()
            return self._offers


def offered_as(field: str, name: str) -> str:
    """The name a worker advertises for ``name``: a `timm:` or `hf:` model is offered as its
    namespace's pattern (services.worker.registry, NAMESPACE_PATTERNS), anything else as itself."""
    if field == "model":
        namespace, sep, rest = name.partition(":")
        if sep and namespace == "timm":
            return "timm:<name>"
        if sep and namespace == "hf":
            return "hf:<directory>" if rest.startswith("/") else "hf:<model_type>"
    return name


def too_few_ranks(gpus: int, queue: str, offer: QueueOffer | None, *, here: str = "",
                  offered: int = 0, then: str = "") -> str:
    """The one message for a ``gpus: k`` job that no worker can give k ranks (the rule:
    ``services.spec.world.enough_ranks``), at submit, at claim and at the start: what it needs,
    ``here`` (what the worker that took it has: ``offered`` ranks), what the queue's live
    workers offer, and the
    fixes, then ``then``. It counts the live workers only: a stopped one (a worker of an earlier
    `accum up`) is no help now, though one that may come back still lets a job in and wait."""
    live = offer.live if offer is not None else 0
    ranks = offer.live_ranks if offer is not None else 0
    has = (f"{live} live worker{'s' if live != 1 else ''}, with at most "
           f"{ranks} ranks{' (one process a job)' if not ranks else ''}"
           if live else "no live worker" if offer is not None else "no live worker with more")
    stopped = offer.workers - offer.live if offer is not None else 0
    return (
        f"gpus {gpus} needs a worker with {gpus} ranks (GPUs, or CPU ranks); {here}queue {queue!r} "
        f"has {has}{f', {stopped} stopped not counted' if stopped else ''}. Ask for gpus "
        f"{max(ranks, offered, 1)} or less, or start a worker with {gpus} GPUs or `--cpu-ranks {gpus}` "
        f"(`accum worker` or `accum up`){then}"
    )


def ranks_refusal(gpus: int, queue: str, offer: QueueOffer) -> Refusal | None:
    """``gpus: k`` asks for k ranks on one worker: GPUs, or the CPU ranks of a worker started
    with ``--cpu-ranks``. Any worker trains a ``gpus: 1`` job in one process (on its CPU when it
    has no GPU: the spec's documented fallback); none trains a DDP job on ranks it did not
    register. The worker that takes a job applies the same rule (``enough_ranks``) and message."""
    if enough_ranks(gpus, offer.max_ranks):
        return None
    most = max(offer.max_ranks, 1)
    return Refusal(("gpus",), too_few_ranks(gpus, queue, offer), gpus, list(range(most + 1)))


def fleet_refusals(
    session: Session, spec: JobSpec, settings: Any, now: datetime | None = None,
    view: FleetView | None = None,
) -> list[Refusal]:
    """What about ``spec`` no worker of its queue (seen within the grace period) can do;
    ``view`` keeps the fleet's offers between calls (a fresh read without it)."""
    grace_s = float(settings.queue_grace_s)
    offers = (view or FleetView(refresh_s=0)).offers(session, grace_s, now)
    if not offers:
        return []  # no registered worker at all in the grace period: no fleet to check
    queue = spec.queue
    offer = offers.get(queue)
    if offer is None:
        if settings.allow_empty_queues:
            return []
        served = sorted(offers)
        return [Refusal(
            ("queue",),
            f"no worker has served queue {queue!r} in the last {_period(grace_s)}; queues with "
            f"workers: {', '.join(served)}. Start one with `accum worker --queues {queue}`, or "
            "set ACCUM_ALLOW_EMPTY_QUEUES=1 where an autoscaler starts workers for queued jobs",
            queue, served,
        )]
    refusals = []
    gpus = ranks_refusal(spec.gpus, queue, offer)
    if gpus is not None:
        refusals.append(gpus)
    for field, name, known in (
        ("model", spec.model.name, offer.models),
        ("dataset", spec.dataset.name, offer.datasets),
    ):
        if offered_as(field, name) not in known | offer.plugins:
            refusals.append(Refusal(
                (field,),
                f"no worker of queue {queue!r} can build {field} {name!r} (upgrade its workers, "
                "or install the plugin there); they offer the names in `allowed`",
                name, sorted(known | offer.plugins),
            ))
    return refusals
