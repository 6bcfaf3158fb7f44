"""A job's checkpoint directory is brought back in line with its rows before an attempt
trains: files no row lists (a predecessor killed between file and row) and temp files (killed
mid-write) go, listed checkpoints and unrelated files stay."""

from __future__ import annotations

from pathlib import Path

from services.worker.checkpoints import orphans, remove_orphans


def test_unlisted_and_temp_files_are_removed_listed_ones_kept(tmp_path: Path) -> None:
    for name in ("10.pt", "20.pt", "30.pt", ".40.pt.x1y2.tmp", "notes.txt", "best.pt"):
        (tmp_path / name).write_bytes(b"x")
    expected = [tmp_path / "30.pt", tmp_path / ".40.pt.x1y2.tmp"]
    assert orphans(tmp_path, [10, 20]) == expected
    assert remove_orphans(tmp_path, [10, 20]) == expected
    assert sorted(p.name for p in tmp_path.iterdir()) == ["10.pt", "20.pt", "best.pt", "notes.txt"]


def test_a_missing_directory_has_no_orphans(tmp_path: Path) -> None:
    assert remove_orphans(tmp_path / "never-written", [5]) == []
