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
