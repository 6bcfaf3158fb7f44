"""The job page's exactness badge in headless Chromium, on a job whose check events the test
writes into the store as a worker would: a check compared only where nothing could differ says
``exactness pending`` (never the pass badge), and a later window's verdict replaces it live."""

from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import expect

from .deployment import Deployment

pytestmark = pytest.mark.browser


def test_a_pending_check_says_pending_until_a_later_window_decides(logged_in: Any, deployment: Deployment) -> None:
    page = logged_in
    run = deployment.run("pending-check")
    pending = ("exactness check pending: the parts' item counts (24, 24, 24) weigh them as a row mean "
               "and a token mean would")
    run.event("exactness_check", pending, {"rel_error": 0.0, "tolerance": 1e-6, "passed": None,
                                           "status": "pending", "step": 0})
    page.goto(f"/#/jobs/{run.id}")
    badge = page.locator("#exactness")
    expect(badge).to_have_text("exactness pending")
    expect(badge).to_have_class("exactness pending")
    expect(badge).to_have_attribute("title", pending)
    run.event("exactness_check", "window 2 != big batch: relative error 0.12 > tolerance 1e-06",
              {"rel_error": 0.12, "tolerance": 1e-6, "passed": False, "status": "failed", "step": 1})
    expect(badge).to_have_text("accumulation NOT exact, rel. error 1.2e-1")
    expect(page.locator("#exactness.pending")).to_have_count(0)
