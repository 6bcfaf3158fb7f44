"""Job commands: submit, jobs, status, cancel, resume, delete. ID is a job id or a unique prefix."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from typing import Any

from services.cli.common import (
    EXIT_CODES,
    FINAL_STATUSES,
    format_progress,
    load_spec,
    make_client,
    resolve_job_id,
    short_id,
)
from services.cli.output import (
    cut,
    duration,
    epoch,
    grouped,
    hanging,
    latest_value,
    parse_time,
    print_fields,
    print_json,
    print_table,
    size,
    when,
    when_short,
)

# Metrics `accum status` prints, in this order, when the job has them (then any others).
SHOWN_FIRST = ("loss", "val_loss", "val_accuracy", "lr", "grad_norm", "samples_per_s")
SKIPPED = {"step", "epoch", "step_time_s", "items_per_s"}
RANK_PEAK = "peak_memory_bytes_rank"  # peak_memory_bytes_rank{r}: the `peak memory` line, by rank
# The system metrics (services/worker/system_metrics.py): one `system` line, not one line each.
SYSTEM = ("host_cpu_percent", "host_memory_percent", "process_rss_bytes", "gpu_utilization_percent",
          "gpu_memory_used_bytes", "gpu_power_watts")


def register(commands: Any) -> None:
    submit = commands.add_parser("submit", help="submit a job spec (.yaml or .json)")
    submit.add_argument("spec", help="path to the spec file, or - for stdin")
    submit.add_argument("--watch", action="store_true", help="follow the job until it ends")
    submit.add_argument("--idempotency-key", help="resubmitting with the same key is a no-op")
    submit.add_argument("--json", action="store_true", help="print the job as JSON")
    submit.add_argument("--tag", action="append", metavar="TAG",
                        help="label the job (repeat for more; added to the spec's tags)")
    submit.add_argument("--notes", metavar="TEXT", help="notes on the job (replace the spec's notes)")
    submit.set_defaults(func=cmd_submit)

    listing = commands.add_parser("jobs", help="list jobs, newest first")
    listing.add_argument("--status", help="only jobs in this status (e.g. running)")
    listing.add_argument("--limit", type=int, default=20, help="how many (default 20)")
    listing.add_argument("--tag", action="append", metavar="TAG",
                         help="only jobs with this tag (repeat: with all of them)")
    listing.add_argument("--search", metavar="TEXT", help="only jobs whose name, notes or a tag contain TEXT")
    listing.add_argument("--json", action="store_true", help="print the page as JSON")
    listing.set_defaults(func=cmd_jobs)

    status = commands.add_parser("status", help="show one job")
    status.add_argument("job_id", metavar="ID", help="job id, or a unique prefix of it")
    status.add_argument("--json", action="store_true", help="print the job as JSON")
    status.set_defaults(func=cmd_status)

    for verb, helptext, func in (
        ("cancel", "cancel a queued or running job", cmd_cancel),
        ("resume", "re-queue a failed or cancelled job from its latest checkpoint", cmd_resume),
        ("delete", "delete a finished job: its checkpoints, metrics and events", cmd_delete),
    ):
        sub = commands.add_parser(verb, help=helptext)
        sub.add_argument("job_id", metavar="ID", help="job id, or a unique prefix of it")
        sub.set_defaults(func=func)
        if verb == "resume":
            start = sub.add_mutually_exclusive_group()
            start.add_argument("--from-step", type=int, metavar="K",
                               help="from the checkpoint at step K (later ones are dropped)")
            start.add_argument("--from-scratch", action="store_true",
                               help="from step 0 (every checkpoint is dropped)")
            sub.add_argument("--timeout", metavar="DURATION",
                             help='a new timeout: seconds, or "90m", "2h", "7d" (the run time '
                             "counts from 0 again on every resume)")


def cmd_submit(args: argparse.Namespace) -> int:
    spec = load_spec(args.spec)
    if args.tag:
        given = spec.get("tags") or []
        spec["tags"] = (given if isinstance(given, list) else [given]) + args.tag
    if args.notes is not None:
        spec["notes"] = args.notes
    with make_client() as client:
        job = client.submit(spec, idempotency_key=args.idempotency_key)
        if args.json:
            print_json(job)
        else:
            print(hanging("", f"submitted job {job['id']} ({job.get('name') or 'unnamed'}): "
                              f"{job['status']}, effective batch {batch(job)}", indent=2))
        if not args.watch:
            return 0
        from services.cli.watch import watch_job

        final = watch_job(client, str(job["id"]))
        return EXIT_CODES.get(final["status"], 1)


def cmd_jobs(args: argparse.Namespace) -> int:
    with make_client() as client:
        page = client.jobs(status=args.status, limit=args.limit, tags=args.tag, q=args.search)
        admin = bool(client.me().get("is_admin")) if not args.json else False
    if args.json:
        print_json(page)
        return 0
    items = page.get("items", [])
    if not items:
        print("no jobs" + (f" with status {args.status}" if args.status else "")
              + (" with those tags or text" if args.tag or args.search else ""))
        return 0
    headers = ["ID", "NAME", "STATUS", "STEP", "CREATED"] + (["OWNER"] if admin else [])
    rows = [
        [short_id(str(j["id"])), str(j.get("name") or ""), j["status"], format_progress(j),
         when_short(j.get("created_at"))] + ([str(j.get("owner") or "")] if admin else [])
        for j in items
    ]
    print_table(headers, rows, flex="NAME")
    if page.get("next_cursor"):
        print(f"(more: accum jobs --limit {args.limit * 2})")
    return 0


def batch(job: dict[str, Any]) -> str:
    """`16 x 4 x 1 GPU = 64`: the effective batch and its factors (m x N x GPUs)."""
    spec, world = job.get("spec") or {}, job.get("world") or {}
    m, n, gpus, nodes = spec.get("micro_batch_size"), spec.get("accumulation_steps"), world.get("gpus"), world.get("nodes")
    total = job.get("effective_batch_size")
    shown = grouped(total) if isinstance(total, int) else "?"
    if not isinstance(m, int) or not isinstance(n, int):
        # "auto" micro-batch or an epoch schedule of N: only the product is fixed
        return f"{shown} (m {m}, N {n})" if m is not None else shown
    device = "CPU" if gpus == 0 else f"{gpus} GPU{'s' if gpus != 1 else ''}"
    return f"{m} x {n} x {device}{f' x {nodes} nodes' if multi_node(job) else ''} = {shown}"


def multi_node(job: dict[str, Any]) -> bool:
    """Whether the job trains on more than one node (the API's ``world``, defaults filled in)."""
    nodes = (job.get("world") or {}).get("nodes")
    return isinstance(nodes, int) and nodes > 1


def nodes_line(job: dict[str, Any]) -> str | None:
    """A multi-node job's nodes: `2 of 2: 0 cpu@n1 (n1), 1 cpu@n2 (n2)`, or how many of them
    joined while its gang forms; None for a one-node job."""
    nodes = job.get("nodes")
    if not isinstance(nodes, list):
        return None
    wanted = (job.get("world") or {}).get("nodes", len(nodes))
    head = f"{len(nodes)} of {wanted}" + (" joined, gang forming" if job["status"] == "queued" else "")
    each = ", ".join(f"{n['node_rank']} {n['worker']}" + (f" ({n['host']})" if n.get("host") else "")
                     for n in nodes)
    return f"{head}: {each}" if each else head


def eta(job: dict[str, Any]) -> str | None:
    """Time left at the latest samples/s: steps to go x samples per step / samples per s."""
    progress = job.get("progress") or {}
    step, total = progress.get("optimizer_step") or 0, progress.get("total_optimizer_steps")
    speed = (job.get("latest_metrics") or {}).get("samples_per_s")
    size = job.get("effective_batch_size")
    if job.get("status") != "running" or not total or not size:
        return None
    if not isinstance(speed, int | float) or speed <= 0:
        return None
    return f"{duration((total - step) * size / speed)} (at {grouped(round(speed))} samples/s)"


def describe_job(job: dict[str, Any]) -> list[tuple[str, str]]:
    spec = job.get("spec") or {}
    progress = job.get("progress") or {}
    model = (spec.get("model") or {}).get("name", spec.get("model"))
    dataset = (spec.get("dataset") or {}).get("name", spec.get("dataset"))
    status = job["status"]
    attempts = job.get("attempts")  # a count, or (newer servers) the list of attempts
    count = len(attempts) if isinstance(attempts, list) else attempts
    if isinstance(count, int) and count > 1:
        status += f" (attempt {count})"
    queue = str(job.get("queue") or spec.get("queue") or "-")
    if spec.get("priority", "normal") != "normal":
        queue += f", priority {spec['priority']}"
    if isinstance(job.get("queue_position"), int) and job["status"] == "queued":
        queue += f", position {job['queue_position']} in line"  # 1 = next to run
    total = progress.get("total_optimizer_steps")
    step = progress.get("optimizer_step") or 0
    percent = f" ({100 * step / total:.0f}%)" if total else ""
    epochs = spec.get("epochs")
    fields = [
        ("id", str(job["id"])),
        ("name", str(job.get("name") or "")),
        *([("tags", ", ".join(job["tags"]))] if job.get("tags") else []),
        *([("notes", str(job["notes"]))] if job.get("notes") else []),
        ("status", status),
        ("model", f"{model} on {dataset}"),
        ("batch", f"{batch(job)}  (m x N x GPUs{' x nodes' if multi_node(job) else ''})"),
        ("queue", queue),
        ("progress", f"step {format_progress(job)}{percent}, epoch "
                     f"{epoch(progress.get('epoch'))}{f' of {epochs}' if epochs else ''}"),
    ]
    if (left := eta(job)) is not None:
        fields.append(("eta", left))
    if (line := exactness_line(job.get("exactness"))) is not None:
        fields.append(("exactness", line))
    worker = job.get("worker") or {}
    if worker:
        fields.append(("worker", " ".join(str(v) for v in worker.values() if v)))
    if (line := nodes_line(job)) is not None:
        fields.append(("nodes", line))
    if job.get("levers"):  # issue 44's memory levers beside accumulation
        fields.append(("levers", ", ".join(str(lever) for lever in job["levers"])))
    if peaks := job.get("peak_memory_bytes_per_rank"):
        fields.append(("peak memory", ", ".join(f"rank {r}: {size(peak)}" for r, peak in enumerate(peaks))))
    fields += [
        ("created", when(job.get("created_at"))),
        ("started", when(job.get("started_at"))),
        ("finished", when(job.get("finished_at"))),
    ]
    if job.get("started_at") and job["status"] in FINAL_STATUSES and job.get("finished_at"):
        # From its first start, not its last attempt's: a restarted job took all of it.
        start, end = parse_time(first_start(job)), parse_time(job["finished_at"])
        if start and end:
            fields.append(("took", took((end - start).total_seconds())))
        if (line := phases_line(job)) is not None:
            fields.append(("phases", line))
    elif job.get("started_at") and job["status"] == "running":
        start = parse_time(job["started_at"])
        if start:
            fields.append(("running for", duration((datetime.now(UTC) - start).total_seconds())))
    error = job.get("error")
    if error:
        fields.append(("error", f"{error.get('type')}: {error.get('message')}"))
    fields += [(f"{run['tracker']}", tracker_link(run)) for run in job.get("trackers") or []]
    latest = job.get("latest_metrics") or {}
    names = [n for n in SHOWN_FIRST if n in latest]
    names += sorted(n for n in latest if n not in names and n not in SKIPPED and n not in SYSTEM
                    and not (n.startswith(RANK_PEAK) and n[len(RANK_PEAK):].isdigit()))  # the peak memory line
    if (line := system_line(latest)) is not None:
        fields.append(("system", line))
    stop = (error or {}).get("nonfinite") or {}
    fields += [(name, latest_value(job, name) + stopped_here(stop, name)) for name in names]
    if stop.get("metric") and stop["metric"] not in names:
        fields.append((stop["metric"], f"{stop.get('value')}{stopped_here(stop, stop['metric'])}"))
    return fields


def system_line(latest: dict[str, Any]) -> str | None:
    """The latest system sample: `host CPU 35%, memory 41%, RSS 312.4 MiB; GPU 97%, 40.1 GiB, 310 W`;
    None for a job without one."""
    def number(name: str) -> float | None:
        value = latest.get(name)
        return float(value) if isinstance(value, int | float) else None

    parts = []
    if (cpu := number("host_cpu_percent")) is not None:
        parts.append(f"host CPU {cpu:.0f}%")
    if (memory := number("host_memory_percent")) is not None:
        parts.append(f"memory {memory:.0f}%")
    if (rss := number("process_rss_bytes")) is not None:
        parts.append(f"RSS {size(rss)}")
    gpu = [f"{value:.0f}%" if name == "gpu_utilization_percent" else size(value) if name == "gpu_memory_used_bytes"
           else f"{value:.0f} W" for name in SYSTEM[3:] if (value := number(name)) is not None]
    text = ", ".join(parts) + (f"{'; ' if parts else ''}GPU {', '.join(gpu)}" if gpu else "")
    return text or None


def first_start(job: dict[str, Any]) -> str | None:
    """When the job first started: its first attempt's start (the job's own ``started_at`` is
    its latest attempt's)."""
    attempts = job.get("attempts")
    if isinstance(attempts, list) and attempts and isinstance(attempts[0], dict):
        return attempts[0].get("started_at") or job.get("started_at")
    return job.get("started_at")


def tracker_link(run: dict[str, Any]) -> str:
    """A tracker run as `accum status` shows it: its link (or, for TensorBoard, its run
    folder), and whether points still wait for the tracker."""
    shown = run.get("url") or (f"run {run['run_id']}" if run.get("run_id") else "not opened yet")
    return shown + (" (points waiting for the tracker)" if run.get("pending") else "")


def attempt_rows(job: dict[str, Any]) -> list[tuple[list[str], str | None]]:
    """One row per attempt (a multi-node attempt's nodes on one row): number, node(s), started,
    ended, outcome, time taken; with how its process died where its worker saw it."""
    attempts = job.get("attempts")
    if not isinstance(attempts, list):
        return []
    grouped_rows: dict[int, list[dict[str, Any]]] = {}
    for attempt in attempts:
        if isinstance(attempt, dict) and isinstance(attempt.get("attempt"), int):
            grouped_rows.setdefault(attempt["attempt"], []).append(attempt)
    rows = []
    for number, nodes in sorted(grouped_rows.items()):
        first = nodes[0]
        workers = ", ".join(str(n.get("worker") or n.get("host") or "?") for n in nodes)
        outcome = str(first.get("outcome") or "-").replace("_", " ")
        causes = sorted({str(n["cause"]) for n in nodes if n.get("cause")})
        start = parse_time(first.get("started_at"))
        ends = [parse_time(n.get("ended_at")) for n in nodes]
        end = max((e for e in ends if e), default=None) if all(ends) else None
        spent = took((end - start).total_seconds()) if start and end else (
            "running" if first.get("outcome") == "running" else "-")
        rows.append(([str(number), workers, when_short(first.get("started_at")),
                      when_short(end.isoformat() if end else None), outcome, spent],
                     "; ".join(causes) or None))
    return rows


def took(seconds: float) -> str:
    """A short job's time to a tenth of a second (``1.3 s``), a longer one as ``duration``."""
    return f"{seconds:.1f} s" if seconds < 59.95 else duration(seconds)


def phases_line(job: dict[str, Any]) -> str | None:
    """Where the last attempt's time went, as its worker timed it (the API's ``phases``):
    ``queued 0.02 s, claim 0.01 s, build 0.21 s, ...``; None from servers without it."""
    attempts = job.get("attempts")
    if not isinstance(attempts, list) or not attempts or not isinstance(attempts[-1], dict):
        return None
    last = attempts[-1]
    phases = last.get("phases")
    if not isinstance(phases, dict) or not phases:
        return None
    parts = []
    created, started = parse_time(job.get("created_at")), parse_time(last.get("started_at"))
    if created and started and len(attempts) == 1:
        parts.append(f"queued {max((started - created).total_seconds(), 0.0):.2f} s")
    parts += [f"{name.replace('_', ' ')} {float(seconds):.2f} s" for name, seconds in phases.items()
              if isinstance(seconds, int | float)]
    return ", ".join(parts)


def stopped_here(stop: dict[str, Any], name: str) -> str:
    """` at step 7 (stopped the run)` after the metric whose non-finite value ended the job."""
    return f" at step {stop.get('step')} (stopped the run)" if stop.get("metric") == name else ""


def exactness_line(check: Any) -> str | None:
    """One line for the first-window check (``GET /v1/jobs/ID``'s ``exactness``): the verdict
    and relative error, or why it did not run; None from servers without it."""
    if not isinstance(check, dict):
        return None
    error, tolerance = check.get("rel_error"), check.get("tolerance")
    shown = f", rel. error {error:.2g}" if isinstance(error, int | float) else ""
    if check.get("passed"):
        return f"first window = big batch{shown}"
    if check.get("checked"):
        bound = f" > {tolerance:g}" if isinstance(tolerance, int | float) and shown else ""
        return f"NOT exact{shown}{bound} (cause: accum watch ID)"
    note = str(check.get("note") or "not checked")
    if check.get("status") == "pending":
        return cut("pending: " + note.removeprefix("exactness check pending: "), 60)
    return cut(note.removeprefix("exactness check not run: "), 60)


def cmd_status(args: argparse.Namespace) -> int:
    with make_client() as client:
        job = client.job(resolve_job_id(client, args.job_id))
    if args.json:
        print_json(job)
        return 0
    print_fields(describe_job(job))
    rows = attempt_rows(job)
    if rows:
        print("\nattempts")
        print_table(["#", "node(s)", "started", "ended", "outcome", "took"],
                    [row for row, _ in rows], flex="node(s)")
        for (row, cause) in rows:
            if cause:
                print(hanging(f"  attempt {row[0]}: ", cause, indent=4))
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    with make_client() as client:
        job_id = resolve_job_id(client, args.job_id)
        job = client.cancel(job_id)
    print(f"job {job_id}: {job.get('status', 'cancel requested')}")
    return 0


def cmd_resume(args: argparse.Namespace) -> int:
    with make_client() as client:
        job_id = resolve_job_id(client, args.job_id)
        timeout = int(args.timeout) if args.timeout and args.timeout.isdigit() else args.timeout
        # A plain resume takes the latest checkpoint; without one it starts over: say so.
        latest = None
        if args.from_step is None and not args.from_scratch:
            latest = max((int(c["step"]) for c in client.checkpoints(job_id)), default=None)
        job = client.resume(job_id, from_step=args.from_step, from_scratch=args.from_scratch,
                            timeout=timeout)
    if args.from_step is not None:
        where = f", from checkpoint step {args.from_step}"
    elif args.from_scratch:
        where = ", from the start"
    elif latest is None:
        where = (", from the start: it has no checkpoint (a job keeps one every "
                 "checkpoint_every steps)")
    else:
        where = f", from its latest checkpoint (step {latest})"
    limit = f", timeout {job['spec']['timeout']} s" if args.timeout and "spec" in job else ""
    print(hanging("", f"job {job_id}: {job.get('status', 'queued')}{where}{limit}", indent=2))
    return 0


def cmd_delete(args: argparse.Namespace) -> int:
    with make_client() as client:
        job_id = resolve_job_id(client, args.job_id)
        client.delete(job_id)
    print(f"job {job_id}: deleted (checkpoints, metrics and events)")
    return 0
