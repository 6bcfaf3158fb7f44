"""The admission checks, one function each: ``check(ctx) -> list[Refusal]`` ([] admits).

Each reads what it needs from the context (services/admission/context.py) and answers every
refusal of its own at once (all the service limits a spec exceeds, not the first); the
pipeline's CHECKS list (pipeline.py) says in which order and phase each runs. A check that needs
the database or the fleet runs at submit; one the worker must apply again to a stored job
runs at its start too.
"""

from __future__ import annotations

from services.admission.context import Admission, Phase
from services.data_roots import data_root_refusal, reader_roots, worker_refusal
from services.fleet import fleet_refusals, too_few_ranks
from services.fleet_nodes import nodes_refusals
from services.jobdb.job_ids import AmbiguousJobId, find_job
from services.jobdb.status import resume_hint
from services.spec.limits import SpecLimits, limit_refusals
from services.spec.priority import ADMIN_ONLY, DEFAULT_PRIORITY, OWNERS_MAY_CHOOSE
from services.spec.refusal import Refusal
from services.spec.world import enough_ranks


def data_roots(ctx: Admission) -> list[Refusal]:
    """The first local path the spec reads (`dataset.data_root`, an `hf:/dir` model, `model.weights`,
    `init_from.uri`) outside the roots of ACCUM_DATA_ROOTS its owner may read; another owner's
    path gets the message a missing one would. The roots are the servers' paths: only an admin
    is told them at submit (in the message and `allowed`); a worker names them in its log only."""
    paths = ctx.spec.local_paths()
    if not paths:
        return []
    roots = reader_roots(ctx.settings, ctx.reader())
    admin = ctx.phase is Phase.SUBMIT and ctx.needs(ctx.owner, "the owner").is_admin
    for where, path in paths:
        if ctx.phase is Phase.START:
            reason = worker_refusal(path, roots)
        else:
            reason = data_root_refusal(path, roots, show_roots=admin)
        if reason is not None:
            return [Refusal(where, reason, path, [str(r) for r in roots.readable()] if admin else None)]
    return []


def init_from_job(ctx: Admission) -> list[Refusal]:
    """`init_from.job` must be one of the owner's jobs (an id or a unique prefix, resolved here
    to the full id the worker loads by); another owner's job gets the same answer as a job
    that does not exist, so nothing about it leaks."""
    ref = ctx.spec.init_from
    if ref is None or ref.job is None:
        return []
    field = ("init_from", "job")
    try:
        job = find_job(ctx.needs(ctx.session, "a session"), ref.job, ctx.needs(ctx.owner, "the owner"),
                       anyones=False)
    except AmbiguousJobId as exc:
        return [Refusal(field, str(exc), ref.job, exc.candidates)]
    if job is None:
        return [Refusal(
            field,
            f"no job {ref.job[:100]!r} of yours to start from; init_from.job takes the id of one "
            "of your jobs, or a unique prefix of it (GET /v1/jobs lists them)",
            ref.job,
        )]
    ref.job = job.id
    return []


def service_limits(ctx: Admission) -> list[Refusal]:
    """This deployment's maxima and minima and the run-length and memory bounds
    (services/spec/limits.py)."""
    return limit_refusals(ctx.spec, SpecLimits.from_settings(ctx.settings))


def fleet(ctx: Admission) -> list[Refusal]:
    """What no registered worker of the spec's queue can do (services/fleet.py): an unknown
    queue (with the queues that exist), more ranks than its workers have, a model or dataset
    they do not offer."""
    return fleet_refusals(ctx.needs(ctx.session, "a session"), ctx.spec, ctx.settings,
                          view=ctx.needs(ctx.fleet, "the fleet view"))


def nodes(ctx: Admission) -> list[Refusal]:
    """A ``nodes: n`` job needs ``min_nodes`` workers of its queue offering ``gpus`` ranks each
    (services/fleet_nodes.py); a one-node job reads nothing."""
    if ctx.spec.nodes == 1:
        return []
    return nodes_refusals(ctx.needs(ctx.session, "a session"), ctx.spec, ctx.settings,
                          ctx.needs(ctx.fleet, "the fleet view"))


def worker_ranks(ctx: Admission) -> list[Refusal]:
    """A ``gpus: k`` job trains on k ranks of one worker, never fewer: the worker that took it
    applies the fleet check's rule to its own ranks (GPUs, else ``--cpu-ranks``)."""
    gpus = ctx.spec.gpus
    if enough_ranks(gpus, 0):
        return []  # any worker trains it in one process: no NVML read
    ranks = ctx.needs(ctx.ranks, "the worker's ranks")()
    if enough_ranks(gpus, ranks):
        return []
    has = f"{ranks} CPU rank{'s' if ranks != 1 else ''} (--cpu-ranks)" if ranks else "no GPU and no --cpu-ranks"
    message = too_few_ranks(gpus, ctx.spec.queue, None, here=f"the worker that took it has {has}; ", offered=ranks,
                            then=f", then {resume_hint(ctx.needs(ctx.job_id, 'the job id'))}")
    return [Refusal(("gpus",), message, gpus)]


def priority(ctx: Admission) -> list[Refusal]:
    """Owners may lower their jobs' priority; raising one above normal is for admins."""
    if ctx.spec.priority not in ADMIN_ONLY or ctx.needs(ctx.owner, "the owner").is_admin:
        return []
    lower = " or ".join(f'"{name}"' for name in reversed(OWNERS_MAY_CHOOSE))
    return [Refusal(
        ("priority",),
        f'priority "{ctx.spec.priority}" is for admins (it goes before everyone\'s '
        f"{DEFAULT_PRIORITY} jobs); use {lower}, "
        "or ask an admin to submit it",
        ctx.spec.priority, list(OWNERS_MAY_CHOOSE),
    )]


def cuda_optimizer(ctx: Admission) -> list[Refusal]:
    """``optimizer: adamw8bit`` (bitsandbytes' 8-bit states) runs on CUDA only: refused for a
    CPU job (``gpus: 0``) and, at submit, for a queue whose registered workers have no GPU."""
    spec = ctx.spec
    if spec.optimizer.name != "adamw8bit":
        return []
    where = None
    if spec.gpus == 0:
        where = "this job trains on the CPU (gpus 0)"
    elif ctx.fleet is not None and ctx.session is not None:
        offer = ctx.fleet.offers(ctx.session, float(ctx.settings.queue_grace_s)).get(spec.queue)
        if offer is not None and offer.max_gpus == 0:
            where = f"the workers of queue {spec.queue!r} have no GPU (a CPU queue)"
    if where is None:
        return []
    return [Refusal(
        ("optimizer", "name"),
        f"optimizer adamw8bit keeps AdamW's states in 8 bits with bitsandbytes, which runs on "
        f"CUDA GPUs only, and {where}: use adamw here, or set gpus >= 1 on a queue with GPU workers",
        "adamw8bit", ["sgd", "adamw"],
    )]
