"""The dashboard in headless Chromium over a real deployment (API + worker subprocesses):
log in, the jobs list, a running job whose loss chart gains points live and is cancelled
(with its exactness badge), two jobs compared on one chart (a badge each), and a job
submitted from the form. Each page is saved as a PNG under test-artifacts/dashboard/."""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import expect

from .deployment import Deployment

pytestmark = pytest.mark.browser

SHORT_STEPS = 20
SHORT: dict[str, Any] = {
    "model": "mlp", "dataset": "digits", "max_steps": SHORT_STEPS, "gpus": 0, "seed": 3,
    "optimizer": {"name": "sgd", "lr": 0.05},
}
# The classic accumulation experiment: one batch of 64 against 16 x 4.
BIG_BATCH = {**SHORT, "name": "batch-64", "micro_batch_size": 64, "accumulation_steps": 1}
ACCUMULATED = {**SHORT, "name": "batch-16x4", "micro_batch_size": 16, "accumulation_steps": 4}
# Runs until cancelled (the test cancels it after watching it train).
LONG = {
    **SHORT, "name": "long-run", "micro_batch_size": 32, "accumulation_steps": 2,
    "max_steps": 100_000, "checkpoint_every": 50,
}
Shot = Callable[[Any, str], Path]


@pytest.fixture(scope="module")
def compared(deployment: Deployment) -> list[str]:
    """Two short jobs, submitted first so the worker finishes them while the browser starts."""
    return [deployment.submit(**BIG_BATCH), deployment.submit(**ACCUMULATED)]


def plotted(page: Any, chart: str, more_than: int, timeout_s: float = 30.0) -> int:
    """The number of points on `chart` once it exceeds `more_than`. Polled from here: the
    page's CSP (no eval) rules out page.wait_for_function."""
    deadline = time.monotonic() + timeout_s
    while (points := int(page.get_attribute(chart, "data-points"))) <= more_than:
        assert time.monotonic() < deadline, f"{chart} stayed at {points} points for {timeout_s} s"
        page.wait_for_timeout(100)
    return points


def test_log_in_with_a_token_and_see_the_jobs_list(
    page: Any, deployment: Deployment, compared: list[str], shot: Shot
) -> None:
    page.goto("/")
    expect(page.locator("#token")).to_be_visible()
    shot(page, "login")

    page.fill("#token", "accum_not-a-token")
    page.click("button[type=submit]")
    expect(page.locator(".error")).to_contain_text("Token refused")
    # The API quotes the command in backticks: shown as code, not as literal backticks.
    expect(page.locator(".error code")).to_have_text("accum token create NAME")
    assert "`" not in page.locator(".error").inner_text()

    page.fill("#token", deployment.token)
    page.click("button[type=submit]")
    expect(page).to_have_url(re.compile(r"#/jobs$"))
    expect(page.locator("#who")).to_have_text("dana (admin)")
    for job_id in compared:
        row = page.locator(f"tr[data-job-id='{job_id}']")
        expect(row).to_be_visible()
        expect(row).to_contain_text("dana")  # the owner column, shown to admins
    expect(page.locator(f"tr[data-job-id='{compared[1]}']")).to_contain_text("16 × 4 × CPU = 64")
    # The list refreshes by itself: both jobs finish without a reload.
    for job_id in compared:
        expect(page.locator(f"tr[data-job-id='{job_id}'] .status")).to_have_text("succeeded", timeout=60_000)
    shot(page, "jobs")

    page.click("[data-filter=running]")
    expect(page.locator("#jobs-table")).to_contain_text("No running jobs")
    # The token survives a reload (local storage).
    page.reload()
    expect(page.locator("#who")).to_have_text("dana (admin)")


def test_a_refused_saved_token_leads_back_to_the_login_page(page: Any) -> None:
    page.add_init_script("localStorage.setItem('accum.token', 'accum_revoked')")
    page.goto("/#/jobs")

    expect(page).to_have_url(re.compile(r"#/login"))
    expect(page.locator(".error")).to_contain_text("saved token was refused")
    expect(page.locator("#nav")).to_be_hidden()


def test_a_running_job_charts_live_and_is_cancelled(
    logged_in: Any, deployment: Deployment, shot: Shot
) -> None:
    page = logged_in
    job_id = deployment.submit(**LONG)
    deployment.stack.wait(job_id, ("running",), timeout=60)
    page.goto(f"/#/jobs/{job_id}")
    expect(page.locator(".status")).to_have_text("running")
    expect(page.locator("#stream-state")).to_have_text("· live")

    first = plotted(page, "#chart-loss", more_than=0)
    # New steps arrive over the stream, without a reload.
    plotted(page, "#chart-loss", more_than=first)
    expect(page.locator("#timeline [data-kind=started]")).to_be_visible()
    # The worker checked the first window against the big batch before the first step.
    expect(page.locator("#exactness.exact")).to_contain_text(
        re.compile(r"^first window = big batch, rel\. error \d\.\de-\d+$"))
    expect(page.locator("#timeline [data-kind=exactness_check]")).to_be_visible()
    shot(page, "job-running")

    page.once("dialog", lambda dialog: dialog.accept())  # "Cancel job long-run? ..."
    page.click("#cancel")
    expect(page.locator(".status")).to_have_text("cancelled", timeout=30_000)
    expect(page.locator("#timeline [data-kind=cancelled]")).to_be_visible()
    expect(page.locator("#resume")).to_be_visible()
    expect(page.locator("#cancel")).to_be_hidden()
    assert deployment.stack.job(job_id).status == "cancelled"
    shot(page, "job-cancelled")


