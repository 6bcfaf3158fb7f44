"""The submit form and its YAML tab against the whole spec, in headless Chromium: numbers written
the way people write them (3e-4, 1e5, .5, +.5) are sent as numbers; Clone keeps the model and
dataset of timm, hf and own-data jobs; and the form alone sends your own model and data (a
timm: model, imagefolder under an allowed data root, options, timeout, warm start)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect

from accum import parse_yaml

from .deployment import Deployment
from .test_forms import JOB_URL, job_spec

pytestmark = pytest.mark.browser
# A queue no worker consumes: the submitted jobs stay queued, so nothing tries to train them.
IDLE_QUEUE = "no-worker-here"


def data_root(deployment: Deployment, *parts: str) -> str:
    """A folder inside the deployment's only allowed data root (ACCUM_DATA_ROOTS unset:
    <home>/data), as the API resolves it."""
    return os.path.join(os.path.realpath(deployment.stack.settings.home / "data"), *parts)


def test_numbers_in_the_yaml_tab_are_sent_as_numbers(logged_in: Any, deployment: Deployment) -> None:
    page = logged_in
    page.goto("/#/submit")
    page.click("#tab-editor")
    page.fill("#spec-editor", (
        "name: yaml-numbers\nmodel: mlp\ndataset: digits\nmicro_batch_size: 8\naccumulation_steps: 2\n"
        f"max_steps: 1e1\ngpus: 0\nqueue: {IDLE_QUEUE}\ngrad_clip_norm: +.5\n"
        "optimizer: {name: sgd, lr: 3e-4, momentum: .5, weight_decay: 1e-5}\n"
        "scheduler: {name: step, step_size: 1e2, gamma: +.25}\n"
    ))
    expect(page.locator("#editor-errors")).to_be_empty()
    page.click("#tab-form")  # the form shows them as numbers too
    expect(page.locator("#lr")).to_have_value("0.0003")
    expect(page.locator("#f-grad-clip-norm")).to_have_value("0.5")
    expect(page.locator("#f-scheduler-gamma")).to_have_value("0.25")
    page.click("#tab-editor")
    page.click("#submit-job")
    expect(page).to_have_url(JOB_URL)
    spec = job_spec(deployment, page.url.rsplit("/", 1)[1])
    optimizer = spec["optimizer"]
    assert (optimizer["lr"], optimizer["momentum"], optimizer["weight_decay"]) == (0.0003, 0.5, 1e-05)
    assert spec["grad_clip_norm"] == 0.5 and spec["max_steps"] == 10
    assert spec["scheduler"]["step_size"] == 100 and spec["scheduler"]["gamma"] == 0.25


OWN_SPECS = {
    "timm": {"model": {"name": "timm:resnet18", "pretrained": False}, "dataset": {"name": "fake", "size": 64}},
    "hf": {"model": {"name": "hf:gpt2", "n_layer": 2}, "dataset": {"name": "text", "max_len": 64}},
    "own-data": {"model": "small_cnn", "dataset": {"name": "imagefolder", "image_size": 64, "horizontal_flip": True}},
}


@pytest.mark.parametrize("kind", list(OWN_SPECS))
def test_clone_keeps_the_model_and_dataset_of_every_kind_of_job(
    logged_in: Any, deployment: Deployment, kind: str
) -> None:
    page = logged_in
    spec = dict(OWN_SPECS[kind])
    if kind == "own-data":
        spec["dataset"] = {**spec["dataset"], "data_root": data_root(deployment, "pictures")}
    source = deployment.run(f"clone-{kind}", **spec, timeout=3600)
    source.finish("succeeded")
    original = job_spec(deployment, source.id)
    page.goto(f"/#/submit?from={source.id}")

    expect(page.locator("#model")).to_have_value(original["model"]["name"])
    expect(page.locator("#dataset")).to_have_value(original["dataset"]["name"])
    page.click("#tab-editor")
    editor = page.locator("#spec-editor")
    for key in ("model", "dataset"):  # `model: NAME`, or `model:` and its `name: NAME` below
        expect(editor).to_have_value(re.compile(rf"^{key}:(\n  name:)? {re.escape(original[key]['name'])}$", re.M))
    page.click("#tab-form")
    page.fill("#queue", IDLE_QUEUE)
    page.click("#submit-job")
    expect(page).to_have_url(JOB_URL)
    clone = job_spec(deployment, page.url.rsplit("/", 1)[1])
    assert {**clone, "name": None, "queue": None} == {**original, "name": None, "queue": None}


def test_the_form_sends_your_own_model_and_data(logged_in: Any, deployment: Deployment, shot: Any) -> None:
    page = logged_in
    page.goto("/#/submit")
    expect(page.locator("#data-root")).to_be_hidden()  # digits needs no folder
    page.fill("#model", "timm:resnet18")
    page.locator("#model").dispatch_event("change")
    page.select_option("#dataset", "imagefolder")
    expect(page.locator("#data-root")).to_be_visible()
    # The allowed roots are offered to this admin.
    allowed = page.locator("#data-root").evaluate("(input) => [...input.list.options].map((o) => o.value)")
    assert allowed == [data_root(deployment)]
    page.fill("#queue", IDLE_QUEUE)
    page.click("#submit-job")
    expect(page.locator("#data-root-error")).to_have_text("required: the folder that holds your imagefolder data")

    page.fill("#data-root", data_root(deployment, "pictures"))
    page.fill("#f-model-options", "{pretrained: false}")
    page.fill("#f-dataset-options", "image_size: 64")
    page.fill("#f-timeout", "90m")
    page.select_option("#f-on-nonfinite", "skip")
    page.select_option("#f-verify-window", "warn")
    page.fill("#f-init-from-uri", data_root(deployment, "weights.pt"))
    page.uncheck("#f-init-from-strict")
    shot(page, "submit-own-data")
    page.click("#submit-job")
    # Either the job's page or the form's answer (which the assertion then shows).
    page.wait_for_function("() => location.hash.startsWith('#/jobs/') || document.querySelector('#submit-message')?.textContent")
    assert JOB_URL.search(page.url), page.locator("#submit-form").inner_text()
    spec = job_spec(deployment, page.url.rsplit("/", 1)[1])
    assert spec["model"] == {"name": "timm:resnet18", "pretrained": False}
    assert spec["dataset"] == {"name": "imagefolder", "data_root": data_root(deployment, "pictures"),
                               "download": False, "image_size": 64}
    assert spec["timeout"] == 90 * 60
    assert spec["on_nonfinite"] == "skip" and spec["verify_window"] == "warn"
    assert spec["init_from"] == {"uri": data_root(deployment, "weights.pt"), "strict": False}


def readme_csv_job() -> tuple[str, str]:
    """The README's "Your own data" example: the script that writes the CSV, and the spec."""
    text = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = text.split("## Your own data", 1)[1]
    script = section.split("<<'EOF'\n", 1)[1].split("\nEOF\n", 1)[0]
    spec = section.split("accum submit - --watch <<EOF\n", 1)[1].split("\nEOF\n", 1)[0]
    return script, spec


