"""The job page of a sharded (FSDP) job in headless Chromium shows how its ranks share the model
and each rank's peak memory at the latest step (GET /v1/jobs/{id}: `strategy`,
`peak_memory_bytes_per_rank`); a one-process job shows neither row."""

from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import expect

from .deployment import Deployment

pytestmark = pytest.mark.browser

SHARDED: dict[str, Any] = {
    "model": "mlp", "dataset": "digits", "max_steps": 20, "micro_batch_size": 16, "accumulation_steps": 2,
    "optimizer": {"name": "sgd", "lr": 0.05}, "gpus": 2, "strategy": "fsdp", "fsdp": {"sync": "window"},
}


def test_the_job_page_shows_the_strategy_and_each_ranks_peak(logged_in: Any, deployment: Deployment) -> None:
    page = logged_in
    run = deployment.run("sharded", **SHARDED)
    run.progress(3, {"loss": 1.5, "peak_memory_bytes": 3 * 2**20, "peak_memory_bytes_rank0": 3 * 2**20,
                     "peak_memory_bytes_rank1": 2 * 2**20})
    page.goto(f"/#/jobs/{run.id}")
    expect(page.locator("#strategy")).to_have_text("fsdp (2 ranks, sync window)")
    expect(page.locator("#rank-peaks")).to_have_text("rank 0: 3.0 MiB, rank 1: 2.0 MiB")

    alone = deployment.run("alone", **{**SHARDED, "gpus": 0, "strategy": "ddp", "fsdp": None})
    page.goto(f"/#/jobs/{alone.id}")
    expect(page.locator(".summary")).to_contain_text("Model / dataset")
    expect(page.locator("#strategy")).to_have_count(0)
    expect(page.locator("#rank-peaks")).to_have_count(0)
