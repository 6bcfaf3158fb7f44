"""Checkpoints of sharded (FSDP) models: a directory per checkpoint, through
``torch.distributed.checkpoint`` (DCP).

    <checkpoint_dir>/<step>/
        .metadata, __<rank>_0.distcp   every rank's shards of the model and optimizer (DCP)
        trainer.pt                     the rest of Trainer.state_dict() (every rank's RNG)

Every rank writes its own shards into ``.<step>.tmp``; rank 0 adds ``trainer.pt`` and renames
the directory, so a reader sees a whole checkpoint or none. Ranks on other nodes (no shared
disk) leave theirs in their node's ``.<step>.tmp``: ``rank_files`` finds a rank's files either
way, for a caller that gathers them elsewhere (the service's artifact store). DCP reshards on loading: a
checkpoint of 2 ranks loads into 1 or 3 ranks, or into a plain (unsharded) model in one
process (``accumcore.load_checkpoint``). ``consolidate`` writes one file with the full state
dict, which ``torch.load`` reads without torch.distributed.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from accumcore import distributed
from accumcore.callbacks import CheckpointInfo
from accumcore.checkpoint import TEMP_SUFFIX, fsync_dir, load_checkpoint, save_checkpoint

TRAINER_FILE = "trainer.pt"
DCP_METADATA = ".metadata"


def is_sharded_checkpoint(path: str | Path) -> bool:
    folder = Path(path)
    return (folder / TRAINER_FILE).is_file() and (folder / DCP_METADATA).is_file()


def save(
    directory: Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    state: dict[str, Any],
    *,
    metrics: dict[str, float] | None = None,
    fsync: bool = True,
) -> CheckpointInfo | None:
    """Write ``directory`` (a collective: call it on every rank); ``state`` is the trainer
    state without model and optimizer. Returns the info on rank 0, None on the others."""
    staging = directory.with_name(f".{directory.name}{TEMP_SUFFIX}")
    main = distributed.is_main_process()
    if main:
        shutil.rmtree(staging, ignore_errors=True)  # left by a writer killed mid-write
        staging.mkdir(parents=True)
    _barrier()
    model_state, optimizer_state = get_state_dict(model, optimizer)
    writer = dcp.FileSystemWriter(staging, sync_files=fsync)
    dcp.save({"model": model_state, "optimizer": optimizer_state}, storage_writer=writer)
    info = None
    if main:
        trainer = save_checkpoint(state, staging / TRAINER_FILE, metrics=metrics, fsync=fsync)
        if directory.exists():
            shutil.rmtree(directory)  # this step written again (a resumed run)
        staging.rename(directory)
        if fsync:
            fsync_dir(directory.parent)
        info = _info(directory, trainer)
    _barrier()  # no rank reads or rewrites it before it is whole
    return info


def rank_files(directory: Path, rank: int) -> list[Path]:
    """The files rank ``rank`` wrote for the checkpoint ``directory`` (after ``save``): its DCP
    shards ``__<rank>_*.distcp``, and on rank 0 ``.metadata`` and ``trainer.pt`` too. They are
    in ``directory``, or in ``.<step>.tmp`` beside it on a node other than rank 0's."""
    staging = directory.with_name(f".{directory.name}{TEMP_SUFFIX}")
    folder = staging if rank != 0 and any(staging.glob(f"__{rank}_*")) else directory
    files = sorted(folder.glob(f"__{rank}_*.distcp"))
    if rank == 0:
        files += [folder / DCP_METADATA, folder / TRAINER_FILE]
    return files


