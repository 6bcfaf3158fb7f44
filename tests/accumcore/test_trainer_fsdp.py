"""FSDP2 (``fully_shard``, gloo on the CPU): the sharded window's update equals the
one-process big batch in float64, in both gradient-sync modes, with uneven shards, padded
tokens, a short last window, clipping, momentum and weight decay; its DCP checkpoints resume
at 1 and 3 ranks, and in a plain model, on the same trajectory."""

from __future__ import annotations

import math

import pytest
import torch
import torch.multiprocessing as mp
import trainer_fsdp_worker as worker
from rank_processes import start_method
from trainer_reference import TokenCrossEntropy, token_model

import accumcore
import accumcore.sharding
from accumcore import Trainer

TOLERANCE = 1e-12


def _oracle(windows_per_epoch: list[list[tuple[torch.Tensor, torch.Tensor]]], epochs: int):
    """One process, float64: each window's summed token loss over its item count, one
    backward, clipped to the global norm, one SGD step."""
    model = token_model(torch.float64)
    optimizer = worker.new_optimizer(model)
    loss_sum = TokenCrossEntropy("sum")
    losses, norms = [], []
    for _ in range(epochs):
        for window in windows_per_epoch:
            total = sum(loss_sum(model(x), y) for x, y in window)
            count = sum(int((y != -100).sum()) for _, y in window)
            (total / count).backward()
            norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), worker.CLIP)))
            losses.append(float(total.detach()) / count)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    return model, losses, norms


def _shard_windows(world: int) -> list[list[tuple[torch.Tensor, torch.Tensor]]]:
    """Window w of the big batch: every rank's window w (a rank that has none adds nothing)."""
    shards = [list(torch.utils.data.DataLoader(worker.shard(world, r), batch_size=worker.MICRO_BATCH))
              for r in range(world)]
    n = worker.ACCUMULATION
    windows = max(math.ceil(len(s) / n) for s in shards)
    return [[b for s in shards for b in s[n * w : n * w + n]] for w in range(windows)]


def _start(fn, world: int, args: tuple) -> None:
    import torch._dynamo  # noqa: F401  (imported before forking: see test_trainer_ddp.py)

    mp.start_processes(fn, args=(world, *args), nprocs=world, join=True, start_method=start_method())


def _assert_on_trajectory(result: dict, reference: torch.nn.Module, losses: list[float], norms: list[float]) -> None:
    for p, q in zip(result["params"], reference.parameters(), strict=True):
        assert float((p.detach() - q.detach()).abs().max()) <= TOLERANCE
    assert len(result["losses"]) == len(losses)
    assert all(abs(a - b) <= TOLERANCE for a, b in zip(result["losses"], losses, strict=True))
    assert all(abs(a - b) <= TOLERANCE for a, b in zip(result["grad_norms"], norms, strict=True))


@pytest.mark.parametrize(("world", "sync"), [(2, "window"), (2, "micro_batch"), (3, "micro_batch")])
def test_sharded_windows_equal_the_big_batch(world: int, sync: str, tmp_path) -> None:
    """2 ranks: 7 and 6 samples, so in each epoch's 2nd window rank 1 has one micro-batch to
    rank 0's two; 3 ranks: 5, 4 and 4, so ranks 1 and 2 have none in the 2nd window."""
    _start(worker.run_shards, world, (sync, str(tmp_path / "init"), str(tmp_path)))
    windows = _shard_windows(world)
    assert len({len(w) for w in windows}) > 1  # a short last window
    reference, losses, norms = _oracle(windows, worker.EPOCHS)
    assert min(norms) > worker.CLIP  # clipping acted on every step
    val = [worker.val_shard(world, r).tensors for r in range(world)]
    with torch.no_grad():
        val_loss = sum(float(TokenCrossEntropy("sum")(reference(x), y)) for x, y in val) / sum(
            int((y != -100).sum()) for _, y in val)
    # Passes per window: the most micro-batches any rank has in it; units with parameters:
    # the embedding and the head (shard wraps each; the root holds none of its own).
    shards = [math.ceil(n / worker.MICRO_BATCH) for n in worker.SHARDS[world]]
    n = worker.ACCUMULATION
    passes = worker.EPOCHS * sum(max(min(n, s - n * w) for s in shards) for w in range(len(windows)))
    units = len(accumcore.sharding.blocks(token_model(torch.float64)))
    for rank in range(world):
        result = torch.load(tmp_path / f"rank{rank}.pt")
        _assert_on_trajectory(result, reference, losses, norms)
        assert result["steps"] == worker.EPOCHS * len(windows)
        assert abs(result["val_loss"] - val_loss) <= TOLERANCE  # ranks with fewer val batches join
        assert result["reduce_scatters"] == units * (result["steps"] if sync == "window" else passes)


