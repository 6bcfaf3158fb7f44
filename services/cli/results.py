"""Result commands: metrics (table or CSV), checkpoints, download (sha256 verified)."""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path
from typing import Any

from services.cli.common import make_client, print_table

METRIC_COLUMNS = ["name", "step", "epoch", "value", "ts"]


def register(commands: Any) -> None:
    metrics = commands.add_parser("metrics", help="print a job's metric history")
    metrics.add_argument("job_id", metavar="ID")
    metrics.add_argument("--name", help="only this metric (e.g. loss, val_accuracy)")
    metrics.add_argument("--since-step", type=int, help="only steps after this one")
    metrics.add_argument("--max-points", type=int, help="downsample to about this many points")
    metrics.add_argument("--csv", action="store_true", help="CSV with a header row")
    metrics.set_defaults(func=cmd_metrics)

    checkpoints = commands.add_parser("checkpoints", help="list a job's checkpoints")
    checkpoints.add_argument("job_id", metavar="ID")
    checkpoints.set_defaults(func=cmd_checkpoints)

    download = commands.add_parser("download", help="download a checkpoint, verifying sha256")
    download.add_argument("job_id", metavar="ID")
    download.add_argument("step", nargs="?", type=int, help="optimizer step (default: latest)")
    download.add_argument("-o", "--output", default=".", help="file or directory (default .)")
    download.set_defaults(func=cmd_download)


def cmd_metrics(args: argparse.Namespace) -> int:
    with make_client() as client:
        points = client.metrics(
            args.job_id, name=args.name, since_step=args.since_step, max_points=args.max_points
        )
    if args.csv:
        writer = csv.writer(sys.stdout, lineterminator="\n")
        writer.writerow(METRIC_COLUMNS)
        for p in points:
            writer.writerow([p.get(c, "") for c in METRIC_COLUMNS])
        return 0
    if not points:
        print("no metrics yet")
        return 0
    rows = [
        [str(p["name"]), str(p["step"]), str(p.get("epoch", "")), f"{p['value']:.6g}"]
        for p in points
    ]
    print_table(["NAME", "STEP", "EPOCH", "VALUE"], rows)
    return 0


def cmd_checkpoints(args: argparse.Namespace) -> int:
    with make_client() as client:
        items = client.checkpoints(args.job_id)
    if not items:
        print("no checkpoints yet")
        return 0
    rows = [
        [str(c["step"]), str(c.get("epoch", "")), str(c.get("size_bytes", "")),
         str(c.get("sha256", "")), str(c.get("created_at", ""))]
        for c in items
    ]
    print_table(["STEP", "EPOCH", "BYTES", "SHA256", "CREATED"], rows)
    return 0


def cmd_download(args: argparse.Namespace) -> int:
    with make_client() as client:
        path = client.download(args.job_id, args.step, Path(args.output))
    print(f"saved {path} ({path.stat().st_size} bytes, sha256 verified)")
    return 0
