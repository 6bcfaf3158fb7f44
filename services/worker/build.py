"""Spec -> the objects of one training run: data loaders, model, optimizer, scheduler, Trainer.

Everything a resumed attempt must rebuild identically is derived from the spec alone (model
initialisation seeded by ``spec.seed``, loader order by (seed, epoch)), so restoring the
checkpoint into these objects continues the run exactly.

Randomness, rank by rank: the model is initialised from ``spec.seed`` on every rank (one set of
weights); the forward's draws (dropout) are keyed by the global micro-batch and
``spec.seed`` (``Trainer(seed=)``), the same on any number of ranks; what is left, each
rank's own streams (random transforms in the main process or in DataLoader workers, whose
seeds ``make_loader(rank=)`` sets apart), is seeded ``rank_seed(spec.seed, rank)`` after the
model is built, so no two ranks draw one stream. Rank 0 keeps ``spec.seed``: a one-GPU job is
what it was.
"""

from __future__ import annotations

import math
import os
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, Subset

from accumcore import Callback, Trainer, fast_path
from accumcore.compile_watch import CompileWatch
from accumcore.data import make_loader
from accumcore.device_data import DeviceBatches
from accumcore.items import unpack
from accumcore.precision import check_native_bf16
from services.catalog.build import (
    DatasetBundle,
    build_dataset,
    build_loss,
    build_model,
    takes_keywords,
)
from services.fleet import too_few_ranks
from services.spec import JobSpec, world_size
from services.spec import total_optimizer_steps as spec_total_steps
from services.spec.batching import batch_over_data
from services.spec.world import enough_ranks
from services.worker import levers, micro_batch, strategy

# Effectively "until max_steps": fit counts epochs from 0 and stops at max_steps first.
UNBOUNDED_EPOCHS = 1 << 40


@dataclass
class Run:
    """A built run: call ``trainer.fit(train_loader, **fit_kwargs)``."""

    trainer: Trainer
    train_loader: Any
    val_loader: Any
    fit_kwargs: dict[str, Any]
    total_steps: int
    micro_batch_size: int
    accumulation_steps: int | dict[int, int]  # N per rank of the spec (the Trainer runs N x nodes x gpus)
    # What a warm start (`init_from`) loaded: the event the worker writes before the first step.
    warm_start: dict[str, Any] | None = field(default=None)
    # (kind, message, data) the runner records as the job's events: what building decided
    notes: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)


def pick_device(spec: JobSpec, local_rank: int = 0) -> str:
    """``cuda:<rank>`` when the job asks for GPUs and this worker has them, else ``cpu``."""
    if spec.gpus >= 1 and torch.cuda.is_available():
        seen = torch.cuda.device_count()
        if not enough_ranks(spec.gpus, seen):
            raise ValueError(too_few_ranks(spec.gpus, spec.queue, None,
                                           here=f"this worker sees {seen} GPUs (CUDA_VISIBLE_DEVICES); ",
                                           offered=seen))
        return f"cuda:{local_rank}"
    return "cpu"


def make_train_loader(
    spec: JobSpec, train: Dataset[Any], bundle: DatasetBundle, micro: int, device: str,
    notes: list[tuple[str, str, dict[str, Any]]] | None = None, *, rank: int = 0, world: int = 1,
) -> Any:
    """The training batches, in the (seed, epoch) order that makes resume exact: rank
    ``rank``'s share of each global window of the whole dataset's order, the same windows for
    any ``world`` (``accumcore.world_order``).

    ``data_on_device``: the whole (small) dataset lives on the device, each micro-batch is one
    indexing kernel; a dataset that does not fit there, or a text dataset (its batches are
    padded per batch by its collate function), is loaded as without it, with a note (event)
    saying so. Otherwise a DataLoader; on CUDA with the fast path, with pinned memory and
    worker processes. The batches stay on the host: the trainer's ``DeviceFeed`` copies each
    micro-batch just before its forward, on a side stream while the previous backward runs
    (a prefetcher in front of the trainer would put a whole window on the device).
    """
    notes = notes if notes is not None else []
    if spec.data_on_device and world > 1:
        notes.append(("data_on_device_ignored",
                      f"data_on_device is ignored on {world} ranks: each rank reads its share of every "
                      "global window through the DataLoader (same order, any world size)",
                      {"dataset": spec.dataset.name, "reason": "ranks"}))
    elif spec.data_on_device and bundle.collate_fn is not None:
        notes.append(("data_on_device_ignored",
                      f"data_on_device is ignored for {spec.dataset.name}: its batches are padded per "
                      "batch by its collate function; it is loaded by the DataLoader",
                      {"dataset": spec.dataset.name, "reason": "collate_fn"}))
    elif spec.data_on_device:
        try:
            return DeviceBatches.from_dataset(train, micro, device=device, seed=spec.seed, shuffle=True)
        except ValueError as exc:  # does not fit: the same batches, streamed
            notes.append(("data_on_device_ignored",
                          f"data_on_device: {exc}; loading it with the DataLoader instead (same order)",
                          {"dataset": spec.dataset.name, "reason": "does_not_fit"}))
    cuda = device.startswith("cuda")
    extra = fast_path.loader_kwargs(device, num_workers=loader_workers()) if cuda and spec.fast_path else {}
    loader = make_loader(train, micro, shuffle=True, seed=spec.seed, collate_fn=bundle.collate_fn,
                         rank=rank, world=world, **extra)
    collate = bundle.collate_fn
    if collate is not None:
        # Batches padded per batch (text) do not concatenate: with their targets by index the
        # trainer counts a window from its targets and the exactness check (verify_window)
        # collates the window's samples as one batch (accumcore.window_source).
        # Any batch shape the trainer takes (a tuple, or a dict of keyword inputs): items.unpack.
        loader.targets_for = lambda indices: unpack(collate([train[i] for i in indices]))[1]
    return loader


