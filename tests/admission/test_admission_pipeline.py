"""services/admission: the ordered checks a spec passes at submit and again at a job's start.

What the API answers for each refusal (status, `body.<field>`, message, `allowed`) is pinned by
tests/api and tests/reliability; these pin the pipeline itself: the order of the checks in each
phase, the first refusing check deciding alone (with all of its refusals), the defaults an
admitted spec carries, and the errors a worker fails a stored job with. Real settings, a real
database on both backends for the checks that read it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from job_specs import MINIMAL_SPEC
from sqlalchemy.orm import Session, sessionmaker

from services.admission import checks
from services.admission.context import Admission, Phase
from services.admission.pipeline import (
    CHECKS,
    SUBMIT,
    Check,
    Refused,
    first_refusal,
    preflight,
    submit,
)
from services.data_roots import DataRootNotAllowed
from services.fleet import FleetView
from services.jobdb import jobs, tokens
from services.jobdb.models import Owner
from services.settings import Settings
from services.spec import JobSpec, parse_spec
from services.spec.refusal import Refusal


def spec_of(**changes: Any) -> JobSpec:
    return parse_spec({**MINIMAL_SPEC, **changes})


@pytest.fixture
def roots(tmp_path: Path) -> Path:
    allowed = tmp_path / "allowed"
    (allowed / "digits").mkdir(parents=True)
    (tmp_path / "outside").mkdir()
    return allowed


@pytest.fixture
def settings(store_settings: Settings, roots: Path) -> Settings:
    return store_settings.model_copy(update={"data_roots": [roots], "max_restarts": 3, "max_gpus": 2})


def owner_named(session_factory: sessionmaker[Session], name: str, admin: bool = False) -> Owner:
    with session_factory.begin() as session:
        owner, _ = tokens.create_owner_with_token(session, name, admin=admin)
        session.expunge(owner)
    return owner


def at_submit(spec: JobSpec, settings: Settings, owner: Owner, session: Session) -> JobSpec:
    return submit(Admission(spec, settings, Phase.SUBMIT, owner=owner, session=session,
                            fleet=FleetView(refresh_s=0)))


def refusals_at_submit(spec: JobSpec, settings: Settings, owner: Owner, session: Session) -> list[Refusal]:
    with pytest.raises(Refused) as refused:
        at_submit(spec, settings, owner, session)
    return refused.value.refusals


def test_each_phase_runs_its_checks_in_the_documented_order() -> None:
    def names(phase: Phase) -> list[str]:
        return [check.run.__name__ for check in CHECKS if phase in check.phases]

    assert names(Phase.SUBMIT) == ["data_roots", "init_from_job", "service_limits", "fleet", "nodes",
                                   "cuda_optimizer", "priority"]
    assert names(Phase.START) == ["data_roots", "worker_ranks"]


def test_the_first_refusing_check_decides_with_all_of_its_refusals(
    session_factory: sessionmaker[Session], settings: Settings, roots: Path,
) -> None:
    """A spec wrong three ways hears of its path first, then of every limit it exceeds at
    once, then of its priority; fixed, it is admitted with the service's timeout."""
    owner = owner_named(session_factory, "alice")
    outside = str(roots.parent / "outside")
    wrong = {"dataset": {"name": "digits", "data_root": outside}, "max_restarts": 5, "gpus": 3,
             "priority": "high"}
    with session_factory() as session:
        first = refusals_at_submit(spec_of(**wrong), settings, owner, session)
        assert [(r.field, r.value, r.allowed) for r in first] == [(("dataset", "data_root"), outside, None)]
        assert str(roots) not in first[0].message  # not an admin: the servers' paths stay unnamed

        inside = {**wrong, "dataset": {"name": "digits", "data_root": str(roots / "digits")}}
        limits = refusals_at_submit(spec_of(**inside), settings, owner, session)
        assert [(r.field, r.kind) for r in limits] == [(("max_restarts",), "limit"), (("gpus",), "limit")]

        within = {**inside, "max_restarts": 3, "gpus": 2}
        (priority,) = refusals_at_submit(spec_of(**within), settings, owner, session)
        assert priority.field == ("priority",) and priority.allowed == ["low", "normal"]

        admitted = at_submit(spec_of(**{**within, "priority": "low"}), settings, owner, session)
    assert admitted.timeout is not None and int(admitted.timeout) == settings.max_job_seconds


def test_an_admin_is_told_the_data_roots(
    session_factory: sessionmaker[Session], settings: Settings, roots: Path,
) -> None:
    admin = owner_named(session_factory, "root", admin=True)
    with session_factory() as session:
        (refusal,) = refusals_at_submit(spec_of(init_from={"uri": "/etc/passwd"}),
                                        settings, admin, session)
    assert refusal.field == ("init_from", "uri") and refusal.allowed == [str(roots)]
    assert str(roots) in refusal.message


