"""ACCUM_DATA_ROOTS entries with owners (issue 42 item 1): who may read where, as the API and
every worker node decide it (services/data_roots.py). The real processes are in
tests/reliability/test_file_isolation.py; these are the rules, one line each."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from services.data_roots import configured_data_roots, data_root_refusal, reader_roots
from services.settings import Settings


def test_the_deepest_root_decides_and_a_folder_holding_anothers_root_is_refused(tmp_path: Path) -> None:
    data = tmp_path / "data"
    settings = Settings(home=tmp_path, data_roots=[
        str(data), f"alice:{data}/alice", f"alice,bob:{data}/team", f"{data}/users/{{owner}}",
        "s3://b/public", "s3://b/users/{owner}",
    ])
    (data / "users" / "bob").mkdir(parents=True)
    (data / "users" / "bob" / "link").symlink_to(data / "users" / "alice")
    readable = {  # path: the owners who may read it
        f"{data}/shared": {"alice", "bob", "carol"},
        f"{data}/alice/x": {"alice"},
        f"{data}/team/x": {"alice", "bob"},
        f"{data}/users/alice/x": {"alice"},
        f"{data}/users/bob/link/x": set(),  # bob's link into alice's folder
        f"{data}/users/alice/../bob": {"bob"},
        f"{data}/users": set(),  # holds every owner's folder
        str(data): set(),
        str(tmp_path / "elsewhere"): set(),
        "s3://b/public/x": {"alice", "bob", "carol"},
        "s3://b/users/carol/x": {"carol"},
        "s3://b/users": set(),
    }
    for path, owners in readable.items():
        for owner in ("alice", "bob", "carol"):
            refusal = data_root_refusal(path, reader_roots(settings, owner), show_roots=False)
            assert (refusal is None) == (owner in owners), (path, owner, refusal)
    # An owner named ".." gets no {owner} folder: /data/users/.. would be /data.
    assert data_root_refusal(str(data), reader_roots(settings, ".."), show_roots=False) is not None
    assert configured_data_roots(settings)[1:4] == [
        f"alice:{data.resolve()}/alice", f"alice,bob:{data.resolve()}/team", f"{data.resolve()}/users/{{owner}}"]


def test_anothers_file_and_a_missing_one_get_one_message(tmp_path: Path) -> None:
    data = tmp_path / "data"
    (data / "users" / "alice").mkdir(parents=True)
    (data / "users" / "alice" / "private.csv").write_text("secret,columns\n")
    roots = reader_roots(Settings(home=tmp_path, data_roots=[f"{data}/users/{{owner}}"]), "bob")
    said = [(data_root_refusal(str(path), roots, show_roots=False) or "").replace(str(path), "<path>")
            for path in (data / "users" / "alice" / "private.csv", data / "users" / "alice" / "absent.csv",
                         data / "users" / "nobody" / "absent.csv")]
    assert said[0] == said[1] == said[2] and "outside the allowed data roots" in said[0]


def test_anothers_path_is_refused_as_written_without_looking_at_the_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Same timing as a missing file: a path written under another owner's folder is refused
    before anything is resolved (resolving an existing path took 1-3 us less than a missing
    one, of ~75 us); bob's own paths are still resolved, links followed."""
    data = tmp_path / "data"
    (data / "users" / "alice").mkdir(parents=True)
    (data / "users" / "bob").mkdir()
    (data / "users" / "bob" / "link").symlink_to(data / "users" / "alice")
    roots = reader_roots(Settings(home=tmp_path, data_roots=[f"{data}/users/{{owner}}"]), "bob")
    looked_up: list[str] = []  # the paths named (the roots are resolved too: the same for all)
    realpath = os.path.realpath
    monkeypatch.setattr(os.path, "realpath", lambda path, **kw: looked_up.append(str(path)) or realpath(path, **kw))
    theirs = [str(data / "users" / "alice"), str(data / "users" / "alice" / "absent"), str(data / "users" / "nobody" / "x")]
    for path in theirs:
        assert data_root_refusal(path, roots, show_roots=False) is not None
    assert not set(theirs) & set(looked_up)
    own = [str(data / "users" / "bob" / "link"), str(data / "users" / "bob")]
    assert [data_root_refusal(path, roots, show_roots=False) is None for path in own] == [False, True]
    assert set(own) <= set(looked_up)


@pytest.mark.parametrize("entry, said", [
    ("/data/{user}", "the only placeholder is {owner}"),
    ("/data/{owner}{owner}", "at most once in a path part"),
    ("s3:///x", "names no bucket"),
])
def test_a_bad_entry_is_refused_at_start_up_with_how_to_write_it(tmp_path: Path, entry: str, said: str) -> None:
    with pytest.raises(ValueError, match=said):
        Settings(home=tmp_path, data_roots=[entry])
