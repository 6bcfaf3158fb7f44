"""The job page charts a job's system metrics beside its loss (host CPU and memory %, the
process's RSS; GPU utilisation and memory where the worker read them), and gives no place to
a figure the job has none of (a CPU job's GPU charts), while it runs and once it ended."""

from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import expect

from .deployment import Deployment

pytestmark = pytest.mark.browser


def test_system_metrics_are_charted_beside_the_loss(logged_in: Any, deployment: Deployment) -> None:
    page = logged_in
    run = deployment.run("system-figures")
    run.metrics("loss", {1: 2.0, 2: 1.5, 3: 1.2})
    run.metrics("host_cpu_percent", {1: 35.0, 3: 80.0})
    run.metrics("host_memory_percent", {1: 41.0, 3: 42.0})
    run.metrics("process_rss_bytes", {1: 3.1e8, 3: 3.3e8})
    run.event("system_metrics", "system metrics every 1 s: host_cpu_percent, host_memory_percent, "
              "process_rss_bytes; not recorded: GPU utilisation and memory: the job trains on cpu, not a GPU")
    page.goto(f"/#/jobs/{run.id}")

    charts = page.locator("#chart-loss, #chart-host, #chart-rss")
    expect(charts).to_have_count(3)
    expect(page.locator("#chart-host")).to_have_attribute("data-points", "4")
    expect(page.locator("#chart-host .chart-title")).to_have_text("Host CPU and memory %")
    expect(page.locator("#chart-rss")).to_have_attribute("data-points", "2")
    for gpu in ("#chart-gpu", "#chart-gpu-memory"):  # live, and no figure: no place taken
        expect(page.locator(gpu)).to_be_hidden()
    order = page.locator("figure.chart:visible").evaluate_all("(figures) => figures.map((f) => f.id)")
    assert order[:3] == ["chart-loss", "chart-host", "chart-rss"]
    expect(page.locator("#timeline")).to_contain_text("not recorded: GPU utilisation and memory")
