"""`accum watch ID`: a job's story so far, then live progress until it ends.

    accum watch 01jd3k5x9a2f            # an id or a unique prefix of it

First the history, oldest first: each attempt's lifecycle events with their times, the past
evaluations in between, runs of checkpoints folded into one line. Then one progress line
(step / total, epoch, loss, average samples/s, ETA) that fits the terminal, with new events
and evaluations printed above it. Exits when the job ends: 0 succeeded, 3 failed,
4 cancelled. If the stream drops (server restart), it reconnects until the job is final.
Ctrl-C leaves the job alone and says how to follow or cancel it (exit 130).
"""

from __future__ import annotations

import argparse
import contextlib
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from rich.console import Console
from rich.progress import Progress, ProgressColumn, Task, TaskID
from rich.text import Text

from accum import AccumAPIError, AccumClient
from services.cli.common import (
    EXIT_CODES,
    FINAL_STATUSES,
    in_cli_words,
    make_client,
    resolve_job_id,
    short_id,
)
from services.cli.output import console as safe_console
from services.cli.output import cut, duration, epoch, grouped, hanging, number, parse_time

RECONNECT_DELAY_S = 1.0
MAX_RECONNECTS = 60  # consecutive failures, one second apart
HINT_TIMEOUT_S = 3.0  # the status read after Ctrl-C
KIND_WIDTH = 13  # "lease expired"; rarer, longer kinds push their message right
# Checkpoint steps a folded line names before it elides the middle ones.
CHECKPOINTS_NAMED = 4


def register(commands: Any) -> None:
    watch = commands.add_parser("watch", help="show a job's history, then follow it live")
    watch.add_argument("job_id", metavar="ID", help="job id, or a unique prefix of it")
    watch.set_defaults(func=cmd_watch)


def cmd_watch(args: argparse.Namespace) -> int:
    with make_client() as client:
        final = watch_job(client, resolve_job_id(client, args.job_id))
    return EXIT_CODES.get(final["status"], 1)


def clock(timestamp: str | None) -> str:
    moment = parse_time(timestamp)
    return moment.astimezone().strftime("%H:%M:%S") if moment else " " * 8


def moment(timestamp: str | None) -> datetime:
    """For ordering events and evaluations in time (the API's timestamps are UTC)."""
    return parse_time(timestamp) or datetime.min.replace(tzinfo=UTC)


@dataclass
class _Eval:
    step: int
    epoch: Any
    ts: str
    values: dict[str, str] = field(default_factory=dict)


class History:
    """Turns events and evaluations into printed lines, in order, each once: attempt rules,
    checkpoints folded, evaluations grouped by step."""

    def __init__(self, console: Console, *, tracebacks: bool = False) -> None:
        self.console = console
        self.tracebacks = tracebacks  # `accum events` lists them; `watch` has the failed line
        self.seen_events: set[Any] = set()
        self.seen_evals: set[tuple[str, int, str]] = set()
        self.attempt = 0
        self.checkpoints: list[tuple[str, int]] = []  # (time, step) not printed yet
        self.pending: list[_Eval] = []  # past evaluations waiting for their place in time
        self.errors_shown: set[str] = set()  # messages of the `failed` events printed

    def line(self, ts: str | None, kind: str, text: str) -> None:
        """One event: time, kind, text; a long text wraps under itself, not under the time."""
        head = f"{clock(ts)}  {kind.ljust(KIND_WIDTH)}  "
        self.console.print(hanging(head, text, self.console.width), markup=False,
                           highlight=False, overflow="fold")

    # -- evaluations ----------------------------------------------------------------------
    def add_past_evals(self, points: list[dict[str, Any]]) -> None:
        """Evaluations logged before the stream opened: printed where they belong in time."""
        by_step: dict[int, _Eval] = {}
        for p in points:
            if not self._new_eval(p):
                continue
            entry = by_step.setdefault(p["step"], _Eval(p["step"], p.get("epoch"), p.get("ts", "")))
            entry.values[p["name"]] = number(p.get("value"), p.get("nonfinite"))
            entry.ts = max(entry.ts, p.get("ts") or "", key=moment)
        self.pending = sorted(by_step.values(), key=lambda e: (moment(e.ts), e.step))

    def _new_eval(self, point: dict[str, Any]) -> bool:
        key = (point["name"], point["step"], number(point.get("value"), point.get("nonfinite")))
        if key in self.seen_evals:
            return False
        self.seen_evals.add(key)
        return True

    def live_eval(self, points: list[dict[str, Any]]) -> None:
        fresh = [p for p in points if self._new_eval(p)]
        if not fresh:
            return
        self.flush_past()
        entry = _Eval(fresh[0]["step"], fresh[0].get("epoch"), fresh[-1].get("ts", ""))
        entry.values = {p["name"]: number(p.get("value"), p.get("nonfinite")) for p in fresh}
        self._print_eval(entry)

    def flush_past(self, before: str | None = None) -> None:
        """Print the past evaluations logged before `before` (all of them without it)."""
        while self.pending and (before is None or moment(self.pending[0].ts) <= moment(before)):
            self._print_eval(self.pending.pop(0))

    def _print_eval(self, entry: _Eval) -> None:
        self.flush_checkpoints()
        shown = ", ".join(f"{k} {v}" for k, v in sorted(entry.values.items()))
        self.line(entry.ts, "eval", f"step {entry.step}, epoch {epoch(entry.epoch)}: {shown}")

    # -- events ---------------------------------------------------------------------------
    def event(self, event: dict[str, Any]) -> None:
        key = event.get("id") or (event.get("kind"), event.get("created_at"))
        if key in self.seen_events or (event.get("kind") == "traceback" and not self.tracebacks):
            # A traceback's message is the error that the `failed` event next to it repeats.
            return
        self.seen_events.add(key)
        created = str(event.get("created_at") or "")
        self.flush_past(before=created)
        kind, message = str(event.get("kind")), str(event.get("message") or "")
        attempt = event.get("attempt")
        if isinstance(attempt, int) and attempt > self.attempt:
            self.flush_checkpoints()
            if self.attempt >= 1:  # a restart: a rule between attempts
                self.console.print(f"{'':8}  {'-' * KIND_WIDTH}  attempt {attempt}", markup=False)
            self.attempt = attempt
        if kind == "checkpoint":
            step = (event.get("data") or {}).get("step")
            self.checkpoints.append((created, step if isinstance(step, int) else -1))
            return
        self.flush_checkpoints()
        text = "" if message in ("", kind) else in_cli_words(message)
        if kind == "failed":
            self.errors_shown.add(message)
        self.line(created, kind.replace("_", " "), text)

    def flush_checkpoints(self) -> None:
        if not self.checkpoints:
            return
        steps = [s for _, s in self.checkpoints]
        if len(steps) == 1:
            text = f"step {steps[0]}"
        elif len(steps) <= CHECKPOINTS_NAMED:
            text = f"steps {', '.join(map(str, steps))}"
        else:
            text = f"{len(steps)} checkpoints, steps {steps[0]}, {steps[1]}, ... {steps[-1]}"
        self.line(self.checkpoints[-1][0], "checkpoint", text)
        self.checkpoints = []

    def finish(self) -> None:
        self.flush_past()
        self.flush_checkpoints()


