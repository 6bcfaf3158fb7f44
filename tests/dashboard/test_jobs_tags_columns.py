"""The jobs list's tag filter (on the server, kept in the URL, a tag in a row filters by it)
and chosen columns (spec fields and latest metrics, sortable, kept in the URL across a
reload), in headless Chromium."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from playwright.sync_api import expect

from .deployment import Deployment

pytestmark = pytest.mark.browser


def tagged_runs(deployment: Deployment, prefix: str) -> dict[str, str]:
    """Three running jobs: lr 0.1 / 0.02 / 0.3, grad_norm 5 / 1 / 3, two tagged `wide`."""
    ids = {}
    for suffix, lr, grad_norm, tags in (("a", 0.1, 5.0, ["wide"]), ("b", 0.02, 1.0, []), ("c", 0.3, 3.0, ["wide", "x2"])):
        run = deployment.run(f"{prefix}-{suffix}", optimizer={"name": "sgd", "lr": lr})
        run.progress(4, {"loss": 1.0, "grad_norm": grad_norm})
        with deployment.api() as client:
            assert client.patch(f"/v1/jobs/{run.id}", json={"tags": [f"{t}-{prefix}" for t in tags]}).status_code == 200
        ids[suffix] = run.id
    return ids


def listed_runs(page: Any, deployment: Deployment, kind: str) -> tuple[str, Any]:
    """`tagged_runs` under a fresh prefix, listed by a search for it: (prefix, the rows)."""
    prefix = f"{kind}-{uuid.uuid4().hex[:6]}"
    tagged_runs(deployment, prefix)
    page.goto(f"/#/jobs?q={prefix}")
    rows = page.locator("#jobs-table tbody tr")
    expect(rows).to_have_count(3)
    return prefix, rows


def test_a_tag_filters_the_list_on_the_server_and_stays_in_the_url(logged_in: Any, deployment: Deployment) -> None:
    page = logged_in
    prefix, rows = listed_runs(page, deployment, "tags")

    page.select_option("#tag-filter", f"wide-{prefix}")
    expect(rows).to_have_count(2)
    assert f"tag=wide-{prefix}" in page.url
    page.reload()
    expect(page.locator("#tag-filter")).to_have_value(f"wide-{prefix}")
    expect(rows).to_have_count(2)

    page.goto(f"/#/jobs?q={prefix}")
    page.locator(f'#jobs-table .tag[data-tag="x2-{prefix}"]').click()  # a row's tag filters by it
    expect(rows).to_have_count(1)
    expect(rows.first.locator(".job-link")).to_have_text(f"{prefix}-c")


def test_chosen_columns_show_spec_fields_and_metrics_sort_and_survive_a_reload(logged_in: Any, deployment: Deployment) -> None:
    page = logged_in
    prefix, rows = listed_runs(page, deployment, "cols")

    page.click("#column-chooser summary")
    page.check('#column-chooser input[value="spec:optimizer.lr"]')
    page.check('#column-chooser input[value="metric:grad_norm"]')
    expect(page.locator('#jobs-table thead button[data-sort="metric:grad_norm"]')).to_be_visible()
    assert "cols=spec%3Aoptimizer.lr%2Cmetric%3Agrad_norm" in page.url or "cols=spec:optimizer.lr,metric:grad_norm" in page.url

    page.click('#jobs-table thead button[data-sort="metric:grad_norm"]')  # descending first
    names = lambda: rows.locator(".job-link").all_inner_texts()  # noqa: E731
    expect(rows.first.locator(".job-link")).to_have_text(f"{prefix}-a")
    assert names() == [f"{prefix}-{s}" for s in "acb"]
    page.reload()
    expect(rows.first.locator(".job-link")).to_have_text(f"{prefix}-a")
    lr = rows.locator('td[data-column="spec:optimizer.lr"]').all_inner_texts()
    grad = rows.locator('td[data-column="metric:grad_norm"]').all_inner_texts()
    assert (lr, grad) == (["0.1", "0.3", "0.02"], ["5", "3", "1"])

    page.click("#column-chooser summary")
    page.uncheck('#column-chooser input[value="metric:grad_norm"]')
    expect(page.locator('#jobs-table td[data-column="metric:grad_norm"]')).to_have_count(0)
    expect(rows.first.locator(".job-link")).to_have_text(f"{prefix}-c")  # back to newest first
