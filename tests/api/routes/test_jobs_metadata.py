"""A job's own metadata: `PATCH /v1/jobs/{id}` renames it and sets its tags and notes (the
spec stays); `GET /v1/jobs?tag=...&q=...` narrows the list; bad tags are 422s at their path;
another owner's job is a 404."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fastapi.testclient import TestClient

from ..helpers import field_error


def submit(client: TestClient, headers: dict[str, str], spec: dict[str, Any], name: str) -> str:
    return str(client.post("/v1/jobs", json={**spec, "name": name}, headers=headers).json()["id"])


def listed(client: TestClient, headers: dict[str, str], **params: Any) -> list[str]:
    response = client.get("/v1/jobs", params={"limit": 100, **params}, headers=headers)
    assert response.status_code == 200, response.text
    return [j["name"] for j in response.json()["items"]]


def test_patch_renames_tags_and_notes_a_job_and_keeps_its_spec(
    client: TestClient, alice: dict[str, str], spec: dict[str, Any]
) -> None:
    job_id = submit(client, alice, spec, "first-try")
    edited = client.patch(f"/v1/jobs/{job_id[:12]}", headers=alice,
                          json={"name": "baseline", "tags": ["sweep", "lr:3e-4", "sweep"], "notes": "the reference"})
    assert edited.status_code == 200, edited.text
    job = client.get(f"/v1/jobs/{job_id}", headers=alice).json()
    assert (job["name"], job["tags"], job["notes"]) == ("baseline", ["lr:3e-4", "sweep"], "the reference")
    assert job["spec"]["name"] == "first-try" and job["spec"] == edited.json()["spec"]
    # What is left out is kept; [] and "" clear.
    client.patch(f"/v1/jobs/{job_id}", headers=alice, json={"notes": ""})
    job = client.get(f"/v1/jobs/{job_id}", headers=alice).json()
    assert (job["name"], job["tags"], job["notes"]) == ("baseline", ["lr:3e-4", "sweep"], None)
    client.patch(f"/v1/jobs/{job_id}", headers=alice, json={"tags": []})
    assert client.get(f"/v1/jobs/{job_id}", headers=alice).json()["tags"] == []


def test_the_list_filters_by_every_tag_and_searches_name_notes_and_tags(
    client: TestClient, alice: dict[str, str], bob: dict[str, str], spec: dict[str, Any]
) -> None:
    a, b, c = (submit(client, alice, spec, n) for n in ("resnet-a", "resnet-b", "vit-c"))
    client.patch(f"/v1/jobs/{a}", headers=alice, json={"tags": ["sweep", "gpu"]})
    client.patch(f"/v1/jobs/{b}", headers=alice, json={"tags": ["sweep"], "notes": "Diverged at 1e-2"})
    client.patch(f"/v1/jobs/{c}", headers=alice, json={"tags": ["sweeping"]})
    theirs = submit(client, bob, spec, "resnet-bob")
    client.patch(f"/v1/jobs/{theirs}", headers=bob, json={"tags": ["sweep"]})

    assert listed(client, alice, tag="sweep") == ["resnet-b", "resnet-a"]  # not "sweeping", not bob's
    assert listed(client, alice, tag=["sweep", "gpu"]) == ["resnet-a"]
    assert listed(client, alice, q="DIVERGED") == ["resnet-b"]  # notes, any case
    assert listed(client, alice, q="resnet") == ["resnet-b", "resnet-a"]
    assert listed(client, alice, q="sweepi") == ["vit-c"]  # a tag
    assert listed(client, alice, q="50%") == []  # % is a character here, not a wildcard


def test_bad_edits_are_422_at_their_field_and_others_jobs_404(
    client: TestClient, alice: dict[str, str], bob: dict[str, str], spec: dict[str, Any]
) -> None:
    job_id = submit(client, alice, spec, "mine")
    bad_tag = client.patch(f"/v1/jobs/{job_id}", headers=alice, json={"tags": ["a,b"]})
    assert "pattern" in field_error(bad_tag, "body.tags.0")["msg"]
    too_many = client.patch(f"/v1/jobs/{job_id}", headers=alice, json={"tags": [f"t{i}" for i in range(21)]})
    assert "at most 20" in field_error(too_many, "body.tags")["msg"]
    typo = client.patch(f"/v1/jobs/{job_id}", headers=alice, json={"note": "x"})
    assert field_error(typo, "body.note")["msg"] == "unknown field 'note'; did you mean notes?"
    assert client.patch(f"/v1/jobs/{job_id}", headers=bob, json={"name": "theirs"}).status_code == 404
    assert client.get(f"/v1/jobs/{job_id}", headers=alice).json()["name"] == "mine"
    assert "at most 20" in field_error(
        client.get("/v1/jobs", params={"tag": [f"t{i}" for i in range(21)]}, headers=alice), "query.tag")["msg"]


def test_control_characters_in_any_text_are_422_at_their_field(
    client: TestClient, alice: dict[str, str], spec: dict[str, Any]
) -> None:
    """Issue 42 item 2: notes, names and data paths that would drive a viewer's terminal (a
    window title, an OSC 52 clipboard write, a bell) are refused where they are set; newline and
    tab stay allowed in notes."""
    job_id = submit(client, alice, spec, "plain")
    title = "\x1b]0;pwned\x07"
    patched = client.patch(f"/v1/jobs/{job_id}", headers=alice, json={"notes": f"see {title}", "name": "ok\x9bname"})
    assert patched.status_code == 422, patched.text
    assert field_error(patched, "body.notes")["msg"].startswith("control character U+001B (ESC) at offset 4")
    assert "U+009B (CSI)" in field_error(patched, "body.name")["msg"]
    data_root = {**spec, "dataset": {"name": "mnist", "data_root": "/data/\x1b]52;c;ZWNobyBoaQ==\x07"}}
    assert "ESC" in field_error(client.post("/v1/jobs", json=data_root, headers=alice),
                                "body.dataset.data_root")["msg"]
    keyed = client.post("/v1/jobs", json={**spec, "accumulation_schedule": {"0\x1b": 2}}, headers=alice)
    assert keyed.status_code == 422 and "ESC" in field_error(keyed, "body.accumulation_schedule.0\x1b")["msg"]
    assert client.get(f"/v1/jobs/{job_id}", headers=alice).json()["notes"] is None  # nothing stored
    fine = client.patch(f"/v1/jobs/{job_id}", headers=alice, json={"notes": "line one\n\tline two"})
    assert fine.status_code == 200 and fine.json()["notes"] == "line one\n\tline two"


def test_tags_and_notes_given_at_submit_are_the_jobs_not_its_specs(
    client: TestClient, alice: dict[str, str], spec: dict[str, Any]
) -> None:
    """Issue 43 item 5: spec fields `tags` and `notes` set them at submit (stored as a PATCH
    would: sorted tags, each once), searchable; the spec keeps neither (nor its hash)."""
    given = {**spec, "name": "tagged", "tags": ["sweep-3", "lr:0.2", "sweep-3"], "notes": "first try\n\twarm-up 5"}
    response = client.post("/v1/jobs", json=given, headers=alice)
    assert response.status_code == 201, response.text
    job = client.get(f"/v1/jobs/{response.json()['id']}", headers=alice).json()
    assert (job["tags"], job["notes"]) == (["lr:0.2", "sweep-3"], "first try\n\twarm-up 5")
    assert "tags" not in job["spec"] and "notes" not in job["spec"]
    assert listed(client, alice, tag="sweep-3") == ["tagged"] and listed(client, alice, q="WARM-UP") == ["tagged"]
    keyed = {"Idempotency-Key": "tags-1", **alice}
    first = client.post("/v1/jobs", json=given, headers=keyed).json()["id"]
    again = client.post("/v1/jobs", json={**given, "notes": "other words"}, headers=keyed)
    assert again.status_code == 200 and again.json()["id"] == first  # the same training


def test_bad_tags_and_notes_at_submit_are_422_with_the_bounds(
    client: TestClient, alice: dict[str, str], spec: dict[str, Any]
) -> None:
    def error(**fields: Any) -> str:
        return str(field_error(client.post("/v1/jobs", json={**spec, **fields}, headers=alice),
                               f"body.{next(iter(fields))}")["msg"])

    assert error(tags=["ok", "two words"]).startswith("tags[1]: a tag is 1 to 40 letters, digits or _ . : -")
    assert "at most 20 tags" in error(tags=[f"t{i}" for i in range(21)])
    assert "at most 20 tags" in error(tags="sweep")
    assert "at most 10,000 characters" in error(notes="x" * 10_001)
    assert "ESC" in error(notes="see \x1b]0;title\x07")  # refused before the spec is read


def test_the_control_character_check_reads_the_body_the_route_parsed(
    client: TestClient, alice: dict[str, str], spec: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 42 item 4: the app-wide check decoded every JSON body a second time; it now walks
    the body the route parsed (Starlette keeps it on the request), with the same refusals."""
    raw, decoded = json.dumps({**spec, "name": "once"}).encode(), []
    loads = json.loads

    def counted(text: Any, *args: Any, **kwargs: Any) -> Any:
        decoded.extend([text] if text == raw else [])
        return loads(text, *args, **kwargs)

    monkeypatch.setattr(json, "loads", counted)  # what starlette's Request.json calls
    response = client.post("/v1/jobs", content=raw, headers={**alice, "Content-Type": "application/json"})
    assert response.status_code == 201, response.text
    assert len(decoded) == 1, f"the body was decoded {len(decoded)} times"
    refused = client.post("/v1/jobs", content=json.dumps({**spec, "name": "x\x1b"}).encode(),
                          headers={**alice, "Content-Type": "application/json"})
    assert "U+001B (ESC)" in field_error(refused, "body.name")["msg"]
    untyped = client.patch(f"/v1/jobs/{response.json()['id']}", content=b'{"notes": "a\\u0007"}', headers=alice)
    assert "U+0007 (BEL)" in field_error(untyped, "body.notes")["msg"]  # no content type: parsed here
