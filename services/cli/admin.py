"""Admin commands that talk to the database directly: `token create`, `db upgrade`.

    ACCUM_DATABASE_URL=postgresql+psycopg://accum@db/accum accum db upgrade
    accum token create alice [--admin]     # prints the token once, on stdout
"""

from __future__ import annotations

import argparse
import sys
from typing import Any


def register(commands: Any) -> None:
    token = commands.add_parser("token", help="manage API tokens (database access needed)")
    token_commands = token.add_subparsers(dest="token_command", metavar="ACTION", required=True)
    create = token_commands.add_parser("create", help="create an owner's token; printed once")
    create.add_argument("name", help="owner name (created if new)")
    create.add_argument("--admin", action="store_true", help="the owner sees every job")
    create.set_defaults(func=cmd_token_create)

    db = commands.add_parser("db", help="database schema (database access needed)")
    db_commands = db.add_subparsers(dest="db_command", metavar="ACTION", required=True)
    upgrade = db_commands.add_parser("upgrade", help="migrate the database to the latest schema")
    upgrade.set_defaults(func=cmd_db_upgrade)


def create_token(settings: Any, name: str, admin: bool) -> str:
    """A new token for owner `name` (created when new), committed; returns the clear text."""
    from services.store.db import make_engine, make_session_factory
    from services.store.tokens import create_owner_with_token

    engine = make_engine(settings)
    try:
        with make_session_factory(engine).begin() as session:
            _owner, token = create_owner_with_token(session, name, admin)
    finally:
        engine.dispose()
    return token


def upgrade_database(settings: Any) -> None:
    from services.store.migrate import upgrade

    upgrade(settings.database_url)


def cmd_token_create(args: argparse.Namespace) -> int:
    from sqlalchemy.exc import OperationalError, ProgrammingError

    from services.settings import get_settings

    settings = get_settings()
    try:
        token = create_token(settings, args.name, args.admin)
    except ValueError as exc:
        print(f"accum token create: {exc}", file=sys.stderr)
        return 2
    except (OperationalError, ProgrammingError) as exc:
        print(
            f"accum token create: database {redacted(settings.database_url)} is not ready "
            f"({type(exc.orig).__name__}); run `accum db upgrade` first",
            file=sys.stderr,
        )
        return 1
    print(token)
    return 0


def cmd_db_upgrade(args: argparse.Namespace) -> int:
    from services.settings import get_settings

    settings = get_settings()
    upgrade_database(settings)
    print(f"database at {redacted(settings.database_url)} is at the latest schema", file=sys.stderr)
    return 0


def redacted(url: str) -> str:
    """Hide a password in a database URL before printing it."""
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)