class JobLine(ProgressColumn):
    """The whole progress line as one column, built to fit the console's width: the bar
    shrinks first, then the labels, then the job's name."""

    def render(self, task: Task) -> Text:
        f = task.fields
        total = int(task.total) if task.total else None
        done = int(task.completed)
        steps = f"{done}/{total}" if total else f"step {done}"
        remaining = task.time_remaining if total and f["status"] == "running" else None
        eta = f"eta {duration(remaining)}" if remaining is not None else ""
        speed = f"{f['sps']} samples/s" if f["sps"] != "-" else ""
        parts = [steps, f"epoch {f['epoch']}", f"loss {f['loss']}", speed, eta]
        width = f["width"]
        name, status = str(task.description), str(f["status"])
        tail = "  ".join(p for p in parts if p)
        room = width - len(tail) - len(status) - 4
        if room < len(name) + 8:  # short of room: shorter labels first
            tail = "  ".join(p for p in [steps, f"ep {f['epoch']}", f"loss {f['loss']}",
                                         speed.replace(" samples", ""), eta] if p)
            room = width - len(tail) - len(status) - 4
        name = cut(name, max(8, min(len(name), room)))
        bar_width = min(24, width - len(name) - len(status) - len(tail) - 5) if total else 0
        text = Text(f"{name} {status} ", no_wrap=True, overflow="ellipsis")
        if bar_width >= 6:
            filled = round(bar_width * min(done / total, 1)) if total else 0
            text.append("━" * filled, style="magenta")
            text.append("━" * (bar_width - filled), style="grey37")
            text.append(" ")
        text.append(tail)
        return text


class Live:
    """The progress line's state: the job's step, epoch, loss and the average samples/s."""

    def __init__(self, progress: Progress, task: TaskID, console: Console, epochs: int | None):
        self.progress, self.task, self.console, self.epochs = progress, task, console, epochs
        self.speeds: list[float] = []

    def epoch_label(self, index: Any) -> str:
        shown = epoch(index)
        return f"{shown}/{self.epochs}" if self.epochs and shown != "-" else shown

    def job(self, job: dict[str, Any]) -> None:
        progress = job.get("progress") or {}
        total = progress.get("total_optimizer_steps")
        self.progress.update(
            self.task, total=total or None, completed=progress.get("optimizer_step") or 0,
            status=job.get("status", "?"), epoch=self.epoch_label(progress.get("epoch")),
            width=self.console.width,
        )

    def metric(self, metric: dict[str, Any]) -> None:
        name, step = metric.get("name", ""), metric.get("step")
        fields: dict[str, Any] = {"epoch": self.epoch_label(metric.get("epoch"))}
        value = number(metric.get("value"), metric.get("nonfinite"))
        if name == "loss":
            fields["loss"] = value
        elif name == "samples_per_s" and isinstance(metric.get("value"), int | float):
            self.speeds.append(float(metric["value"]))
            fields["sps"] = grouped(round(sum(self.speeds) / len(self.speeds)))
        if isinstance(step, int):
            fields["completed"] = max(self.progress.tasks[self.task].completed, step)
        self.progress.update(self.task, width=self.console.width, **fields)