def test_init_from_resolves_a_prefix_of_the_owners_job_and_hides_anyone_elses(
    session_factory: sessionmaker[Session], settings: Settings,
) -> None:
    alice, bob = owner_named(session_factory, "alice"), owner_named(session_factory, "bob")
    with session_factory.begin() as session:
        alices, _ = jobs.create_job(session, owner=alice, spec=dict(MINIMAL_SPEC))
        job_id = alices.id
    prefix = job_id[:12]
    with session_factory() as session:
        admitted = at_submit(spec_of(init_from={"job": prefix}), settings, alice, session)
        assert admitted.init_from is not None and admitted.init_from.job == job_id
        (as_bob,) = refusals_at_submit(spec_of(init_from={"job": prefix}), settings, bob, session)
        (unknown,) = refusals_at_submit(spec_of(init_from={"job": "zzzz" + prefix[4:]}), settings, bob,
                                        session)
    assert as_bob.field == ("init_from", "job") and "no job" in as_bob.message
    assert as_bob.message.replace(prefix, "?") == unknown.message.replace("zzzz" + prefix[4:], "?")


def start(spec: JobSpec, settings: Settings, ranks: Callable[[], int] | None = None) -> None:
    preflight(Admission(spec, settings, Phase.START, job_id="job-under-test", ranks=ranks))


@pytest.fixture
def worker_settings(tmp_path: Path, roots: Path) -> Settings:
    return Settings(home=tmp_path / "home", data_roots=[roots])


class Ranks:
    """A worker's ranks, counting how often a check read them (an NVML read on a worker)."""

    def __init__(self, ranks: int) -> None:
        self.ranks, self.reads = ranks, 0

    def __call__(self) -> int:
        self.reads += 1
        return self.ranks


def test_adamw8bit_is_refused_at_submit_for_a_cpu_job_at_optimizer_name(
    session_factory: sessionmaker[Session], settings: Settings,
) -> None:
    owner = owner_named(session_factory, "alice")
    adamw8bit = {"name": "adamw8bit", "lr": 1e-3}
    with session_factory() as session:
        [refusal] = refusals_at_submit(spec_of(gpus=0, optimizer=adamw8bit), settings, owner, session)
        assert (refusal.field, refusal.allowed) == (("optimizer", "name"), ["sgd", "adamw"])
        assert "CUDA GPUs only" in refusal.message and "gpus 0" in refusal.message
        assert at_submit(spec_of(gpus=1, optimizer=adamw8bit), settings, owner, session).optimizer.betas == (0.9, 0.999)


def test_the_worker_fails_a_stored_path_outside_the_roots_before_it_counts_ranks(
    worker_settings: Settings, roots: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    """The owner's reason names no root; the worker's log (its operator's) names them."""
    ranks = Ranks(8)
    outside = str(roots.parent / "outside")
    with caplog.at_level(logging.WARNING), pytest.raises(DataRootNotAllowed) as refused:
        start(spec_of(dataset={"name": "digits", "data_root": outside}, gpus=4), worker_settings, ranks)
    assert "outside the allowed data roots" in str(refused.value) and str(roots) not in str(refused.value)
    assert str(roots) in caplog.text
    assert ranks.reads == 0  # the first check refused: the ranks were never read


def test_the_worker_refuses_more_ranks_than_it_offers_and_reads_them_for_ddp_jobs_only(
    worker_settings: Settings,
) -> None:
    one_rank = Ranks(1)
    start(spec_of(gpus=1), worker_settings, one_rank)
    assert one_rank.reads == 0
    with pytest.raises(ValueError, match=r"gpus 2 needs a worker with 2 ranks .* has 1 CPU rank") as refused:
        start(spec_of(gpus=2), worker_settings, one_rank)
    assert type(refused.value) is ValueError and "job-under-test" in str(refused.value)
    start(spec_of(gpus=2), worker_settings, Ranks(2))


def test_a_new_check_is_one_function_and_one_entry(worker_settings: Settings) -> None:
    """What the next engineer writes (a `strategy` or `nodes` check): the function, and its
    entry at its place in the order; a check of the other phase never runs."""
    settings = worker_settings

    def no_lbfgs(ctx: Admission) -> list[Refusal]:
        name = ctx.spec.optimizer.name
        return [Refusal(("optimizer", "name"), "not here", name, ["sgd"])] if name != "sgd" else []

    listed = (*CHECKS, Check(no_lbfgs, SUBMIT))
    ctx = Admission(spec_of(optimizer={"name": "adamw", "lr": 0.1}), settings, Phase.START,
                    job_id="j", ranks=lambda: 1)
    assert first_refusal(ctx, listed) is None
    submitted = Admission(ctx.spec, settings, Phase.SUBMIT, owner=Owner(id=1, name="a", is_admin=True))
    # data_roots, init_from_job, service_limits pass without a session; fleet needs one:
    found = first_refusal(submitted, [c for c in listed if c.run is not checks.fleet])
    assert found is not None
    check, (refusal,) = found
    assert check.run is no_lbfgs and refusal.as_error() == {
        "type": "not_allowed", "loc": ("body", "optimizer", "name"), "msg": "not here",
        "input": "adamw", "ctx": {"allowed": ["sgd"]},
    }


def test_a_check_missing_what_it_reads_says_what_to_pass(tmp_path: Path) -> None:
    ctx = Admission(spec_of(priority="high"), Settings(home=tmp_path), Phase.SUBMIT)
    with pytest.raises(TypeError, match="needs the owner; pass it to Admission"):
        checks.priority(ctx)
