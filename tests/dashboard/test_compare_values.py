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


def test_parallel_coordinates_put_the_spec_fields_against_the_last_metric(
    logged_in: Any, deployment: Deployment, shot: Any
) -> None:
    page = logged_in
    runs = []
    for m, lr, last in ((16, 0.1, 0.5), (32, 0.05, 0.25), (64, 0.2, 0.75)):
        run = deployment.run(f"sweep-m{m}", micro_batch_size=m, accumulation_steps=2,
                             optimizer={"name": "sgd", "lr": lr, "momentum": 0.9})
        run.metrics("val_loss", {5: 1.0, 10: last})
        run.finish("succeeded")
        runs.append(run)
    page.goto(f"/#/compare?ids={','.join(r.id for r in runs)}&metrics=val_loss,loss")

    figure = page.locator("#parallel-coordinates")
    expect(figure).to_be_visible()
    axes = figure.get_attribute("data-axes").split("|")
    assert sorted(axes) == sorted(["effective batch", "m", "lr", "last val_loss"]) and axes[-1] == "last val_loss"
    for run, (m, lr, last) in zip(runs, ((16, 0.1, 0.5), (32, 0.05, 0.25), (64, 0.2, 0.75)), strict=True):
        line = figure.locator(f"polyline[data-job-id='{run.id}']")
        values = dict(zip(axes, line.get_attribute("data-values").split("|"), strict=True))
        assert values == {"effective batch": str(2 * m), "m": str(m), "lr": str(lr), "last val_loss": str(last)}
        assert len(line.get_attribute("points").split()) == 4
    shot(page, "compare-parallel")
