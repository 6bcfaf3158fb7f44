"""The job page's "Took" counts a restarted job from its first attempt's start, not from its
job row's `started_at` (its latest attempt's), as `accum status` does."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from playwright.sync_api import expect
from sqlalchemy import update

from services.jobdb.models import Job, JobAttempt
from services.jobdb.types import utcnow

from .deployment import Deployment

pytestmark = pytest.mark.browser


def test_took_counts_from_the_first_attempts_start(logged_in: Any, deployment: Deployment) -> None:
    run = deployment.run("restarted")
    now = utcnow()
    with deployment.stack.sessions.begin() as session:  # attempt 1 began 10 min ago; the row says 5 s
        session.execute(update(JobAttempt).where(JobAttempt.job_id == run.id)
                        .values(started_at=now - timedelta(seconds=600)))
        session.execute(update(Job).where(Job.id == run.id).values(started_at=now - timedelta(seconds=5)))
    run.finish("succeeded")
    page = logged_in
    page.goto(f"/#/jobs/{run.id}")
    took = page.locator(".summary div", has=page.locator("dt", has_text="Took")).locator("dd")
    expect(took).to_have_text(re.compile(r"^10 min\b"))  # (from the row's started_at: 5.0 s)
