"""The job page's Logs panel: what the job printed, each attempt under its header, new lines
appearing while it runs, one attempt chosen, stderr told apart, and a job that printed nothing
saying so (the capture itself runs through a real worker in tests/integration/test_job_logs.py)."""

from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import expect

from .deployment import Deployment

pytestmark = pytest.mark.browser


def test_the_logs_panel_shows_each_attempts_lines_live_and_by_attempt(logged_in: Any, deployment: Deployment) -> None:
    page = logged_in
    run = deployment.run("chatty")
    run.prints(1, [("stdout", "loading 1,797 digits"), ("stderr", "UserWarning: the dataset is tiny")])
    page.goto(f"/#/jobs/{run.id}")
    logs = page.locator("#logs")
    expect(logs).to_contain_text("── attempt 1 ──\nloading 1,797 digits\nUserWarning: the dataset is tiny")
    expect(logs.locator(".log-stderr")).to_have_text("UserWarning: the dataset is tiny\n")

    second = run.restart_from(4)
    second.prints(2, [("stdout", "resumed from step 4")])
    expect(logs).to_contain_text("── attempt 2 ──\nresumed from step 4", timeout=10_000)  # polled while it runs
    expect(page.locator("#log-attempt option")).to_have_count(3, timeout=10_000)  # all, 1, 2
    page.select_option("#log-attempt", "2")
    expect(logs).to_have_text("resumed from step 4\n")
    page.select_option("#log-attempt", "1")
    expect(logs).not_to_contain_text("resumed from step 4")

    second.prints(2, [("stdout", "the last line, stored before the job ended")])
    second.finish("succeeded")
    page.select_option("#log-attempt", "")
    expect(logs).to_contain_text("the last line, stored before the job ended", timeout=10_000)


def test_a_job_that_printed_nothing_says_so(logged_in: Any, deployment: Deployment) -> None:
    page = logged_in
    run = deployment.run("quiet")
    run.finish("succeeded")
    page.goto(f"/#/jobs/{run.id}")
    expect(page.locator("#logs")).to_have_text("This job printed nothing")