def test_compare_two_jobs_on_one_chart(
    logged_in: Any, deployment: Deployment, compared: list[str], shot: Shot
) -> None:
    page = logged_in
    for job_id in compared:
        deployment.stack.wait(job_id, ("succeeded",))
    page.goto(f"/#/compare?ids={','.join(compared)}")

    chart = page.locator("#compare-loss")
    expect(chart).to_have_attribute("data-series", "2")
    expect(chart).to_have_attribute("data-points", str(2 * SHORT_STEPS))
    expect(page.locator("#compare-table tbody tr")).to_have_count(2)
    expect(page.locator("#compare-table .exactness.exact")).to_have_count(2)  # a badge per job
    expect(chart.locator(".u-legend")).to_contain_text("batch-64")
    expect(chart.locator(".u-legend")).to_contain_text("batch-16x4")
    shot(page, "compare")


def test_submit_form_shows_the_effective_batch_and_submits(
    logged_in: Any, deployment: Deployment, shot: Shot
) -> None:
    page = logged_in
    page.goto("/#/submit")
    effective = page.locator("#effective-batch")
    expect(effective).to_contain_text("16 × 4 × 1 GPU = 64")

    page.fill("#m", "8")
    expect(effective).to_contain_text("8 × 4 × 1 GPU = 32")
    page.fill("#n", "3")
    expect(effective).to_contain_text("8 × 3 × 1 GPU = 24")
    page.fill("#gpus", "0")
    expect(effective).to_contain_text("8 × 3 × CPU = 24")
    page.fill("#name", "from-the-form")
    page.fill("#max-steps", "5")
    page.fill("#queue", deployment.stack.queue)
    shot(page, "submit")

    page.click("#submit-job")
    expect(page).to_have_url(re.compile(r"#/jobs/[0-9a-z]{26}$"))
    job_id = page.url.rsplit("/", 1)[1]
    job = deployment.stack.wait(job_id, ("succeeded",), timeout=60)
    assert job.spec["micro_batch_size"] == 8 and job.spec["accumulation_steps"] == 3
    assert job.effective_batch_size == 24
    expect(page.locator(".status")).to_have_text("succeeded")
    checkpoint = page.locator("#checkpoints tbody tr[data-step='5']")
    expect(checkpoint).to_be_visible()
    shot(page, "job-succeeded")

    with page.expect_download() as download:  # fetched with the token, saved from a blob
        checkpoint.locator("a.download").click()
    saved = Path(download.value.path())
    assert download.value.suggested_filename == f"{job_id}-5.pt"
    assert hashlib.sha256(saved.read_bytes()).hexdigest() == checkpoint.locator("td[title]").get_attribute("title")


def test_make_a_token_and_revoke_it(logged_in: Any, deployment: Deployment, shot: Shot) -> None:
    page = logged_in
    page.goto("/#/tokens")
    in_use = page.locator(f"#tokens-table tr[data-prefix='{deployment.token[:12]}']")
    expect(in_use).to_contain_text("(this browser)")

    page.click("#make-token")
    value = page.locator("#new-token-value")
    expect(value).to_have_text(re.compile(r"^accum_\S{40,}$"))
    token = value.inner_text()
    made = page.locator(f"#tokens-table tr[data-prefix='{token[:12]}']")
    expect(made).to_be_visible()
    expect(made.locator("td[data-label='Last used']")).to_have_text("never")
    expect(in_use.locator("td[data-label='Last used']")).to_have_text(re.compile(r" ago$"))
    page.click("#copy-token")  # the clipboard, or (refused in a headless browser) a selection
    expect(page.locator("#copy-token")).to_have_text(re.compile(r"^(Copied|Selected: press Ctrl-C)$"))
    assert httpx.get(f"{deployment.url}/v1/me", headers={"Authorization": f"Bearer {token}"}).status_code == 200
    shot(page, "tokens")

    page.once("dialog", lambda dialog: dialog.accept())  # "Revoke accum_…?"
    made.locator("button.danger").click()
    expect(made).to_have_count(0)
    assert httpx.get(f"{deployment.url}/v1/me", headers={"Authorization": f"Bearer {token}"}).status_code == 401
    expect(in_use).to_be_visible()  # this browser's own token is untouched


def test_a_job_that_is_not_yours_says_so_and_leads_back(logged_in: Any) -> None:
    page = logged_in
    page.goto("/#/jobs/0000000000000000000000000z")

    expect(page.locator("#not-found")).to_contain_text("does not exist, or it belongs to another owner")
    assert "/v1/" not in page.locator("main").inner_text()
    page.click("#not-found a.button")
    expect(page).to_have_url(re.compile(r"#/jobs$"))
