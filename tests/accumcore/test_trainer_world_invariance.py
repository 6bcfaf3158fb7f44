"""The same trajectory on any number of ranks (docs/accumulation.md, rule 14 of the brief).

With ``make_loader(rank=..., world=...)`` and ``accumulation_steps`` counting a global window's
micro-batches, 1, 2 and 3 ranks (gloo, float64) train on the same global windows: padded token
sequences, a short last micro-batch, a short last window that one of 3 ranks has no
micro-batch of. Their weights and logged losses match the one-process big batch to 1e-12. A
checkpoint written by 2 ranks inside an epoch resumes on 1 and on 3 ranks with the next global
window and ends at the uninterrupted weights.

Randomness keyed by the micro-batch (docs/accumulation.md): a dropout MLP, each rank's process
seeded apart, follows the one-process trajectory on 2 and 3 ranks (and resumed from a 2-rank
checkpoint on 1 and 3) to 1e-12; every micro-batch draws its own mask, the one it draws in one
process, so no two ranks share one.

Real models (issue 41), in the same rank processes: a BatchNorm CNN ends with the weights,
running statistics (replayed in the global order: ``accumcore.batchnorm_sync``) and val_loss of
one process on 2, 3 and 4 ranks (each rank evaluating its slice of the validation set), and a
tiny GPT-2 with dropout 0.3 (transformers' config, no download) with its trajectory (its own
spawns, slow: importing transformers takes seconds). One 4-rank spawn checks the token model,
the dropout MLP and the CNN at once.
"""

from __future__ import annotations

import pytest
import torch
import torch.multiprocessing as mp
import world_invariance_worker as worker
from rank_processes import start_method
from trainer_reference import TokenCrossEntropy, big_batch_training, token_loss_sum, token_model

from accumcore import Trainer, load_checkpoint
from accumcore.data import EpochBatchSampler, make_loader
from accumcore.schedule import AccumulationSchedule

TOLERANCE = 1e-12


def _ranks(world: int, tmp_path, name: str, checkpoint_dir=None, resume=None) -> list[dict]:
    import torch._dynamo  # noqa: F401  (import what DDP imports before forking: see test_trainer_ddp)

    out = tmp_path / name
    out.mkdir()
    mp.start_processes(
        worker.run,
        args=(world, str(out / "init"), str(out), str(checkpoint_dir) if checkpoint_dir else None,
              str(resume) if resume else None),
        nprocs=world, join=True, start_method=start_method(),
    )
    return [torch.load(out / f"rank{r}.pt") for r in range(world)]


def _max_diff(params: list[torch.Tensor], other: list[torch.Tensor]) -> float:
    return max(float((p - q).abs().max()) for p, q in zip(params, other, strict=True))


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    """The big-batch oracle, one process, 2 ranks (with checkpoints) and 3 ranks; then the
    2-rank checkpoint of step 4 resumed on 1 and on 3 ranks."""
    tmp_path = tmp_path_factory.mktemp("world")
    oracle, oracle_losses = big_batch_training(
        token_model(torch.float64), make_loader(worker.dataset(), worker.MICRO_BATCH, seed=worker.SEED),
        token_loss_sum, AccumulationSchedule(worker.WINDOW), worker.EPOCHS, lr=0.2,
    )
    batchnorm_one = worker.train_batchnorm(0, 1)
    checkpoints = tmp_path / "checkpoints"
    two = _ranks(2, tmp_path, "two", checkpoint_dir=checkpoints)
    resume_from = checkpoints / f"{worker.CHECKPOINT_STEP}.pt"
    return {
        "oracle": [p.detach() for p in oracle.parameters()],
        "oracle_losses": oracle_losses,
        "one": worker.train(0, 1),
        "two": two,
        "three": _ranks(3, tmp_path, "three"),
        "four": _ranks(4, tmp_path, "four"),
        "batchnorm_one": batchnorm_one,
        "checkpoint": load_checkpoint(resume_from),
        "resumed_one": worker.train(0, 1, resume=resume_from),
        "dropout_one": worker.train_dropout(0, 1),
        "dropout_resumed_one": worker.train_dropout(
            0, 1, resume=checkpoints / "dropout" / f"{worker.DROPOUT_CHECKPOINT_STEP}.pt"),
        "resumed_three": _ranks(3, tmp_path, "resumed_three", resume=resume_from),
    }


