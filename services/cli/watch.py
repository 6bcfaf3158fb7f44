"""`accum watch ID`: a live progress bar and metric lines from the job's SSE stream.

The bar shows optimizer step / total, loss and samples/s; evaluations and lifecycle events
print as lines above it. The command exits when the job ends: 0 succeeded, 3 failed,
4 cancelled. If the stream drops (server restart), it reconnects until the job is final.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)

from accum import AccumAPIError, AccumClient
from services.cli.common import EXIT_CODES, FINAL_STATUSES, make_client

RECONNECT_DELAY_S = 1.0
MAX_RECONNECTS = 60  # consecutive failures, one second apart


def register(commands: Any) -> None:
    watch = commands.add_parser("watch", help="follow a job live until it ends")
    watch.add_argument("job_id", metavar="ID")
    watch.set_defaults(func=cmd_watch)


def cmd_watch(args: argparse.Namespace) -> int:
    with make_client() as client:
        final = watch_job(client, args.job_id)
    return EXIT_CODES.get(final["status"], 1)


def _fmt(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


class _Display:
    """Turns stream messages into bar updates and printed lines."""

    def __init__(
        self, progress: Progress, task: TaskID, console: Console, epochs: int | None
    ) -> None:
        self.progress, self.task, self.console = progress, task, console
        self.epochs = epochs
        self.seen_events: set[Any] = set()
        self.pending_eval: dict[str, Any] = {}
        self.pending_step: Any = None
        self.status = "queued"

    def apply_job(self, job: dict[str, Any]) -> None:
        progress = job.get("progress") or {}
        total = progress.get("total_optimizer_steps")
        step = progress.get("optimizer_step") or 0
        if job.get("status") and job["status"] != self.status:
            self.status = job["status"]
        self.progress.update(
            self.task, total=total or None, completed=step, status=self.status,
            epoch=self.epoch_label(progress.get("epoch")),
        )

    def epoch_label(self, epoch: Any) -> str:
        """The API counts epochs from 0; people count from 1."""
        if not isinstance(epoch, int):
            return "-"
        return f"{epoch + 1}/{self.epochs}" if self.epochs else str(epoch + 1)

    def on_metric(self, metric: dict[str, Any]) -> None:
        name, step, value = metric.get("name", ""), metric.get("step"), metric.get("value")
        if name.startswith("val_"):
            if self.pending_step is not None and step != self.pending_step:
                self.flush_eval()
            self.pending_step = step
            self.pending_eval[name] = value
            return
        self.flush_eval()
        fields: dict[str, Any] = {"epoch": self.epoch_label(metric.get("epoch"))}
        if name == "loss":
            fields["loss"] = _fmt(value)
        elif name == "samples_per_s":
            fields["sps"] = f"{value:.0f}" if isinstance(value, float | int) else str(value)
        if isinstance(step, int):
            current = self.progress.tasks[self.task].completed
            fields["completed"] = max(current, step)
        self.progress.update(self.task, **fields)

    def on_event(self, event: dict[str, Any]) -> None:
        key = event.get("id") or (event.get("kind"), event.get("created_at"))
        if key in self.seen_events:
            return
        self.seen_events.add(key)
        self.flush_eval()
        kind, message = str(event.get("kind")), str(event.get("message") or "")
        line = f"[{kind}]" if message in ("", kind) else f"[{kind}] {message}"
        self.console.print(line, markup=False)

    def flush_eval(self) -> None:
        if not self.pending_eval:
            return
        shown = "  ".join(f"{k} {_fmt(v)}" for k, v in sorted(self.pending_eval.items()))
        self.console.print(f"step {self.pending_step}  {shown}", markup=False)
        self.pending_eval, self.pending_step = {}, None


def watch_job(client: AccumClient, job_id: str, console: Console | None = None) -> dict[str, Any]:
    """Follow a job until it is final; returns the final job object."""
    console = console or Console()
    job = client.job(job_id)
    if job["status"] in FINAL_STATUSES:
        console.print(f"job {job_id} already {job['status']}", markup=False)
        return job
    progress = Progress(
        # markup=False: job names and "[running]" are text, not rich markup tags.
        TextColumn(
            "{task.description} [{task.fields[status]}] epoch {task.fields[epoch]}", markup=False
        ),
        # Logs and pipes get 80 columns: the numbers matter more there than the bar.
        *([BarColumn(bar_width=24)] if console.is_terminal else []),
        MofNCompleteColumn(),
        TextColumn("loss {task.fields[loss]}  {task.fields[sps]} samples/s", markup=False),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    )
    name = str(job.get("name") or job_id)
    with progress:
        task = progress.add_task(name, total=None, status=job["status"], epoch="-", loss="-", sps="-")
        epochs = (job.get("spec") or {}).get("epochs")
        display = _Display(progress, task, console, epochs if isinstance(epochs, int) else None)
        display.apply_job(job)
        failures = 0  # consecutive rounds in which neither stream nor job could be read
        while True:
            try:
                for event, data in client.stream_events(job_id):
                    if event == "status":
                        display.apply_job(data)
                    elif event == "metric":
                        display.on_metric(data)
                    elif event == "job_event":
                        display.on_event(data)
                    elif event == "end":
                        break
            except AccumAPIError as exc:
                # A dropped connection (0) or a server error may pass (restart, deploy): keep
                # polling the job below. A client error (404, 401) will not pass.
                if 0 < exc.status < 500:
                    raise
            display.flush_eval()
            try:
                job = client.job(job_id)
            except AccumAPIError as exc:
                failures += 1
                if 0 < exc.status < 500 or failures > MAX_RECONNECTS:
                    raise
            else:
                failures = 0
                display.apply_job(job)
                if job["status"] in FINAL_STATUSES:
                    break
            time.sleep(RECONNECT_DELAY_S)
    _print_outcome(console, job)
    return job


def _print_outcome(console: Console, job: dict[str, Any]) -> None:
    line = f"job {job['id']} {job['status']}"
    error = job.get("error")
    if error:
        line += f": {error.get('type')}: {error.get('message')}"
    console.print(line, markup=False)
