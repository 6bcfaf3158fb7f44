"""The Workers page: the deployment's real worker, registered by itself, is listed with its
state, queue and CPU, and the top bar links to the page (the server has a registry)."""

from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import expect

from .deployment import Deployment

pytestmark = pytest.mark.browser


def test_workers_page_lists_the_registered_worker(page: Any, deployment: Deployment) -> None:
    (name,) = deployment.stack.hostnames
    page.goto("/#/login")
    page.fill("#token", deployment.token)
    page.click("button[type=submit]")
    link = page.locator("#nav a[data-route=workers]")
    expect(link).to_be_visible()
    link.click()
    row = page.locator(f"#workers-table tr[data-worker='{name}']")
    expect(row).to_be_visible(timeout=60_000)  # the worker registers once it consumes
    expect(row.locator("td[data-label=Queues]")).to_have_text(deployment.stack.queue)
    expect(row.locator("td[data-label=State]")).to_have_text("idle")
    expect(row.locator("td[data-label=Devices]")).to_contain_text("cores")
    expect(row.locator("td[data-label=Heartbeat]")).to_contain_text("ago")