def test_the_setup_has_uneven_shares_and_a_short_last_window() -> None:
    """What the invariance below is tested on: 8 micro-batches over 3 ranks as 3, 3, 2, and a
    short last window of 2 as 1, 1, 0; the epoch's last micro-batch holds 1 sample."""
    shares = []
    for rank in range(3):
        sampler = EpochBatchSampler(worker.SAMPLES, worker.MICRO_BATCH, seed=worker.SEED, rank=rank, world=3)
        sampler.set_window(worker.WINDOW)
        shares.append(sampler.layout().sizes())
    assert shares == [[3, 3, 1], [3, 3, 1], [2, 2, 0]]
    assert worker.SAMPLES % worker.MICRO_BATCH == 1


def test_one_two_and_three_ranks_follow_the_big_batch_trajectory(runs) -> None:
    steps = len(runs["oracle_losses"])
    assert steps == worker.EPOCHS * 3
    for name in ("one", "two", "three", "four"):
        results = [runs[name]] if name == "one" else runs[name]
        for result in results:
            assert result["steps"] == list(range(1, steps + 1)), name
            assert _max_diff(result["params"], runs["oracle"]) <= TOLERANCE, name
            # The logged loss is the global window's mean, the same on every rank.
            assert max(abs(a - b) for a, b in zip(result["losses"], runs["oracle_losses"], strict=True)) <= TOLERANCE
            assert result["items"] == runs["one"]["items"], name
    # Padding makes the windows' item counts differ: a per-window average would not be exact.
    assert len(set(runs["one"]["items"])) > 2


def test_a_two_rank_checkpoint_resumes_on_one_and_on_three_ranks(runs) -> None:
    progress = runs["checkpoint"]["progress"]
    # Epoch 1, after its first global window of 8 micro-batches of 2 samples.
    assert (progress["epoch"], progress["window_in_epoch"], progress["samples_in_epoch"]) == (1, 1, 16)
    uninterrupted = runs["two"][0]["params"]
    resumed = [runs["resumed_one"], *runs["resumed_three"]]
    for result in resumed:
        assert result["steps"] == list(range(worker.CHECKPOINT_STEP + 1, worker.EPOCHS * 3 + 1))
        assert _max_diff(result["params"], uninterrupted) <= TOLERANCE
        assert result["losses"] == pytest.approx(runs["two"][0]["losses"][worker.CHECKPOINT_STEP:], abs=TOLERANCE)


def test_a_checkpoint_without_the_global_position_resumes_from_its_batch_count(tmp_path) -> None:
    """A checkpoint written before progress held window_in_epoch and samples_in_epoch (same
    format otherwise) still resumes exactly, from its batches stepped on."""
    worker.train(0, 1, checkpoint_dir=tmp_path)
    state = load_checkpoint(tmp_path / f"{worker.CHECKPOINT_STEP}.pt")
    del state["progress"]["window_in_epoch"], state["progress"]["samples_in_epoch"]
    model = token_model(torch.float64)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.5)
    trainer = Trainer(model, optimizer, loss_fn=TokenCrossEntropy(), accumulation_steps=worker.WINDOW)
    trainer.load_state_dict(state)
    trainer.fit(make_loader(worker.dataset(), worker.MICRO_BATCH, seed=worker.SEED), epochs=worker.EPOCHS)
    final = load_checkpoint(tmp_path / f"{worker.EPOCHS * 3}.pt")["model"]
    assert trainer.global_step == worker.EPOCHS * 3
    assert all(torch.equal(model.state_dict()[k], v) for k, v in final.items())


def test_a_loader_made_for_another_world_is_refused() -> None:
    model = token_model(torch.float64)
    trainer = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), accumulation_steps=worker.WINDOW)
    loader = make_loader(worker.dataset(), worker.MICRO_BATCH, rank=1, world=2)
    with pytest.raises(ValueError, match=r"rank 1 of world 2 .* this process is rank 0 of 1 .*DistributedDataParallel"):
        trainer.fit(loader)


def _mask_keys(masks: list[torch.Tensor]) -> list[tuple]:
    return [(tuple(m.shape), m.numpy().tobytes()) for m in masks]


