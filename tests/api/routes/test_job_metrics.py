"""Metrics over HTTP: keyset pages in (name, step) order, name and since_step filters, and
`max_points` downsampling that keeps each curve's extremes."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from services.jobdb import metrics
from services.jobdb.models import Job


def write_curve(session_factory: sessionmaker[Session], job_id: str, steps: int) -> dict[int, float]:
    """loss (a noisy decay with one spike) and lr for steps 1..steps; returns the loss by step."""
    loss = {s: 2.0 * math.exp(-s / 200) + 0.05 * math.sin(s) for s in range(1, steps + 1)}
    loss[steps // 3] = 9.0  # a spike a downsample must not smooth away
    rows = [{"name": "loss", "step": s, "epoch": s // 100, "value": v} for s, v in loss.items()]
    rows += [{"name": "lr", "step": s, "epoch": s // 100, "value": 0.1} for s in loss]
    with session_factory.begin() as session:
        metrics.write_metrics(session, job_id, attempt=1, rows=rows)
    return loss


def test_pages_follow_name_then_step_and_cover_everything_once(
    client: TestClient, alice: dict[str, str], submitted: dict[str, Any], session_factory: sessionmaker[Session]
) -> None:
    write_curve(session_factory, submitted["id"], 25)
    seen, cursor = [], None
    while True:
        params: dict[str, Any] = {"limit": 10, **({"cursor": cursor} if cursor else {})}
        page = client.get(f"/v1/jobs/{submitted['id']}/metrics", params=params, headers=alice).json()
        seen += [(p["name"], p["step"]) for p in page["items"]]
        cursor = page["next_cursor"]
        if not cursor:
            break

    assert seen == [("loss", s) for s in range(1, 26)] + [("lr", s) for s in range(1, 26)]


def test_points_carry_name_step_epoch_value_and_time(
    client: TestClient, alice: dict[str, str], submitted: dict[str, Any], session_factory: sessionmaker[Session]
) -> None:
    loss = write_curve(session_factory, submitted["id"], 3)

    items = client.get(
        f"/v1/jobs/{submitted['id']}/metrics", params={"name": "loss"}, headers=alice
    ).json()["items"]

    assert [(p["step"], p["value"]) for p in items] == [(s, pytest.approx(v)) for s, v in loss.items()]
    assert set(items[0]) == {"name", "step", "epoch", "value", "ts"}
    assert items[0]["ts"]


def test_name_and_since_step_filter(
    client: TestClient, alice: dict[str, str], submitted: dict[str, Any], session_factory: sessionmaker[Session]
) -> None:
    write_curve(session_factory, submitted["id"], 30)

    page = client.get(
        f"/v1/jobs/{submitted['id']}/metrics",
        params={"name": "lr", "since_step": 27},
        headers=alice,
    ).json()

    assert [(p["name"], p["step"]) for p in page["items"]] == [("lr", 28), ("lr", 29), ("lr", 30)]
    assert page["next_cursor"] is None


def test_max_points_downsamples_and_keeps_the_extremes(
    client: TestClient, alice: dict[str, str], submitted: dict[str, Any], session_factory: sessionmaker[Session]
) -> None:
    loss = write_curve(session_factory, submitted["id"], 2000)

    page = client.get(
        f"/v1/jobs/{submitted['id']}/metrics",
        params={"name": "loss", "max_points": 100},
        headers=alice,
    ).json()
    steps = [p["step"] for p in page["items"]]
    values = [p["value"] for p in page["items"]]

    assert 50 <= len(steps) <= 100
    assert steps == sorted(steps) and len(set(steps)) == len(steps)
    assert max(values) == pytest.approx(max(loss.values()))  # the spike survived
    assert min(values) == pytest.approx(min(loss.values()))
    assert page["next_cursor"] is None


def test_max_points_without_name_downsamples_each_metric(
    client: TestClient, alice: dict[str, str], submitted: dict[str, Any], session_factory: sessionmaker[Session]
) -> None:
    write_curve(session_factory, submitted["id"], 500)

    items = client.get(
        f"/v1/jobs/{submitted['id']}/metrics", params={"max_points": 20}, headers=alice
    ).json()["items"]

    by_name: dict[str, int] = {}
    for p in items:
        by_name[p["name"]] = by_name.get(p["name"], 0) + 1
    assert set(by_name) == {"loss", "lr"}
    assert all(n <= 20 for n in by_name.values())


@pytest.mark.parametrize(
    ("params", "loc"),
    [
        ({"max_points": 1}, "query.max_points"),
        ({"since_step": -1}, "query.since_step"),
        ({"limit": 0}, "query.limit"),
        ({"cursor": "%%%"}, "query.cursor"),
        ({"max_points": 10, "cursor": "abc"}, "query.cursor"),
    ],
)
def test_bad_metric_parameters_are_422(
    client: TestClient, alice: dict[str, str], submitted: dict[str, Any], params: dict[str, Any], loc: str
) -> None:
    response = client.get(f"/v1/jobs/{submitted['id']}/metrics", params=params, headers=alice)

    assert response.status_code == 422, response.text
    assert [e["loc"] for e in response.json()["errors"]] == [loc]


def test_nan_and_infinities_are_null_with_their_label(
    client: TestClient, alice: dict[str, str], submitted: dict[str, Any], session_factory: sessionmaker[Session]
) -> None:
    """JSON has no NaN: the value is null (as before, so numeric clients keep working) and
    `nonfinite` says which, in pages and in downsampled histories; the job names its own."""
    job_id = submitted["id"]
    rows = [(1, 0.5), (2, math.nan), (3, math.inf), (4, -math.inf)]
    with session_factory.begin() as session:
        metrics.write_metrics(session, job_id, 1, [{"name": "loss", "step": s, "value": v} for s, v in rows])
        session.get(Job, job_id).latest_metrics = {"loss": "NaN", "val_loss": 0.25}  # as stored

    for params in ({"name": "loss"}, {"name": "loss", "max_points": 10}):
        response = client.get(f"/v1/jobs/{job_id}/metrics", params=params, headers=alice)
        json.loads(response.content, parse_constant=lambda c: pytest.fail(f"{c} is not JSON"))
        items = response.json()["items"]
        assert [(p["value"], p.get("nonfinite")) for p in items] == [
            (0.5, None), (None, "NaN"), (None, "inf"), (None, "-inf"),
        ]
        assert "nonfinite" not in items[0]  # finite points keep their old shape
    job = client.get(f"/v1/jobs/{job_id}", headers=alice).json()
    assert job["latest_metrics"] == {"loss": None, "val_loss": 0.25}
    assert job["nonfinite_metrics"] == {"loss": "NaN"}
