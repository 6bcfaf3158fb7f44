"""ResNet-50 bf16 training images/s through a real job: API -> worker -> accumcore.

Only meaningful on a GPU (target: >= 3,000 img/s on one H100; NVIDIA's published A100 AMP
figure for the same model is 2,470 img/s). It starts the local service (`accum demo`'s
LocalService: SQLite database and broker under a temporary ACCUM_HOME, the API and one
worker as subprocesses), submits a ResNet-50 job on synthetic 224x224 `fake` data with
precision bf16 and the fast path, waits for it, and reads the job's `samples_per_s` metric
over HTTP (median after the warm-up steps). Without a GPU it reports `skipped: no GPU` and
no number. `--cpu-pipeline` runs the same path with a tiny CPU job, to check the plumbing.

    .venv/bin/python -m bench.service.resnet50_h100 [--quick] [--out] [--cpu-pipeline]
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.harness import common as _common

TARGET = 3000.0
WARMUP_STEPS = 10


def gpu_spec(steps: int) -> dict[str, Any]:
    return {
        "name": "bench-resnet50-bf16",
        "model": "resnet50",
        "dataset": {"name": "fake", "size": 256 * steps, "val_size": 256, "image_size": 224,
                    "num_classes": 1000},
        "micro_batch_size": 256, "accumulation_steps": 1, "max_steps": steps,
        "precision": "bf16", "fast_path": True, "gpus": 1,
        "optimizer": {"name": "sgd", "lr": 0.1, "momentum": 0.9},
    }


def cpu_spec() -> dict[str, Any]:
    return {"name": "bench-pipeline-check", "model": "mlp", "dataset": "digits",
            "micro_batch_size": 16, "accumulation_steps": 2, "max_steps": 12 + WARMUP_STEPS,
            "optimizer": {"name": "sgd", "lr": 0.05}, "gpus": 0}


def run_job(spec: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    """Start API + worker under a fresh ACCUM_HOME, run `spec`, return status and img/s."""
    from accum import AccumClient
    from services.cli.local import LocalService
    from services.ports import free_port
    from services.settings import Settings

    with tempfile.TemporaryDirectory() as home:
        settings = Settings(home=Path(home))  # embedded SQLite database and broker
        os.environ["ACCUM_HOME"] = home
        service = LocalService(settings, port=free_port(), log_dir=Path(home) / "logs")
        try:
            token = service.start()
            with AccumClient(service.url, token) as client:
                job_id = str(client.submit(spec)["id"])
                deadline = time.monotonic() + timeout_s
                job = client.job(job_id)
                while job["status"] not in ("succeeded", "failed", "cancelled"):
                    if time.monotonic() > deadline:
                        client.cancel(job_id)
                        return {"status": "timeout", "job_id": job_id}
                    time.sleep(2)
                    job = client.job(job_id)
                points = client.metrics(job_id, name="samples_per_s")
        finally:
            service.stop()
    rates = [float(p["value"]) for p in sorted(points, key=lambda p: p["step"])][WARMUP_STEPS:]
    result = {"status": job["status"], "job_id": job_id, "steps_measured": len(rates),
              "images_per_s": _common.median(rates) if rates else None}
    if job["status"] != "succeeded":
        result["error"] = job.get("error")  # why, for a run that left no figure
    return result


def main() -> None:
    parser = _common.base_parser(__doc__.splitlines()[0])
    parser.add_argument("--cpu-pipeline", action="store_true", help="tiny CPU job through the same path")
    args = parser.parse_args()
    import torch

    gpu = torch.cuda.is_available()
    out: dict[str, Any] = {"machine": _common.machine("cuda" if gpu else "cpu"),
                           "figure": "ResNet-50 bf16 images/s through API -> worker -> accumcore",
                           "target": TARGET}
    if gpu and not args.quick:
        result = run_job(gpu_spec(steps=60), timeout_s=540)
        out.update(result, measured=result["images_per_s"],
                   verdict=_common.verdict(result["images_per_s"], TARGET, True))
    elif args.cpu_pipeline:
        result = run_job(cpu_spec(), timeout_s=300)
        out.update(result, measured=None, verdict="not measured",
                   skipped="no GPU: ran the CPU pipeline check instead (not a ResNet-50 figure)")
    else:
        reason = "quick mode" if gpu else "no GPU: torch.cuda.is_available() is False on this machine"
        out.update(measured=None, verdict="not measured", skipped=reason)
    _common.emit("resnet50_h100", out, args)


if __name__ == "__main__":
    main()
