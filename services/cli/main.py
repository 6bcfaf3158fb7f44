"""`accum`: the command line of the accum training-job service.

    accum up                         # local service (API + worker, SQLite), prints URL + token
    accum submit examples/digits_small_cnn.yaml --watch
    accum jobs | status ID | watch ID | events ID | cancel ID | delete ID  # ID: id or prefix
    accum logs ID [--attempt K] [--follow]   # what the job's training printed
    accum resume ID [--from-step K | --from-scratch] [--timeout 2h]
    accum edit ID [--name N] [--tag T ...] [--notes TEXT] | jobs [--tag T] [--search TEXT]
    accum metrics ID [--name loss] [--all] [--csv] | checkpoints ID | download ID [STEP] -o model.pt
    accum catalog [models|datasets] | workers [--all]
    accum token create NAME [--admin] | token list [NAME] | token revoke PREFIX|TOKEN
    accum login URL [--token T]      # remember a server and token for every folder
    accum db upgrade | api | worker | demo

Server URL and token come from ACCUM_URL / ACCUM_TOKEN, else from a local.json that `accum up`
wrote: ACCUM_HOME's, ./.accum's or a parent folder's, else ~/.config/accum/ (accum.config).
Exit codes: 0 ok, 1 error (on stderr), 2 usage; `watch` exits 3 when the job failed and 4 when
it was cancelled, 130 on Ctrl-C. Epochs are counted from 1 in everything printed (the API's
`epoch` fields count from 0).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from pydantic import ValidationError

from accum import AccumAPIError, __version__
from accum.config import ConfigError
from services.cli import (
    admin,
    catalog,
    completion,
    demo,
    edit,
    events,
    jobs,
    login,
    logs,
    results,
    server,
    watch,
    workers,
)
from services.cli.common import CommandError, UsageError, in_cli_words
from services.cli.interrupts import sigint_interrupts
from services.cli.output import hanging, safe_terminal


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="accum",
        description="Submit and follow training jobs with exact gradient accumulation.",
        epilog="Server and token: ACCUM_URL / ACCUM_TOKEN, else the local.json `accum up` "
        "wrote: ./.accum's or a parent folder's, else ~/.config/accum/ (from any folder).",
    )
    parser.add_argument("--version", action="version", version=f"accum {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in (server, jobs, edit, watch, events, logs, results, catalog, workers, admin, login,
                   demo, completion):
        module.register(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """The command, with every character it prints terminal-safe: a control character in a
    note, a path, an error or a job's output is shown escaped (services/cli/output.py)."""
    with safe_terminal():
        return run(argv)


def run(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        with sigint_interrupts():  # Ctrl-C ends any command, also one started as `cmd &`
            return int(args.func(args) or 0)
    except UsageError as exc:
        print(hanging(f"accum {args.command}: ", str(exc), indent=2), file=sys.stderr)
        return 2
    except (AccumAPIError, ConfigError, CommandError) as exc:
        first, *more = exc.lines() if isinstance(exc, AccumAPIError) else [str(exc)]
        said = [hanging(f"accum {args.command}: ", in_cli_words(first), indent=2)]
        said += [hanging("  ", in_cli_words(line), indent=4) for line in more]
        print("\n".join(said), file=sys.stderr)
        return 1
    except BrokenPipeError:
        # `accum metrics ID --csv | head`: the reader left; exit quietly, as Unix tools do.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except OSError as exc:
        # A file the command reads or writes (`download -o /no/such/dir/x.pt`): one line.
        where = f" {exc.filename}" if exc.filename else ""
        print(f"accum {args.command}: cannot use{where}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    except ValidationError as exc:
        # Settings read from ACCUM_* variables: each error already says how to fix it.
        problems = "; ".join(str(e.get("msg", e)) for e in exc.errors())
        print(hanging(f"accum {args.command}: ", f"invalid configuration: {problems}", indent=2),
              file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
