"""Spec -> run objects: LR schedule in optimizer steps, rank shards, micro-batch geometry."""

from __future__ import annotations

import math

import pytest

from services.spec import parse_spec
from services.worker.build import lr_lambda, rank_shard
from services.worker.micro_batch import from_spec

BASE = {"model": "mlp", "dataset": "digits", "micro_batch_size": 8, "accumulation_steps": 2,
        "max_steps": 10, "optimizer": {"name": "sgd", "lr": 0.1}, "gpus": 0}


def test_no_schedule_means_no_scheduler() -> None:
    assert lr_lambda(parse_spec(BASE), 10) is None


def test_cosine_warms_up_then_decays_to_zero_over_the_optimizer_steps() -> None:
    spec = parse_spec({**BASE, "scheduler": {"name": "cosine", "warmup_steps": 4}})
    factor = lr_lambda(spec, total_steps=14)
    assert factor is not None
    warm = [factor(s) for s in range(4)]
    assert warm == sorted(warm) and 0 < warm[0] < warm[-1] < 1
    assert factor(4) == pytest.approx(1.0)
    assert factor(9) == pytest.approx(0.5 * (1 + math.cos(math.pi * 5 / 10)))
    assert factor(14) == pytest.approx(0.0, abs=1e-12)


def test_step_schedule_multiplies_by_gamma_every_step_size_after_warmup() -> None:
    spec = parse_spec({**BASE, "scheduler": {"name": "step", "step_size": 3, "gamma": 0.5, "warmup_steps": 1}})
    factor = lr_lambda(spec, total_steps=10)
    assert factor is not None
    assert [factor(s) for s in range(1, 8)] == [1, 1, 1, 0.5, 0.5, 0.5, 0.25]


def test_accumulation_schedule_keys_become_epochs() -> None:
    spec = parse_spec({**{k: v for k, v in BASE.items() if k != "max_steps"}, "epochs": 3,
                       "accumulation_steps": {"0": 4, "2": 1}})
    assert from_spec(spec) == (8, {0: 4, 2: 1})


def test_auto_micro_batch_starts_with_the_whole_per_rank_batch() -> None:
    spec = parse_spec({**{k: v for k, v in BASE.items() if k != "accumulation_steps"},
                       "micro_batch_size": "auto", "effective_batch_size": 64})
    assert from_spec(spec) == (64, 1)


def test_rank_shards_cover_the_dataset_once_and_differ_by_at_most_one() -> None:
    data = list(range(11))
    shards = [rank_shard(data, r, 3) for r in range(3)]  # type: ignore[arg-type]
    assert [len(s) for s in shards] == [4, 4, 3]  # type: ignore[arg-type]
    seen = sorted(s[i] for s in shards for i in range(len(s)))  # type: ignore[arg-type, index]
    assert seen == data  # every sample once: none repeated to even the shards out
    assert rank_shard(data, 0, 1) is data  # type: ignore[arg-type]


def _final_weights(spec_overrides: dict[str, object]) -> dict[str, object]:
    from services.worker.build import build_run

    spec = parse_spec({**BASE, "max_steps": 5, **spec_overrides})
    run = build_run(spec, callbacks=[], checkpoint_dir=None)
    run.fit_kwargs["val_loader"] = None
    run.trainer.fit(run.train_loader, **run.fit_kwargs)
    return {k: v.clone() for k, v in run.trainer.model.state_dict().items()}


def test_data_on_device_trains_in_the_same_order_as_the_loader() -> None:
    import torch

    loader, on_device = _final_weights({}), _final_weights({"data_on_device": True})
    assert loader.keys() == on_device.keys()
    assert all(torch.equal(loader[k], on_device[k]) for k in loader)  # type: ignore[arg-type]


def test_a_bf16_job_on_a_gpu_without_native_bf16_fails_at_its_start_naming_fp16(monkeypatch) -> None:
    import torch

    from accumcore.precision import UnsupportedPrecision
    from services.worker.build import build_run

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla T4")
    spec = parse_spec({"model": "mlp", "dataset": "digits", "micro_batch_size": 8, "accumulation_steps": 2,
                       "epochs": 1, "optimizer": {"name": "sgd", "lr": 0.1}, "precision": "bf16"})
    with pytest.raises(UnsupportedPrecision, match="Tesla T4 is 7.5.*precision='fp16'"):
        build_run(spec, callbacks=[], checkpoint_dir=None, device="cuda:0")


def _notes_and_loader(spec_update: dict):
    from services.worker.build import build_run

    spec = parse_spec({"model": "mlp", "dataset": "digits", "micro_batch_size": 8, "accumulation_steps": 2,
                       "epochs": 1, "optimizer": {"name": "sgd", "lr": 0.1}, "data_on_device": True,
                       **spec_update})
    run = build_run(spec, callbacks=[], checkpoint_dir=None, device="cpu")
    return run.notes, run.train_loader


