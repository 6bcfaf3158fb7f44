"""In-process fixtures for the worker's and dispatch's unit tests: a migrated SQLite store
under a fresh ACCUM_HOME (``settings``) and queued jobs in it (``make_job``). Their folders'
conftest.py files import them."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from job_specs import TINY_SPEC

from services.dispatch.enqueue import reset_enqueue_cache
from services.jobdb import jobs, tokens
from services.jobdb.migrate import upgrade
from services.jobdb.sessions import session_factory
from services.settings import Settings


@pytest.fixture
def settings(tmp_path: Path) -> Iterator[Settings]:
    """A worker without GPUs that offers 2 CPU ranks (``accum worker --cpu-ranks 2``): the
    ``gpus: 2`` tests run their ranks on it with gloo."""
    settings = Settings(home=tmp_path / "home", lease_timeout_s=2, heartbeat_interval_s=1, cpu_ranks=2)
    upgrade(settings.database_url)
    yield settings
    reset_enqueue_cache()


@pytest.fixture
def make_job(settings: Settings) -> Callable[..., str]:
    """Insert a queued job with this (raw, unvalidated) spec; returns its id."""

    def make(spec: dict[str, Any] | None = None, queue: str = "default") -> str:
        with session_factory(settings).begin() as session:
            owner, _ = tokens.create_owner_with_token(session, f"u-{uuid.uuid4().hex[:8]}")
            job, _ = jobs.create_job(session, owner=owner, spec=spec or TINY_SPEC, queue=queue)
            return job.id

    return make
