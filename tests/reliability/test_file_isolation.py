"""One owner cannot make the service read a file that is not theirs (issue 25, items 1 and 2).

    .venv/bin/python -m pytest tests/reliability/test_file_isolation.py -q

The audit's production shape, on one machine: the API as production starts it, a worker
process, PostgreSQL, Redis, checkpoints on the S3 test server (moto), the worker holding an AWS
secret in its environment. Alice trains a job, so her checkpoint sits in the worker's node cache.

- Item 1, model options: bob names alice's cached checkpoint (or another file) through every
  model family's options (timm's `checkpoint_path`, `weights` outside the data roots, an `hf:`
  config key, a plugin option, an option of a saved `hf:` directory): 422 at `model.<option>`
  listing what is accepted, nothing stored. A job stored past the API (an older spec, another
  allow-list) fails on the worker before anything is built.
- Issue 42 item 1, owners' data roots: `data/users/{owner}` and `s3://datasets/users/{owner}`
  are each owner's own. bob names alice's files by every route (data_root, an `hf:` directory,
  `init_from.uri`, a link in his own folder, an s3 prefix, a folder holding hers): each is
  refused with the message a missing path gets; one stored past the API fails on the worker with
  it; alice's own job trains. (A tokenizer or data file is relative to data_root, and a link to
  hers is refused below, item 2.)
- Item 2, files under a data root: bob's data root holds links out of it (to the worker's
  `/proc/self/environ`, to alice's images, tokenizer and saved dataset), an image column naming
  alice's image, and a CSV whose parse error would quote its line. Each job fails naming the
  path as bob wrote it; the secret and alice's bytes are in no error, event, metric or checkpoint.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from api_process import ApiProcess, running_api
from worker_stack import Stack, make_stack

from services.jobdb import checkpoints, events, jobs, metrics, tokens
from tests.own_data_files import (
    ensure_example_plugin,
    make_image_folder,
    train_tokenizer,
    write_text,
)

SECRET = f"secret-{uuid.uuid4().hex}"  # the worker's AWS_SECRET_ACCESS_KEY
ALICE_TEXT = f"alice-private-{uuid.uuid4().hex[:12]}"  # in alice's files only
JOB_TIMEOUT_S = 180.0
TINY = {"micro_batch_size": 8, "accumulation_steps": 1, "max_steps": 4, "checkpoint_every": 2,
        "optimizer": {"name": "sgd", "lr": 0.05}, "seed": 1, "gpus": 0}


class Service:
    def __init__(self, stack: Stack, api: ApiProcess, alice: str, bob: str, names: tuple[str, str]) -> None:
        self.stack, self.api = stack, api
        self.alice_name, self.bob_name = names
        self.alice, self.bob = {"Authorization": f"Bearer {alice}"}, {"Authorization": f"Bearer {bob}"}
        self.data = stack.settings.home / "data"

    def submit(self, headers: dict[str, str], **spec: Any) -> httpx.Response:
        return httpx.post(f"{self.api.url}/v1/jobs", json={**TINY, **spec, "queue": self.stack.queue},
                          headers=headers, timeout=30)

    def finished(self, job_id: str, headers: dict[str, str]) -> dict[str, Any]:
        deadline = time.monotonic() + JOB_TIMEOUT_S
        while time.monotonic() < deadline:
            job = httpx.get(f"{self.api.url}/v1/jobs/{job_id}", headers=headers, timeout=30).json()
            if job["status"] in ("succeeded", "failed", "cancelled"):
                return job
            time.sleep(0.3)
        raise AssertionError(f"job {job_id} did not finish:\n{self.stack.worker_logs()}")

    def everything_recorded(self, job_id: str, job: dict[str, Any]) -> str:
        """All a job left for its owner to read: the job (its error), its events (traceback
        included), its metrics and the bytes of its checkpoints."""
        with self.stack.sessions() as session:
            listed = events.list_events(session, job_id, limit=10_000)
            rows, _ = metrics.read_metrics(session, job_id, limit=10_000)
            stored = checkpoints.list_checkpoints(session, job_id)
        texts = [json.dumps(job), *(f"{e.kind} {e.message} {json.dumps(e.data)}" for e in listed),
                 *(f"{r.name} {r.value}" for r in rows)]
        cached = [self.stack.settings.cache_path / "objects" / c.key for c in stored]
        return "\n".join(texts) + "".join(p.read_bytes().hex() for p in cached if p.is_file())


@pytest.fixture(scope="module")
def service(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
            s3_server: Any) -> Iterator[Service]:
    ensure_example_plugin()  # before the API and the worker start, so they see its entry points
    stack = make_stack("postgres_redis", tmp_path_factory.mktemp("isolation"), request)
    stack.settings = stack.settings.model_copy(update={"artifacts_url": s3_server.url()})
    names = (f"alice-{uuid.uuid4().hex[:6]}", f"bob-{uuid.uuid4().hex[:6]}")
    with stack.sessions.begin() as session:
        _, alice = tokens.create_owner_with_token(session, names[0])
        stack.owner, bob = tokens.create_owner_with_token(session, names[1])
    # <home>/data is everyone's, as by default; data/users/<owner> and an s3 prefix per owner
    # are each owner's own (issue 42).
    data = stack.settings.home / "data"
    roots = json.dumps([str(data), f"{data}/users/{{owner}}", "s3://datasets/users/{owner}"])
    stack.start_worker(**{**s3_server.env, "AWS_SECRET_ACCESS_KEY": SECRET, "ACCUM_DATA_ROOTS": roots})
    try:
        # The stacks of one test session share a database, so other queues' workers are
        # registered: this queue is allowed before its own worker has registered too.
        env = {**stack.env(), **s3_server.env, "ACCUM_ALLOW_EMPTY_QUEUES": "1", "ACCUM_DATA_ROOTS": roots}
        with running_api(env, stack.logs / "api.log") as api:
            yield Service(stack, api, alice, bob, names)
    finally:
        stack.stop_workers()


def errors_at(response: httpx.Response) -> dict[str, dict[str, Any]]:
    assert response.status_code == 422, response.text
    return {e["loc"]: e for e in response.json()["errors"]}


def test_model_options_that_name_files_are_refused_at_submit_and_on_the_worker(
    service: Service, record_figure: Any,
) -> None:
    theirs = service.submit(service.alice, model="mlp", dataset="digits")
    assert theirs.status_code == 201, theirs.text
    assert service.finished(theirs.json()["id"], service.alice)["status"] == "succeeded"
    [cached] = sorted((service.stack.settings.cache_path / "objects" / theirs.json()["id"]).glob("*.pt"))[-1:]
    make_image_folder(service.data / "bob" / "images", per_class=4, size=8)
    images = {"name": "imagefolder", "data_root": str(service.data / "bob" / "images"), "image_size": 8}
    write_text(service.data / "bob" / "text", "jsonl", repeat=2)
    text = {"name": "files", "data_root": str(service.data / "bob" / "text"), "data_files": "text.jsonl",
            "tokenizer": "bytes", "max_len": 16}
    attacks = [  # (model, dataset, the field refused)
        ({"name": "timm:resnet18", "checkpoint_path": str(cached)}, images, "body.model.checkpoint_path"),
        ({"name": "timm:resnet18", "pretrained_cfg_overlay": {"file": str(cached)}}, images,
         "body.model.pretrained_cfg_overlay"),
        ({"name": "timm:resnet18", "pretrained": True, "weights": str(cached)}, images, "body.model.weights"),
        ({"name": "hf:gpt2", "n_layer": 1, "name_or_path": str(cached)}, text, "body.model.name_or_path"),
        ({"name": f"hf:{service.data / 'bob'}", "cache_dir": str(cached.parent)}, text, "body.model.cache_dir"),
        ({"name": "example_mlp", "hidden": 8, "path": str(cached)}, "example_blobs", "body.model.path"),
    ]
    refused = 0
    for model, dataset, field in attacks:
        errors = errors_at(service.submit(service.bob, model=model, dataset=dataset))
        assert field in errors, (field, errors)
        if field != "body.model.weights":  # an unknown option: the accepted ones are listed
            assert errors[field]["type"] == "unknown_option" and "accepted options" in errors[field]["msg"]
            assert "checkpoint_path" not in errors[field]["allowed"]
        refused += 1
    assert httpx.get(f"{service.api.url}/v1/jobs", headers=service.bob, timeout=30).json()["items"] == []

    # A spec stored past the API (written before the allow-list, or by another deployment).
    with service.stack.sessions.begin() as session:
        stored = jobs.create_job(
            session, owner=service.stack.owner, queue=service.stack.queue, max_restarts=0,
            spec={**TINY, "model": {"name": "timm:resnet18", "checkpoint_path": str(cached)}, "dataset": images,
                  "queue": service.stack.queue},
        )[0].id
    from services.dispatch.enqueue import enqueue_job

    enqueue_job(service.stack.settings, stored, service.stack.queue)
    job = service.finished(stored, service.bob)
    assert job["status"] == "failed", job
    assert "does not accept option 'checkpoint_path'" in job["error"]["message"], job["error"]
    recorded = service.everything_recorded(stored, job)
    with service.stack.sessions() as session:
        assert checkpoints.list_checkpoints(session, stored) == []
        assert metrics.read_metrics(session, stored, limit=10)[0] == []  # nothing trained
    leaked = int(cached.read_bytes().hex()[:4096] in recorded)
    refused += 1
    record_figure(
        "model_option_files", area="bad input",
        check="Model options that name files (issue 25 item 1): timm checkpoint_path and pretrained_cfg_overlay, "
              "weights outside the data roots, an hf: config key, an option of a saved hf: directory, a plugin "
              "option, each naming another owner's cached checkpoint; and one such spec stored past the API",
        figure=f"{refused}/{len(attacks) + 1} refused ({len(attacks)} with a 422 at model.<option> at submit, "
               f"1 failed by the worker before building), {leaked} files leaked",
        passed=refused == len(attacks) + 1 and leaked == 0,
    )
    assert leaked == 0, "alice's checkpoint bytes reached bob's job"


def test_files_a_data_root_links_to_are_never_read(service: Service, record_figure: Any) -> None:
    alice, bob = service.data / "alice", service.data / "bob-links"
    make_image_folder(alice / "images", per_class=4, size=8)
    (alice / "private.jsonl").write_text(json.dumps({"body": ALICE_TEXT, "id": "1"}) + "\n")
    train_tokenizer(alice / "tok")
    import datasets

    datasets.Dataset.from_list([{"x": float(i), "y": i % 2, "note": ALICE_TEXT} for i in range(8)]).save_to_disk(
        str(alice / "saved"))
    bob.mkdir(parents=True)
    (bob / "env.csv").symlink_to("/proc/self/environ")  # the worker's environment: its AWS secret
    make_image_folder(bob / "images", per_class=4, size=8)
    (bob / "images" / "theirs").symlink_to(alice / "images" / "blue", target_is_directory=True)
    write_text(bob / "text", "jsonl", repeat=2)
    (bob / "text" / "tok").symlink_to(alice / "tok", target_is_directory=True)
    (bob / "rows.jsonl").write_text("".join(
        json.dumps({"img": {"bytes": None, "path": str(alice / "images" / "red" / "0.png")}, "y": i % 2}) + "\n"
        for i in range(8)))
    (bob / "bad.csv").write_text(f"a,b\n1,2\n{ALICE_TEXT},3,4\n")
    datasets.Dataset.from_list([{"x": float(i), "y": i % 2} for i in range(8)]).save_to_disk(str(bob / "saved"))
    state = json.loads((bob / "saved" / "state.json").read_text())
    state["_data_files"][0]["filename"] = f"../../alice/saved/{state['_data_files'][0]['filename']}"
    (bob / "saved" / "state.json").write_text(json.dumps(state))

    features = {"features": ["b"], "label": "a"}
    attacks = [  # (model, dataset, what the error says)
        ("mlp", {"name": "files", "data_root": str(bob), "data_files": "env.csv", "format": "csv",
                 "columns": features}, "'env.csv' leads outside data_root"),
        ("small_cnn", {"name": "imagefolder", "data_root": str(bob / "images"), "image_size": 8},
         "'theirs' leads outside data_root"),
        ("tiny_transformer", {"name": "files", "data_root": str(bob / "text"), "data_files": "text.jsonl",
                              "columns": {"text": "body"}, "tokenizer": "tok", "max_len": 16},
         "'tok' leads outside data_root"),
        ("small_cnn", {"name": "files", "data_root": str(bob), "data_files": "rows.jsonl",
                       "columns": {"image": "img", "label": "y"}, "image_size": 8}, "leads outside data_root"),
        ("mlp", {"name": "hf_disk", "data_root": str(bob / "saved"), "columns": {"features": ["x"], "label": "y"}},
         "'../../alice/saved/"),
        ("mlp", {"name": "files", "data_root": str(bob), "data_files": "bad.csv", "columns": features},
         "could not be read as csv"),
    ]
    failed_safely, leaked = 0, []
    for model, dataset, said in attacks:
        response = service.submit(service.bob, model=model, dataset=dataset)
        assert response.status_code == 201, response.text  # data_root itself is allowed
        job = service.finished(response.json()["id"], service.bob)
        assert job["status"] == "failed" and said in job["error"]["message"], (said, job["error"])
        recorded = service.everything_recorded(job["id"], job)
        if SECRET in recorded or ALICE_TEXT in recorded:
            leaked.append(said)
        failed_safely += 1
    record_figure(
        "data_root_links", area="bad input",
        check="Files under a data root (issue 25 item 2): links out to the worker's /proc/self/environ (its "
              "AWS secret), to another owner's image class, tokenizer and saved dataset (state.json naming "
              "../), an image column naming another owner's image, a CSV whose parse error quotes its line",
        figure=f"{failed_safely}/{len(attacks)} jobs failed, naming bob's own path (or only the reader's error "
               f"type); {len(leaked)} files leaked (the worker's secret or the other owner's text in an error, "
               "event, metric or checkpoint)",
        passed=failed_safely == len(attacks) and not leaked,
    )
    assert not leaked, leaked


def test_another_owners_files_are_refused_as_missing_ones_are(service: Service, record_figure: Any) -> None:
    users = service.data / "users"
    hers, his = users / service.alice_name, users / service.bob_name
    write_text(hers / "text", "jsonl", repeat=2)
    (hers / "model.pt").write_bytes(b"alice's weights")
    (hers / "hf").mkdir()
    his.mkdir(parents=True)
    (his / "link").symlink_to(hers / "text", target_is_directory=True)
    (his / "dangling").symlink_to(users / "nobody" / "text")
    text = {"name": "files", "data_files": "text.jsonl", "columns": {"text": "body"}, "tokenizer": "bytes",
            "max_len": 16}

    def data(root: str) -> dict[str, Any]:
        return {"model": "tiny_transformer", "dataset": {**text, "data_root": root}}

    def hf(root: str) -> dict[str, Any]:
        return {"model": f"hf:{root}", "dataset": {**text, "data_root": str(his)}}

    def init_from(uri: str) -> dict[str, Any]:
        return {**data(str(his)), "init_from": {"uri": uri}}

    nobody = users / "nobody"  # no such owner, no such folder
    routes = [  # (spec for a path, alice's path, a missing path, the field refused)
        (data, hers / "text", nobody / "text", "body.dataset.data_root"),
        (hf, hers / "hf", nobody / "hf", "body.model.name"),
        (init_from, hers / "model.pt", nobody / "model.pt", "body.init_from.uri"),
        (data, his / "link", his / "dangling", "body.dataset.data_root"),
        (data, f"s3://datasets/users/{service.alice_name}/text", "s3://datasets/users/nobody/text",
         "body.dataset.data_root"),
        (data, users, nobody, "body.dataset.data_root"),  # a folder holding hers
    ]
    def bobs_jobs() -> list[str]:
        listed = httpx.get(f"{service.api.url}/v1/jobs?limit=500", headers=service.bob, timeout=30).json()
        return [job["id"] for job in listed["items"]]

    before, same = bobs_jobs(), 0
    for spec, theirs, missing, field in routes:
        said = [errors_at(service.submit(service.bob, **spec(str(path))))[field]["msg"].replace(str(path), "<path>")
                for path in (theirs, missing)]
        assert said[0] == said[1] and "outside the allowed data roots" in said[0], said
        assert str(hers) not in said[0] and service.alice_name not in said[0], said
        same += 1
    assert bobs_jobs() == before  # nothing stored

    # Stored past the API: the worker refuses it with the same message, before reading anything.
    with service.stack.sessions.begin() as session:
        stored = jobs.create_job(session, owner=service.stack.owner, queue=service.stack.queue, max_restarts=0,
                                 spec={**TINY, **data(str(hers / "text")), "queue": service.stack.queue})[0].id
    from services.dispatch.enqueue import enqueue_job

    enqueue_job(service.stack.settings, stored, service.stack.queue)
    refused = service.finished(stored, service.bob)
    submitted = errors_at(service.submit(service.bob, **data(str(hers / "text"))))["body.dataset.data_root"]
    assert refused["status"] == "failed" and refused["error"]["type"] == "DataRootNotAllowed", refused
    assert refused["error"]["message"] == submitted["msg"], (refused["error"], submitted)
    assert "alice's weights" not in service.everything_recorded(stored, refused)

    response = service.submit(service.alice, **data(str(hers / "text")))
    assert response.status_code == 201, response.text
    trained = service.finished(response.json()["id"], service.alice)
    assert trained["status"] == "succeeded", (trained["error"], service.stack.worker_logs()[-3000:])
    record_figure(
        "owner_data_roots", area="bad input",
        check="Owners' data roots (issue 42 item 1): data/users/{owner} and s3://datasets/users/{owner} are each "
              "owner's own; bob names alice's files by data_root, an hf: directory, init_from.uri, a link in his "
              "own folder, an s3 prefix and the folder holding hers, and one such job is stored past the API",
        figure=f"{same}/{len(routes)} refused at submit with the message a missing path gets; the stored job "
               f"failed on the worker ({refused['error']['type']}) with the same message; alice's own job "
               f"{trained['status']}",
        passed=same == len(routes) and trained["status"] == "succeeded",
    )
