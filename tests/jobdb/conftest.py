"""Helpers for the store tests: an owner with a token, and jobs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from job_specs import MINIMAL_SPEC
from sqlalchemy.orm import Session, sessionmaker

from services.jobdb import jobs, tokens
from services.jobdb.models import Job, Owner


@pytest.fixture
def owner(session_factory: sessionmaker[Session]) -> Owner:
    with session_factory.begin() as session:
        owner, _ = tokens.create_owner_with_token(session, "alice")
    return owner


@pytest.fixture
def make_job(session_factory: sessionmaker[Session], owner: Owner) -> Callable[..., Job]:
    """``make_job(**create_job_kwargs)`` creates and commits one queued job of ``owner``."""

    def make(**kwargs: Any) -> Job:
        spec = dict(MINIMAL_SPEC, seed=kwargs.pop("seed", 0))
        with session_factory.begin() as session:
            job, created = jobs.create_job(
                session, owner=kwargs.pop("owner", owner), spec=spec, **kwargs
            )
        assert created
        return job

    return make


@pytest.fixture
def spec() -> dict[str, Any]:
    """A fresh copy of the minimal valid spec from issue 3."""
    return dict(MINIMAL_SPEC, optimizer=dict(MINIMAL_SPEC["optimizer"]))
