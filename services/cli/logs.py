"""`accum logs ID`: what a job's training process printed (stdout, stderr, Python warnings,
library log messages), captured per attempt by its worker; `--follow` prints new lines as
they come until the job finishes.

    accum logs 01jd3k5x9a2f
    accum logs 01jd3k5x9a2f --attempt 2 --follow
    accum logs 01jd3k5x9a2f --json | jq -r '.[] | select(.stream == "stderr") | .line'
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable
from typing import Any

from services.cli.common import make_client, resolve_job_id
from services.cli.output import print_json


def register(commands: Any) -> None:
    logs = commands.add_parser("logs", help="print what a job's training printed, per attempt")
    logs.add_argument("job_id", metavar="ID", help="job id, or a unique prefix of it")
    logs.add_argument("--attempt", type=_attempt, metavar="K",
                      help="only attempt K (1 is the first; `accum status ID` lists them)")
    logs.add_argument("--follow", "-f", action="store_true",
                      help="keep printing new lines until the job finishes")
    logs.add_argument("--json", action="store_true", help="print the lines as JSON")
    logs.set_defaults(func=cmd_logs)


def _attempt(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"--attempt takes a whole number from 1 (the first attempt), not {text!r}")
    return value


def cmd_logs(args: argparse.Namespace) -> int:
    with make_client() as client:
        job_id = resolve_job_id(client, args.job_id)
        if args.json and not args.follow:
            print_json(client.all_logs(job_id, attempt=args.attempt))
            return 0
        lines = (client.follow_logs(job_id, attempt=args.attempt) if args.follow
                 else client.all_logs(job_id, attempt=args.attempt))
        printed = print_lines(lines, as_json=args.json, headers=args.attempt is None)
    if not printed:
        which = f"attempt {args.attempt} of job {args.job_id}" if args.attempt else f"job {args.job_id}"
        print(f"{which} has printed nothing (a queued job has not started; only what the "
              "training process prints is captured)", file=sys.stderr)
    return 0


def print_lines(lines: Iterable[dict[str, Any]], *, as_json: bool, headers: bool) -> int:
    """Print each line as it comes (a header where a new attempt starts); returns how many."""
    count, attempt = 0, None
    for item in lines:
        if as_json:
            print(json.dumps(item, sort_keys=True))  # one JSON object a line
        else:
            if headers and item["attempt"] != attempt:
                print(f"── attempt {item['attempt']} ──")
            print(item["line"])
        attempt = item["attempt"]
        count += 1
        sys.stdout.flush()
    return count
