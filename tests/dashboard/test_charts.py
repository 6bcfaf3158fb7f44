"""The job page's charts in headless Chromium, on jobs whose metrics the test writes into the
store as a worker would: a zoom that survives live points, legend values that belong to the
cursor's step (and one cursor across the charts), and a diverged run whose NaN and inf are
shown as such: in the summary, on the charts (a marker where the curve went non-finite), in
the legend and in the jobs list, with the error once and its traceback folded."""

from __future__ import annotations

import math
import time
from typing import Any

import pytest
from playwright.sync_api import expect

from .deployment import Deployment

pytestmark = pytest.mark.browser


def x_range(page: Any, chart: str) -> tuple[float, float]:
    low, high = page.get_attribute(chart, "data-x-range").split(",")
    return float(low), float(high)


def hover_step(page: Any, chart: str, step: float, shows: str | None = None) -> None:
    """Put the cursor over `step` on `chart` (from the x range the chart says it draws). With
    `shows`, until the chart's legend names that step, moving again from the chart's box as it
    is now (up to 10 s): a page still laying out after its last fetch (the error box above
    the charts, a redraw) moves the charts between reading a box and the mouse's move."""
    deadline = time.monotonic() + 10
    while True:
        low, high = x_range(page, chart)
        over = page.locator(f"{chart} .u-over")
        over.scroll_into_view_if_needed()  # the mouse reaches only what the viewport shows
        box = over.bounding_box()
        page.mouse.move(box["x"] + (step - low) / (high - low) * box["width"], box["y"] + box["height"] / 2)
        if shows is None or legend(page, chart)[:1] == [shows] or time.monotonic() > deadline:
            return  # (past the deadline the caller's assertion on the legend says what it shows)
        page.wait_for_timeout(100)


def legend(page: Any, chart: str) -> list[str]:
    """The legend's values, first the x axis's, then each curve's."""
    return page.locator(f"{chart} .u-legend .u-series .u-value").all_inner_texts()


def test_a_zoom_survives_live_updates(logged_in: Any, deployment: Deployment) -> None:
    page = logged_in
    run = deployment.run("zoomed")
    run.metrics("loss", {s: 1 / s for s in range(1, 41)})
    page.goto(f"/#/jobs/{run.id}")
    chart = "#chart-loss"
    expect(page.locator(chart)).to_have_attribute("data-points", "40")

    box = page.locator(f"{chart} .u-over").bounding_box()
    y = box["y"] + box["height"] / 2
    page.mouse.move(box["x"] + 0.3 * box["width"], y)
    page.mouse.down()
    page.mouse.move(box["x"] + 0.6 * box["width"], y, steps=5)
    page.mouse.up()
    expect(page.locator(chart)).to_have_attribute("data-zoomed", "true")
    zoomed = x_range(page, chart)
    assert 10 < zoomed[0] < zoomed[1] < 30

    run.metrics("loss", {s: 1 / s for s in range(41, 61)})  # arrives over the live stream
    expect(page.locator(chart)).to_have_attribute("data-points", "60", timeout=15_000)
    page.wait_for_timeout(300)  # a frame to draw
    assert x_range(page, chart) == zoomed
    expect(page.locator(chart)).to_have_attribute("data-zoomed", "true")

    page.locator(f"{chart} .u-over").dblclick()  # back to the whole run
    expect(page.locator(chart)).to_have_attribute("data-zoomed", "false")
    assert x_range(page, chart) == (1, 60)


def test_the_legend_shows_what_was_logged_at_the_cursors_step(
    logged_in: Any, deployment: Deployment
) -> None:
    page = logged_in
    run = deployment.run("evaluated-every-10")
    run.metrics("loss", {s: 1 / s for s in range(1, 21)})
    run.metrics("lr", {s: 0.01 * s for s in range(1, 21)})
    run.metrics("val_loss", {10: 0.25, 20: 0.125})
    run.finish("succeeded")
    page.goto(f"/#/jobs/{run.id}")
    expect(page.locator("#chart-loss")).to_have_attribute("data-points", "22")

    hover_step(page, "#chart-loss", 7, shows="7")
    # val_loss was measured at steps 10 and 20: at step 7 it has no value, not step 10's.
    assert legend(page, "#chart-loss") == ["7", "0.1429", "–"]
    assert legend(page, "#chart-lr") == ["7", "0.07"]  # one cursor for every chart
    hover_step(page, "#chart-loss", 10, shows="10")
    assert legend(page, "#chart-loss") == ["10", "0.1", "0.25"]