def test_data_on_device_that_does_not_fit_falls_back_to_the_loader_with_an_event(monkeypatch) -> None:
    from torch.utils.data import DataLoader

    from accumcore import device_data

    # The device's free memory, stood in for: the dataset does not fit.
    monkeypatch.setattr(device_data, "fits_on_device", lambda nbytes, device, fraction=0.25: False)
    notes, loader = _notes_and_loader({})
    assert isinstance(loader, DataLoader)
    assert [(kind, data["reason"]) for kind, _message, data in notes] == [("data_on_device_ignored", "does_not_fit")]
    assert "loading it with the DataLoader instead" in notes[0][1]


def test_data_on_device_is_said_to_be_ignored_for_text() -> None:
    notes, _loader = _notes_and_loader({"model": "tiny_transformer", "dataset": "text"})
    assert [(kind, data["reason"]) for kind, _message, data in notes] == [("data_on_device_ignored", "collate_fn")]
    assert "ignored for text" in notes[0][1]


def test_ddp_ranks_evaluate_disjoint_shares_of_the_validation_set() -> None:
    from services.worker.build import build_run

    spec = parse_spec({"model": "mlp", "dataset": "digits", "micro_batch_size": 8, "accumulation_steps": 2,
                       "epochs": 1, "optimizer": {"name": "sgd", "lr": 0.1}, "gpus": 2})
    shares = [build_run(spec, callbacks=[], checkpoint_dir=None, device="cpu", rank=r, world=2).val_loader.dataset
              for r in range(2)]
    single = parse_spec({**spec.model_dump(mode="json"), "gpus": 1})
    full = build_run(single, callbacks=[], checkpoint_dir=None, device="cpu").val_loader.dataset
    assert abs(len(shares[0]) - len(shares[1])) <= 1 and len(shares[0]) + len(shares[1]) == len(full)
    assert set(shares[0].indices).isdisjoint(shares[1].indices)


def test_ranks_draw_their_own_streams_and_the_trainer_keys_masks_by_the_spec_seed() -> None:
    """Issue 41: every rank seeded spec.seed (one set of weights) and was left so, so k ranks
    drew one stream. Now the Trainer's masks are keyed by spec.seed, and after building each
    rank's torch, numpy and Python streams and its DataLoader's worker seed differ (rank 0's
    are the one-process ones)."""
    import random

    import numpy as np
    import torch

    from services.worker.build import build_run

    spec = parse_spec({**BASE, "seed": 5, "gpus": 2})
    draws, worker_seeds = [], []
    for rank in range(2):
        run = build_run(spec, callbacks=[], checkpoint_dir=None, device="cpu", rank=rank, world=2)
        assert run.trainer.seed == 5
        draws.append((torch.rand(3).tolist(), np.random.rand(), random.random()))
        worker_seeds.append(run.train_loader.generator.initial_seed())
    one = build_run(parse_spec({**BASE, "seed": 5, "gpus": 1}), callbacks=[], checkpoint_dir=None, device="cpu")
    one_draws = (torch.rand(3).tolist(), np.random.rand(), random.random())
    assert all(a != b for a, b in zip(*draws, strict=True))
    assert one_draws[0] == draws[0][0]  # rank 0's torch stream is the one-GPU job's
    assert worker_seeds[0] == one.train_loader.generator.initial_seed() != worker_seeds[1]


def test_a_batch_larger_than_own_data_is_said_at_the_start_with_the_numbers(tmp_path) -> None:
    """Own data is sized only when the worker reads it (the submit check cannot): the job's
    start says that each step sees the whole split, not the batch asked for."""
    from services.worker.build import build_run

    rows = "\n".join(f"{i / 40:.3f},{i % 2}" for i in range(40))
    (tmp_path / "train.csv").write_text(f"x,label\n{rows}\n")
    spec = parse_spec({**BASE, "dataset": {"name": "files", "data_root": str(tmp_path), "data_files": "train.csv",
                                           "columns": {"features": ["x"], "label": "label"}},
                       "micro_batch_size": 16, "accumulation_steps": 4})
    run = build_run(spec, callbacks=[], checkpoint_dir=None, device="cpu")
    [(message, data)] = [(m, d) for kind, m, d in run.notes if kind == "batch_over_data"]
    size = data["train_size"]
    assert data["field"] == "accumulation_steps" and size < 64
    assert message == (f"micro_batch_size 16 x accumulation_steps 4 = 64 samples a step is more than the {size} "
                       f"training samples of dataset 'files': every step would see those {size}, not 64. "
                       f"Lower accumulation_steps so that a step takes at most {size}")