def test_a_dropout_model_follows_one_trajectory_on_one_two_and_three_ranks(runs) -> None:
    """Dropout 0.3, each rank's process seeded 100 + rank: 2 and 3 ranks, and the 2-rank
    checkpoint of step 3 resumed on 1 and 3 ranks, end within 1e-12 of one process (before the
    masks were keyed by the micro-batch: 0.23-0.36 apart in the audit's run)."""
    one = runs["dropout_one"]
    assert len(one["losses"]) == worker.EPOCHS * 2
    for name in ("two", "three", "four"):
        for result in runs[name]:
            assert _max_diff(result["dropout"]["params"], one["params"]) <= TOLERANCE, name
            assert result["dropout"]["losses"] == pytest.approx(one["losses"], abs=TOLERANCE), name
    for result in (runs["dropout_resumed_one"], *(r["dropout"] for r in runs["resumed_three"])):
        assert _max_diff(result["params"], one["params"]) <= TOLERANCE
        assert result["losses"] == pytest.approx(one["losses"][worker.DROPOUT_CHECKPOINT_STEP:], abs=TOLERANCE)


def test_every_micro_batch_draws_its_own_mask_on_whatever_rank_runs_it(runs) -> None:
    """Masks differ between micro-batches, none repeats across ranks (the service's ranks all
    drew rank 0's), each rank's are the ones its micro-batches draw in one process, and the
    forwards leave each process's own CPU generator where it was."""
    one = _mask_keys(runs["dropout_one"]["masks"])
    assert len(one) == 2 * 12 and len(set(one)) == len(one)
    for name in ("two", "three", "four"):
        ranks = [_mask_keys(r["dropout"]["masks"]) for r in runs[name]]
        drawn = [mask for masks in ranks for mask in masks]
        assert len(set(drawn)) == len(drawn) == len(one), name  # no mask shared by two ranks
        assert set(drawn) == set(one), name
        assert all(r["dropout"]["own_rng_kept"] for r in runs[name])
    assert runs["dropout_one"]["own_rng_kept"]


def test_a_batchnorm_cnn_ends_with_one_process_weights_statistics_and_val_loss(runs) -> None:
    """Running statistics replayed in the global micro-batch order on every rank: 2, 3 and 4
    ranks end within 1e-12 of one process in weights, buffers and val_loss (before: each rank
    folded its own micro-batches, 0.21-0.28 apart in running statistics, val_loss 0.042-0.057
    apart, num_batches_tracked 12-18 short)."""
    one = runs["batchnorm_one"]
    assert len(one["val_losses"]) == worker.EPOCHS and len(one["losses"]) == worker.EPOCHS * 3
    for name in ("two", "three", "four"):
        for result in (r["batchnorm"] for r in runs[name]):
            assert _max_diff(result["params"], one["params"]) <= TOLERANCE, name
            assert _max_diff(result["buffers"], one["buffers"]) <= TOLERANCE, name
            assert result["val_losses"] == pytest.approx(one["val_losses"], abs=TOLERANCE), name
            assert result["losses"] == pytest.approx(one["losses"], abs=TOLERANCE), name
            assert result["hooks"] == 0, name  # the replay's hooks live for one window


@pytest.mark.slow
def test_a_dropout_causal_lm_follows_one_trajectory_on_two_three_and_four_ranks(tmp_path) -> None:
    """A tiny GPT-2 (1 layer, 8 wide, dropout 0.3 on embeddings, attention and residuals), each
    rank's process seeded apart: 2, 3 and 4 ranks end within 1e-12 of one process."""
    import torch._dynamo  # noqa: F401  (import what DDP imports before forking: see test_trainer_ddp)

    one = worker.train_dropout_lm(0, 1)  # imports transformers here, once: the forked ranks share it
    assert len(one["losses"]) == worker.EPOCHS * 2
    for world in (2, 3, 4):
        out = tmp_path / str(world)
        out.mkdir()
        mp.start_processes(worker.run_lm, args=(world, str(out / "init"), str(out)), nprocs=world, join=True,
                           start_method=start_method())
        for rank in range(world):
            result = torch.load(out / f"lm{rank}.pt")
            assert _max_diff(result["params"], one["params"]) <= TOLERANCE, world
            assert result["losses"] == pytest.approx(one["losses"], abs=TOLERANCE), world
