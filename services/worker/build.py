"""Spec -> the objects of one training run: data loaders, model, optimizer, scheduler, Trainer.

Everything a resumed attempt must rebuild identically is derived from the spec alone (model
initialisation seeded by ``spec.seed``, loader order by (seed, epoch)), so restoring the
checkpoint into these objects continues the run exactly.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset, Subset

from accumcore import Callback, Trainer, fast_path
from accumcore.auto_batch import accumulation_for, find_micro_batch_size
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
from services.spec import JobSpec, accumulation_at, effective_batch_size, world_size
from services.spec import total_optimizer_steps as spec_total_steps

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
    accumulation_steps: int | dict[int, int]
    # What a warm start (`init_from`) loaded: the event the worker writes before the first step.
    warm_start: dict[str, Any] | None = field(default=None)
    # (kind, message, data) the runner records as the job's events: what building decided
    notes: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)


def pick_device(spec: JobSpec, local_rank: int = 0) -> str:
    """``cuda:<rank>`` when the job asks for GPUs and this worker has them, else ``cpu``."""
    if spec.gpus >= 1 and torch.cuda.is_available():
        if torch.cuda.device_count() < spec.gpus:
            raise ValueError(
                f"the job asks for gpus={spec.gpus} but this worker sees "
                f"{torch.cuda.device_count()} (CUDA_VISIBLE_DEVICES); route it to a queue whose "
                "workers have enough GPUs, or lower gpus"
            )
        return f"cuda:{local_rank}"
    return "cpu"


def micro_batch_and_steps(spec: JobSpec) -> tuple[int, int | dict[int, int]]:
    """(m, N) from the spec. ``"auto"``: the whole per-rank batch in one micro-batch, which
    ``probe_micro_batch`` refines on a GPU (on the CPU nothing runs out of memory)."""
    if spec.micro_batch_size == "auto":
        return effective_batch_size(spec) // world_size(spec), 1
    steps = spec.accumulation_steps
    if isinstance(steps, dict):
        return spec.micro_batch_size, {int(e): int(n) for e, n in steps.items()}
    n = accumulation_at(spec, 0)
    assert n is not None
    return spec.micro_batch_size, n


def probe_micro_batch(
    spec: JobSpec, model: torch.nn.Module, train: Dataset[Any], bundle: DatasetBundle,
    loss_fn: Any, device: str, optimizer: torch.optim.Optimizer | None = None,
) -> tuple[int, int]:
    """The largest m dividing the per-rank effective batch that fits on the GPU (m x N == B)."""
    per_rank = effective_batch_size(spec) // world_size(spec)

    def sample(m: int) -> Any:
        return next(iter(make_loader(train, m, shuffle=False, collate_fn=bundle.collate_fn)))

    # The job's own optimizer type sizes the optimizer state in the probe; read-ahead is
    # assumed (the conservative side) because the loader depends on the m being chosen.
    micro = find_micro_batch_size(model, sample, per_rank, device, loss_fn=loss_fn,
                                  precision=spec.precision, optimizer=optimizer)
    return micro, accumulation_for(per_rank, micro)


def agree_on_smallest(spec: JobSpec, micro: int, device: str) -> tuple[int, int]:
    """The smallest m the DDP ranks picked (one all-reduce), and its N: a divisor of the
    per-rank batch that fits on every rank."""
    import torch.distributed as dist

    from accumcore.auto_batch import accumulation_for

    picked = torch.tensor([micro], device=device)
    dist.all_reduce(picked, op=dist.ReduceOp.MIN)
    per_rank = effective_batch_size(spec) // world_size(spec)
    return int(picked.item()), accumulation_for(per_rank, int(picked.item()))


def make_train_loader(
    spec: JobSpec, train: Dataset[Any], bundle: DatasetBundle, micro: int, device: str,
    notes: list[tuple[str, str, dict[str, Any]]] | None = None,
) -> Any:
    """The training batches, in the (seed, epoch) order that makes resume exact.

    ``data_on_device``: the whole (small) dataset lives on the device, each micro-batch is one
    indexing kernel; a dataset that does not fit there, or a text dataset (its batches are
    padded per batch by its collate function), is loaded as without it, with a note (event)
    saying so. Otherwise a DataLoader; on CUDA with the fast path, with pinned memory and
    worker processes. The batches stay on the host: the trainer's ``DeviceFeed`` copies each
    micro-batch just before its forward, on a side stream while the previous backward runs
    (a prefetcher in front of the trainer would put a whole window on the device).
    """
    notes = notes if notes is not None else []
    if spec.data_on_device and bundle.collate_fn is not None:
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
    loader = make_loader(train, micro, shuffle=True, seed=spec.seed, collate_fn=bundle.collate_fn, **extra)
    collate = bundle.collate_fn
    if collate is not None:
        # Batches padded per batch (text) do not concatenate: with their targets by index the
        # trainer counts a window from its targets and the exactness check (verify_window)
        # collates the window's samples as one batch (accumcore.window_source).
        # Any batch shape the trainer takes (a tuple, or a dict of keyword inputs): items.unpack.
        loader.targets_for = lambda indices: unpack(collate([train[i] for i in indices]))[1]
    return loader


def loader_workers() -> int:
    """DataLoader workers for a GPU job: enough to keep the GPU fed, leaving cores to the rest."""
    return max(0, min(8, (os.cpu_count() or 2) // 2))


def rank_shard(dataset: Dataset[Any], rank: int, world: int) -> Dataset[Any]:
    """Rank ``rank``'s share of the training set: samples rank, rank + world, ... each once.

    Shards differ by at most one sample (no padding by repetition, which would count the
    repeated samples twice and move the update off the big batch of the data). Ranks still
    run the same windows: accumcore agrees on them in each window's all-reduce, and a rank
    with no micro-batch left contributes zero items (docs/accumulation.md rule 7)."""
    if world == 1:
        return dataset
    size = len(dataset)  # type: ignore[arg-type]
    if size < world:
        raise ValueError(
            f"the training set has {size} samples, fewer than the {world} ranks of gpus={world}; "
            "lower gpus or use a larger dataset"
        )
    return Subset(dataset, list(range(rank, size, world)))


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
    (``services.worker.micro_batch``), used instead of probing again.

    ``init_weights``: the file ``spec.init_from`` names (resolved by the runner), loaded into
    the model before training (``services.worker.warm_start``).

    ``checkpoint_dir``: a staging directory whose files the caller uploads to the artifact
    store; they are written atomically but not fsynced (the store's copy is the durable one).

    Raises:
        ValueError: a spec the catalog refuses. DatasetUnavailable: missing data root files.
    """
    device = device or pick_device(spec, rank)
    if spec.precision == "bf16":
        check_native_bf16(torch.device(device))  # before anything is built: fail at the start
    bundle = build_data(spec, data_root_default)
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
    if spec.compile:
        model = fast_path.maybe_compile(model, True).model  # forward only; state_dict unchanged
    optimizer = build_optimizer(spec, model.parameters(), device)
    if wrap_model is not None:
        model = wrap_model(model)
    micro, steps = micro_batch_and_steps(spec)
    train = rank_shard(bundle.train, rank, world)
    if spec.micro_batch_size == "auto" and chosen is not None:
        micro, steps = chosen
    elif spec.micro_batch_size == "auto" and device.startswith("cuda"):
        micro, steps = probe_micro_batch(spec, model, train, bundle, loss_fn, device, optimizer)
        if world > 1:  # every rank must run the same (m, N): the smallest pick fits on all
            micro, steps = agree_on_smallest(spec, micro, device)
    notes: list[tuple[str, str, dict[str, Any]]] = []
    train_loader = make_train_loader(spec, train, bundle, micro, device, notes)
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
    factor = lr_lambda(spec, total)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor) if factor else None
    trainer = Trainer(
        model,
        optimizer,
        loss_fn=loss_fn,
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
        on_nonfinite=spec.on_nonfinite,
        verify_window=spec.verify_window,
        # A causal LM's loss scores labels[..., 1:]: count those (docs/accumulation.md rule 1).
        shift_labels=keywords and bundle.info.task == "language_modeling",
    )
    fit_kwargs: dict[str, Any] = {
        "epochs": spec.epochs or UNBOUNDED_EPOCHS,
        "max_steps": spec.max_steps,
        "val_loader": val_loader,
        "eval_every": spec.eval_every,
    }
    return Run(trainer, train_loader, val_loader, fit_kwargs, total, micro, steps, warm, notes)