def test_a_diverged_run_shows_nan_and_inf_as_such(
    logged_in: Any, deployment: Deployment, shot: Any
) -> None:
    page = logged_in
    run = deployment.run("diverged")
    run.metrics("loss", {1: 2.0, 2: 3.5, 3: math.nan, 4: math.nan})
    run.metrics("grad_norm", {1: 1.0, 2: 40.0, 3: math.inf, 4: math.nan})
    run.progress(4, {"loss": math.nan, "grad_norm": math.nan})
    run.event("traceback", "NonFiniteError: loss is NaN at step 3",
              {"traceback": "Traceback (most recent call last):\nNonFiniteError: loss is NaN at step 3"})
    run.finish("failed", {"type": "NonFiniteError", "message": "loss is NaN at step 3; lower the learning rate"})
    page.goto(f"/#/jobs/{run.id}")

    expect(page.locator("#latest-loss")).to_have_text("NaN")
    expect(page.locator("#chart-loss")).to_have_attribute("data-nonfinite", "loss@3:NaN")
    expect(page.locator("#chart-grad-norm")).to_have_attribute("data-nonfinite", "grad_norm@3:inf")
    hover_step(page, "#chart-loss", 3.1, shows="3")  # nearest logged step: 3, where it went NaN
    assert legend(page, "#chart-loss")[:2] == ["3", "NaN"]
    # The error once, with its traceback folded under it; the timeline does not repeat it.
    error = page.locator("#job-error")
    expect(error).to_contain_text("NonFiniteError: loss is NaN at step 3; lower the learning rate")
    expect(page.get_by_text("lower the learning rate")).to_have_count(1)
    expect(error.locator("details.traceback pre")).to_be_hidden()
    error.locator("details.traceback summary").click()
    expect(error.locator("details.traceback pre")).to_contain_text("Traceback (most recent call last)")
    expect(page.locator("#timeline [data-kind=failed]")).to_contain_text("see the error above")
    expect(page.locator("#timeline [data-kind=traceback]")).to_have_count(0)
    shot(page, "job-diverged")

    page.goto("/#/jobs?q=diverged")
    expect(page.locator(f"tr[data-job-id='{run.id}'] td[data-label=Loss]")).to_have_text("NaN")


def test_axes_smoothing_log_scale_and_restarts(logged_in: Any, deployment: Deployment) -> None:
    """x by samples seen (step x the effective batch 16 x 2), the EMA drawn over a faint raw
    curve whose legend stays the raw value, a log y axis, and attempt 2's restart on the axis."""
    page = logged_in
    run = deployment.run("restarted")
    run.metrics("loss", {s: 1 / s for s in range(1, 9)})
    run = run.restart_from(5)
    run.metrics("loss", {s: 1 / s for s in range(6, 21)})
    run.finish("succeeded")
    page.goto(f"/#/jobs/{run.id}")
    chart = "#chart-loss"
    expect(page.locator(chart)).to_have_attribute("data-points", "20")
    expect(page.locator(chart)).to_have_attribute("data-restarts", "5")
    expect(page.locator("#attempts tbody tr")).to_have_count(2)
    expect(page.locator("#attempts tbody tr[data-attempt='1']")).to_contain_text("worker lost")
    expect(page.locator("#attempts tbody tr[data-attempt='2'] td").nth(5)).to_have_text("5")  # from step

    page.select_option("#x-axis", "samples")
    page.wait_for_timeout(200)
    assert x_range(page, chart) == (32, 640)
    page.select_option("#x-axis", "step")

    page.fill("#smoothing", "0.6")
    page.wait_for_timeout(200)
    assert page.locator(f"{chart} .u-legend .u-series:not([hidden])").count() == 3  # x, loss, val_loss
    hover_step(page, chart, 4, shows="4")
    assert legend(page, chart)[:2] == ["4", "0.25"]  # the raw value, not the average

    page.locator(f"{chart} .log-toggle").check()
    page.wait_for_timeout(200)
    expect(page.locator(chart)).to_have_attribute("data-points", "20")
    page.fill("#smoothing", "0")
