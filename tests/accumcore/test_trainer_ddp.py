"""DDP on the CPU (gloo, 2 processes): one gradient all-reduce per window, not per
micro-batch, and the result equals the single-process big batch over both ranks' data."""

from __future__ import annotations

import math

import pytest
import torch
import torch.multiprocessing as mp
import trainer_ddp_worker as worker
from rank_processes import start_method
from trainer_reference import TokenCrossEntropy, token_model


def _reference():
    """Single process: each window is the union of both ranks' window, one backward."""
    model = token_model(torch.float64)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5)
    loss_sum = TokenCrossEntropy("sum")
    shards = [list(torch.utils.data.DataLoader(worker.shard(r), batch_size=worker.MICRO_BATCH)) for r in range(worker.WORLD)]
    losses = []
    items = []
    for _ in range(worker.EPOCHS):
        for start in range(0, len(shards[0]), worker.ACCUMULATION):
            window = [b for s in shards for b in s[start : start + worker.ACCUMULATION]]
            total = sum(loss_sum(model(x), y) for x, y in window)
            count = sum(int((y != -100).sum()) for _, y in window)
            (total / count).backward()
            losses.append(float(total.detach()) / count)
            items.append(count)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    return model, losses, items


def test_ddp_skips_sync_inside_windows_and_equals_the_big_batch(tmp_path) -> None:
    # Fork, after importing what DDP imports (torch._dynamo): spawned children would each
    # re-import torch, which costs seconds on a shared 2-core machine. The children run one
    # thread each, so forking a process that has used OpenMP is safe here.
    import torch._dynamo  # noqa: F401

    mp.start_processes(worker.run, args=(str(tmp_path / "init"), str(tmp_path)), nprocs=worker.WORLD,
                       join=True, start_method=start_method())
    results = [torch.load(tmp_path / f"rank{r}.pt") for r in range(worker.WORLD)]
    reference, losses, items = _reference()
    steps = worker.EPOCHS * math.ceil(math.ceil(worker.SAMPLES_PER_RANK / worker.MICRO_BATCH) / worker.ACCUMULATION)
    micro_batches = worker.EPOCHS * math.ceil(worker.SAMPLES_PER_RANK / worker.MICRO_BATCH)
    for result in results:
        # One bucket for this tiny model: one all-reduce per optimizer step.
        assert result["allreduces"] == steps < micro_batches
        for p, q in zip(result["params"], reference.parameters(), strict=True):
            assert float((p - q.detach()).abs().max()) <= 1e-12
        # Logged loss and items are global (both ranks), not the rank's own.
        assert all(abs(a - b) <= 1e-12 for a, b in zip(result["losses"], losses, strict=True))
        assert [round(n) for n in result["items_per_step"]] == items
    # The ranks' item counts differ, so plain averaging over ranks would not be exact.
    per_rank = [[int((y != -100).sum()) for _, y in torch.utils.data.DataLoader(worker.shard(r), batch_size=6)] for r in range(2)]
    assert per_rank[0] != per_rank[1]


def _uneven_reference():
    """Single process, float64: window w is the union of every rank's window w (a rank that
    has none left adds nothing); one backward of the window's mean."""
    model = token_model(torch.float64)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5)
    loss_sum = TokenCrossEntropy("sum")
    shards = [list(torch.utils.data.DataLoader(worker.uneven_shard(r), batch_size=worker.MICRO_BATCH))
              for r in range(worker.WORLD)]
    windows = max(math.ceil(len(s) / 2) for s in shards)
    losses = []
    for _ in range(worker.UNEVEN_EPOCHS):
        for w in range(windows):
            window = [b for s in shards for b in s[2 * w : 2 * w + 2]]
            total = sum(loss_sum(model(x), y) for x, y in window)
            count = sum(int((y != -100).sum()) for _, y in window)
            (total / count).backward()
            losses.append(float(total.detach()) / count)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    return model, losses


def _run_case(case: str, tmp_path) -> list[dict]:
    import torch._dynamo  # noqa: F401  (see above: import before forking)

    mp.start_processes(worker.run_case, args=(case, str(tmp_path / "init"), str(tmp_path)), nprocs=worker.WORLD,
                       join=True, start_method=start_method())
    return [torch.load(tmp_path / f"rank{r}.pt") for r in range(worker.WORLD)]


@pytest.mark.parametrize("case", ["uneven", "oom"])
def test_uneven_shards_and_an_oom_on_one_rank_equal_the_big_batch(case: str, tmp_path) -> None:
    """Rank 1 has 4 samples, rank 0 has 7: in each epoch's 2nd window rank 1 has no micro-batch,
    contributes zero items and still joins the collectives. With "oom", rank 1 alone runs out
    of memory at 2 samples: every rank backs off to 1-sample micro-batches together."""
    results = _run_case(case, tmp_path)
    reference, losses = _uneven_reference()
    for result in results:
        for p, q in zip(result["params"], reference.parameters(), strict=True):
            assert float((p - q.detach()).abs().max()) <= 1e-12
        assert all(abs(a - b) <= 1e-12 for a, b in zip(result["losses"], losses, strict=True))
        assert result["steps"] == len(losses) == 4
        assert result["events"] == (["oom_backoff"] if case == "oom" else [])
        assert result["split"] == (2 if case == "oom" else 1)


def test_a_stop_on_one_rank_stops_every_rank_at_the_same_window(tmp_path) -> None:
    results = _run_case("stop", tmp_path)
    assert [r["stopped"] for r in results] == [True, True]
    assert [r["steps"] for r in results] == [1, 1]
    assert all(torch.equal(p, q) for p, q in zip(results[0]["params"], results[1]["params"], strict=True))
