"""The job page shows the tags and notes given at submit (spec fields `tags`, `notes`) and edits
them in place (PATCH /v1/jobs/{id}): saved, shown, kept by the API; a bad tag is refused with
the API's words and nothing changes."""

from __future__ import annotations

from typing import Any

import pytest
from job_specs import MINIMAL_SPEC
from playwright.sync_api import expect

from .deployment import Deployment

pytestmark = pytest.mark.browser


def test_the_job_page_shows_and_edits_tags_and_notes(logged_in: Any, deployment: Deployment) -> None:
    spec = {**MINIMAL_SPEC, "name": "labelled", "queue": "nobody-serves-this",
            "tags": ["sweep-3", "baseline"], "notes": "first try\nlr from the paper"}
    with deployment.api() as client:
        response = client.post("/v1/jobs", json=spec)
    assert response.status_code == 201, response.text
    job_id = response.json()["id"]
    page = logged_in
    page.goto(f"/#/jobs/{job_id}")

    expect(page.locator("#job-tags .tag")).to_have_text(["baseline", "sweep-3"])
    expect(page.locator("#job-notes")).to_have_text("first try\nlr from the paper")

    page.click("#edit-labels")
    page.fill("#tags-input", "sweep-3, bad tag")
    page.click("#save-labels")
    expect(page.locator("#labels-form .error")).to_contain_text("tags.1")
    page.fill("#tags-input", "sweep-3, keeper")
    page.fill("#notes-input", "diverged at lr 0.4")
    page.click("#save-labels")

    expect(page.locator("#job-tags .tag")).to_have_text(["keeper", "sweep-3"])
    expect(page.locator("#job-notes")).to_have_text("diverged at lr 0.4")
    with deployment.api() as client:
        job = client.get(f"/v1/jobs/{job_id}").json()
    assert (job["tags"], job["notes"]) == (["keeper", "sweep-3"], "diverged at lr 0.4")
