"""bench/trainer/exactness_fsdp.py records what a run of 2 gloo ranks came to: a figure, a
refusal (an error before the first micro-batch, with its first line), or a hang (the ranks
killed after the timeout, each rank's micro-batch count said). The figure itself is checked by
test_bench_smoke.py (the exactness bench in --quick mode)."""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from bench.trainer import exactness_fsdp as fsdp


def _refuses(rank: int, folder: str, sizes: tuple[int, ...]) -> None:
    raise ValueError("The strategy wants a GPU.\nSecond line of the message.")


def _uneven_collectives(rank: int, folder: str, sizes: tuple[int, ...]) -> None:
    """Rank 0 runs two all-reduces; rank 1 joins the first, then never comes."""
    dist.init_process_group("gloo", rank=rank, world_size=fsdp.WORLD)
    for _ in range(2 - rank):
        fsdp._training(folder, rank)
        dist.all_reduce(torch.ones(1))
    time.sleep(600)


def test_an_error_before_the_first_micro_batch_is_a_refusal_with_its_first_line() -> None:
    assert fsdp._run(_refuses, fsdp.SHARDS, timeout_s=60) == {
        "status": "refused on CPU: ValueError: The strategy wants a GPU."}


def test_a_run_whose_ranks_wait_on_each_other_is_killed_and_recorded_as_hung() -> None:
    result = fsdp._run(_uneven_collectives, fsdp.SHARDS, timeout_s=5)
    assert result["status"].startswith(
        "hung: rank 0 waiting after 2 micro-batches, rank 1 waiting after 1 micro-batches"), result