def test_the_readmes_csv_job_is_submitted_through_the_form(logged_in: Any, deployment: Deployment) -> None:
    """With model mlp the Dataset list offers `files` (features and label columns), and the
    README's job typed into the form is the README's spec (that it trains as written is
    tests/cli/test_readme.py's)."""
    script, text = readme_csv_job()
    points = Path(data_root(deployment, "points"))
    points.mkdir(parents=True, exist_ok=True)
    with (points / "train.csv").open("w") as out:
        subprocess.run([sys.executable, "-c", script], stdout=out, check=True, timeout=30)
    readme = parse_yaml(text.replace("$PWD/.accum/data", data_root(deployment)))
    dataset = dict(readme["dataset"])
    options = {k: v for k, v in dataset.items() if k not in ("name", "data_root")}

    page = logged_in
    page.goto("/#/submit")
    page.fill("#model", readme["model"])
    page.locator("#model").dispatch_event("change")
    page.select_option("#dataset", dataset["name"])
    page.fill("#data-root", dataset["data_root"])
    page.fill("#f-dataset-options", json.dumps(options))
    page.fill("#m", str(readme["micro_batch_size"]))
    page.fill("#n", str(readme["accumulation_steps"]))
    page.fill("#epochs", str(readme["epochs"]))
    page.select_option("#f-optimizer-name", readme["optimizer"]["name"])
    page.fill("#lr", str(readme["optimizer"]["lr"]))
    page.fill("#queue", IDLE_QUEUE)
    page.click("#submit-job")
    page.wait_for_function("() => location.hash.startsWith('#/jobs/') || document.querySelector('#submit-message')?.textContent")
    assert JOB_URL.search(page.url), page.locator("#submit-form").inner_text()
    job_id = page.url.rsplit("/", 1)[1]
    spec = job_spec(deployment, job_id)
    assert {k: v for k, v in spec["dataset"].items() if k != "download"} == dataset
    assert (spec["model"]["name"], spec["micro_batch_size"], spec["accumulation_steps"], spec["epochs"]) == (
        readme["model"], readme["micro_batch_size"], readme["accumulation_steps"], readme["epochs"])
    assert (spec["optimizer"]["name"], spec["optimizer"]["lr"]) == (readme["optimizer"]["name"], readme["optimizer"]["lr"])

