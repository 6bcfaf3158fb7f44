"""`accum workers`: the registered workers, their queues, devices and state."""

from __future__ import annotations

import argparse
from typing import Any

from services.cli.common import make_client, short_id
from services.cli.output import duration, print_json, print_table


def register(commands: Any) -> None:
    listing = commands.add_parser("workers", help="list the workers and the queues they serve")
    listing.add_argument("--all", action="store_true", help="stopped workers too")
    listing.add_argument("--json", action="store_true", help="print them as JSON")
    listing.set_defaults(func=cmd_workers)


def devices(worker: dict[str, Any]) -> str:
    """`2x NVIDIA H100 80GB HBM3 (80 GiB)` or `cpu, 16 cores`."""
    found = worker.get("devices") or []
    gpus = [d for d in found if d.get("kind") == "gpu"]
    if gpus:
        names = sorted({str(d.get("name")) for d in gpus})
        memory = max((d.get("memory_bytes") or 0 for d in gpus), default=0)
        size = f" ({memory / 2**30:.0f} GiB)" if memory else ""
        return f"{len(gpus)}x {', '.join(names)}{size}"
    cores = sum(int(d.get("cores") or 0) for d in found)
    return f"cpu, {cores} cores" if cores else "cpu"


def cmd_workers(args: argparse.Namespace) -> int:
    with make_client() as client:
        items = client.workers()
    if not args.all:
        items = [w for w in items if w.get("state") != "stopped"]
    if args.json:
        print_json({"items": items})
        return 0
    if not items:
        print("no workers" + ("" if args.all else " running (--all lists stopped ones)"))
        return 0
    admin = any("last_seen" in w for w in items)  # an admin's answer has every field
    headers = ["NAME", "STATE", "QUEUES", "DEVICES"] + (["JOB", "SEEN"] if admin else [])
    rows = []
    for w in items:
        row = [str(w["name"]), str(w["state"]), ",".join(w.get("queues") or []), devices(w)]
        if admin:
            job = w.get("current_job")
            age = w.get("heartbeat_age_s")
            row += [short_id(job) if job else "-",
                    f"{duration(age)} ago" if isinstance(age, int | float) else "-"]
        rows.append(row)
    print_table(headers, rows, flex="DEVICES")
    return 0
