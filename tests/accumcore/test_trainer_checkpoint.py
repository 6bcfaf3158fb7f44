"""Checkpoint files are written atomically and report their size and sha256."""

from __future__ import annotations

import hashlib
import os

import pytest
import torch

from accumcore import Trainer, load_checkpoint, save_checkpoint
from accumcore.checkpoint import CheckpointWriteError, atomic_write_bytes, temp_files


def test_save_reports_size_and_digest_and_loads_back(tmp_path) -> None:
    state = {"progress": {"step": 7, "epoch": 2}, "w": torch.arange(5.0)}
    info = save_checkpoint(state, tmp_path / "sub" / "7.pt", metrics={"loss": 0.5})
    data = info.path.read_bytes()
    assert (info.step, info.epoch, info.size_bytes) == (7, 2, len(data))
    assert info.sha256 == hashlib.sha256(data).hexdigest() and info.metrics == {"loss": 0.5}
    loaded = load_checkpoint(info.path)
    assert torch.equal(loaded["w"], state["w"]) and loaded["progress"] == state["progress"]


def test_a_failed_write_keeps_the_old_file_and_no_temporary(tmp_path, monkeypatch) -> None:
    target = tmp_path / "1.pt"
    atomic_write_bytes(target, b"old")

    def broken_fsync(fd: int) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "fsync", broken_fsync)
    with pytest.raises(OSError, match="disk full"):
        atomic_write_bytes(target, b"new")
    assert target.read_bytes() == b"old" and [p.name for p in tmp_path.iterdir()] == ["1.pt"]


def test_missing_checkpoint_error_says_what_to_pass(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match="checkpoint_dir"):
        load_checkpoint(tmp_path / "nope.pt")


def test_an_unwritable_checkpoint_names_the_file_and_cause_and_leaves_no_temporary(
    tmp_path,
) -> None:
    blocker = tmp_path / "job"
    blocker.write_bytes(b"a file where the checkpoint directory should be")
    with pytest.raises(CheckpointWriteError, match=r"could not write checkpoint .*job/3\.pt: .*writable"):
        save_checkpoint({"progress": {"step": 3}}, blocker / "3.pt")
    assert [p.name for p in tmp_path.iterdir()] == ["job"] and temp_files(tmp_path) == []


def test_temp_files_finds_what_a_killed_writer_left(tmp_path) -> None:
    atomic_write_bytes(tmp_path / "4.pt", b"done")
    left = tmp_path / ".8.pt.abc123.tmp"  # the name atomic_write_bytes gives its temp file
    left.write_bytes(b"half")
    assert temp_files(tmp_path) == [left] and temp_files(tmp_path / "missing") == []


def fsync_calls(monkeypatch) -> list[int]:
    calls: list[int] = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (calls.append(fd), real(fd))[1])
    return calls


def test_a_checkpoint_is_fsynced_with_its_directory_by_default(tmp_path, monkeypatch) -> None:
    calls = fsync_calls(monkeypatch)
    save_checkpoint({"progress": {"step": 1}}, tmp_path / "1.pt")
    assert len(calls) == 2  # the file, then the directory holding its new name


def test_without_fsync_a_checkpoint_is_still_written_whole_by_rename(tmp_path, monkeypatch) -> None:
    calls = fsync_calls(monkeypatch)
    atomic_write_bytes(tmp_path / "2.pt", b"old")
    info = save_checkpoint({"progress": {"step": 2}, "w": torch.ones(3)}, tmp_path / "2.pt", fsync=False)
    assert len(calls) == 2  # only the first write's
    assert torch.equal(load_checkpoint(info.path)["w"], torch.ones(3))
    assert info.sha256 == hashlib.sha256(info.path.read_bytes()).hexdigest()
    assert temp_files(tmp_path) == []


def test_a_trainer_with_checkpoint_fsync_false_writes_checkpoints_without_fsync(tmp_path, monkeypatch) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    trainer = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), accumulation_steps=2,
                      checkpoint_every=1, checkpoint_dir=tmp_path, checkpoint_fsync=False)
    data = [(torch.randn(4, 3), torch.randint(0, 2, (4,))) for _ in range(4)]
    calls = fsync_calls(monkeypatch)
    history = trainer.fit(data, epochs=1)
    assert [c.step for c in history.checkpoints] == [1, 2] and calls == []
    assert load_checkpoint(tmp_path / "2.pt")["progress"]["step"] == 2
