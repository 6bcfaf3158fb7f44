"""The jobs list in headless Chromium: search by name, sort by a column (NaN last, the worst
loss), filter by queue, and the choices kept in the URL across a reload."""

from __future__ import annotations

import math
import uuid
from typing import Any

import pytest
from playwright.sync_api import expect

from .deployment import Deployment

pytestmark = pytest.mark.browser


def test_search_sort_and_filter_survive_a_reload(logged_in: Any, deployment: Deployment) -> None:
    page = logged_in
    tag = uuid.uuid4().hex[:6]
    losses = {"a": 0.5, "b": math.nan, "c": 0.25}
    for suffix, loss in losses.items():
        run = deployment.run(f"sweep-{tag}-{suffix}")
        run.metrics("loss", {1: loss})
        run.progress(1, {"loss": loss})
    page.goto(f"/#/jobs?q=sweep-{tag}")
    rows = page.locator("#jobs-table tbody tr")
    expect(rows).to_have_count(3)

    page.click("button.sort[data-sort=loss]")  # descending first: NaN is the worst loss
    names = lambda: rows.locator(".job-link").all_inner_texts()  # noqa: E731
    expect(rows.first.locator(".job-link")).to_have_text(f"sweep-{tag}-b")
    assert names() == [f"sweep-{tag}-{s}" for s in "bac"]
    page.click("button.sort[data-sort=loss]")
    expect(rows.first.locator(".job-link")).to_have_text(f"sweep-{tag}-c")
    assert names() == [f"sweep-{tag}-{s}" for s in "cab"]
    expect(page.locator("th[aria-sort=ascending]")).to_contain_text("Loss")

    page.reload()  # search and sort are in the URL
    expect(page.locator("#job-search")).to_have_value(f"sweep-{tag}")
    expect(rows.first.locator(".job-link")).to_have_text(f"sweep-{tag}-c")

    page.select_option("#queue-filter", deployment.stack.queue)
    expect(rows).to_have_count(3)
    page.fill("#job-search", "no-such-job-name")
    expect(rows).to_have_count(1)
    expect(rows.first).to_contain_text("No jobs match these filters")
