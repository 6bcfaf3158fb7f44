"""An ``s3://`` data_root through real workers on two nodes (PostgreSQL + Redis, moto's S3), laid
out as the README deploys it: ACCUM_DATA_ROOTS lists the bucket prefix, each node syncs it into
its own cache and trains from there. A bucket the list does not name is refused before a
single object is fetched, with a message that names neither the allowed roots nor the node's
cache."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from services.artifacts import open_store
from tests.own_data_files import make_image_folder
from tests.s3_server import S3Server
from tests.worker_stack import Stack, make_stack

pytestmark = pytest.mark.slow


def upload_tree(local: Path, url: str) -> int:
    store = open_store(url)
    files = [p for p in local.rglob("*") if p.is_file()]
    for path in files:
        store.put(str(path.relative_to(local)), path)
    return len(files)


def images_at(url: str) -> dict[str, object]:
    return {"name": "imagefolder", "data_root": url, "image_size": 16, "val_fraction": 0.25}


def test_an_s3_data_root_trains_on_two_nodes_and_another_bucket_is_refused_unfetched(
    request: pytest.FixtureRequest, tmp_path: Path, s3_url: str, s3_server: S3Server,
    record_figure: Callable[..., None],
) -> None:
    allowed = f"{s3_url}/datasets"
    dataset = f"{allowed}/colours"
    assert upload_tree(make_image_folder(tmp_path / "colours", per_class=6, size=16), dataset) == 18
    other_bucket = f"other-{uuid.uuid4().hex[:8]}"  # readable with the same credentials
    s3_server.create_bucket(other_bucket)
    upload_tree(make_image_folder(tmp_path / "secret", per_class=2, size=16), f"s3://{other_bucket}/secret")

    (tmp_path / "stack").mkdir()
    stack: Stack = make_stack("postgres_redis", tmp_path / "stack", request)
    own = stack.variant(tmp_path, artifacts_url=f"{s3_url}/artifacts")
    roots = json.dumps([str(tmp_path / "local-data"), allowed])
    homes = [tmp_path / f"node{i}" for i in (1, 2)]
    spec = {"model": "small_cnn", "dataset": images_at(dataset), "micro_batch_size": 6,
            "accumulation_steps": 1, "max_steps": 4, "checkpoint_every": 2}
    try:
        succeeded = []
        for home in homes:  # one node after the other: each syncs the dataset itself
            own.start_worker(ACCUM_HOME=str(home), ACCUM_CACHE_DIR=str(home / "cache"),
                             ACCUM_DATA_ROOTS=roots)
            job = own.wait(own.create(**spec), timeout=240)
            assert job.status == "succeeded", (job.error, own.worker_logs())
            synced = home / "cache" / "data" / dataset.removeprefix("s3://")
            assert len([p for p in synced.rglob("*.png")]) == 18
            succeeded.append(job.id)
            if home != homes[-1]:
                own.stop_workers()

        refused = own.wait(own.create(**{**spec, "dataset": images_at(f"s3://{other_bucket}/secret")}),
                           timeout=120)
        assert refused.status == "failed" and refused.error is not None
        assert refused.error["type"] == "DataRootNotAllowed"
        assert "outside the allowed data roots" in refused.error["message"]
        message = refused.error["message"]
        assert allowed not in message and str(tmp_path) not in message  # no roots, no cache path
        # The sync would have made <cache>/data/<bucket>/ for its temp directory: not a byte read.
        assert not [home for home in homes if (home / "cache" / "data" / other_bucket).exists()]
    finally:
        own.stop_workers()
    record_figure(
        "s3_data_root_two_nodes",
        area="fault",
        check="an s3:// data_root listed in ACCUM_DATA_ROOTS trains on two worker nodes (each syncs "
              "it into its own cache); a readable bucket outside the list is refused",
        figure=f"{len(succeeded)}/2 nodes trained the s3 dataset; other bucket: DataRootNotAllowed, "
               "0 objects fetched, no root or cache path in the message",
        passed=True,
    )
