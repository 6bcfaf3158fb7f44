"""What a finished job's page says about how it ended: the non-finite value that stopped a run
under the default on_nonfinite: fail (its step was never logged as a metric, only named in
the error), a BatchNorm model's caveat on the exactness badge itself, and a finished job that
saved no checkpoint."""

from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import expect

from .deployment import Deployment
from .test_charts import hover_step, legend

pytestmark = pytest.mark.browser
# accumcore's NonFiniteError messages, as the worker records them (services/worker/rank.py).
STOPPED_AT_4 = ("step 4: loss is nan; no checkpoint was written before it. Lower the learning rate, clip gradients "
                "(grad_clip_norm), or pass on_nonfinite='skip' to skip such steps")
DIVERGED_AT_9 = ("3 consecutive steps skipped for non-finite values, up to step 9 (grad_norm is inf): the run has "
                 "diverged; no checkpoint was written before it. Lower the learning rate")


def test_the_nonfinite_value_that_stopped_a_run_is_shown_where_it_stopped(
    logged_in: Any, deployment: Deployment, shot: Any
) -> None:
    page = logged_in
    run = deployment.run("stopped-by-nan")
    run.metrics("loss", {1: 2.0, 2: 2.5, 3: 3.5})  # step 4's loss was NaN: never logged
    run.progress(3, {"loss": 3.5})
    run.finish("failed", {"type": "NonFiniteError", "message": STOPPED_AT_4,
                          "nonfinite": {"step": 4, "metric": "loss", "value": "NaN"}})
    page.goto(f"/#/jobs/{run.id}")

    expect(page.locator("#stopped-by")).to_have_text("loss NaN at step 4")
    expect(page.locator("#chart-loss")).to_have_attribute("data-nonfinite", "loss@4:NaN")
    # The x axis reaches step 4 once the marker is drawn (read before it, 3.9 lay off the chart).
    page.wait_for_function("() => Number(document.querySelector('#chart-loss')"
                           ".getAttribute('data-x-range').split(',')[1]) >= 4")
    hover_step(page, "#chart-loss", 3.9, shows="4")  # nearest logged step: 4, the last (the x axis ends there)
    assert legend(page, "#chart-loss")[:2] == ["4", "NaN"]
    shot(page, "job-stopped-by-nan")

    diverged = deployment.run("diverged-after-skips", on_nonfinite="skip")
    diverged.metrics("grad_norm", {s: float(s) for s in range(1, 7)})
    diverged.finish("failed", {"type": "NonFiniteError", "message": DIVERGED_AT_9,
                               "nonfinite": {"step": 9, "metric": "grad_norm", "value": "inf"}})
    page.goto(f"/#/jobs/{diverged.id}")
    expect(page.locator("#stopped-by")).to_have_text("grad_norm inf at step 9")
    expect(page.locator("#chart-grad-norm")).to_have_attribute("data-nonfinite", "grad_norm@9:inf")

    # The page reads the structured `error.nonfinite`, never the message's words: an error
    # that only says it in words marks nothing.
    worded = deployment.run("nonfinite-in-words-only")
    worded.finish("failed", {"type": "NonFiniteError", "message": STOPPED_AT_4})
    page.goto(f"/#/jobs/{worded.id}")
    expect(page.locator("#job-error")).to_contain_text("step 4: loss is nan")
    expect(page.locator("#stopped-by")).to_have_count(0)


def test_a_batchnorm_caveat_is_on_the_badge_and_no_checkpoint_is_said_so(
    logged_in: Any, deployment: Deployment
) -> None:
    page = logged_in
    run = deployment.run("batchnorm-model")
    run.event("exactness_check", "first window = big batch (eval mode)", {"passed": True, "rel_error": 0.0, "tolerance": 1e-6})
    run.event("batchnorm_warning", "the model has BatchNorm layers: in train mode they normalise each micro-batch "
              "on its own statistics, so accumulation is not exactly equivalent to the big batch", {"accumulation_steps": 4})
    run.metrics("loss", {1: 1.0, 2: 0.5})
    run.finish("succeeded")
    page.goto(f"/#/jobs/{run.id}")

    badge = page.locator("#exactness")
    expect(badge).to_contain_text("BatchNorm")
    expect(badge).to_have_class("exactness caveat")
    assert "normalise each micro-batch" in badge.get_attribute("title")
    expect(page.locator("#checkpoints tbody")).to_have_text("None: this job saved no checkpoint")

    plain = deployment.run("no-batchnorm")
    plain.event("exactness_check", "first window = big batch", {"passed": True, "rel_error": 0.0, "tolerance": 1e-6})
    page.goto(f"/#/jobs/{plain.id}")  # still running: no checkpoint *yet*, and no caveat
    expect(page.locator("#exactness")).to_have_class("exactness exact")
    expect(page.locator("#checkpoints tbody")).to_have_text("None yet")