def rank_seed(seed: int, rank: int) -> int:
    """The seed of rank ``rank``'s own streams: ``seed`` on rank 0, apart from it on the others."""
    return seed if rank == 0 else (seed * 1_000_003 + 7_919 * rank) % (2**32)


def seed_rank_streams(seed: int, rank: int) -> None:
    """Seed this rank's torch, numpy and Python streams with ``rank_seed``. Every rank seeded
    ``spec.seed`` for the model's weights; left so, k ranks would draw one stream (random
    transforms, anything unkeyed): the bug of issue 41, where every rank drew rank 0's masks."""
    if rank == 0:
        return  # already seeded with spec.seed by build_model_on
    own = rank_seed(seed, rank)
    torch.manual_seed(own)
    np.random.seed(own)
    random.seed(own)


def loader_workers() -> int:
    """DataLoader workers for a GPU job: enough to keep the GPU fed, leaving cores to the rest."""
    return max(0, min(8, (os.cpu_count() or 2) // 2))


def rank_shard(dataset: Dataset[Any], rank: int, world: int) -> Dataset[Any]:
    """Rank ``rank``'s share of the validation set: samples rank, rank + world, ... each once
    (evaluation sums loss, items and hits over the ranks; training uses the global windows of
    ``make_train_loader`` instead).

    Shards differ by at most one sample (no padding by repetition, which would count the
    repeated samples twice)."""
    if world == 1:
        return dataset
    size = len(dataset)  # type: ignore[arg-type]
    if size < world:
        raise ValueError(
            f"the validation set has {size} samples, fewer than the job's {world} ranks (nodes x "
            "gpus); lower gpus or nodes, or give it a larger validation split"
        )
    return Subset(dataset, list(range(rank, size, world)))


def global_window(steps: int | dict[int, int], spec_world: int) -> int | dict[int, int]:
    """The Trainer's accumulation_steps G: micro-batches of one step over all ranks, N x the
    spec's world (nodes x gpus). Fixed by the spec, not by the ranks that run an attempt: a
    resume on fewer ranks (``min_nodes``) runs the same windows, each rank more of them."""
    if isinstance(steps, dict):
        return {epoch: n * spec_world for epoch, n in steps.items()}
    return steps * spec_world


def lr_lambda(spec: JobSpec, total_steps: int) -> Callable[[int], float] | None:
    """LR multiplier per optimizer step: linear warm-up, then constant / cosine / step decay."""
    sched = spec.scheduler
    warmup = sched.warmup_steps
    if sched.name == "none" and warmup == 0:
        return None

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / (warmup + 1)
        after = step - warmup
        if sched.name == "cosine":
            span = max(total_steps - warmup, 1)
            return 0.5 * (1.0 + math.cos(math.pi * min(after, span) / span))
        if sched.name == "step":
            assert sched.step_size is not None and sched.gamma is not None
            return float(sched.gamma ** (after // sched.step_size))
        return 1.0

    return factor


def build_optimizer(spec: JobSpec, params: Any, device: str) -> torch.optim.Optimizer:
    opt = spec.optimizer
    if opt.name == "adamw8bit":
        return levers.adamw8bit(spec, params, device)
    return fast_path.make_optimizer(
        opt.name,
        params,
        opt.lr,
        momentum=opt.momentum or 0.0,
        weight_decay=opt.weight_decay,
        betas=(float(opt.betas[0]), float(opt.betas[1])) if opt.betas else (0.9, 0.999),
        device=device,
        fast=spec.fast_path,
    )


def build_data(spec: JobSpec, data_root_default: Path | None) -> DatasetBundle:
    ref = spec.dataset
    root = ref.data_root if ref.data_root is not None else data_root_default
    return build_dataset(ref.name, data_root=root, download=ref.download, seed=spec.seed, **ref.options)


@dataclass
class Model:
    """The model as a run trains it, with what building it found out."""

    module: torch.nn.Module
    loss_fn: Any
    bundle: DatasetBundle  # its collate function the one the model takes
    keywords: bool  # a Hugging Face model: keyword batches with unshifted labels
    warm_start: dict[str, Any] | None  # what ``init_weights`` loaded
    compiled: fast_path.CompileResult | None = None  # ``compile: true``: what came of it


def build_model_on(spec: JobSpec, bundle: DatasetBundle, device: str, init_weights: Path | None) -> Model:
    """The spec's model, seeded, warm-started from ``init_weights``, on ``device``."""
    torch.manual_seed(spec.seed)  # the same seed gives the same initial weights on resume
    model = build_model(spec.model.name, bundle, **spec.model.options)
    warm = None
    if init_weights is not None:
        from services.worker.warm_start import load_initial_weights

        assert spec.init_from is not None
        warm = load_initial_weights(model, init_weights, strict=spec.init_from.strict)
    # A Hugging Face model takes keyword batches with unshifted labels (catalog.own_data).
    keywords = takes_keywords(model)
    loss_fn = build_loss(bundle, model)  # before any wrapping hides what the model is
    if keywords and bundle.keyword_collate_fn is not None:
        bundle = replace(bundle, collate_fn=bundle.keyword_collate_fn)
    model = model.to(device)
    if spec.fast_path:
        model = fast_path.use_channels_last(model, device)  # same values, faster conv layout
    compiled = fast_path.maybe_compile(model, True) if spec.compile else None  # state_dict unchanged
    return Model(model, loss_fn, bundle, keywords, warm, compiled)


def make_trainer(spec: JobSpec, model: Model, optimizer: torch.optim.Optimizer, steps: int | dict[int, int],
                 total: int, device: str, callbacks: Sequence[Callback], checkpoint_dir: Path | None) -> Trainer:
    """The Trainer of the run, its scheduler sized to ``total`` optimizer steps."""
    factor = lr_lambda(spec, total)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor) if factor else None
    return Trainer(
        model.module,
        optimizer,
        loss_fn=model.loss_fn,
        accumulation_steps=steps,
        scheduler=scheduler,
        precision=spec.precision,
        grad_clip_norm=spec.grad_clip_norm,
        device=device,
        callbacks=callbacks,
        checkpoint_every=spec.checkpoint_every if checkpoint_dir is not None else None,
        checkpoint_dir=checkpoint_dir,
        # checkpoint_dir is the node's staging directory: the durable copy is the one the
        # uploader puts in the artifact store (a file store fsyncs its own copy), so the
        # trainer skips the fsyncs at the window boundary (most of its time per checkpoint).
        checkpoint_fsync=False,
        checkpoint_frozen=spec.peft is None,  # LoRA: the adapters; the base is rebuilt from its source
        on_nonfinite=spec.on_nonfinite,
        seed=spec.seed,  # dropout keyed by (seed, epoch, global micro-batch): any rank count, one trajectory
        **strategy.trainer_options(spec, model.module),  # verify_window, FSDP's sync mode
        # A causal LM's loss scores labels[..., 1:]: count those (docs/accumulation.md rule 1).
        shift_labels=model.keywords and model.bundle.info.task == "language_modeling",
    )


def compile_watch(model: Model, notes: list[tuple[str, str, dict[str, Any]]]) -> list[Callback]:
    """``compile: true``: the callback that reports the compile time or the fallback at the
    first step (``accumcore.compile_watch``); a toolchain missing here is a note now."""
    if model.compiled is None:
        return []
    if not model.compiled.compiled:
        reason = model.compiled.reason
        notes.append(("compile_fallback", f"torch.compile is not available on this worker ({reason}); "
                      "the model runs eagerly (same arithmetic, without the compiled speed-up)",
                      {"reason": reason}))
        return []
    return [CompileWatch()]


def build_run(
    spec: JobSpec,
    *,
    callbacks: Sequence[Callback],
    checkpoint_dir: Path | None,
    data_root_default: Path | None = None,
    device: str | None = None,
    rank: int = 0,
    world: int = 1,
    wrap_model: Callable[[torch.nn.Module], torch.nn.Module] | None = None,
    init_weights: Path | None = None,
    chosen: tuple[int, int] | None = None,
) -> Run:
    """Build everything for one attempt of ``spec`` (on rank ``rank`` of ``world``).
    ``chosen``: the (m, N) an earlier attempt chose for ``micro_batch_size: "auto"``
    (``services.worker.micro_batch`` decides), used instead of probing again.

    ``init_weights``: the file ``spec.init_from`` names (resolved by the runner), loaded into
    the model before training (``services.worker.warm_start``).

    ``wrap_model``: how the ranks share the model (``services.worker.strategy``), applied before
    the optimizer is built (FSDP's sharded parameters are the ones it steps).

    ``checkpoint_dir``: a staging directory whose files the caller uploads to the artifact
    store; they are written atomically but not fsynced (the store's copy is the durable one).

    Raises:
        ValueError: a spec the catalog refuses. DatasetUnavailable: missing data root files.
    """
    device = device or pick_device(spec, rank)
    if spec.precision == "bf16":
        check_native_bf16(torch.device(device))  # before anything is built: fail at the start
    model = build_model_on(spec, build_data(spec, data_root_default), device, init_weights)
    bundle = model.bundle
    model = replace(model, module=levers.apply(spec, model.module))  # LoRA, checkpointing: before FSDP
    if wrap_model is not None:  # before the optimizer: FSDP replaces the parameters (strategy)
        model = replace(model, module=wrap_model(model.module))
    optimizer = build_optimizer(spec, levers.trainable_parameters(model.module), device)
    train = bundle.train  # every rank orders all of it; the loader takes this rank's share
    micro, steps = micro_batch.decide(
        spec, chosen=chosen, device=device, world=world,
        probe=lambda: micro_batch.probe_on_device(spec, model.module, train, bundle.collate_fn,
                                                  model.loss_fn, device, optimizer),
    )
    seed_rank_streams(spec.seed, rank)  # after every rank built the same model and its wrapping
    notes: list[tuple[str, str, dict[str, Any]]] = []
    train_loader = make_train_loader(spec, train, bundle, micro, device, notes, rank=rank, world=world)
    window = global_window(steps, world_size(spec))
    if device.startswith("cuda"):
        # Image batches have one shape: let cuDNN time its algorithms once and keep the
        # fastest (not bitwise reproducible across runs on CUDA: docs/deployment.md, "Determinism on CUDA").
        torch.backends.cudnn.benchmark = spec.fast_path and bundle.collate_fn is None
    # Each DDP rank evaluates its own share; accumcore's evaluate sums loss, items and hits
    # over the ranks, so the metrics are those of the whole validation set.
    val = rank_shard(bundle.val, rank, world) if len(bundle.val) >= world else bundle.val  # type: ignore[arg-type]
    val_loader = make_loader(val, micro, shuffle=False, collate_fn=bundle.collate_fn)
    total = spec_total_steps(spec, train_size=len(bundle.train))  # type: ignore[arg-type]  # map-style datasets are Sized
    assert total is not None  # the size is known here
    if (over := batch_over_data(spec, len(bundle.train))) is not None:  # type: ignore[arg-type]
        # Own data is sized only here: the submit check (services.spec.limits) could not say it.
        notes.append(("batch_over_data", over[1], {"field": over[0], "train_size": len(bundle.train)}))  # type: ignore[arg-type]
    trainer = make_trainer(spec, model, optimizer, window, total, device,
                           [*callbacks, *compile_watch(model, notes)], checkpoint_dir)
    notes.extend(strategy.notes(spec, model.module))
    notes.extend(levers.notes(spec, model.module))
    fit_kwargs: dict[str, Any] = {
        "epochs": spec.epochs or UNBOUNDED_EPOCHS,
        "max_steps": spec.max_steps,
        "val_loader": val_loader,
        "eval_every": spec.eval_every,
    }
    return Run(trainer, train_loader, val_loader, fit_kwargs, total, micro, steps, model.warm_start, notes)
