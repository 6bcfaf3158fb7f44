"""`accum login URL [--token T]`: remember a server for every folder, as `gh auth login` does.

    accum login https://accum.example.org       # asks for the token (or reads it from stdin)
    ACCUM_TOKEN=accum_... accum login http://gpu-box:8000

The token is checked (GET /v1/me) before anything is written; then the URL and token go to the
per-user record (accum.config.user_config_path, mode 0600), which the CLI and AccumClient()
read from any folder that has no .accum of its own. The next `accum up` replaces it.
"""

from __future__ import annotations

import argparse
import getpass
import os
import sys
from typing import Any

from accum import AccumClient
from accum.config import user_config_path, write_config_file
from services.cli.common import UsageError


def register(commands: Any) -> None:
    login = commands.add_parser(
        "login", help="remember a server and token for every folder (the per-user config)"
    )
    login.add_argument("url", help="the API's address, e.g. http://127.0.0.1:8000")
    login.add_argument(
        "--token", help="default: ACCUM_TOKEN, else asked for (or one line of stdin)"
    )
    login.set_defaults(func=cmd_login)


def cmd_login(args: argparse.Namespace) -> int:
    url = args.url.rstrip("/")
    token = args.token or os.environ.get("ACCUM_TOKEN") or _ask_token(url)
    if not token:
        raise UsageError("no token given: pass --token, set ACCUM_TOKEN, or type it when asked")
    with AccumClient(url, token) as client:
        me = client.me()  # 401 or unreachable: the error says so, and nothing is written
    path = write_config_file(user_config_path(), {"url": url, "token": token})
    role = " (admin)" if me.get("is_admin") else ""
    print(f"logged in to {url} as {me.get('name')}{role}; saved in {path}", file=sys.stderr)
    return 0


def _ask_token(url: str) -> str:
    if sys.stdin.isatty():
        return getpass.getpass(f"token for {url}: ").strip()
    return sys.stdin.readline().strip()