def watch_job(
    client: AccumClient, job_id: str, console: Console | None = None, *, interrupt_hint: bool = True
) -> dict[str, Any]:
    """Print the job's history, follow it until it is final; returns the final job object.
    On Ctrl-C (with `interrupt_hint`) says how to pick it up again, then re-raises."""
    console = console or safe_console()
    history = History(console)
    job = client.job(job_id)
    if job["status"] in FINAL_STATUSES:
        _replay(client, job_id, history)
        _print_outcome(console, job, history)
        return job
    progress = Progress(JobLine(), console=console, transient=False)
    name = str(job.get("name") or short_id(job_id))
    epochs = (job.get("spec") or {}).get("epochs")
    try:
        with progress:
            task = progress.add_task(name, total=None, status=job["status"], epoch="-", loss="-",
                                     sps="-", width=console.width)
            live = Live(progress, task, console, epochs if isinstance(epochs, int) else None)
            live.job(job)
            job = _follow(client, job_id, history, live)
            history.finish()
    except KeyboardInterrupt:
        history.finish()
        if interrupt_hint:
            _say_still_running(client, job_id, job)
        raise
    _print_outcome(console, job, history)
    return job


def _replay(client: AccumClient, job_id: str, history: History) -> None:
    """A finished job's whole story: its events and evaluations, in order."""
    history.add_past_evals(_past_evals(client, job_id))
    for event in client.all_events(job_id):
        history.event(event)
    history.finish()


def _past_evals(client: AccumClient, job_id: str) -> list[dict[str, Any]]:
    names = {p["name"] for p in client.metrics(job_id, max_points=2)}
    return [p for n in sorted(names) if n.startswith("val_") for p in client.metrics(job_id, name=n)]


def _follow(client: AccumClient, job_id: str, history: History, live: Live) -> dict[str, Any]:
    failures = 0  # consecutive rounds in which neither stream nor job could be read
    evals: list[dict[str, Any]] = []  # the current step's evaluation metrics
    opened = False
    while True:
        try:
            for event, data in client.stream_events(job_id):
                if not opened:
                    # The stream's metrics start now: what came before is history, read once.
                    opened = True
                    history.add_past_evals(_past_evals(client, job_id))
                if evals and (event != "metric" or data.get("step") != evals[0].get("step")
                              or not str(data.get("name", "")).startswith("val_")):
                    history.live_eval(evals)
                    evals = []
                if event == "status":
                    live.job(data)
                elif event == "metric":
                    if str(data.get("name", "")).startswith("val_"):
                        evals.append(data)
                    else:
                        history.flush_past()
                        live.metric(data)
                elif event == "job_event":
                    history.event(data)
                elif event == "end":
                    break
        except AccumAPIError as exc:
            # A dropped connection (0) or a server error may pass (restart, deploy): keep
            # polling the job below. A client error (404, 401) will not pass.
            if 0 < exc.status < 500:
                raise
        if evals:
            history.live_eval(evals)
            evals = []
        try:
            job = client.job(job_id)
        except AccumAPIError as exc:
            failures += 1
            if 0 < exc.status < 500 or failures > MAX_RECONNECTS:
                raise
        else:
            failures = 0
            live.job(job)
            if job["status"] in FINAL_STATUSES:
                return job
        time.sleep(RECONNECT_DELAY_S)


def _say_still_running(client: AccumClient, job_id: str, job: dict[str, Any]) -> None:
    # After Ctrl-C the user waits for the prompt: a server slow to answer gets a few seconds,
    # not the client's 30, and the hint then says what the watcher knew last.
    with contextlib.suppress(AccumAPIError):
        job = client.job(job_id, timeout=HINT_TIMEOUT_S)
    err = safe_console(stderr=True)
    if job["status"] in FINAL_STATUSES:
        err.print(f"job {job_id} {job['status']}", markup=False)
        return
    progress = job.get("progress") or {}
    total = progress.get("total_optimizer_steps")
    at = f" at step {progress.get('optimizer_step') or 0}{f'/{total}' if total else ''}"
    prefix = short_id(job_id)
    err.print(
        f"stopped watching; job {job_id} is still {job['status']}{at if job['status'] != 'queued' else ''}.\n"
        f"follow it again: accum watch {prefix}\nstop it:         accum cancel {prefix}",
        markup=False,
    )


def _print_outcome(console: Console, job: dict[str, Any], history: History) -> None:
    """The last line; the error only when no `failed` event above said it already."""
    line = f"job {job['id']} {job['status']}"
    error = job.get("error") or {}
    said = f"{error.get('type')}: {error.get('message')}"
    if error and not history.errors_shown & {said, str(error.get("message"))}:
        line += f": {in_cli_words(said)}"
    console.print(hanging("", line, console.width, indent=4), markup=False, overflow="fold")

