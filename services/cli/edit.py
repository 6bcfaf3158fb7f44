"""`accum edit ID`: a job's name, tags and notes, changed after submit (the spec stays).

    accum edit 01jd3k5x9a2f --name lr-sweep-3 --tag sweep --tag lr=3e-4 --notes "baseline"
    accum edit 01jd3k5x9a2f --tag ""        # no tags
    accum jobs --tag sweep --search baseline
"""

from __future__ import annotations

import argparse
from typing import Any

from services.cli.common import UsageError, make_client, resolve_job_id
from services.cli.output import hanging, print_json


def register(commands: Any) -> None:
    edit = commands.add_parser("edit", help="rename a job, set its tags or notes")
    edit.add_argument("job_id", metavar="ID", help="job id, or a unique prefix of it")
    edit.add_argument("--name", help="a new name")
    edit.add_argument("--tag", action="append", metavar="TAG",
                      help='a tag (repeat for several; they replace the old ones; --tag "" clears)')
    edit.add_argument("--notes", help='notes ("" clears them)')
    edit.add_argument("--json", action="store_true", help="print the job as JSON")
    edit.set_defaults(func=cmd_edit)


def cmd_edit(args: argparse.Namespace) -> int:
    if args.name is None and args.tag is None and args.notes is None:
        raise UsageError("say what to change: --name, --tag or --notes")
    tags = None if args.tag is None else [t for t in args.tag if t]
    with make_client() as client:
        job = client.edit(resolve_job_id(client, args.job_id), name=args.name, tags=tags,
                          notes=args.notes)
    if args.json:
        print_json(job)
        return 0
    tagged = ", ".join(job.get("tags") or []) or "none"
    print(hanging("", f"job {job['id']}: name {job.get('name') or '-'}, tags {tagged}", indent=2))
    return 0
