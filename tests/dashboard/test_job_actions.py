"""The job page's own actions: export every logged point as CSV (NaN kept as NaN), and delete
a finished job (confirmed; a running one offers no Delete)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect

from .deployment import Deployment

pytestmark = pytest.mark.browser


def test_the_metrics_download_as_csv(logged_in: Any, deployment: Deployment) -> None:
    page = logged_in
    run = deployment.run("to-export")
    run.metrics("loss", {1: 2.0, 2: 1.5, 3: math.nan})
    run.metrics("val_loss", {2: 1.25})
    run.finish("succeeded")
    page.goto(f"/#/jobs/{run.id}")
    with page.expect_download() as download:
        page.click("#export-csv")
    assert download.value.suggested_filename == "to-export-metrics.csv"
    rows = [line.split(",") for line in Path(download.value.path()).read_text().splitlines()]
    assert rows[0] == ["name", "step", "epoch_index", "value", "ts"]
    assert sorted((r[0], r[1], r[3]) for r in rows[1:]) == [
        ("loss", "1", "2"), ("loss", "2", "1.5"), ("loss", "3", "NaN"), ("val_loss", "2", "1.25")]


def test_a_finished_job_is_deleted_from_its_page(logged_in: Any, deployment: Deployment) -> None:
    page = logged_in
    running = deployment.run("still-running")
    page.goto(f"/#/jobs/{running.id}")
    expect(page.locator("#cancel")).to_be_visible()
    expect(page.locator("#delete")).to_be_hidden()

    done = deployment.run("to-delete")
    done.finish("succeeded")
    page.goto(f"/#/jobs/{done.id}")
    page.once("dialog", lambda dialog: dialog.dismiss())  # changed their mind: nothing happens
    page.click("#delete")
    with deployment.api() as client:
        assert client.get(f"/v1/jobs/{done.id}").status_code == 200
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("#delete")
    expect(page.locator("#jobs-table")).to_be_visible()
    with deployment.api() as client:
        assert client.get(f"/v1/jobs/{done.id}").status_code == 404
