"""Every page at phone widths (360 and 390 CSS pixels): nothing scrolls sideways, the top
bar's Log out stays on screen, and tables turn into one card per row with every column."""

from __future__ import annotations

import math
from typing import Any

import pytest
from playwright.sync_api import expect

from .deployment import Deployment

pytestmark = pytest.mark.browser
LONG_NAME = "resnet50-imagenet-subset-lr-sweep-warmup-2000-cosine-bf16-run-7"


@pytest.fixture(scope="module")
def phone_jobs(deployment: Deployment) -> list[str]:
    """A diverged job with a long name and a long error, and a plain finished one."""
    diverged = deployment.run(LONG_NAME)
    diverged.metrics("loss", {1: 2.0, 2: math.nan})
    diverged.finish("failed", {"type": "NonFiniteError", "message": "loss is NaN at optimizer step 2 "
                               "(on_nonfinite='fail'); lower the learning rate or clip gradients: " + "x" * 120})
    plain = deployment.run("plain")
    plain.metrics("loss", {s: 1 / s for s in range(1, 30)})
    plain.finish("succeeded")
    return [diverged.id, plain.id]


def fits(page: Any, width: int) -> None:
    page.wait_for_timeout(400)  # layout settled (charts sized by their observers)
    scroll = page.evaluate("() => document.documentElement.scrollWidth")
    assert scroll <= width, f"{page.url} is {scroll} px wide on a {width} px screen"


@pytest.mark.parametrize("width", [360, 390])
def test_no_page_scrolls_sideways_on_a_phone(
    page: Any, deployment: Deployment, phone_jobs: list[str], width: int, shot: Any
) -> None:
    page.set_viewport_size({"width": width, "height": 800})
    page.goto("/#/login")
    expect(page.locator("#token")).to_be_visible()
    fits(page, width)

    page.fill("#token", deployment.token)
    page.click("button[type=submit]")
    expect(page.locator("#jobs-table")).to_be_visible()
    logout = page.locator("#logout")
    expect(logout).to_be_in_viewport()
    box = logout.bounding_box()
    assert box["x"] + box["width"] <= width
    fits(page, width)
    row = page.locator(f"tr[data-job-id='{phone_jobs[0]}']")
    for label in ("Status", "Progress", "Loss", "Queue", "Age", "Owner"):  # every column, as a card
        expect(row.locator(f"td[data-label={label}]")).to_be_visible()
    shot(page, f"phone-{width}-jobs")

    pages = [
        f"#/jobs/{phone_jobs[0]}",  # a long name and a long error
        f"#/jobs/{phone_jobs[1]}",
        f"#/compare?ids={','.join(phone_jobs)}&metrics=loss,val_loss",
        "#/submit",
        "#/tokens",
        "#/workers",
        "#/jobs/0000000000000000000000000a",  # not found
    ]
    for target in pages:
        page.goto(f"/{target}")
        expect(page.locator("main h1")).to_be_visible()
        fits(page, width)
    page.goto("/#/submit")
    page.click("#tab-editor")
    fits(page, width)
    page.goto("/#/tokens")
    page.click("#make-token")
    expect(page.locator("#new-token-value")).to_be_visible()
    fits(page, width)
    revoke = page.locator("#tokens-table button.danger").first
    box = revoke.bounding_box()
    assert box["x"] + box["width"] <= width and revoke.inner_text() == "Revoke"
    shot(page, f"phone-{width}-tokens")


def on_screen(locator: Any, width: int) -> None:
    """Every element of `locator` lies within the screen's width (read in one go: the page
    re-renders its tables as data arrives)."""
    edges = locator.evaluate_all("(items) => items.map((e) => [e.getBoundingClientRect().left, e.getBoundingClientRect().right])")
    assert edges
    outside = [edge for edge in edges if edge[0] < 0 or edge[1] > width]
    assert outside == [], f"{len(outside)} of {len(edges)} cut off at {width} px: {outside}"


def test_job_and_compare_tables_are_one_card_per_row_on_a_phone(
    logged_in: Any, deployment: Deployment, phone_jobs: list[str], shot: Any
) -> None:
    """The attempts and checkpoints tables and both compare tables, at 360 px: every cell
    (the Download button included) on screen, under its column's name."""
    page = logged_in
    width = 360
    page.set_viewport_size({"width": width, "height": 800})
    run = deployment.run("restarted-with-checkpoints")
    run.metrics("loss", {s: 1 / s for s in range(1, 9)})
    run = run.restart_from(5)
    run.finish("succeeded")
    page.goto(f"/#/jobs/{run.id}")
    expect(page.locator("#attempts tbody tr")).to_have_count(2)
    expect(page.locator("#checkpoints tbody tr[data-step='5']")).to_be_visible()
    page.locator("#checkpoints").scroll_into_view_if_needed()
    on_screen(page.locator("#checkpoints .download"), width)
    on_screen(page.locator("#attempts tbody td, #checkpoints tbody td"), width)
    expect(page.locator("#attempts tr[data-attempt='2'] td[data-label='From step']")).to_have_text("5")
    expect(page.locator("#checkpoints tr[data-step='5'] td[data-label='File']")).to_contain_text("Download")
    fits(page, width)
    shot(page, "phone-360-job-tables")

    long_run = deployment.run("long-run", max_steps=100_000)
    long_run.progress(2_300, {"loss": 0.5})
    page.goto(f"/#/jobs/{long_run.id}")
    expect(page.locator(".summary .bar-label")).to_have_text("2,300 / 100,000")
    on_screen(page.locator(".summary .bar-label"), width)

    page.goto(f"/#/compare?ids={phone_jobs[1]},{run.id}&metrics=loss,val_loss")
    expect(page.locator("#compare-table tbody tr")).to_have_count(2)
    expect(page.locator("#compare-diff-table tbody tr").first).to_be_visible()
    on_screen(page.locator("#compare-table tbody td, #compare-diff-table tbody td"), width)
    expect(page.locator(f"#compare-table tr[data-job-id='{run.id}'] td[data-label='Last loss']")).to_be_visible()
    fits(page, width)