def whole_size_estimate(directory: Path, world_size: int) -> int:
    """Bytes of the whole checkpoint ``directory`` of ``world_size`` ranks, as far as this node
    can tell: its files, plus, for each rank whose shards are on another node (not here), as
    many bytes as the shards here average (FSDP's shards differ by padding only)."""
    files = [p for p in directory.iterdir() if p.is_file()]
    shards: dict[str, int] = {}
    for file in files:
        if file.name.startswith("__") and file.suffix == ".distcp":
            rank = file.name[2:].split("_", 1)[0]
            shards[rank] = shards.get(rank, 0) + file.stat().st_size
    here = sum(file.stat().st_size for file in files)
    missing = max(world_size - len(shards), 0)
    return here + (missing * sum(shards.values()) // len(shards) if shards else 0)


def _info(directory: Path, trainer: CheckpointInfo) -> CheckpointInfo:
    """Size and sha256 over every file of the directory (names and bytes, sorted)."""
    digest = hashlib.sha256()
    size = 0
    for file in sorted(p for p in directory.iterdir() if p.is_file()):
        digest.update(file.name.encode() + b"\0")
        with file.open("rb") as handle:
            while block := handle.read(1 << 20):
                digest.update(block)
                size += len(block)
    return CheckpointInfo(path=directory, step=trainer.step, epoch=trainer.epoch, size_bytes=size,
                          sha256=digest.hexdigest(), metrics=trainer.metrics)


def load(
    directory: str | os.PathLike[str],
    model: torch.nn.Module | None = None,
    optimizer: torch.optim.Optimizer | None = None,
) -> dict[str, Any]:
    """The trainer state of a checkpoint directory. With ``model`` (and ``optimizer``), their
    shards (or whole tensors, for a plain model) are loaded in place first, at this world size
    (a collective under torch.distributed), and the state's ``model``/``optimizer`` entries
    are theirs, so that ``Trainer.load_state_dict`` of it continues the run."""
    folder = Path(directory)
    if not is_sharded_checkpoint(folder):
        raise FileNotFoundError(
            f"{folder} is not a sharded checkpoint (no {TRAINER_FILE} and {DCP_METADATA} in it); "
            "pass a <step> directory that a Trainer of a sharded model wrote"
        )
    state = load_checkpoint(folder / TRAINER_FILE)
    if model is None:
        return state
    optimizers = [optimizer] if optimizer is not None else []
    model_state, optimizer_state = get_state_dict(model, optimizers)
    stored: dict[str, Any] = {"model": model_state}
    if optimizer is not None:
        stored["optimizer"] = optimizer_state
    dcp.load(stored, checkpoint_id=folder, no_dist=not (dist.is_available() and dist.is_initialized()))
    set_state_dict(model, optimizers, model_state_dict=stored["model"],
                   optim_state_dict=stored.get("optimizer", {}))
    state["model"] = model.state_dict()
    state["optimizer"] = optimizer.state_dict() if optimizer is not None else None
    return state


def consolidate(directory: str | Path, target: str | Path) -> Path:
    """One file with the full state (the trainer state; ``model``: the full model state dict;
    ``optimizer``: its state keyed by parameter names), readable by ``torch.load`` into a plain
    model (``torch.load(target)["model"]``) and by ``accumcore.load_checkpoint`` with a model
    and optimizer. Run it in one process: it holds the whole model in memory."""
    folder = Path(directory)
    state = load(folder)
    with tempfile.TemporaryDirectory(dir=Path(target).parent) as scratch:
        full_path = Path(scratch) / "full.pt"
        dcp_to_torch_save(folder, full_path)
        full = torch.load(full_path, map_location="cpu", weights_only=True)
    state["model"], state["optimizer"] = full["model"], full["optimizer"]
    save_checkpoint(state, target)
    return Path(target)


def model_state(directory: str | Path) -> dict[str, Any]:
    """The full model state dict of a checkpoint directory, in one process (a warm start's
    weights: the plain model's names, whole tensors on the CPU)."""
    with tempfile.TemporaryDirectory() as scratch:
        full_path = Path(scratch) / "full.pt"
        dcp_to_torch_save(Path(directory), full_path)
        full = torch.load(full_path, map_location="cpu", weights_only=True)
    return dict(full["model"])


def _barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
