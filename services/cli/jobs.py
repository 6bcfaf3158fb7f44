"""Job commands: submit, jobs, status, cancel, resume."""

from __future__ import annotations

import argparse
from typing import Any

from services.cli.common import (
    EXIT_CODES,
    format_progress,
    load_spec,
    make_client,
    print_json,
    print_table,
)


def register(commands: Any) -> None:
    submit = commands.add_parser("submit", help="submit a job spec (.yaml or .json)")
    submit.add_argument("spec", help="path to the spec file, or - for stdin")
    submit.add_argument("--watch", action="store_true", help="follow the job until it ends")
    submit.add_argument("--idempotency-key", help="resubmitting with the same key is a no-op")
    submit.add_argument("--json", action="store_true", help="print the job as JSON")
    submit.set_defaults(func=cmd_submit)

    listing = commands.add_parser("jobs", help="list jobs, newest first")
    listing.add_argument("--status", help="only jobs in this status (e.g. running)")
    listing.add_argument("--limit", type=int, default=20, help="how many (default 20)")
    listing.add_argument("--json", action="store_true", help="print the page as JSON")
    listing.set_defaults(func=cmd_jobs)

    status = commands.add_parser("status", help="show one job")
    status.add_argument("job_id", metavar="ID")
    status.add_argument("--json", action="store_true", help="print the job as JSON")
    status.set_defaults(func=cmd_status)

    for verb, helptext in (
        ("cancel", "cancel a queued or running job"),
        ("resume", "re-queue a failed or cancelled job from its latest checkpoint"),
    ):
        sub = commands.add_parser(verb, help=helptext)
        sub.add_argument("job_id", metavar="ID")
        sub.set_defaults(func=cmd_cancel if verb == "cancel" else cmd_resume)


def cmd_submit(args: argparse.Namespace) -> int:
    spec = load_spec(args.spec)
    with make_client() as client:
        job = client.submit(spec, idempotency_key=args.idempotency_key)
        if args.json:
            print_json(job)
        else:
            print(
                f"submitted job {job['id']} ({job.get('name') or 'unnamed'}): "
                f"{job['status']}, effective batch {job.get('effective_batch_size')}"
            )
        if not args.watch:
            return 0
        from services.cli.watch import watch_job

        final = watch_job(client, str(job["id"]))
        return EXIT_CODES.get(final["status"], 1)


def cmd_jobs(args: argparse.Namespace) -> int:
    with make_client() as client:
        page = client.jobs(status=args.status, limit=args.limit)
    if args.json:
        print_json(page)
        return 0
    rows = [
        [str(j["id"]), str(j.get("name") or ""), j["status"], format_progress(j),
         str(j.get("created_at") or "")]
        for j in page.get("items", [])
    ]
    if not rows:
        print("no jobs" + (f" with status {args.status}" if args.status else ""))
        return 0
    print_table(["ID", "NAME", "STATUS", "STEP", "CREATED"], rows)
    if page.get("next_cursor"):
        print(f"(more: accum jobs --limit {args.limit * 2})")
    return 0


def describe_job(job: dict[str, Any]) -> list[tuple[str, str]]:
    progress = job.get("progress") or {}
    fields = [
        ("id", str(job["id"])),
        ("name", str(job.get("name") or "")),
        ("status", job["status"]),
        ("progress", f"step {format_progress(job)}, epoch {_epoch(progress, job)}"),
        ("effective batch", str(job.get("effective_batch_size"))),
        ("attempts", str(job.get("attempts"))),
        ("created", str(job.get("created_at"))),
        ("started", str(job.get("started_at") or "-")),
        ("finished", str(job.get("finished_at") or "-")),
    ]
    error = job.get("error")
    if error:
        fields.append(("error", f"{error.get('type')}: {error.get('message')}"))
    for name, value in sorted((job.get("latest_metrics") or {}).items()):
        if name in ("step", "epoch"):  # already in the progress line
            continue
        shown = f"{value:.6g}" if isinstance(value, float) else str(value)
        fields.append((name, shown))
    return fields


def _epoch(progress: dict[str, Any], job: dict[str, Any]) -> str:
    """1-based for people (the API counts from 0), with the total when the spec has one."""
    epoch = progress.get("epoch")
    if not isinstance(epoch, int):
        return "-"
    total = (job.get("spec") or {}).get("epochs")
    return f"{epoch + 1} of {total}" if total else str(epoch + 1)


def cmd_status(args: argparse.Namespace) -> int:
    with make_client() as client:
        job = client.job(args.job_id)
    if args.json:
        print_json(job)
        return 0
    fields = describe_job(job)
    width = max(len(k) for k, _ in fields)
    for key, value in fields:
        print(f"{key.ljust(width)}  {value}")
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    with make_client() as client:
        job = client.cancel(args.job_id)
    print(f"job {args.job_id}: {job.get('status', 'cancel requested')}")
    return 0


def cmd_resume(args: argparse.Namespace) -> int:
    with make_client() as client:
        job = client.resume(args.job_id)
    print(f"job {args.job_id}: {job.get('status', 'queued')}")
    return 0
