"""Warm starts: `build_run` with `init_weights` has, before its first step, the checkpoint's
weights; a head of another size is re-initialised and listed; a non-strict load lists missing
and unexpected keys, a strict one refuses them; the store side finds only the owner's jobs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from accumcore import save_checkpoint
from services.jobdb import checkpoints, jobs, tokens
from services.spec import parse_spec
from services.worker.build import build_run
from services.worker.warm_start import InitFromRefused, describe, initial_weights_path, state_sha256
from tests.job_specs import TINY_SPEC


def trained_checkpoint(tmp_path: Path, spec: dict[str, Any]) -> Path:
    run = build_run(parse_spec(spec), callbacks=[], checkpoint_dir=tmp_path / "a", device="cpu")
    run.trainer.fit(run.train_loader, **{**run.fit_kwargs, "val_loader": None})
    return sorted((tmp_path / "a").glob("*.pt"))[-1]


def test_weights_before_the_first_step_equal_the_checkpoint(tmp_path: Path) -> None:
    path = trained_checkpoint(tmp_path, TINY_SPEC)
    saved = torch.load(path, weights_only=True)["model"]
    run = build_run(parse_spec({**TINY_SPEC, "seed": 5, "init_from": {"uri": str(path)}}), callbacks=[],
                    checkpoint_dir=None, device="cpu", init_weights=path)
    state = run.trainer.model.state_dict()
    assert state.keys() == saved.keys() and all(torch.equal(state[k], saved[k]) for k in saved)
    assert run.warm_start is not None and run.warm_start["loaded"] == len(saved)
    assert run.warm_start["reinitialised"] == run.warm_start["missing_keys"] == []
    assert run.warm_start["weights_sha256"] == [state_sha256(saved)]  # what loaded is the file's
    assert f"weights sha256 {state_sha256(saved)[:16]}" in describe(run.warm_start)
    assert state_sha256(saved) != state_sha256(build_run(parse_spec({**TINY_SPEC, "seed": 5}), callbacks=[],
                                                         checkpoint_dir=None, device="cpu").trainer.model.state_dict())


def test_a_head_of_another_size_is_reinitialised_and_said(tmp_path: Path) -> None:
    fake = {"name": "fake", "size": 32, "val_size": 8, "image_size": 8, "num_classes": 10}
    path = trained_checkpoint(tmp_path, {**TINY_SPEC, "dataset": fake})
    spec = {**TINY_SPEC, "dataset": {**fake, "num_classes": 3}, "init_from": {"uri": str(path)}}
    run = build_run(parse_spec(spec), callbacks=[], checkpoint_dir=None, device="cpu", init_weights=path)
    report = run.warm_start
    assert report is not None and report["reinitialised"] == ["layers.3.bias", "layers.3.weight"]
    assert "re-initialised (shape differs): layers.3.bias, layers.3.weight" in describe(report)


def test_strict_refuses_and_non_strict_reports_missing_and_unexpected_keys(tmp_path: Path) -> None:
    path = trained_checkpoint(tmp_path, TINY_SPEC)
    state = torch.load(path, weights_only=True)["model"]
    state["extra.weight"] = state.pop("layers.1.bias")
    odd = tmp_path / "odd.pt"
    torch.save(state, odd)  # a plain state dict, not an accum checkpoint
    with pytest.raises(InitFromRefused, match=r"missing keys \['layers.1.bias'\], unexpected keys \['extra.weight'\]"):
        build_run(parse_spec({**TINY_SPEC, "init_from": {"uri": str(odd)}}), callbacks=[],
                  checkpoint_dir=None, device="cpu", init_weights=odd)
    run = build_run(parse_spec({**TINY_SPEC, "init_from": {"uri": str(odd), "strict": False}}), callbacks=[],
                    checkpoint_dir=None, device="cpu", init_weights=odd)
    assert run.warm_start is not None
    assert (run.warm_start["missing_keys"], run.warm_start["unexpected_keys"]) == (["layers.1.bias"], ["extra.weight"])


def test_only_the_owners_jobs_resolve(session_factory: Any, tmp_path: Path) -> None:
    with session_factory.begin() as session:
        alice, _ = tokens.create_owner_with_token(session, "alice")
        bob, _ = tokens.create_owner_with_token(session, "bob")
        job, _ = jobs.create_job(session, owner=alice, spec=parse_spec(TINY_SPEC).normalised(), queue="default",
                                 max_restarts=0, total_optimizer_steps=3)
        job_id, alice_id, bob_id = job.id, alice.id, bob.id
    spec = parse_spec({**TINY_SPEC, "init_from": {"job": job_id}})
    path = tmp_path / "3.pt"
    fetched: list[tuple[str, str]] = []

    def fetch(key: str, sha256: str) -> Path:  # the node cache's fetch from the store
        fetched.append((key, sha256))
        return path

    with session_factory() as session, pytest.raises(InitFromRefused, match="has no checkpoint"):
        initial_weights_path(session, spec, alice_id, fetch)
    save_checkpoint({"model": {}}, path)
    with session_factory.begin() as session:
        checkpoints.add_checkpoint(session, job_id, 3, f"{job_id}/3.pt", path.stat().st_size, "0" * 64)
    with session_factory() as session:
        assert initial_weights_path(session, spec, alice_id, fetch) == path
        assert fetched == [(f"{job_id}/3.pt", "0" * 64)]
        with pytest.raises(InitFromRefused, match="no such job of yours"):
            initial_weights_path(session, spec, bob_id, fetch)
        stepped = parse_spec({**TINY_SPEC, "init_from": {"job": job_id, "step": 2}})
        with pytest.raises(InitFromRefused, match="no checkpoint at step 2; kept steps: 3"):
            initial_weights_path(session, stepped, alice_id, fetch)
