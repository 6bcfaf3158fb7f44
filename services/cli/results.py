"""Result commands: metrics (a summary, every row, or CSV), checkpoints, download (sha256
verified). Epochs are counted from 1 here, in the CSV too (the API's `epoch` counts from 0)."""

from __future__ import annotations

import argparse
import csv
import math
import sys
from pathlib import Path
from typing import Any

from accum import AccumClient
from services.cli.common import CommandError, make_client, resolve_job_id
from services.cli.output import epoch, number, point_value, print_table, size, when

METRIC_COLUMNS = ["name", "step", "epoch", "value", "ts"]
# A summary reads each metric downsampled to this many points: the API keeps every bucket's
# lowest and highest point, so the minimum and maximum are exact whatever the run's length.
SUMMARY_POINTS = 1000


def register(commands: Any) -> None:
    metrics = commands.add_parser(
        "metrics", help="a job's metrics: last, min and max of each (--all: every row)"
    )
    metrics.add_argument("job_id", metavar="ID", help="job id, or a unique prefix of it")
    metrics.add_argument("--name", help="every row of this metric (e.g. loss, val_accuracy)")
    metrics.add_argument("--all", action="store_true", help="every row of every metric")
    metrics.add_argument("--since-step", type=int, help="only steps after this one")
    metrics.add_argument("--max-points", type=int, help="downsample to about this many points")
    metrics.add_argument("--csv", action="store_true", help="every row as CSV, with a header")
    metrics.set_defaults(func=cmd_metrics)

    checkpoints = commands.add_parser("checkpoints", help="list a job's checkpoints")
    checkpoints.add_argument("job_id", metavar="ID", help="job id, or a unique prefix of it")
    checkpoints.set_defaults(func=cmd_checkpoints)

    download = commands.add_parser("download", help="download a checkpoint, verifying sha256")
    download.add_argument("job_id", metavar="ID", help="job id, or a unique prefix of it")
    download.add_argument("step", nargs="?", type=int, help="optimizer step (default: latest)")
    download.add_argument("-o", "--output", default=".", help="file or directory (default .)")
    download.add_argument("--merged", action="store_true",
                          help="a LoRA job's merged model (spec peft.merge): a tar of its save_pretrained folder")
    download.set_defaults(func=cmd_download)


def cmd_metrics(args: argparse.Namespace) -> int:
    with make_client() as client:
        job_id = resolve_job_id(client, args.job_id)
        rows_wanted = args.all or args.csv or args.name or args.max_points
        if not rows_wanted:
            summary = summarise(client, job_id, args.since_step)
            if not summary:
                print("no metrics yet")
            else:
                print_table(["NAME", "LAST STEP", "LAST", "MIN", "MAX"], summary)
            return 0
        points = client.metrics(
            job_id, name=args.name, since_step=args.since_step, max_points=args.max_points
        )
        if args.name and not points:
            names = sorted({p["name"] for p in client.metrics(job_id, max_points=2)})
            if names:
                raise CommandError(
                    f"job {job_id} has no metric {args.name!r}; it has: {', '.join(names)}"
                )
    if args.csv:
        writer = csv.writer(sys.stdout, lineterminator="\n")
        writer.writerow(METRIC_COLUMNS)
        for p in points:
            value = p.get("nonfinite") or p.get("value")
            counted = p["epoch"] + 1 if isinstance(p.get("epoch"), int) else ""
            writer.writerow([p["name"], p["step"], counted, value, p.get("ts", "")])
        return 0
    if not points:
        print("no metrics yet")
        return 0
    rows = [[str(p["name"]), str(p["step"]), epoch(p.get("epoch")), point_value(p)] for p in points]
    print_table(["NAME", "STEP", "EPOCH", "VALUE"], rows)
    return 0


def summarise(client: AccumClient, job_id: str, since_step: int | None) -> list[list[str]]:
    """Per metric: the last step and value, the minimum and the maximum (NaN left out of
    those two, unless it is all there is)."""
    by_name: dict[str, list[dict[str, Any]]] = {}
    for p in client.metrics(job_id, since_step=since_step, max_points=SUMMARY_POINTS):
        by_name.setdefault(p["name"], []).append(p)
    rows = []
    for name, points in sorted(by_name.items()):
        # The downsample keeps extremes, not the last step: read what came after its last point.
        tail = client.metrics(job_id, name=name, since_step=points[-1]["step"])
        last = (tail or points)[-1]
        values = [v for v in (_as_float(p) for p in points + tail) if not math.isnan(v)]
        low, high = (number(min(values)), number(max(values))) if values else ("NaN", "NaN")
        rows.append([name, str(last["step"]), point_value(last), low, high])
    return rows


def _as_float(point: dict[str, Any]) -> float:
    value = point.get("value")
    return float(value) if value is not None else float(point.get("nonfinite") or "nan")


def cmd_checkpoints(args: argparse.Namespace) -> int:
    with make_client() as client:
        items = client.checkpoints(resolve_job_id(client, args.job_id))
    if not items:
        print("no checkpoints yet")
        return 0
    rows = [
        [str(c["step"]) + (" *" if c.get("is_best") else ""), epoch(c.get("epoch")),
         size(c.get("size_bytes")), number((c.get("metrics") or {}).get("val_loss")),
         str(c.get("sha256", ""))[:12], when(c.get("created_at"))]
        for c in items
    ]
    print_table(["STEP", "EPOCH", "SIZE", "VAL_LOSS", "SHA256", "CREATED"], rows)
    if any(c.get("is_best") for c in items):
        print("* best val_loss (kept beside the latest ones)")
    return 0


def cmd_download(args: argparse.Namespace) -> int:
    target = Path(args.output)
    folder = target if target.is_dir() else target.parent
    if not folder.is_dir():
        raise CommandError(f"cannot save to {target}: there is no directory {folder}")
    if args.merged and args.step is not None:
        raise CommandError("--merged downloads the job's merged model, which has no step: leave the step out")
    with make_client() as client:
        job_id = resolve_job_id(client, args.job_id)
        path = client.download_merged(job_id, target) if args.merged else client.download(job_id, args.step, target)
    print(f"saved {path} ({size(path.stat().st_size)}, sha256 verified)")
    return 0
