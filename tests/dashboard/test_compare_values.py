"""The compare page never prints two different values the same: spec fields (weight_decay 0
against 0.0001) and the jobs' last metrics get as many digits as it takes to tell them apart."""

from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import expect

from .deployment import Deployment

pytestmark = pytest.mark.browser


def test_different_values_never_print_the_same(logged_in: Any, deployment: Deployment) -> None:
    page = logged_in
    plain = deployment.run("wd-0", optimizer={"name": "adamw", "lr": 0.1, "weight_decay": 0.0})
    decayed = deployment.run("wd-1e-4", optimizer={"name": "adamw", "lr": 0.10001, "weight_decay": 0.0001})
    plain.metrics("loss", {1: 0.5, 2: 0.123451})
    decayed.metrics("loss", {1: 0.5, 2: 0.123459})
    for run in (plain, decayed):
        run.finish("succeeded")
    page.goto(f"/#/compare?ids={plain.id},{decayed.id}&metrics=loss")

    rows = page.locator("#compare-diff-table tbody tr")
    expect(rows.first).to_be_visible()
    table = {r.locator("th").inner_text(): r.locator("td").all_inner_texts() for r in rows.all()}
    assert table["optimizer.weight_decay"] == ["0", "0.0001"]
    assert table["lr"] == ["0.1", "0.10001"]
    expect(page.locator(f"#compare-table tr[data-job-id='{plain.id}'] td").last).to_have_text("0.12345")
    expect(page.locator(f"#compare-table tr[data-job-id='{decayed.id}'] td").last).to_have_text("0.12346")
