"""``peak_memory_bytes_rank{r}``: every rank's step peak, gathered on every rank (2 gloo ranks;
the CUDA peak each rank reports is stood in for by a number of its own), so rank 0, which
records the job's metrics, has the sharded ranks' peaks too; nothing in one process."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from rank_processes import start_method

from accumcore.metrics import rank_peaks


def _rank(rank: int, init_file: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        gathered = rank_peaks(1000.0 * (rank + 1) + 0.5, torch.device("cpu"))
        torch.save(gathered, Path(out) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_every_rank_gets_every_ranks_peak(tmp_path: Path) -> None:
    mp.start_processes(_rank, args=(str(tmp_path / "init"), str(tmp_path)), nprocs=2, join=True,
                       start_method=start_method())
    expected = {"peak_memory_bytes_rank0": 1000.5, "peak_memory_bytes_rank1": 2000.5}
    assert [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)] == [expected, expected]


def test_one_process_has_no_rank_peaks() -> None:
    assert rank_peaks(5.0, torch.device("cpu")) == {}
