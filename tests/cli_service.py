"""A service as a CLI user reaches it, for the tests that run ``accum`` (or a script calling
it) in a subprocess: a real API and one real worker on an embedded (SQLite) stack, an owner's
token, and the client's environment, which names the service by ACCUM_URL/ACCUM_TOKEN only
(no ACCUM_* setting of the test process leaks in; its own config and home folders).

    with cli_service(request, tmp_path, "ex", before=make_data) as (stack, env):
        subprocess.run(["accum", "submit", ...], env=env)
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from api_process import running_api
from worker_stack import Stack, make_stack

from services.jobdb import tokens


@contextmanager
def cli_service(request: pytest.FixtureRequest, tmp_path: Path, owner: str,
                **client_env: str) -> Iterator[tuple[Stack, dict[str, str]]]:
    """The stack (its worker started) and the client's environment (``client_env`` added);
    the worker is stopped afterwards."""
    stack = make_stack("sqlite", tmp_path, request)
    with stack.sessions.begin() as session:
        _, token = tokens.create_owner_with_token(session, owner)
    stack.start_worker()
    try:
        with running_api(stack.env(), stack.logs / "api.log") as api:
            env = {k: v for k, v in os.environ.items() if not k.startswith("ACCUM_")}
            env.update(ACCUM_URL=api.url, ACCUM_TOKEN=token, XDG_CONFIG_HOME=str(tmp_path / "config"),
                       ACCUM_HOME=str(tmp_path / "client"), **client_env)
            yield stack, env
    finally:
        stack.stop_workers()
