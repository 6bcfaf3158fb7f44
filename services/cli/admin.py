"""Admin commands that talk to the database directly: `token create|list|revoke`, `db upgrade`.

    ACCUM_DATABASE_URL=postgresql+psycopg://accum@db/accum accum db upgrade
    accum token create alice [--admin]     # prints the token once, on stdout
    accum token list [alice] [--all]       # owner, prefix, created, last used (--all: revoked too, and when)
    accum token revoke accum_AbCdEf        # the prefix or the whole token; refused at once

From any folder they use the database of the service `accum up` ran (store_settings); none is
made by accident.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from services.cli.common import CommandError

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    from services.settings import Settings

T = TypeVar("T")


def register(commands: Any) -> None:
    token = commands.add_parser("token", help="manage API tokens (database access needed)")
    token_commands = token.add_subparsers(dest="token_command", metavar="ACTION", required=True)
    create = token_commands.add_parser("create", help="create an owner's token; printed once")
    create.add_argument("name", help="owner name (created if new)")
    create.add_argument("--admin", action="store_true", help="the owner sees every job")
    create.set_defaults(func=cmd_token_create)
    listing = token_commands.add_parser("list", help="list tokens by owner and prefix")
    listing.add_argument("name", nargs="?", help="only this owner's tokens")
    listing.add_argument(
        "--all", action="store_true", help="revoked tokens too, with the time of revocation"
    )
    listing.set_defaults(func=cmd_token_list)
    revoke = token_commands.add_parser(
        "revoke", help="revoke a token: the next request with it gets 401 (its row is kept)"
    )
    revoke.add_argument("token", help="the token, or its prefix as `accum token list` shows it")
    revoke.set_defaults(func=cmd_token_revoke)

    db = commands.add_parser("db", help="database schema (database access needed)")
    db_commands = db.add_subparsers(dest="db_command", metavar="ACTION", required=True)
    upgrade = db_commands.add_parser("upgrade", help="migrate the database to the latest schema")
    upgrade.set_defaults(func=cmd_db_upgrade)


class Failed(int):
    """The exit code of a store command that failed (its one line is already on stderr)."""


def store_settings(command: str, create: bool = False) -> Settings:
    """The database the store commands use: ACCUM_HOME / ACCUM_DATABASE_URL when set; else the
    one of the service `accum up` ran, from any folder: ./.accum or the nearest parent folder's,
    else the one the per-user record names (accum.config). None found: `create` (db upgrade)
    makes ./.accum's, the others say where they looked (they never make an empty database)."""
    from accum.config import DEFAULT_HOME, folder_homes, read_config_file, user_config_path
    from services.settings import Settings, get_settings

    if os.environ.get("ACCUM_HOME") or os.environ.get("ACCUM_DATABASE_URL"):
        return get_settings()
    for home in folder_homes():
        if (home / "local.json").is_file() or (home / "accum.sqlite").is_file():
            settings = Settings(home=home)
            break
    else:
        record = read_config_file(user_config_path())
        if record.get("home"):
            settings = Settings(home=Path(record["home"]),
                                database_url=record.get("database_url", ""))
        elif create:
            return get_settings()
        else:
            raise CommandError(
                f"no accum service found: no {DEFAULT_HOME}/ here or in a parent folder, and no "
                f"{user_config_path()}; run `accum up` first (it records where its database "
                "is), or set ACCUM_HOME to the folder it used (ACCUM_DATABASE_URL for PostgreSQL)"
            )
    if Path.cwd() / DEFAULT_HOME != settings.home:
        print(f"accum {command}: using database {redacted(settings.database_url)}", file=sys.stderr)
    return settings


def in_store(command: str, work: Callable[[Session], T]) -> T | Failed:
    """`work(session)` in one committed transaction on the store_settings() database. A
    ValueError (bad argument) is exit 2, a missing, unmigrated or unreachable database exit 1:
    one line each."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import OperationalError, ProgrammingError

    from services.jobdb.db import make_engine, make_session_factory

    settings = store_settings(command)
    url = make_url(settings.database_url)
    db_file = url.database if url.get_backend_name() == "sqlite" and not url.query.get("uri") else ""
    if db_file and db_file != ":memory:" and not Path(db_file).exists():
        # Connecting would make an empty file: a second database, beside the service's.
        print(
            f"accum {command}: no database at {db_file}; run `accum db upgrade` first to "
            "create it (`accum up` does too), or set ACCUM_HOME to the folder a running "
            "`accum up` uses",
            file=sys.stderr,
        )
        return Failed(1)
    engine = make_engine(settings)
    try:
        with make_session_factory(engine).begin() as session:
            return work(session)
    except ValueError as exc:
        print(f"accum {command}: {exc}", file=sys.stderr)
        return Failed(2)
    except (OperationalError, ProgrammingError) as exc:
        print(
            f"accum {command}: database {redacted(settings.database_url)} is not ready "
            f"({type(exc.orig).__name__}); run `accum db upgrade` first",
            file=sys.stderr,
        )
        return Failed(1)
    finally:
        engine.dispose()


def create_token(settings: Settings, name: str, admin: bool) -> str:
    """A new token for owner `name` (created when new), committed; returns the clear text."""
    from services.jobdb.db import make_engine, make_session_factory
    from services.jobdb.tokens import create_owner_with_token

    engine = make_engine(settings)
    try:
        with make_session_factory(engine).begin() as session:
            _owner, token = create_owner_with_token(session, name, admin)
    finally:
        engine.dispose()
    return token


def upgrade_database(settings: Settings) -> None:
    from services.jobdb.migrate import upgrade

    upgrade(settings.database_url)


def cmd_token_create(args: argparse.Namespace) -> int:
    from services.jobdb.tokens import create_owner_with_token

    created = in_store("token create", lambda s: create_owner_with_token(s, args.name, args.admin))
    if isinstance(created, Failed):
        return created
    print(created[1])
    return 0


def cmd_token_list(args: argparse.Namespace) -> int:
    from services.jobdb.tokens import list_tokens

    rows = in_store("token list", lambda s: list_tokens(s, args.name, include_revoked=args.all))
    if isinstance(rows, Failed):
        return rows
    for owner, prefix, created_at, revoked_at, last_used_at in rows:
        used = f"used {last_used_at:%Y-%m-%d %H:%M}" if last_used_at else "never used"
        line = f"{owner}\t{prefix}\t{created_at:%Y-%m-%d %H:%M:%S}\t{used}"
        if args.all:
            line += f"\trevoked {revoked_at:%Y-%m-%d %H:%M:%S}" if revoked_at else "\tlive"
        print(line)
    return 0


def cmd_token_revoke(args: argparse.Namespace) -> int:
    from services.jobdb.tokens import revoke_token

    revoked = in_store("token revoke", lambda s: revoke_token(s, args.token))
    if isinstance(revoked, Failed):
        return revoked
    if not revoked:
        print(
            "accum token revoke: no such token (already revoked?); `accum token list` shows "
            "the prefixes of the tokens that exist",
            file=sys.stderr,
        )
        return 1
    print("revoked: requests with this token now get 401", file=sys.stderr)
    return 0


def cmd_db_upgrade(args: argparse.Namespace) -> int:
    settings = store_settings("db upgrade", create=True)
    upgrade_database(settings)
    print(f"database at {redacted(settings.database_url)} is at the latest schema", file=sys.stderr)
    return 0


def redacted(url: str) -> str:
    """Hide a password in a database URL before printing it."""
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)
