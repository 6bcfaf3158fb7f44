"""The submit form's three ways to give the batch, in headless Chromium: m × N, the effective
batch with m "auto" (or a number, N following), and N by epoch; each sent as the spec has it,
said in words as it is typed, a bad schedule refused at its field, and a clone of such a job
opening in the form with its batch as it was."""

from __future__ import annotations

import re
from typing import Any

import pytest
from playwright.sync_api import expect

from .deployment import Deployment

pytestmark = pytest.mark.browser
JOB_URL = re.compile(r"#/jobs/([0-9a-z]{26})$")


def submitted_spec(page: Any, deployment: Deployment) -> dict[str, Any]:
    page.click("#submit-job")
    expect(page).to_have_url(JOB_URL)
    job_id = JOB_URL.search(page.url).group(1)  # type: ignore[union-attr]
    with deployment.api() as client:
        return dict(client.get(f"/v1/jobs/{job_id}").json()["spec"])


def test_an_effective_batch_with_m_auto_is_sent_and_cloned_as_such(logged_in: Any, deployment: Deployment) -> None:
    page = logged_in
    page.goto("/#/submit")
    page.fill("#queue", deployment.stack.queue)
    # The form's own choice is shown in words, not as its values (m_n, effective, by_epoch).
    expect(page.locator("#f-batch-by option")).to_have_text(
        ["m × N", "effective batch (N follows)", "N by epoch"])
    page.select_option("#f-batch-by", "effective")
    expect(page.locator("#n")).to_be_hidden()
    page.fill("#f-effective-batch-size", "64")
    page.fill("#m", "16")
    page.fill("#gpus", "0")
    expect(page.locator("#effective-batch")).to_have_text("16 × 4 × CPU = 64 samples per optimizer step")
    page.fill("#m", "24")
    expect(page.locator("#effective-batch")).to_contain_text("pick an m that divides 64")
    page.check("#f-micro-batch-auto")
    expect(page.locator("#m")).to_be_hidden()
    expect(page.locator("#effective-batch")).to_contain_text("64 samples per optimizer step; m is chosen on the CPU")
    expect(page.locator("#spec-preview")).to_contain_text('"micro_batch_size": "auto"')

    spec = submitted_spec(page, deployment)
    assert (spec["micro_batch_size"], spec["effective_batch_size"], spec.get("accumulation_steps")) == ("auto", 64, None)

    page.click("#clone")
    expect(page.locator("#f-batch-by")).to_have_value("effective")
    expect(page.locator("#f-micro-batch-auto")).to_be_checked()
    expect(page.locator("#f-effective-batch-size")).to_have_value("64")
    expect(page.locator("#tab-form")).to_have_class(re.compile(r"\bactive\b"))  # the form holds it


def test_n_by_epoch_is_sent_as_a_mapping_and_a_bad_one_is_refused_at_its_field(logged_in: Any, deployment: Deployment) -> None:
    page = logged_in
    page.goto("/#/submit")
    page.fill("#queue", deployment.stack.queue)
    page.fill("#gpus", "0")
    page.fill("#m", "8")
    page.select_option("#f-batch-by", "by_epoch")
    page.fill("#f-accumulation-by-epoch", "0: 8, two: 2")
    page.click("#submit-job")
    expect(page.locator("#f-accumulation-by-epoch-error")).to_have_text("write it as epoch: N pairs, such as 0: 8, 4: 2")

    page.fill("#f-accumulation-by-epoch", "0: 8, 2: 2")
    expect(page.locator("#effective-batch")).to_have_text(
        "from epoch 1: 8 × 8 × CPU = 64; from epoch 3: 8 × 2 × CPU = 16 samples per optimizer step")
    spec = submitted_spec(page, deployment)
    assert spec["accumulation_steps"] == {"0": 8, "2": 2} and spec["micro_batch_size"] == 8

    page.click("#clone")
    expect(page.locator("#f-batch-by")).to_have_value("by_epoch")
    expect(page.locator("#f-accumulation-by-epoch")).to_have_value("0: 8, 2: 2")
