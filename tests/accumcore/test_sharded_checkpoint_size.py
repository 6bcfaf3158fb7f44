"""How big a sharded checkpoint is as a whole, seen from rank 0's node: its own files, plus the
shards of ranks on other nodes at the size of the shards it has (the artifact quota's check
before an upload, services.worker.callbacks)."""

from __future__ import annotations

from pathlib import Path

from accumcore.sharded_checkpoint import DCP_METADATA, TRAINER_FILE, whole_size_estimate


def files(folder: Path, sizes: dict[str, int]) -> Path:
    folder.mkdir()
    for name, size in sizes.items():
        (folder / name).write_bytes(b"x" * size)
    return folder


def test_every_rank_here_is_its_own_size(tmp_path: Path) -> None:
    folder = files(tmp_path / "4", {DCP_METADATA: 10, TRAINER_FILE: 20, "__0_0.distcp": 100,
                                    "__1_0.distcp": 104})
    assert whole_size_estimate(folder, world_size=2) == 234


def test_ranks_on_other_nodes_count_as_the_shards_here_average(tmp_path: Path) -> None:
    folder = files(tmp_path / "4", {DCP_METADATA: 10, TRAINER_FILE: 20, "__0_0.distcp": 100,
                                    "__1_0.distcp": 104})
    assert whole_size_estimate(folder, world_size=4) == 234 + 2 * 102
    alone = files(tmp_path / "6", {DCP_METADATA: 10, TRAINER_FILE: 20, "__0_0.distcp": 100})
    assert whole_size_estimate(alone, world_size=3) == 130 + 2 * 100
