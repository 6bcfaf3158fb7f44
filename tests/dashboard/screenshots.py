"""Screenshots of the dashboard's main pages for the README, at a laptop's and a phone's size.

    python tests/dashboard/screenshots.py docs/screenshots      # what `make screenshots` runs

Starts the embedded stack (SQLite database and broker, one worker, the API) in a temporary
ACCUM_HOME, trains a few small jobs on digits (batch 64 against 16 x 4, a CNN, one left
running), writes a diverged run's history the way a worker would (its loss went NaN at step 31,
which under the default on_nonfinite: fail stopped it before that step was logged), then
drives Debian's Chromium through the pages at 1366x900 and 360x800 and saves
`<page>-desktop.png` and `<page>-phone.png`. Takes about two minutes on a CPU.
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "src"), str(ROOT), str(ROOT / "tests")]

import httpx  # noqa: E402
from api_process import running_api  # noqa: E402
from worker_stack import make_stack  # noqa: E402

from services.jobdb import events, leases, metrics, tokens  # noqa: E402
from services.jobdb.models import Job  # noqa: E402
from services.jobdb.types import utcnow  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"]
SIZES = {"desktop": {"width": 1366, "height": 900}, "phone": {"width": 360, "height": 800}}
BASE: dict[str, Any] = {
    "model": "mlp", "dataset": "digits", "gpus": 0, "seed": 3, "eval_every": 10,
    "optimizer": {"name": "sgd", "lr": 0.05, "momentum": 0.9}, "checkpoint_every": 20,
}
JOBS = [
    {**BASE, "name": "batch-64", "micro_batch_size": 64, "accumulation_steps": 1, "max_steps": 60},
    {**BASE, "name": "batch-16x4", "micro_batch_size": 16, "accumulation_steps": 4, "max_steps": 60},
    {**BASE, "name": "cnn-digits", "model": "small_cnn", "micro_batch_size": 16, "accumulation_steps": 4,
     "epochs": 2, "eval_every": None, "optimizer": {"name": "adamw", "lr": 0.003},
     "scheduler": {"name": "cosine", "warmup_steps": 5}},
]
LONG = {**BASE, "name": "long-run", "micro_batch_size": 32, "accumulation_steps": 2, "max_steps": 100_000,
        "checkpoint_every": 100, "eval_every": 50}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="folder for the PNGs (e.g. docs/screenshots)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="accum-shots-") as tmp:
        stack = make_stack("sqlite", Path(tmp), None)  # type: ignore[arg-type]
        with stack.sessions.begin() as session:
            _, token = tokens.create_owner_with_token(session, "dana", admin=True)
        stack.start_worker()
        try:
            with running_api(stack.env(), stack.logs / "api.log") as api:
                shoot(api.url, token, stack, args.out)
        finally:
            stack.stop_workers()
    print(f"screenshots in {args.out}")
    return 0


def submit(client: httpx.Client, spec: dict[str, Any], queue: str) -> str:
    body = {k: v for k, v in {**spec, "queue": queue}.items() if v is not None}
    response = client.post("/v1/jobs", json=body)
    response.raise_for_status()
    return str(response.json()["id"])


def diverged(stack: Any) -> str:
    """A job whose loss went NaN at step 31, as a worker records it: steps 1-30 logged, then
    the trainer's NonFiniteError (on_nonfinite: fail) fails the job before step 31 is logged."""
    job_id = stack.create(enqueue=False, name="lr-too-high", max_steps=60,
                          optimizer={"name": "sgd", "lr": 8.0})
    with stack.sessions.begin() as session:
        session.get(Job, job_id).name = "lr-too-high"
        leases.claim_job(session, job_id, "gpu0@node1", "node1", "cpu", 60)
    start = utcnow().timestamp() - 60
    rows = []
    for step in range(1, 31):
        loss = 2.3 * math.exp(-step / 40) * (1 + step / 20) ** 3
        stamp = datetime.fromtimestamp(start + step * 0.2, tz=UTC)
        rows += [{"name": "loss", "step": step, "epoch": 0, "value": loss, "ts": stamp},
                 {"name": "lr", "step": step, "epoch": 0, "value": 8.0, "ts": stamp},
                 {"name": "grad_norm", "step": step, "epoch": 0, "value": loss * 4, "ts": stamp},
                 {"name": "samples_per_s", "step": step, "epoch": 0, "value": 5200.0 + 40 * math.sin(step), "ts": stamp}]
    message = ("step 31: loss is nan; the last checkpoint with finite values is s3://accum/lr-too-high/20.pt (step 20). "
               "Lower the learning rate, clip gradients (grad_clip_norm), or pass on_nonfinite='skip' to skip such steps")
    with stack.sessions.begin() as session:
        metrics.write_metrics(session, job_id, 1, rows)
        leases.update_progress(session, job_id, {"optimizer_step": 30, "epoch": 0},
                               {"loss": rows[-4]["value"], "lr": 8.0, "grad_norm": rows[-2]["value"]})
        events.add_event(session, job_id, "traceback", f"NonFiniteError: {message}",
                         {"traceback": "Traceback (most recent call last):\n  File \"accumcore/trainer.py\", "
                          "line 412, in fit\n    self._check_finite(loss)\naccumcore.NonFiniteError: " + message},
                         attempt=1)
        stop = {"step": 31, "metric": "loss", "value": "NaN"}  # the structured error.nonfinite
        leases.finish_job(session, job_id, "gpu0@node1", "failed",
                          {"type": "NonFiniteError", "message": message, "nonfinite": stop})
    return job_id


def shoot(url: str, token: str, stack: Any, out: Path) -> None:
    from playwright.sync_api import sync_playwright

    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30) as client:
        short = [submit(client, spec, stack.queue) for spec in JOBS]
        bad = diverged(stack)
        for job_id in short:
            stack.wait(job_id, ("succeeded",), timeout=300)
        long_id = submit(client, LONG, stack.queue)
        stack.wait(long_id, ("running",), timeout=120)
        time.sleep(8)  # a few hundred steps and an evaluation to draw
        pages = {
            "jobs": "#/jobs",
            "job-running": f"#/jobs/{long_id}",
            "job-diverged": f"#/jobs/{bad}",
            "compare": f"#/compare?ids={short[0]},{short[1]}&metrics=loss,val_loss",
            "submit": "#/submit",
            "tokens": "#/tokens",
        }
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            for size_name, viewport in SIZES.items():
                context = browser.new_context(viewport=viewport, base_url=url, device_scale_factor=1)
                context.add_init_script(f"localStorage.setItem('accum.token', {token!r})")
                page = context.new_page()
                for name, hash_ in pages.items():
                    page.goto(f"/{hash_}")
                    page.wait_for_selector("main h1")
                    page.wait_for_timeout(2000)  # charts drawn, live points in
                    page.screenshot(path=str(out / f"{name}-{size_name}.png"))
                context.close()
            browser.close()
        client.post(f"/v1/jobs/{long_id}/cancel")


if __name__ == "__main__":
    raise SystemExit(main())