def test_a_run_resumed_into_a_window_some_ranks_have_nothing_in_stays_on_the_big_batch(tmp_path) -> None:
    """3 ranks (3, 2 and 2 micro-batches an epoch) resume from the checkpoint after the first
    step: in the first window of the new processes ranks 1 and 2 have no micro-batch and have
    seen none, yet must join rank 0's pass; they take its shape from rank 0 (a 0-row batch)."""
    _start(worker.run_shards, 3, ("window", str(tmp_path / "init"), str(tmp_path), 1))
    windows = _shard_windows(3)
    assert [len(w) for w in windows] == [6, 1]  # the 2nd window: rank 0's micro-batch only
    reference, losses, norms = _oracle(windows, worker.EPOCHS)
    _start(worker.run_shards, 3, ("window", str(tmp_path / "init-resumed"), str(tmp_path), 0,
                                  str(tmp_path / "checkpoints" / "1")))
    for rank in range(3):
        result = torch.load(tmp_path / f"resumed-rank{rank}.pt")
        assert result["steps"] == worker.EPOCHS * len(windows)
        _assert_on_trajectory({**result, "losses": losses[:1] + result["losses"],
                               "grad_norms": norms[:1] + result["grad_norms"]}, reference, losses, norms)


def test_a_sharded_checkpoint_resumes_at_one_and_three_ranks_and_in_a_plain_model(tmp_path) -> None:
    """2 ranks train epoch 0 and checkpoint (every rank its shards); 1 sharded rank, 3 ranks
    and a plain one-process model each continue with epoch 1 on the uninterrupted trajectory."""
    _start(worker.run_windows, 2, ("first", str(tmp_path / "init0"), str(tmp_path)))
    (checkpoint,) = (tmp_path / "checkpoints").iterdir()
    assert sorted(p.name for p in checkpoint.iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp", "trainer.pt"]
    reference, losses, norms = _oracle([[w] for w in worker.global_windows()], worker.EPOCHS)
    for world in (1, 3):
        _start(worker.run_windows, world, ("resume", str(tmp_path / f"init{world}"), str(tmp_path), str(checkpoint)))
        for rank in range(world):
            result = torch.load(tmp_path / f"resume{world}-rank{rank}.pt")
            assert result["steps"] == 2 * len(worker.global_windows())
            _assert_on_trajectory({**result, "losses": losses[:2] + result["losses"],
                                   "grad_norms": norms[:2] + result["grad_norms"]}, reference, losses, norms)
    # A plain model in a process without torch.distributed, from the directory and from the
    # consolidated file (whose "model" torch.load reads as a plain state dict).
    consolidated = accumcore.consolidate_checkpoint(checkpoint, tmp_path / "full.pt")
    full = torch.load(consolidated, weights_only=True)
    for source in (checkpoint, consolidated):
        model = token_model(torch.float64)
        optimizer = worker.new_optimizer(model)
        trainer = Trainer(model, optimizer, loss_fn=TokenCrossEntropy(), accumulation_steps=worker.ACCUMULATION,
                          grad_clip_norm=worker.CLIP)
        trainer.load_state_dict(accumcore.load_checkpoint(source, model=model, optimizer=optimizer))
        assert all(torch.equal(full["model"][name], p) for name, p in model.state_dict().items())
        history = trainer.fit(worker.window_batches(1, 0), epochs=worker.EPOCHS)
        _assert_on_trajectory(
            {"params": list(model.parameters()), "losses": losses[:2] + [s["loss"] for s in history.steps],
             "grad_norms": norms[:2] + [s["grad_norm"] for s in history.steps]}, reference, losses, norms)


def test_a_plain_models_checkpoint_file_continues_on_two_sharded_ranks(tmp_path) -> None:
    """The other way: a one-process run's single-file checkpoint (optimizer state by position)
    loads into a sharded model and its optimizer; 2 ranks continue on the same trajectory."""
    model = token_model(torch.float64)
    trainer = Trainer(model, worker.new_optimizer(model), loss_fn=TokenCrossEntropy(),
                      accumulation_steps=worker.ACCUMULATION, grad_clip_norm=worker.CLIP,
                      checkpoint_dir=tmp_path / "plain")
    trainer.fit(worker.window_batches(1, 0), epochs=1)
    (checkpoint,) = (tmp_path / "plain").iterdir()
    assert checkpoint.is_file()
    _start(worker.run_windows, 2, ("resume", str(tmp_path / "init"), str(tmp_path), str(checkpoint)))
    reference, losses, norms = _oracle([[w] for w in worker.global_windows()], worker.EPOCHS)
    for rank in range(2):
        result = torch.load(tmp_path / f"resume2-rank{rank}.pt")
        _assert_on_trajectory({**result, "losses": losses[:2] + result["losses"],
                               "grad_norms": norms[:2] + result["grad_norms"]}, reference, losses, norms)


def test_a_checkpoint_from_inside_an_epoch_is_refused_at_another_world_size(tmp_path) -> None:
    """Each rank's position in its own shard does not carry over to another world size: a
    per-rank loader (a plain DataLoader over this rank's shard) is refused when the fit starts;
    make_loader's global order (rank=, world=) carries it over (test_trainer_world_invariance)."""
    model = token_model(torch.float64)
    trainer = Trainer(model, worker.new_optimizer(model), loss_fn=TokenCrossEntropy(), accumulation_steps=2)
    state = trainer.state_dict()
    state["progress"].update(world_size=2, batch_in_epoch=2, step=1)
    trainer.load_state_dict(state)
    loader = torch.utils.data.DataLoader(worker.shard(2, 0), batch_size=2)
    with pytest.raises(ValueError, match="written by 2 ranks inside an epoch .* resume it with 2 ranks"):
        trainer.fit(loader, epochs=1)
    state["progress"]["batch_in_epoch"] = 0
    trainer.load_state_dict(state)  # at an epoch's start it resumes
    assert trainer.global_step == 1


def test_bf16_parameters_and_cpu_offload_train_and_inexact_options_are_refused(tmp_path) -> None:
    _start(worker.run_policies, 2, (str(tmp_path / "init"), str(tmp_path)))
    results = [torch.load(tmp_path / f"policies-rank{rank}.pt") for rank in range(2)]
    for result in results:
        fp16, unmarked = result["refusals"]  # (verify_window runs on a sharded model: test_rank_agreement)
        assert "reduction='mean' attribute" in unmarked
        assert "precision='fp16'" in fp16 and "mixed_precision=True" in fp16
        losses = result["losses"]
        assert all(math.isfinite(x) for x in losses) and len(losses) == 4 * 2
        # Same windows each epoch: the last epoch's mean loss is below the first's.
        assert sum(losses[-2:]) < sum(losses[:2])
        assert all(not torch.equal(p, q) for p, q in zip(result["params"], result["before"], strict=True))
        # The sharded parameters (what the optimizer steps) stay float32; gradients are freed.
        assert result["param_dtypes"] == ["torch.float32"] and result["grad_free"]
        assert result["output_dtype"] == "torch.bfloat16"  # computed with bf16 parameters
    assert results[0]["losses"] == results[1]["losses"]  # one global loss per step


def test_shard_wraps_hugging_face_blocks_or_top_level_children() -> None:
    """What ``accumcore.shard`` wraps one by one before the root (no process group needed)."""

    class Inner(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.wte = torch.nn.Embedding(7, 4)
            self.h = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(3))

    class GPTLike(torch.nn.Module):  # model.transformer.h, as GPT-2 names its blocks
        def __init__(self) -> None:
            super().__init__()
            self.transformer = Inner()
            self.lm_head = torch.nn.Linear(4, 7)

    gpt = GPTLike()
    assert accumcore.sharding.blocks(gpt) == list(gpt.transformer.h)
    plain = token_model(torch.float64)
    assert accumcore.sharding.blocks(plain) == [plain.embed, plain.head]
    with pytest.raises(ValueError, match="fsdp_sync must be one of micro_batch, window"):
        accumcore.sharding.check_sync_mode("step")
