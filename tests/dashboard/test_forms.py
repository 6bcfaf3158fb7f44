"""The submit form, compare and clone in headless Chromium: problems shown once at their field
in the form's words (what the browser checks, and the API's 422), the YAML editor tab, the
table of spec fields two jobs differ in, and Clone opening the form with a job's spec."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect

from tests.own_data_files import save_gpt2, write_labelled_text

from .deployment import Deployment

pytestmark = pytest.mark.browser
JOB_URL = re.compile(r"#/jobs/[0-9a-z]{26}$")


def job_spec(deployment: Deployment, job_id: str) -> dict[str, Any]:
    with deployment.api() as client:
        return dict(client.get(f"/v1/jobs/{job_id}").json()["spec"])


def test_form_errors_are_shown_once_at_their_field_in_its_words(
    logged_in: Any, deployment: Deployment, shot: Any
) -> None:
    page = logged_in
    page.goto("/#/submit")
    page.fill("#m", "0")
    page.click("#submit-job")
    expect(page.locator("#m-error")).to_have_text("must be at least 1")  # checked before sending
    expect(page.locator("#effective-batch")).to_contain_text("m and N must be whole numbers")

    page.fill("#m", "8")
    page.fill("#lr", "0")  # the browser lets 0 through; the API refuses it
    page.fill("#queue", deployment.stack.queue)
    page.click("#submit-job")
    expect(page.locator("#lr-error")).to_have_text("must be a number greater than 0 and at most 10; got 0")
    expect(page.locator("#m-error")).to_be_empty()
    body = page.locator("main").inner_text()
    assert "body." not in body and "optimizer.lr" not in body
    assert body.count("must be a number greater than 0") == 1
    expect(page).to_have_url(re.compile(r"#/submit$"))
    shot(page, "submit-errors")


def test_the_editor_tab_reads_yaml_and_says_where_it_is_wrong(
    logged_in: Any, deployment: Deployment
) -> None:
    page = logged_in
    page.goto("/#/submit")
    page.fill("#m", "32")
    page.click("#tab-editor")
    editor = page.locator("#spec-editor")
    expect(editor).to_have_value(re.compile(r"micro_batch_size: 32"))

    editor.fill("model: mlp\ndataset: [digits\n")
    expect(page.locator("#editor-errors")).to_contain_text("not valid YAML at line")
    editor.fill(
        "name: from-yaml\nmodel: mlp\ndataset: digits\nmicro_batch_size: 8\naccumulation_steps: 2\n"
        f"max_steps: 3\ngpus: 0\nqueue: {deployment.stack.queue}\noptimizer: {{name: adamw, lr: 0.001}}\n"
        "scheduler: {name: cosine, warmup_steps: 1}\n"
    )
    expect(page.locator("#editor-errors")).to_be_empty()
    page.click("#tab-form")  # the form takes what the editor holds
    expect(page.locator("#m")).to_have_value("8")
    expect(page.locator("#f-scheduler-name")).to_have_value("cosine")
    page.click("#submit-job")
    expect(page).to_have_url(JOB_URL)
    spec = job_spec(deployment, page.url.rsplit("/", 1)[1])
    assert spec["name"] == "from-yaml" and spec["optimizer"]["name"] == "adamw"
    assert spec["scheduler"] == {"name": "cosine", "warmup_steps": 1}


def test_compare_tables_the_spec_fields_that_differ(logged_in: Any, deployment: Deployment, shot: Any) -> None:
    page = logged_in
    big = deployment.run("cmp-64", micro_batch_size=64, accumulation_steps=1)
    small = deployment.run("cmp-16x4", micro_batch_size=16, accumulation_steps=4, optimizer={"name": "sgd", "lr": 0.2, "momentum": 0.9})
    for run in (big, small):
        run.metrics("loss", {s: 1 / s for s in range(1, 11)})
        run.metrics("val_loss", {5: 0.4, 10: 0.3})
        run.finish("succeeded")
    page.goto(f"/#/compare?ids={big.id},{small.id}&metrics=loss,val_loss")

    expect(page.locator("#compare-loss")).to_have_attribute("data-series", "2")
    expect(page.locator("#compare-val-loss")).to_have_attribute("data-points", "4")
    rows = page.locator("#compare-diff-table tbody tr")
    expect(rows).to_have_count(4)
    table = {r.locator("th").inner_text(): r.locator("td").all_inner_texts() for r in rows.all()}
    assert table == {"effective batch": ["64", "64"], "m": ["64", "16"], "N": ["1", "4"], "lr": ["0.05", "0.2"]}
    # Names repeat between experiments: the legends add the short id.
    expect(page.locator("#compare-loss .u-legend")).to_contain_text(f"cmp-64 · {big.id[-6:]}")
    shot(page, "compare-diff")


def test_clone_opens_the_form_with_the_jobs_spec(logged_in: Any, deployment: Deployment) -> None:
    page = logged_in
    source = deployment.run("to-clone", micro_batch_size=8, accumulation_steps=3, seed=11,
                            optimizer={"name": "adamw", "lr": 0.004, "weight_decay": 0.01})
    source.finish("succeeded")
    page.goto(f"/#/jobs/{source.id}")
    page.click("#clone")

    expect(page).to_have_url(re.compile(rf"#/submit\?from={source.id}$"))
    expect(page.locator("#name")).to_have_value("to-clone-clone")
    for field, value in (("#m", "8"), ("#n", "3"), ("#lr", "0.004"), ("#f-optimizer-weight-decay", "0.01"),
                         ("#f-seed", "11"), ("#f-optimizer-name", "adamw")):
        expect(page.locator(field)).to_have_value(value)
    page.click("#submit-job")
    expect(page).to_have_url(JOB_URL)
    original = job_spec(deployment, source.id)
    clone = job_spec(deployment, page.url.rsplit("/", 1)[1])
    # The source was written into the store directly, without a timeout; the clone went through
    # the API, which fills in the service's (ACCUM_MAX_JOB_SECONDS).
    assert clone.pop("timeout") == (original.pop("timeout") or deployment.stack.settings.max_job_seconds)
    assert {**clone, "name": None} == {**original, "name": None}
    assert clone["name"] == "to-clone-clone"


def choose_levers(page: Any, every: str, r: str) -> None:
    """Activation checkpointing every `every` blocks, LoRA of rank `r` on c_attn."""
    page.select_option("#f-activation-checkpointing", every)
    page.select_option("#f-peft-method", "lora")
    page.fill("#f-peft-r", r)
    page.fill("#f-peft-target-modules", "c_attn")


def submitted(page: Any, queue: str) -> str:
    """Submit the form to `queue`; the new job's id (its page is open)."""
    page.fill("#queue", queue)
    page.click("#submit-job")
    page.wait_for_function("() => location.hash.startsWith('#/jobs/') || document.querySelector('#submit-message')?.textContent")
    assert JOB_URL.search(page.url), page.locator("#submit-form").inner_text()
    return str(page.url.rsplit("/", 1)[1])


