"""`accum token create | list | revoke` against the real API server's database: a revoked
token gets 401 on its next request, the list never shows a whole token."""

from __future__ import annotations

import httpx
import pytest
from cli_helpers import Server, unwrapped

from services.cli.main import main


@pytest.fixture
def server_database(api_server: Server, monkeypatch: pytest.MonkeyPatch) -> Server:
    """The token commands pointed at the test server's database (ACCUM_HOME)."""
    for key, value in api_server.env.items():
        if key.startswith("ACCUM_"):
            monkeypatch.setenv(key, value)
    return api_server


def accum(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_list_then_revoke_by_prefix_refuses_the_next_request(
    server_database: Server, capsys: pytest.CaptureFixture[str]
) -> None:
    _, token, _ = accum(capsys, "token", "create", "dora")
    token = token.strip()
    headers = {"Authorization": f"Bearer {token}"}
    assert httpx.get(f"{server_database.url}/v1/jobs", headers=headers).status_code == 200

    code, listing, _ = accum(capsys, "token", "list", "dora")
    assert code == 0 and listing.split("\t")[:2] == ["dora", token[:12]]
    assert listing.split("\t")[3].startswith("used 20")  # the GET above used it
    assert token[12:] not in listing
    code, out, err = accum(capsys, "token", "revoke", token[:12])
    assert (code, out) == (0, "") and "401" in err

    assert httpx.get(f"{server_database.url}/v1/jobs", headers=headers).status_code == 401
    code, _, err = accum(capsys, "token", "revoke", token)
    assert code == 1 and "no such token" in unwrapped(err) and "accum token list" in unwrapped(err)
    assert accum(capsys, "token", "list", "dora")[1] == ""  # live tokens only
    code, trail, _ = accum(capsys, "token", "list", "dora", "--all")
    assert code == 0 and trail.split("\t")[:2] == ["dora", token[:12]]
    assert trail.split("\t")[4].startswith("revoked 20")


def test_revoke_by_whole_token_and_bad_arguments(
    server_database: Server, capsys: pytest.CaptureFixture[str]
) -> None:
    _, token, _ = accum(capsys, "token", "create", "eve")
    assert accum(capsys, "token", "revoke", token.strip())[0] == 0
    assert accum(capsys, "token", "list", "eve")[1] == ""

    code, _, err = accum(capsys, "token", "revoke", "accum_")
    assert code == 2 and "12-character prefix" in err
