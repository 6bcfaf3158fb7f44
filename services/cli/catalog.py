"""`accum catalog [models|datasets]`: the names a spec may use, with what each one is."""

from __future__ import annotations

import argparse
from typing import Any

from services.cli.common import make_client
from services.cli.output import print_json, print_table


def register(commands: Any) -> None:
    catalog = commands.add_parser("catalog", help="list the models and datasets a spec may name")
    catalog.add_argument("kind", nargs="?", choices=("models", "datasets"), help="default: both")
    catalog.add_argument("--json", action="store_true", help="print the catalog as JSON")
    catalog.set_defaults(func=cmd_catalog)


def cmd_catalog(args: argparse.Namespace) -> int:
    kinds = [args.kind] if args.kind else ["models", "datasets"]
    with make_client() as client:
        listings = {kind: client.catalog(kind) for kind in kinds}
    if args.json:
        print_json(listings)
        return 0
    for number, (kind, items) in enumerate(listings.items()):
        if number:
            print()
        rows = [[str(i.get("name")), str(i.get("description") or "")] for i in items]
        print_table([kind[:-1].upper(), "DESCRIPTION"], rows, flex="DESCRIPTION")
    return 0
