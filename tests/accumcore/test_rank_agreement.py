"""Ranks that differ: the exactness check and errors agreed by every rank (issue 41 items 3, 4).

Two gloo ranks, started once for the module (``rank_agreement_worker.py`` runs every case in
the same processes, one Trainer each):

- the check fails on both ranks when only rank 1's share shows the mistake, and rank 0's
  message names the fix rank 1 found; with fewer micro-batches than ranks (one row each: no
  rank's own share can tell a sum from a mean) the window's micro-batches are gathered and the
  lying loss fails at window 1; a rank that cannot check its share makes the check
  ``partial`` (not passed), and ``"strict"`` fails on both ranks;
- an error that only rank 1 meets (targets it cannot count, before the window's all-reduce;
  a loss refused by the loss check on rank 1 alone; a token id out of range in a forward
  inside the window) is raised on both ranks as the same ``RankFailed`` within 5 s, rank 1's
  own error as its cause (before: rank 0 waited in the window's all-reduce until the process
  group's timeout, 120 s in the audit's run), a BatchNorm1d refusing rank 1's one-sample
  micro-batch too; label-shift detection of a sharded tiny causal LM (``loss_fn=None``, keyword
  batches) with a rank that has no data in the first window is decided by both ranks (it
  deadlocked);
- on a sharded model (FSDP2 ``fully_shard``, float64) the check compares the reduce-scattered
  shards: uneven shares pass (1e-16) and train bitwise as unchecked; a summing loss and a
  per-row mean fail at window 1 with the fix named.
"""

from __future__ import annotations

import pytest
import rank_agreement_worker as worker
import torch
import torch.multiprocessing as mp
from rank_processes import start_method

WORLD = 2


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> list[dict]:
    import torch._dynamo  # noqa: F401  # imported before forking, as test_trainer_ddp does

    out = tmp_path_factory.mktemp("agreement")
    mp.start_processes(worker.run, args=(WORLD, str(out / "init"), str(out), list(worker.CASES)),
                       nprocs=WORLD, join=True, start_method=start_method())
    return [torch.load(out / f"rank{r}.pt") for r in range(WORLD)]


def test_a_mistake_only_rank_1_can_see_fails_both_ranks_with_the_fix_named_on_rank_0(results) -> None:
    zero, one = (r["exact_on_rank0_only"] for r in results)
    assert one["events"] == []  # rank 0 reports
    [(message, data)] = zero["events"]
    assert data["status"] == "failed" and data["ranks_checked"] == WORLD and data["cause_rank"] == 1
    assert "count_items='rows'" in message and "found on rank 1" in message
    assert zero["error"]["message"] == one["error"]["message"]
    assert all(r["error"]["cause"] == "count_items" and r["steps"] == 0 for r in (zero, one))


def test_fewer_micro_batches_than_ranks_are_gathered_and_a_lying_loss_fails_at_window_1(results) -> None:
    zero, one = (r["fewer_micro_batches_than_ranks"] for r in results)
    [(message, data)] = zero["events"]
    assert data["status"] == "failed" and data["gathered"] and data["micro_batches"] == WORLD
    assert "all 2 ranks gathered" in message
    assert all(r["error"]["cause"] == "reduction" and r["steps"] == 0 for r in (zero, one))


def test_a_rank_that_cannot_check_makes_the_check_partial_and_strict_fail_on_every_rank(results) -> None:
    zero, one = (r["cannot_check_true"] for r in results)
    [(message, data)] = zero["events"]
    assert data["status"] == "partial" and data["passed"] is None
    assert (data["ranks_checked"], data["ranks_with_data"], data["unchecked_ranks"]) == (1, 2, [1])
    assert "rank 1: skipped: the micro-batches cannot be concatenated" in message
    assert zero["error"] is None and one["error"] is None and zero["steps"] == one["steps"] == 1
    strict = [r["cannot_check_strict"] for r in results]
    assert all(r["error"]["cause"] == "not_run" and r["steps"] == 0 for r in strict)
    assert "not checked on rank(s) 1" in strict[0]["error"]["message"]


