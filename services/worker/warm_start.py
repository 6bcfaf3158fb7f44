"""Warm starts (`init_from`): which file a job starts from, and loading it into the model.

    path = initial_weights_path(session, spec, owner_id, fetch)  # None without init_from
    report = load_initial_weights(model, path, strict=True)  # -> the `warm_start` event's data

A job may start from one of its owner's own jobs (`{"job": ID, "step": K}`, the latest kept
checkpoint by default, sharded or not) or from a file under a data root (`{"uri": ...}`: an accum checkpoint,
a plain state dict, or a `.safetensors` file). Another owner's job reads as a job that does
not exist, so nothing about it leaks. Tensors whose shape differs (a classifier head for
another number of classes) keep the new model's initialisation and are listed; missing and
unexpected keys fail a strict load and are listed by a non-strict one.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from services.jobdb.checkpoints import get_checkpoint, list_checkpoints
from services.jobdb.jobs import load_job
from services.jobdb.models import Job
from services.spec import JobSpec


class InitFromRefused(ValueError):
    """init_from names a job or checkpoint this job may not start from; the message says why."""


# (key, sha256) of a stored checkpoint -> its local copy (the node cache's fetch, sha256 checked)
Fetch = Callable[[str, str], Path]


def job_initial_weights(
    sessions: sessionmaker[Session], spec: JobSpec, job_id: str, fetch: Fetch
) -> Path | None:
    """`initial_weights_path` for job `job_id` (read by its owner's rights)."""
    if spec.init_from is None:
        return None
    with sessions() as session:
        job = session.get(Job, job_id)
        assert job is not None
        return initial_weights_path(session, spec, job.owner_id, fetch)


def initial_weights_path(session: Session, spec: JobSpec, owner_id: Any, fetch: Fetch) -> Path | None:
    """The file `spec.init_from` names, checked: the job is the owner's, the step is kept; a
    job's checkpoint is fetched from the artifact store with `fetch`."""
    ref = spec.init_from
    if ref is None:
        return None
    if ref.uri is not None:
        return Path(ref.uri)
    assert ref.job is not None
    job = load_job(session, ref.job)
    if job is None or job.owner_id != owner_id:
        raise InitFromRefused(
            f"init_from.job {ref.job!r}: no such job of yours; give the id of one of your jobs "
            "(accum jobs lists them)"
        )
    kept = list_checkpoints(session, job.id)
    if not kept:
        raise InitFromRefused(f"init_from.job {ref.job!r} has no checkpoint to start from")
    if ref.step is None:
        return fetch(kept[-1].key, kept[-1].sha256)
    checkpoint = get_checkpoint(session, job.id, ref.step)
    if checkpoint is None:
        steps = ", ".join(str(c.step) for c in kept)
        raise InitFromRefused(f"init_from.job {ref.job!r} keeps no checkpoint at step {ref.step}; kept steps: {steps}")
    return fetch(checkpoint.key, checkpoint.sha256)


def read_state(path: Path) -> dict[str, Any]:
    """Model tensors from an accum checkpoint (its `model`; a sharded one's folder: the full
    model state of its shards), a state dict, or safetensors."""
    import torch

    if path.is_dir():  # a sharded (FSDP) checkpoint: its every rank's files, fetched
        from accumcore.sharded_checkpoint import is_sharded_checkpoint, model_state

        if not is_sharded_checkpoint(path):
            raise InitFromRefused(f"init_from: {path} is a folder but not a sharded checkpoint "
                                  "(no trainer.pt and .metadata); give a checkpoint file or folder")
        return model_state(path)
    if not path.is_file():
        raise InitFromRefused(f"init_from: no file at {path}")
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return dict(load_file(str(path)))
    state = torch.load(path, map_location="cpu", weights_only=True)
    if isinstance(state, dict) and isinstance(state.get("model"), dict):
        state = state["model"]
    if not isinstance(state, dict):
        raise InitFromRefused(f"init_from: {path} holds a {type(state).__name__}, not a state dict")
    return state


def state_sha256(state: Mapping[str, Any]) -> str:
    """sha256 of a state dict: each tensor's name, dtype, shape and bytes, in order. Equal on
    every rank when each loaded the same weights; equal to the file's when all of it loaded."""
    import torch

    digest = hashlib.sha256()
    for key, value in state.items():
        tensor = value.detach().to("cpu").contiguous()
        digest.update(f"{key}:{tensor.dtype}:{tuple(tensor.shape)};".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def load_initial_weights(model: Any, path: Path, strict: bool) -> dict[str, Any]:
    """Load `path` into `model`; returns what was loaded, re-initialised, missing, unexpected,
    and `weights_sha256`: [the model's `state_sha256` after the load] (one per rank once a
    `gpus: N` job has gathered them, `services.worker.distributed`)."""
    state = read_state(path)
    own = model.state_dict()
    reinitialised = sorted(k for k, v in state.items() if k in own and tuple(own[k].shape) != tuple(v.shape))
    for key in reinitialised:
        del state[key]
    result = model.load_state_dict(state, strict=False)
    missing = sorted(set(result.missing_keys) - set(reinitialised))
    unexpected = sorted(result.unexpected_keys)
    if strict and (missing or unexpected):
        raise InitFromRefused(
            f"init_from {path} does not match the model: missing keys {missing[:20]}, unexpected "
            f"keys {unexpected[:20]}; set init_from.strict to false to load what matches"
        )
    return {"path": str(path), "loaded": len(state) - len(unexpected), "missing_keys": missing,
            "unexpected_keys": unexpected, "reinitialised": reinitialised,
            "weights_sha256": [state_sha256(model.state_dict())]}


def describe(report: dict[str, Any]) -> str:
    """The `warm_start` event's message."""
    parts = [f"loaded {report['loaded']} tensors from {report['path']}"]
    hashes = report.get("weights_sha256") or []
    if len(set(hashes)) == 1:
        parts.append(f"weights sha256 {hashes[0][:16]}" + (f" on all {len(hashes)} ranks" if len(hashes) > 1 else ""))
    elif hashes:
        parts.append(f"weights DIFFER across ranks: sha256 {', '.join(h[:16] for h in hashes)}")
    if report["reinitialised"]:
        parts.append(f"re-initialised (shape differs): {', '.join(report['reinitialised'])}")
    if report["missing_keys"]:
        parts.append(f"missing (kept as initialised): {', '.join(report['missing_keys'][:20])}")
    if report["unexpected_keys"]:
        parts.append(f"unexpected (ignored): {', '.join(report['unexpected_keys'][:20])}")
    return "; ".join(parts)
