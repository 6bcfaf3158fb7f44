"""Admission in one ordered list: every check a spec passes before a job is stored or trained.

    spec = submit(Admission(spec, settings, Phase.SUBMIT, owner=owner, session=session,
                            fleet=fleet))                      # the API; raises Refused
    preflight(Admission(spec, settings, Phase.START, job_id=job_id, ranks=ranks))  # the worker

The spec's own validators (``JobSpec``: types, ranges, closed sets, the catalog's names and
options) run first, when the body is parsed (FastAPI at submit, ``parse_spec`` at a job's
start). Then CHECKS, in order: the first check that refuses decides the answer, with all of its
refusals (the API: one 422, each at ``body.<field>``; the worker: the job fails with them), so
a spec is never told about its fleet before its paths. The per-owner cap on unfinished jobs
is no check here: it is counted again after the job's insert, under a lock
(services/jobdb/quotas.py), which is what makes it exact under concurrent submits, and it is a
429, not a field's refusal.

Adding a check: one function ``check(ctx) -> list[Refusal]`` in checks.py and one entry below,
at its place in the order, with the phases it runs in.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from services.admission import checks
from services.admission.context import Admission, Phase
from services.data_roots import DataRootNotAllowed
from services.spec import JobSpec
from services.spec.limits import SpecLimits, with_defaults
from services.spec.refusal import Refusal

SUBMIT = frozenset({Phase.SUBMIT})
BOTH = frozenset({Phase.SUBMIT, Phase.START})
START = frozenset({Phase.START})


@dataclass(frozen=True)
class Check:
    """One step of admission: the function, the phases it runs in, and the exception a worker
    fails a stored job with when it refuses (its type is the job's `error.type`)."""

    run: Callable[[Admission], list[Refusal]]
    phases: frozenset[Phase]
    fails_as: type[ValueError] = ValueError


CHECKS: tuple[Check, ...] = (
    Check(checks.data_roots, BOTH, fails_as=DataRootNotAllowed),
    Check(checks.init_from_job, SUBMIT),
    Check(checks.service_limits, SUBMIT),
    Check(checks.fleet, SUBMIT),
    Check(checks.nodes, SUBMIT),
    Check(checks.cuda_optimizer, SUBMIT),
    Check(checks.worker_ranks, START),
    Check(checks.priority, SUBMIT),
)


class Refused(ValueError):
    """A spec refused at submit: the refusals of the first check that refused it."""

    def __init__(self, refusals: list[Refusal]) -> None:
        self.refusals = refusals
        super().__init__("; ".join(refusal.message for refusal in refusals))


def first_refusal(ctx: Admission, checks: Sequence[Check] = CHECKS) -> tuple[Check, list[Refusal]] | None:
    """The first of ``checks`` of ``ctx.phase`` that refuses the spec, with its refusals; None
    when every one admits it."""
    for check in checks:
        if ctx.phase in check.phases and (refusals := check.run(ctx)):
            return check, refusals
    return None


def submit(ctx: Admission) -> JobSpec:
    """The spec admitted at submit, with this service's defaults filled in (a `timeout` of
    ACCUM_MAX_JOB_SECONDS, `checkpoint_every` raised to ACCUM_MIN_CHECKPOINT_EVERY); raises
    Refused."""
    if (refused := first_refusal(ctx)) is not None:
        raise Refused(refused[1])
    return with_defaults(ctx.spec, SpecLimits.from_settings(ctx.settings))


def preflight(ctx: Admission) -> None:
    """The worker's checks before it reads data or builds anything; raises the refusing
    check's ``fails_as`` with the reasons, which the job's owner may read."""
    if (refused := first_refusal(ctx)) is not None:
        check, refusals = refused
        raise check.fails_as("; ".join(refusal.message for refusal in refusals))