@pytest.mark.parametrize("case, kind, says", [
    ("bad_targets", "TypeError", "cannot count items of targets of type list"),
    ("bad_targets_checked", "TypeError", "cannot count items of targets of type list"),
    ("sharded_bad_targets", "TypeError", "cannot count items of targets of type list"),
    ("loss_check", "ValueError", "loss_fn returns a sum over the micro-batch"),
    ("forward_error", "IndexError", "index out of range"),
])
def test_an_error_on_rank_1_alone_is_raised_on_both_ranks_at_once(results, case: str, kind: str, says: str) -> None:
    zero, one = (r[case] for r in results)
    for result in (zero, one):
        error = result["error"]
        assert (error["rank"], error["kind"]) == (1, kind) and says in error["message"]
        assert error["message"].startswith(f"rank 1 of 2 failed: {kind}: ")
        assert result["seconds"] < 5
    assert zero["error"]["message"] == one["error"]["message"]
    assert one["error"]["own"] == kind  # rank 1's own error is the cause
    assert zero["steps"] == one["steps"]


def test_a_sharded_model_is_checked_shard_by_shard_and_trains_as_without_the_check(results) -> None:
    """FSDP2 on 2 gloo ranks, float64, rank 1 with fewer micro-batches: the reduce-scattered
    window equals the big batch's shards, and the run ends bitwise where it ends unchecked."""
    zero, one = (r["sharded_exact"] for r in results)
    [(message, data)] = zero["events"]
    assert data["status"] == "passed" and data["sharded"] and data["rel_error"] <= 1e-12, message
    assert (data["micro_batches"], data["window_micro_batches"]) == (5, 5)
    for result in (zero, one):
        assert result["error"] is None and result["steps"] == 1
        assert all(torch.equal(p, q) for p, q in zip(result["params"], result["unchecked_params"], strict=True))


def test_a_sharded_model_computing_in_bf16_is_not_checked_and_trains(results) -> None:
    """A MixedPrecisionPolicy computes in bf16: the fp32 comparison would fail on rounding, so
    the check is skipped with the reason (verify_window='strict' would fail then)."""
    zero, one = (r["sharded_mixed"] for r in results)
    [(message, data)] = zero["events"]
    assert data["status"] == "skipped" and "computes in bfloat16" in message
    assert zero["error"] is None and one["error"] is None and zero["steps"] == one["steps"] == 1


@pytest.mark.parametrize("case, cause, fix", [
    ("sharded_sums", "reduction", "reduction='mean'"),
    ("sharded_rows", "count_items", "count_items='rows'"),
])
def test_a_sharded_model_fails_a_lying_loss_at_window_1_with_the_fix(results, case: str, cause: str, fix: str) -> None:
    zero, one = (r[case] for r in results)
    [(message, data)] = zero["events"]
    assert data["status"] == "failed" and fix in message
    assert all(r["error"]["cause"] == cause and r["steps"] == 0 for r in (zero, one))
    assert zero["error"]["message"] == one["error"]["message"]


def test_a_batchnorm_refusing_one_sample_on_rank_1_fails_both_ranks_at_once(results) -> None:
    zero, one = (r["batchnorm_one_sample"] for r in results)
    for result in (zero, one):
        assert result["error"]["kind"] == "ValueError" and "Expected more than 1 value per channel" in result["error"]["message"]
        assert result["seconds"] < 5 and result["steps"] == 0
    assert zero["error"]["message"] == one["error"]["message"]


def test_label_shift_detection_on_a_sharded_lm_is_agreed_with_a_rank_without_data(results) -> None:
    """Rank 1 has no micro-batch: it joins the detection's forward (a collective under FSDP)
    on a row rank 0 shares, and both ranks count the labels shifted."""
    zero, one = (r["sharded_lm_detection"] for r in results)
    assert zero["detected"] == one["detected"] == [{"shift_labels": True}]
    assert zero["shift"] is one["shift"] is True and zero["steps"] == one["steps"] == 2
