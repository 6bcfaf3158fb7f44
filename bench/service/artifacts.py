"""Artifact store figures (issue 14), one JSON object on stdout:

    .venv/bin/python -m bench.service.artifacts [--rounds 3] [--mb 100] [--steps 1500] [--quick] [--out [DIR]]

- ``upload``: MB/s of a ``--mb`` MB checkpoint put to a local S3 server (moto, server mode, in
  its own process) by obstore (what accum uses: hashing what it sends, and, as the worker now
  does, given the writer's sha256 and size) and by s3fs, each against writing the same
  bytes to a local file (fsync'd) in the same round; rounds interleaved, medians reported,
  ratio = S3 MB/s / local-file MB/s.
- ``fetch``: resume fetch of that checkpoint into a node cache (``NodeCache.fetch``: download
  and sha256) cold, and warm (already cached: the sha256 check alone).
- ``trainer_checkpoint_ms``: the trainer's time per checkpoint of that job's size
  (``save_checkpoint``), with fsync (a library user's default) and without (the worker's staged
  files, whose durable copy is the store's), interleaved.
- ``throughput``: a real job (``run_job`` in this process, S3 store) with a checkpoint about
  every 2 s over the same job without checkpoints; steps/s from the loss rows' timestamps
  (first to last step: model building is out), rounds interleaved; target >= 0.95. A third run
  per round takes the checkpoint path as it was before the staged file skipped its fsyncs and
  the put took the trainer's sha256 (``as_before_the_fixes``), for the fixes' effect.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.harness import common as _common

ROOT = Path(__file__).resolve().parents[2]
BUCKET = "bench"
# ~9 MB checkpoints (1.1 M parameters and SGD momentum) on digits: cheap steps, real files.
JOB = {"model": {"name": "mlp", "hidden": 1024, "depth": 2}, "dataset": "digits",
       "micro_batch_size": 32, "accumulation_steps": 2, "keep_checkpoints": 2,
       "optimizer": {"name": "sgd", "lr": 0.01, "momentum": 0.9}, "seed": 3, "gpus": 0}


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_s3(nice: int) -> tuple[subprocess.Popen[bytes], str]:
    """moto's S3 server in its own process (not this one's GIL), with the bench bucket;
    ``nice`` > 0 runs it at a lower priority, as a store on another machine would not take
    this one's cores at all."""
    port = free_port()
    prefix = ["nice", "-n", str(nice)] if nice else []
    process = subprocess.Popen([*prefix, sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    os.environ.update(AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench",
                      AWS_REGION="us-east-1", AWS_ENDPOINT_URL=endpoint)
    import boto3

    client = boto3.client("s3", endpoint_url=endpoint)
    deadline = time.monotonic() + 30
    while True:
        try:
            client.create_bucket(Bucket=BUCKET)
            return process, endpoint
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def local_write(source: Path, target: Path) -> None:
    with source.open("rb") as src, target.open("wb") as out:
        while chunk := src.read(8 * 1024 * 1024):
            out.write(chunk)
        out.flush()
        os.fsync(out.fileno())


def s3fs_put(fs: Any, source: Path, key: str) -> None:
    fs.put_file(str(source), f"{BUCKET}/{key}")


def upload_and_fetch(mb: int, rounds: int, tmp: Path) -> dict[str, Any]:
    import s3fs

    from services.artifacts import open_store
    from services.artifacts.cache import NodeCache

    source = tmp / "checkpoint.pt"
    block = os.urandom(1024 * 1024)
    with source.open("wb") as f:
        for _ in range(mb):
            f.write(block)
    sha = hashlib.sha256(source.read_bytes()).hexdigest()
    size_mb = source.stat().st_size / 1e6
    store = open_store(f"s3://{BUCKET}/upload")
    fs = s3fs.S3FileSystem(endpoint_url=os.environ["AWS_ENDPOINT_URL"])
    size = source.stat().st_size
    seconds: dict[str, list[float]] = {"local_file": [], "obstore": [], "obstore_writer_sha": [],
                                       "s3fs": [], "fetch_cold": [], "fetch_warm": []}
    for n in range(rounds):  # interleaved: each round measures every variant once
        for name, run in (
            ("local_file", lambda: local_write(source, tmp / "copy.pt")),
            ("obstore", lambda n=n: store.put(f"r{n}/obstore.pt", source, sha)),
            ("obstore_writer_sha", lambda n=n: store.put(f"r{n}/known.pt", source, sha, size=size)),
            ("s3fs", lambda n=n: s3fs_put(fs, source, f"upload/r{n}/s3fs.pt")),
        ):
            start = time.perf_counter()
            run()
            seconds[name].append(time.perf_counter() - start)
        cache = NodeCache(tmp / f"cache{n}", 10 * mb * 1024 * 1024)
        for name in ("fetch_cold", "fetch_warm"):
            start = time.perf_counter()
            cache.fetch(store, f"r{n}/obstore.pt", sha)
            seconds[name].append(time.perf_counter() - start)
    med = {k: statistics.median(v) for k, v in seconds.items()}
    uploads = ("local_file", "obstore", "obstore_writer_sha", "s3fs")
    mbps = {k: round(size_mb / med[k], 1) for k in uploads}
    return {
        "checkpoint_mb": round(size_mb, 1),
        "upload_mb_per_s": mbps,
        "upload_ratio_to_local_file": {k: round(mbps[k] / mbps["local_file"], 3)
                                       for k in uploads[1:]},
        "fetch_s": {"cold": round(med["fetch_cold"], 3), "warm": round(med["fetch_warm"], 3)},
        "seconds": {k: [round(x, 3) for x in v] for k, v in seconds.items()},
    }


def steps_per_s(settings: Any, job_id: str) -> float:
    from services.jobdb.metrics import read_metrics
    from services.jobdb.sessions import session_factory

    with session_factory(settings)() as session:
        rows, _ = read_metrics(session, job_id, name="loss", limit=1_000_000)
    first, last = rows[0], rows[-1]
    return (last.step - first.step) / (last.ts - first.ts).total_seconds()


def run_job_once(settings: Any, spec: dict[str, Any]) -> tuple[float, int]:
    from services.jobdb import checkpoints, jobs, tokens
    from services.jobdb.sessions import session_factory
    from services.worker.runner import run_job

    with session_factory(settings).begin() as session:
        owner, _ = tokens.create_owner_with_token(session, f"bench-{uuid.uuid4().hex[:8]}")
        job, _ = jobs.create_job(session, owner=owner, spec=spec, queue="bench")
    assert run_job(settings, job.id, "bench") == "succeeded"
    with session_factory(settings)() as session:
        kept = len(checkpoints.list_checkpoints(session, job.id))
    return steps_per_s(settings, job.id), kept


@contextlib.contextmanager
def as_before_the_fixes() -> Iterator[None]:
    """The checkpoint path as it was before (the baseline of the fixes' figure): the trainer
    fsyncs its staged file and directory, and the put reads and hashes the file again instead
    of taking the trainer's sha256 and size."""
    from unittest import mock

    import services.worker.build as build
    from services.artifacts.s3 import S3Store

    trainer, put = build.Trainer, S3Store.put

    def fsyncing(*args: Any, **kwargs: Any) -> Any:
        return trainer(*args, **{**kwargs, "checkpoint_fsync": True})

    def rehashing(self: S3Store, key: str, source: Path, sha256: str | None = None, **_: Any) -> Any:
        return put(self, key, source, sha256)

    with mock.patch.object(build, "Trainer", fsyncing), mock.patch.object(S3Store, "put", rehashing):
        yield


def throughput(steps: int, rounds: int, tmp: Path) -> dict[str, Any]:
    from services.jobdb.migrate import upgrade
    from services.settings import Settings

    settings = Settings(home=tmp / "home", artifacts_url=f"s3://{BUCKET}/jobs")
    upgrade(settings.database_url)
    plain = {**JOB, "max_steps": steps, "checkpoint_every": steps * 10}
    calibration, _ = run_job_once(settings, plain)  # also warms imports and the dataset
    every = max(1, round(2.0 * calibration))  # a checkpoint about every 2 s
    checkpointed = {**JOB, "max_steps": steps, "checkpoint_every": every}
    rates: dict[str, list[float]] = {"none": [], "every_2s": [], "every_2s_before_fixes": []}
    for _ in range(rounds):
        rates["none"].append(run_job_once(settings, plain)[0])
        rates["every_2s"].append(run_job_once(settings, checkpointed)[0])
        with as_before_the_fixes():
            rates["every_2s_before_fixes"].append(run_job_once(settings, checkpointed)[0])
    ratios = {k: [c / n for c, n in zip(rates[k], rates["none"], strict=True)]
              for k in ("every_2s", "every_2s_before_fixes")}
    return {
        "steps": steps,
        "checkpoint_every": every,
        "checkpoints_per_run": steps // every,
        "steps_per_s": {k: [round(x, 1) for x in v] for k, v in rates.items()},
        "ratio_checkpointed_over_none": round(statistics.median(ratios["every_2s"]), 3),
        "ratios": [round(r, 3) for r in ratios["every_2s"]],
        "ratio_before_fixes_over_none": round(statistics.median(ratios["every_2s_before_fixes"]), 3),
        "ratios_before_fixes": [round(r, 3) for r in ratios["every_2s_before_fixes"]],
        "target": 0.95,
    }


def trainer_write_ms(rounds: int, tmp: Path) -> dict[str, Any]:
    """The trainer's own time per checkpoint (``save_checkpoint``: serialise, sha256, write) of
    the bench job's state size, with the fsyncs (a library default) and without (the worker's
    staged files), interleaved; medians in ms."""
    import torch

    from accumcore import save_checkpoint

    state = {"w": torch.randn(2 * 1024 * 1024 + 256 * 1024)}  # ~9 MB, as the job's checkpoints
    ms: dict[str, list[float]] = {"fsync": [], "no_fsync": []}
    for n in range(rounds * 5):
        for name in ms:
            start = time.perf_counter()
            save_checkpoint(state, tmp / f"w{n}.pt", fsync=name == "fsync")
            ms[name].append((time.perf_counter() - start) * 1000)
            (tmp / f"w{n}.pt").unlink()
    return {k: round(statistics.median(v), 1) for k, v in ms.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--mb", type=int, default=100)
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--skip-throughput", action="store_true")
    parser.add_argument("--skip-store", action="store_true", help="no upload/fetch figures")
    parser.add_argument("--server-nice", type=int, default=0,
                        help="run the S3 server at this nice value (it shares this machine's cores)")
    parser.add_argument("--quick", action="store_true", help="smoke run: 1 round, 2 MB, 30 steps")
    _common.add_out_argument(parser)
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.mb, args.steps = 1, 2, 30
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    server, _ = start_s3(args.server_nice)
    try:
        with tempfile.TemporaryDirectory() as folder:
            tmp = Path(folder)
            result: dict[str, Any] = {
                "machine": {"cpu_count": os.cpu_count(), "python": platform.python_version(),
                            "load_average_1m": round(os.getloadavg()[0], 2)},
                "s3_server": f"moto 5.2.5, server mode, localhost, nice {args.server_nice}",
            }
            if not args.skip_store:
                result["store"] = upload_and_fetch(args.mb, args.rounds, tmp)
            if not args.skip_throughput:
                result["trainer_checkpoint_ms"] = trainer_write_ms(args.rounds, tmp)
                result["throughput"] = throughput(args.steps, args.rounds, tmp)
            result["machine"]["load_average_1m_end"] = round(os.getloadavg()[0], 2)
    finally:
        server.terminate()
        server.wait(10)
    _common.emit("artifacts", result, args)


if __name__ == "__main__":
    main()
