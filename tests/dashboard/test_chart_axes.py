"""The job page's charts at the edges: y-axis ticks that stay readable and distinct for very
large values (no "0,000T"), and a double-click that resets every synced chart, not only the
one clicked."""

from __future__ import annotations

import re
from typing import Any

import pytest
from playwright.sync_api import expect

from .deployment import Deployment
from .test_charts import hover_step, legend, x_range

pytestmark = pytest.mark.browser


def drag(page: Any, chart: str, start: float, end: float) -> None:
    box = page.locator(f"{chart} .u-over").bounding_box()
    y = box["y"] + box["height"] / 2
    page.mouse.move(box["x"] + start * box["width"], y)
    page.mouse.down()
    page.mouse.move(box["x"] + end * box["width"], y, steps=5)
    page.mouse.up()


def test_a_double_click_resets_every_synced_chart(logged_in: Any, deployment: Deployment) -> None:
    page = logged_in
    run = deployment.run("zoom-all")
    curves = {"loss": lambda s: 1 / s, "lr": lambda s: 0.001 * s, "grad_norm": lambda s: 2.0 + s}
    for name, curve in curves.items():
        run.metrics(name, {s: curve(s) for s in range(1, 41)})
    page.goto(f"/#/jobs/{run.id}")
    charts = ["#chart-loss", "#chart-lr", "#chart-grad-norm"]
    for chart in charts:
        expect(page.locator(chart)).to_have_attribute("data-points", "40")

    drag(page, "#chart-loss", 0.3, 0.6)  # uPlot zooms the synced charts together
    for chart in charts:
        expect(page.locator(chart)).to_have_attribute("data-zoomed", "true")
    page.locator("#chart-lr .u-over").dblclick()  # on another chart than the one zoomed
    for chart in charts:
        expect(page.locator(chart)).to_have_attribute("data-zoomed", "false")

    for name, curve in curves.items():  # live points: no chart goes back to the old zoom
        run.metrics(name, {s: curve(s) for s in range(41, 61)})
    for chart in charts:
        expect(page.locator(chart)).to_have_attribute("data-points", "60", timeout=15_000)
    page.wait_for_timeout(300)  # a frame to draw
    assert [x_range(page, chart) for chart in charts] == [(1, 60)] * 3
    hover_step(page, "#chart-grad-norm", 50, shows="50")
    assert [legend(page, chart)[:2] for chart in charts] == [["50", "0.02"], ["50", "0.05"], ["50", "52"]]


def y_ticks(page: Any, chart: str) -> list[str]:
    return page.get_attribute(chart, "data-y-ticks").split("|")


def test_y_ticks_are_short_and_distinct_for_large_and_close_values(logged_in: Any, deployment: Deployment) -> None:
    page = logged_in
    huge = deployment.run("huge-loss")
    huge.metrics("loss", {s: 1e15 * s ** 3 for s in range(1, 81)})
    close = deployment.run("close-loss")
    close.metrics("loss", {s: 1 + s * 1e-6 for s in range(1, 41)})
    for run in (huge, close):
        run.finish("failed", {"type": "RuntimeError", "message": "stopped by the test"})

    page.goto(f"/#/jobs/{huge.id}")
    expect(page.locator("#chart-loss")).to_have_attribute("data-y-ticks", re.compile("e"))
    ticks = y_ticks(page, "#chart-loss")
    assert all(re.fullmatch(r"0|\d(\.\d+)?e\d+", t) for t in ticks), ticks  # 4e20, never 400,000,000T
    assert len(set(ticks)) == len(ticks) > 2
    hover_step(page, "#chart-loss", 50, shows="50")
    assert legend(page, "#chart-loss")[1] == "1.25e20"

    page.goto(f"/#/jobs/{close.id}")
    expect(page.locator("#chart-loss")).to_have_attribute("data-y-ticks", re.compile(r"1\.0000"))
    ticks = y_ticks(page, "#chart-loss")
    assert len(set(ticks)) == len(ticks) > 2, ticks  # 1.00001, 1.00002, ..., not 1, 1, 1


def test_every_logged_metric_gets_a_chart(logged_in: Any, deployment: Deployment) -> None:
    """items_per_s and step_time_s (logged by every run), a GPU worker's system metric, and one
    that arrives live: each drawn like the fixed five, on the page's one cursor."""
    page = logged_in
    run = deployment.run("every-metric")
    for name in ("loss", "items_per_s", "step_time_s", "gpu_utilization"):
        run.metrics(name, {s: float(s) for s in range(1, 11)})
    page.goto(f"/#/jobs/{run.id}")
    for chart in ("#chart-items-per-s", "#chart-step-time-s", "#chart-gpu-utilization"):
        expect(page.locator(chart)).to_have_attribute("data-points", "10")
    run.metrics("gpu_memory_bytes", {s: 2.0e9 + s for s in range(1, 11)})  # over the live stream
    expect(page.locator("#chart-gpu-memory-bytes")).to_have_attribute("data-points", "10", timeout=15_000)
    hover_step(page, "#chart-loss", 5, shows="5")
    assert legend(page, "#chart-step-time-s")[:2] == ["5", "5"]
