"""The job page links the job's runs in its trackers (GET /v1/jobs/{id} `trackers`): a link
where the tracker has a web address, the tracker's name where it has none, "(pending)" while
points wait for a tracker that is down."""

from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import expect

from services.jobdb.tracker_runs import mark_undelivered, open_run, set_identity

from .deployment import Deployment

pytestmark = pytest.mark.browser


def test_the_job_page_links_its_tracker_runs(logged_in: Any, deployment: Deployment) -> None:
    run = deployment.run("tracked", trackers=["mlflow", "tensorboard"])
    url = f"http://mlflow.example:5000/#/experiments/3/runs/r{run.id[-8:]}"
    with deployment.stack.sessions.begin() as session:  # as the worker's sinks record them
        open_run(session, run.id, "mlflow")
        set_identity(session, run.id, "mlflow", f"r{run.id[-8:]}", url)
        open_run(session, run.id, "tensorboard")
        set_identity(session, run.id, "tensorboard", run.id, None)
        mark_undelivered(session, run.id, "tensorboard", "OSError: disk full")
    page = logged_in
    page.goto(f"/#/jobs/{run.id}")

    trackers = page.locator("#trackers")
    expect(trackers.locator("a.tracker-mlflow")).to_have_attribute("href", url)
    expect(trackers.locator("a.tracker-mlflow")).to_have_attribute("target", "_blank")
    expect(trackers.locator("span.tracker-tensorboard")).to_have_text("tensorboard")
    expect(trackers).to_contain_text("tensorboard (pending)")
    expect(trackers.locator("a")).to_have_count(1)
