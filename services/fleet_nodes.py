"""Submit check for multi-node jobs: a ``nodes: n`` job needs ``min_nodes`` workers of its
queue that each offer its ``gpus`` ranks.

    refusals = nodes_refusals(session, spec, settings, view)   # beside services.fleet's

The gang waits for n such workers free together (``services.jobdb.gangs``) and may start on
``min_nodes`` of them; a queue with fewer could never start it, so it is refused at submit with
the count it has. As in ``services.fleet``: nothing is checked without a registered fleet, and
a queue without workers is that module's refusal. Torch-free (the API imports it).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from services.fleet import FleetView, Refusal
from services.spec import JobSpec
from services.spec.world import enough_ranks


def nodes_refusals(
    session: Session, spec: JobSpec, settings: Any, view: FleetView | None = None,
    now: datetime | None = None,
) -> list[Refusal]:
    """A refusal at ``nodes`` (or ``min_nodes``) when fewer than ``min_nodes`` workers of the
    queue offer ``gpus`` ranks each (any worker runs a one-process node: ``gpus`` 0 or 1)."""
    if spec.nodes == 1:
        return []
    offers = (view or FleetView(refresh_s=0)).offers(session, float(settings.queue_grace_s), now)
    offer = offers.get(spec.queue)
    if offer is None:
        return []
    need = spec.min_nodes or spec.nodes
    fit = sum(1 for ranks in offer.ranks if enough_ranks(spec.gpus, ranks))
    if fit >= need:
        return []
    field, value = ("min_nodes", need) if need != spec.nodes else ("nodes", spec.nodes)
    each = f" with {spec.gpus} ranks each (GPUs, or `--cpu-ranks {spec.gpus}`)" if spec.gpus > 1 else ""
    return [Refusal(
        (field,),
        f"nodes {spec.nodes} (min_nodes {need}) needs {need} workers of queue {spec.queue!r}"
        f"{each}; it has {fit} (of {offer.workers} seen within ACCUM_QUEUE_GRACE_S). Start more "
        f"with `accum worker --queues {spec.queue}` on other nodes, or ask for at most {fit}",
        value, list(range(1, fit + 1)),
    )]
