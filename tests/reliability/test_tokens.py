"""Tokens at rest and revoked: no clear token in any stored row; a revoked token is refused
on the very next request by every API process (real uvicorn processes, SQLite and PostgreSQL).

    .venv/bin/python -m pytest tests/reliability/test_tokens.py -q
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from api_process import running_api
from sqlalchemy import Engine, select, text

from services.cli.main import main as accum
from services.jobdb.models import Base
from services.settings import Settings


def create_token(capsys: pytest.CaptureFixture[str], name: str, *flags: str) -> str:
    assert accum(["token", "create", name, *flags]) == 0
    return capsys.readouterr().out.strip()


@pytest.fixture
def cli_database(store_settings: Settings, monkeypatch: pytest.MonkeyPatch) -> Settings:
    """The `accum token` commands pointed at this test's database."""
    for name in Settings.model_fields:  # settings only: test switches such as ACCUM_RECORD_* stay
        monkeypatch.delenv(f"ACCUM_{name.upper()}", raising=False)
    monkeypatch.setenv("ACCUM_HOME", str(store_settings.home))
    monkeypatch.setenv("ACCUM_DATABASE_URL", store_settings.database_url)
    return store_settings


def test_no_stored_row_holds_a_clear_token(
    cli_database: Settings,
    db_engine: Engine,
    capsys: pytest.CaptureFixture[str],
    record_figure: Any,
    database_backend: str,
) -> None:
    issued = [create_token(capsys, "alice"), create_token(capsys, "bob"),
              create_token(capsys, "root", "--admin")]

    rows = cells = 0
    leaks = []
    with db_engine.connect() as conn:
        for table in Base.metadata.sorted_tables:
            for row in conn.execute(select(table)):
                rows += 1
                for value in row:
                    cells += 1
                    # The random part alone: the "accum_" prefix is in every token.
                    leaks += [t for t in issued if t[6:] in str(value)]
        stored = dict(conn.execute(text("SELECT token_hash, prefix FROM api_tokens")).all())

    assert leaks == []
    assert sorted(stored) == sorted(hashlib.sha256(t.encode()).hexdigest() for t in issued)
    assert all(len(prefix) == 12 for prefix in stored.values())
    record_figure(
        "tokens_hashed",
        area="auth",
        check=f"{len(issued)} tokens made with `accum token create`; every cell of every table "
        f"read back raw ({database_backend})",
        figure=f"0 clear tokens in {cells} cells of {rows} rows; api_tokens holds sha256 "
        f"({len(stored)}/{len(issued)} match) and a 12-character prefix",
        passed=not leaks,
    )


def test_a_revoked_token_is_refused_at_once_by_every_api_process(
    cli_database: Settings,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    record_figure: Any,
    database_backend: str,
) -> None:
    doomed = create_token(capsys, "carol")
    kept = create_token(capsys, "carol")
    env = {k: v for k, v in os.environ.items()}
    auth = {"Authorization": f"Bearer {doomed}"}
    with (
        running_api(env, tmp_path / "api-1.log") as first,
        running_api(env, tmp_path / "api-2.log") as second,
    ):
        apis = [httpx.Client(base_url=api.url, timeout=30) for api in (first, second)]
        # Warm: each process has accepted the token many times (any cache would hold it now).
        warm = [c.get("/v1/jobs", headers=auth).status_code for c in apis for _ in range(20)]

        assert accum(["token", "list", "carol"]) == 0
        listing = capsys.readouterr().out
        assert doomed[:12] in listing and doomed[12:] not in listing
        assert accum(["token", "revoke", doomed[:12]]) == 0
        revoked_at = time.monotonic()
        after = [c.get("/v1/jobs", headers=auth) for c in apis]
        refused_within = time.monotonic() - revoked_at
        still_kept = [c.get("/v1/jobs", headers={"Authorization": f"Bearer {kept}"}) for c in apis]
        for c in apis:
            c.close()

    assert warm == [200] * len(warm)
    assert [r.status_code for r in after] == [401, 401]
    assert "revoked" in after[0].json()["detail"]
    assert [r.status_code for r in still_kept] == [200, 200], "only the revoked token goes"
    record_figure(
        "token_revocation",
        area="auth",
        check="`accum token revoke PREFIX` while 2 API processes had each accepted the token "
        f"20 times ({database_backend})",
        figure=f"the first request after the revoke got 401 in {sum(r.status_code == 401 for r in after)}"
        f"/2 processes ({refused_within * 1000:.0f} ms after it); the owner's other token "
        "still works",
        passed=[r.status_code for r in after] == [401, 401],
    )
