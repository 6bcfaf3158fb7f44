"""A ``nodes: 2`` job against ``gpus: 2`` on one node (CPU, gloo), one JSON object on stdout.

    .venv/bin/python -m bench.service.multi_node [--quick] [--steps 60] [--out FILE]

Two worker processes on this machine as two nodes (each its own ACCUM_HOME, ``--cpu-ranks 2``,
advertising 127.0.0.1; PostgreSQL + Redis; one file artifact store), three jobs of one spec
(same m, seed and effective batch), run one after the other:

1. ``gpus: 1, N: 4`` on one process (the reference trajectory),
2. ``gpus: 2, N: 2``: two gloo ranks on one worker,
3. ``nodes: 2, gpus: 1, N: 2``: one gloo rank on each of the two workers.

Figures: the max abs distance of the final weights of 2 and 3 from 1 (float32; target: round-off,
<= 1e-5), and the throughput ratio of 3 / 2 (optimizer steps per second between the first and
the last step, from the loss metrics' timestamps; both in this one run).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.harness.common import base_parser, emit, machine, verdict
from bench.service.worker import ROOT, Deployment

ROUND_OFF = 1e-5


def spec(steps: int, **batching: Any) -> dict[str, Any]:
    return {"model": {"name": "mlp", "hidden": 256, "depth": 2}, "dataset": "digits",
            "micro_batch_size": 32, "max_steps": steps, "optimizer": {"name": "sgd", "lr": 0.05, "momentum": 0.9},
            "checkpoint_every": 100_000, "seed": 3, **batching}


def final_weights(deployment: Deployment, job_id: str) -> dict[str, Any]:
    import torch

    from services.artifacts import open_store
    from services.jobdb import checkpoints
    from services.jobdb.sessions import session_factory

    with session_factory(deployment.settings)() as session:
        latest = checkpoints.list_checkpoints(session, job_id)[-1]
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "final.pt"
        open_store(deployment.settings.artifacts_url).get(latest.key, path, latest.sha256)
        return dict(torch.load(path, weights_only=True)["model"])


def distance(a: dict[str, Any], b: dict[str, Any]) -> float:
    return max(float((a[n].double() - b[n].double()).abs().max()) for n in a)


def main() -> None:
    parser = base_parser(__doc__)
    parser.add_argument("--steps", type=int, default=60)
    args = parser.parse_args()
    steps = 20 if args.quick else args.steps
    store = Path(tempfile.mkdtemp(prefix="accum-bench-store-"))
    os.environ.update(ACCUM_CPU_RANKS="2", ACCUM_GANG_FORM_TIMEOUT_S="30",
                      ACCUM_ARTIFACTS_URL=store.as_uri(), ACCUM_ADVERTISE_ADDRESS="127.0.0.1")
    deployment = Deployment("postgres_redis", threads=1)
    second_home = deployment.tmp / "node2"
    log = open(deployment.tmp / "worker2.log", "wb")  # noqa: SIM115 - closed below
    second = subprocess.Popen(
        [sys.executable, "-m", "services.worker", "--queues", deployment.queue, "--loglevel", "WARNING",
         "--hostname", f"bench-node2-{os.getpid()}@localhost"],
        cwd=ROOT, env=dict(os.environ, ACCUM_HOME=str(second_home), ACCUM_DATABASE_URL=deployment.settings.database_url,
                           ACCUM_BROKER_URL=deployment.settings.broker_url, OMP_NUM_THREADS="1",
                           ACCUM_ALLOW_ROOT="1"),
        stdout=log, stderr=subprocess.STDOUT,
    )
    try:
        runs: dict[str, dict[str, Any]] = {}
        for name, batching in (("one_process", {"gpus": 1, "accumulation_steps": 4}),
                               ("gpus_2", {"gpus": 2, "accumulation_steps": 2}),
                               ("nodes_2", {"gpus": 1, "nodes": 2, "accumulation_steps": 2})):
            job_id = deployment.submit(spec(steps, **batching))
            deployment.wait(job_id, timeout=900, poll_s=0.5)
            runs[name] = {"job": job_id, "steps_per_s": deployment.step_rate(job_id),
                          "weights": final_weights(deployment, job_id)}
        reference = runs["one_process"]["weights"]
        worst = max(distance(runs[n]["weights"], reference) for n in ("gpus_2", "nodes_2"))
        ratio = runs["nodes_2"]["steps_per_s"] / runs["gpus_2"]["steps_per_s"]
        emit("multi_node", {
            "steps": steps,
            "distance_gpus_2": distance(runs["gpus_2"]["weights"], reference),
            "distance_nodes_2": distance(runs["nodes_2"]["weights"], reference),
            "steps_per_s": {n: round(r["steps_per_s"], 3) for n, r in runs.items()},
            "throughput_nodes_2_over_gpus_2": ratio,
            "target": ROUND_OFF, "measured": worst, "verdict": verdict(worst, ROUND_OFF, False),
            "machine": machine(),
        }, args)
    finally:
        second.terminate()
        try:
            second.wait(timeout=20)
        except subprocess.TimeoutExpired:
            second.kill()
        log.close()
        deployment.close()


if __name__ == "__main__":
    main()
