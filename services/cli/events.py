"""`accum events ID`: a job's lifecycle events, oldest first, as `accum watch` shows them
(time, kind, message wrapped under itself), tracebacks included; `--json` for scripts.

    accum events 01jd3k5x9a2f
    accum events 01jd3k5x9a2f --json | jq '.[] | select(.kind == "traceback") | .data'
"""

from __future__ import annotations

import argparse
from typing import Any

from services.cli.common import make_client, resolve_job_id
from services.cli.output import console, print_json
from services.cli.watch import History


def register(commands: Any) -> None:
    events = commands.add_parser("events", help="list a job's lifecycle events, oldest first")
    events.add_argument("job_id", metavar="ID", help="job id, or a unique prefix of it")
    events.add_argument("--json", action="store_true", help="print the events as JSON")
    events.set_defaults(func=cmd_events)


def cmd_events(args: argparse.Namespace) -> int:
    with make_client() as client:
        items = client.all_events(resolve_job_id(client, args.job_id))
    if args.json:
        print_json(items)
        return 0
    history = History(console(), tracebacks=True)
    for event in items:
        history.event(event)
    history.finish()
    return 0