def test_the_form_sends_checkpointing_and_lora_for_an_hf_model(logged_in: Any, deployment: Deployment) -> None:
    """The memory levers: LoRA's fields appear for an hf: model only, both levers reach the stored
    spec as the API takes them, and the job page lists them. Then a saved model (hf:<dir>: a
    tiny GPT-2 the test saves under the data root) is fine-tuned from the form as a sequence
    classifier on labelled text with both levers, on the worker: it succeeds, levers listed."""
    page = logged_in
    page.goto("/#/submit")
    expect(page.locator("#f-peft-method")).to_be_hidden()  # mlp: no adapters to fit
    page.fill("#model", "hf:gpt2")
    page.locator("#model").dispatch_event("change")
    page.fill("#f-model-options", "{n_layer: 2, n_embd: 16, n_head: 2}")
    page.select_option("#dataset", "text")
    choose_levers(page, every="2", r="4")
    page.check("#f-peft-merge")
    spec = job_spec(deployment, submitted(page, "no-worker-here"))  # stays queued: nothing trains it
    assert spec["activation_checkpointing"] == {"every": 2}
    assert spec["peft"] == {"method": "lora", "r": 4, "alpha": 16, "dropout": 0.0, "target_modules": ["c_attn"],
                            "merge": True}
    expect(page.locator("#levers")).to_have_text("activation_checkpointing (every 2), lora (r 4, alpha 16, merge)")

    root = Path(os.path.realpath(deployment.stack.settings.home / "data"))  # the API's allowed data root
    write_labelled_text(root / "reviews", "jsonl", rows=24)
    save_gpt2(root / "models" / "gpt2")
    page.goto("/#/submit")
    page.fill("#model", f"hf:{root / 'models' / 'gpt2'}")
    page.locator("#model").dispatch_event("change")
    page.select_option("#dataset", "files")
    page.fill("#data-root", str(root / "reviews"))
    page.fill("#f-dataset-options", json.dumps({"data_files": "labelled.jsonl", "tokenizer": "bytes", "max_len": 32,
                                                "columns": {"text": "body", "label": "y"}}))
    page.fill("#m", "2")
    page.fill("#n", "2")
    page.fill("#gpus", "0")
    page.fill("#max-steps", "2")
    choose_levers(page, every="1", r="2")
    job = deployment.stack.wait(submitted(page, deployment.stack.queue), timeout=120)  # the worker's queue
    assert job.status == "succeeded", (job.error, deployment.stack.worker_logs())
    expect(page.locator(".status")).to_have_text("succeeded")
    expect(page.locator("#levers")).to_have_text("activation_checkpointing, lora (r 2, alpha 16)")
