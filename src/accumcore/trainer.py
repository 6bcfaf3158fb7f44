"""The trainer: exact gradient accumulation, metrics, checkpoints and exact resume.

    trainer = Trainer(model, optimizer, loss_fn=torch.nn.CrossEntropyLoss(), accumulation_steps=4)
    history = trainer.fit(make_loader(train_set, batch_size=32), epochs=2, val_loader=val_loader)

What ``fit`` does, one screen (numbers: the rules of docs/accumulation.md; right: where):

    for epoch in epochs:
        batches = iter(loader) from the epoch's start RNG states       # loader_state (9)
        while window := next N batches:                                 # _train_epoch
            first batch of the fit: does the model's loss shift labels? # label_shift (15)
            micro, n_i = split on OOM back-off, count items             # window, items (2, 10, 15)
            first window (later ones while pending): == big batch?      # verify_window (16)
            W = sum(n_i)  [DDP: all-reduce with the stop/data flags]    # window.WindowRunner (7)
            for i, mb in enumerate(micro):
                with no_sync unless i is last:                          # distributed (7)
                    loss = loss_fn(model(mb.inputs), mb.targets)        # items.forward (15)
                    backward(loss * n_i / W)   (n_i = 0: nothing)       # precision (1, 6, 14)
            unscale (fp16), clip; grad_norm                             # stepper, precision (6)
            read loss, W, grad_norm [DDP: OOM flags]: the one sync      # stepper, metrics (12)
            OOM on any rank: split in two, run the window again         # _run_window, oom (10)
            W == 0 or inf/NaN: no step; fail or skip                    # stepper, _step (13, 14)
            optimizer.step(); scheduler.step(); zero_grad()             # stepper (4, 5)
            metrics, callbacks, every k steps a checkpoint              # _step, checkpoint (9)
        evaluate(val_loader); ReduceLROnPlateau.step(val_loss)          # evaluation (4)

Checkpoints, ``state_dict`` and ``should_stop`` act only at window boundaries, which is what
makes resume bitwise exact; the window's targets are counted before its first backward (from
the targets alone where the loader allows it, see ``window_source``; otherwise by loading the
window's N micro-batches ahead).
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from accumcore import (
    distributed,
    epoch_windows,
    items,
    label_shift,
    loader_state,
    metrics,
    sharded_checkpoint,
    sharding,
)
from accumcore.batchnorm_sync import BatchNormReplay
from accumcore.callbacks import Callback, CallbackList, CheckpointInfo
from accumcore.checkpoint import save_checkpoint
from accumcore.evaluation import evaluate
from accumcore.fast_path import host_loader
from accumcore.frozen import load_model_state, model_state
from accumcore.loss import ModelLossOrCrossEntropy, check_loss_fn, check_mean_over_items
from accumcore.oom import MicroBatchTooSmall, is_oom, next_split, release_memory
from accumcore.precision import Precision
from accumcore.rng import (
    capture_rng_state,
    epoch_key,
    micro_batch_seed,
    restore_rng_state,
    serialise_rng_state,
)
from accumcore.schedule import AccumulationSchedule
from accumcore.state import STATE_FORMAT, check_state
from accumcore.stepper import StepOutcome, WindowStepper, is_plateau
from accumcore.verify_window import check_option, verify
from accumcore.window import EXHAUSTED, FAILED, STOPPED, WindowRunner, make_micro_batches
from accumcore.window_source import PendingBatch, target_source
from accumcore.world_order import WindowLayout

NONFINITE_POLICIES = ("fail", "skip")


class NonFiniteError(RuntimeError):
    """A window's loss or gradient norm was inf or NaN (``Trainer(on_nonfinite="fail")``), or
    too many steps in a row were skipped for it. The message names the step, the metric and
    the last checkpoint written with finite values."""

    def __init__(self, message: str, *, step: int, metric: str, value: float, checkpoint: Path | None) -> None:
        super().__init__(message)
        self.step = step
        self.metric = metric
        self.value = value
        self.checkpoint = checkpoint


@dataclass
class FitHistory:
    """What ``fit`` did: step and eval metrics, events, checkpoints, and why it ended."""

    steps: list[dict[str, float]] = field(default_factory=list)
    evals: list[dict[str, float]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    checkpoints: list[CheckpointInfo] = field(default_factory=list)
    stopped: bool = False  # True when a callback's should_stop ended the run
    skipped_steps: int = 0  # steps skipped for inf/nan: fp16 overflow, or on_nonfinite="skip"


class Trainer:
    """Trains ``model`` with exact, item-weighted gradient accumulation.

    Args:
        model: the module (optionally DDP-wrapped); moved to ``device``. A batch that is a
            mapping (Hugging Face style) is passed as keyword arguments: ``model(**batch)``.
        optimizer: built on the model's parameters.
        loss_fn: ``fn(outputs, targets)`` returning the mean over a micro-batch's items
            (``reduction='mean'``; a callable without a ``reduction`` attribute is checked
            on the first micro-batch, see ``accumcore.loss``). None: the model's own loss
            when its output has one (``outputs.loss``), else
            ``CrossEntropyLoss(ignore_index=ignore_index)``.
        accumulation_steps: N, or an epoch schedule such as ``{0: 8, 4: 2}``. With a loader
            made by ``make_loader(..., rank=r, world=k)``, N counts the micro-batches of one
            step over all ranks (each rank runs its share), so the same value gives the same
            trajectory on any number of ranks; with a loader per rank's shard, each rank's.
        scheduler: stepped once per optimizer step (not per micro-batch).
        precision: ``"fp32"``, ``"bf16"`` (autocast) or ``"fp16"`` (autocast + GradScaler).
        grad_clip_norm: clip the total gradient norm to this value (after fp16 unscaling).
        device: ``"cpu"``, ``"cuda"``, ``"cuda:1"``...
        callbacks: ``accumcore.Callback`` instances.
        count_items: what the loss averages over (n_i): ``"tokens"`` (non-ignored integer
            targets; every position of float targets), ``"rows"`` (samples), a callable
            ``fn(inputs, targets) -> int``, or None to infer it (``items.ItemCounter``;
            an ambiguous count is refused, never guessed).
        shift_labels: the model (or ``loss_fn``) scores ``labels[..., 1:]``, as a causal LM
            does: count those. None: False with a ``loss_fn``; for the model's own loss, told
            once at fit start from what it computes (``accumcore.label_shift``: its loss
            against its logits' cross-entropy with the labels shifted and in place, float64),
            refused with a ``ValueError`` when neither matches.
        ignore_index: integer targets equal to this are not items (and not scored).
        checkpoint_every: write ``checkpoint_dir/<step>.pt`` every this many optimizer steps.
        checkpoint_dir: where checkpoints go; also written at the end of ``fit``.
        checkpoint_fsync: fsync each checkpoint file and its directory (the write is atomic
            either way: temp file, rename). ``False`` only where the file is a staged copy
            that something else makes durable (the accum worker uploads it to its artifact
            store): a power cut may then lose or truncate the latest file.
        checkpoint_frozen: write the frozen parameters (``requires_grad`` False) into
            checkpoints. ``False``: the trainable ones only (LoRA adapters on a frozen base);
            the resuming run must rebuild the same frozen base (``accumcore.frozen``).
        grad_norm: report the pre-clip total gradient norm (metric ``grad_norm``) every
            optimizer step. It costs one pass over all gradients per step; with ``False``
            and no ``grad_clip_norm`` that pass is skipped and the metric is absent (and the
            non-finite check reads the loss only).
        on_nonfinite: what a window with an inf/NaN loss or gradient norm does (checked once
            per optimizer step, with the step's one device sync, before the step):
            ``"fail"`` raises ``NonFiniteError``; ``"skip"`` skips the optimizer and scheduler
            step with a ``nonfinite_step_skipped`` event. fp16 leaves inf/NaN gradients to
            the GradScaler, which skips those steps itself.
        max_consecutive_skips: raise ``NonFiniteError`` after this many skipped steps in a
            row (``on_nonfinite="skip"`` or fp16 overflows): the run has diverged.
        verify_window: before the first optimizer step of a fit from step 0, compare the
            first window's accumulated gradient with its big batch's (eval mode, fp32;
            ``accumcore.verify_window``) and report it as an ``exactness_check`` event.
            ``True`` raises ``ExactnessError`` (naming the fix that made the comparison pass
            when re-run with it) above the tolerance, ``"warn"`` reports and trains on,
            ``"strict"`` also fails when the check cannot run, ``False`` (default) skips it.
            A window whose parts could not differ (one micro-batch: compared as two unequal
            parts; rows of equal length, where a row mean is a token mean) reports
            ``pending``, never ``passed``, and later windows are checked until one can.
        verify_memory_limit_bytes: cap on the check's big-batch peak memory; the check then
            uses the first micro-batches that fit (a sub-window, said in the event).
        fsdp_sync: for a model sharded with ``fully_shard`` (``accumcore.shard``):
            ``"micro_batch"`` reduce-scatters gradients after every micro-batch (sharded
            gradients only), ``"window"`` once per window (unsharded gradients held through
            the window). Both are exact; see ``accumcore.sharding``. Sharded models write
            checkpoint directories (``accumcore.sharded_checkpoint``).
        seed: keys each micro-batch's randomness (dropout, stochastic depth, ``torch.rand*`` in
            the forward): global micro-batch i of epoch e runs its forward and backward on
            the CPU generator (and the model's CUDA device's) seeded from (seed, e, i), and
            the previous states are put back after (``accumcore.rng.KeyedRng``, a few us a
            micro-batch). The same micro-batch then draws the same masks on any rank, so a
            dropout model follows one trajectory on 1, 2 or 8 ranks, and no two ranks share
            masks. None: ``torch.initial_seed()`` (what ``torch.manual_seed`` set), rank
            0's under DDP/FSDP (agreed at the first fit). A resumed run uses the
            checkpoint's.

    Raises:
        TypeError: no model or no optimizer.
        ValueError: for a loss that cannot be item-weighted, an optimizer on another model's
            parameters, or invalid settings.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        loss_fn: Callable[[Any, Any], torch.Tensor] | None = None,
        accumulation_steps: int | Mapping[int, int] = 1,
        scheduler: Any | None = None,
        precision: str = "fp32",
        grad_clip_norm: float | None = None,
        device: str | torch.device = "cpu",
        callbacks: Iterable[Callback] = (),
        count_items: str | Callable[[Any, Any], int | torch.Tensor] | None = None,
        ignore_index: int = -100,
        checkpoint_every: int | None = None,
        checkpoint_dir: str | Path | None = None,
        checkpoint_fsync: bool = True,
        checkpoint_frozen: bool = True,
        grad_norm: bool = True,
        shift_labels: bool | None = None,
        on_nonfinite: str = "fail",
        max_consecutive_skips: int = 25,
        verify_window: bool | str = False,
        verify_memory_limit_bytes: int | None = None,
        fsdp_sync: str = sharding.DEFAULT_SYNC,
        seed: int | None = None,
    ) -> None:
        _check_model_and_optimizer(model, optimizer, loss_fn)
        _check_settings(on_nonfinite=on_nonfinite, max_consecutive_skips=max_consecutive_skips,
                        verify_memory_limit_bytes=verify_memory_limit_bytes, grad_clip_norm=grad_clip_norm,
                        checkpoint_every=checkpoint_every, checkpoint_dir=checkpoint_dir)
        self.on_nonfinite = on_nonfinite
        self.max_consecutive_skips = max_consecutive_skips
        self.verify_window = check_option(verify_window)
        self.verify_memory_limit_bytes = verify_memory_limit_bytes
        self._verify_pending = False  # set by fit: the check runs on a fresh fit's first window
        self._verify_ran = False  # ... and on later windows while its result is "pending"
        self.device = torch.device(device)
        self._place_model(model, precision)
        self.optimizer = optimizer
        self._set_loss(loss_fn, count_items, ignore_index, shift_labels)
        self.schedule = AccumulationSchedule(accumulation_steps)
        self.scheduler = scheduler
        self.precision = Precision(precision, self.device)
        self.grad_clip_norm = grad_clip_norm
        self.callbacks = CallbackList(callbacks)
        self.checkpoint_every = checkpoint_every
        self.checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir is not None else None
        self.checkpoint_fsync = checkpoint_fsync
        self.checkpoint_frozen = checkpoint_frozen
        self._stepper = WindowStepper(
            self.model, optimizer, scheduler, self.precision, grad_clip_norm, self.device,
            track_grad_norm=grad_norm,
        )
        self._runner = WindowRunner(
            self.model, self.loss_fn, self.precision, self.device,
            self.callbacks.should_stop if self.callbacks.can_stop else None, fsdp_sync,
        )
        self._reset_progress()
        self.seed = seed  # None until the first fit agrees on one (``_agree_seed``)
        # DDP or FSDP: the ranks agree on each window's counts and on the epoch's end.
        self._ddp = distributed.ddp_wrapped(self.model) or self.sharded
        # BatchNorm running statistics kept the one-process ones on any number of ranks.
        replay = BatchNormReplay(self.model) if self._ddp else None
        self._batchnorm = replay if replay is not None and replay.layers else None
        self._history = FitHistory()

    def _place_model(self, model: torch.nn.Module, precision: str) -> None:
        """The model on the device; FSDP places its shards itself (in host memory with CPU
        offload)."""
        self.sharded = sharding.is_sharded(model)
        if self.sharded:
            _check_sharded(model, precision, self.verify_window)
        self.model = model if self.sharded else model.to(self.device)

    def _set_loss(
        self,
        loss_fn: Callable[[Any, Any], torch.Tensor] | None,
        count_items: str | Callable[[Any, Any], int | torch.Tensor] | None,
        ignore_index: int,
        shift_labels: bool | None,
    ) -> None:
        """The loss and how its items are counted (docs/accumulation.md rules 1-3)."""
        self.loss_fn = loss_fn if loss_fn is not None else ModelLossOrCrossEntropy(ignore_index)
        custom_counter = callable(count_items)
        check_loss_fn(self.loss_fn, ignore_index, custom_counter=custom_counter)
        self.shift_labels = _shift_labels(loss_fn, shift_labels)
        # The model's own loss: whether it shifts its labels is told from what it computes on
        # the first micro-batch of a fit (accumcore.label_shift), once.
        self._detect_shift = self.shift_labels is None
        # A loss that does not say it is a mean is checked on the first micro-batch.
        self._check_loss_scale = not hasattr(self.loss_fn, "reduction")
        if self.sharded and self._check_loss_scale:
            # The check's forwards depend on this rank's data; FSDP's are collectives.
            raise ValueError(
                "a sharded (FSDP) model's loss_fn must say it is a mean over the items: give it a "
                "reduction='mean' attribute (the check that runs instead on a plain model would "
                "run a different number of forwards on each rank)"
            )
        self.ignore_index = ignore_index
        self.count_items: Callable[[Any, Any], Any] = (
            count_items if callable(count_items)
            else items.ItemCounter(count_items, ignore_index, self.shift_labels, self.loss_fn)
        )
        self._custom_counter = custom_counter  # a callable may need the inputs: no targets-only path

    def _reset_progress(self) -> None:
        """Progress, all of it at the last window boundary: a new trainer's, before a fit or a
        resume sets it."""
        self.epoch = 0
        self.batch_in_epoch = 0  # loaded batches of the current epoch already stepped on
        self.window_in_epoch = 0  # windows (optimizer steps) of the current epoch, the same on every rank
        self.samples_in_epoch = 0  # samples of those windows over all ranks: the global position
        self._window_sizes: list[int] | None = None  # this rank's batches per window (epoch_windows)
        self._layout: WindowLayout | None = None  # ... and the global micro-batches of each (rule 14)
        self._pending_position: dict[str, Any] | None = None  # a checkpoint's progress, to place the resume
        self.global_step = 0
        self.skipped_steps = 0
        self.consecutive_skips = 0  # skipped steps since the last applied one
        self.oom_split = 1  # each loaded batch runs as this many micro-batches (OOM back-off)
        # RNG states at the last window boundary; None while the current states are those
        # (capturing costs ~0.1 ms, so it is done only when a stop could leave a window).
        self._rng_at_boundary: dict[str, Any] | None = None
        self._pending_rng: dict[str, Any] | None = None
        self._pending_sampler: dict[str, Any] | None = None
        self._sampler_state: dict[str, Any] | None = None
        # RNG/generator states the loader's iterator draws from at the current epoch's start
        # (accumcore.loader_state), and whether the last fit's loader can be replayed from them.
        self._epoch_start: dict[str, Any] | None = None
        self._pending_loader: dict[str, Any] | None = None
        self._resume_exact = True
        # An IterableDataset that saves its own position (loader_state.stateful_dataset): the
        # one of the current fit, its state at the last boundary, and one loaded to resume.
        self._stateful_dataset: Any | None = None
        self._dataset_at_boundary: dict[str, Any] | None = None
        self._pending_dataset: dict[str, Any] | None = None
        self._last_checkpoint_step: int | None = None
        self._last_eval_step: int | None = None
        self._last_metrics: dict[str, float] = {}
        self._largest_batch = 0  # samples of the largest loaded batch seen (OOM messages)
        self._window_was_last = False  # DDP: the window just stepped ends the epoch on every rank

    # ----------------------------------------------------------------------------- fit
    def fit(
        self,
        train_loader: Iterable[Any],
        epochs: int = 1,
        val_loader: Iterable[Any] | None = None,
        max_steps: int | None = None,
        eval_every: int | None = None,
    ) -> FitHistory:
        """Train until ``epochs`` epochs (counted from 0, resumable) or ``max_steps`` steps.

        Evaluates on ``val_loader`` after each epoch and every ``eval_every`` optimizer steps.
        ``max_steps`` counts optimizer steps in total, including those before a resume.
        """
        if epochs < 1:
            raise ValueError(f"epochs must be >= 1, got {epochs}")
        if max_steps is not None and max_steps < 1:
            raise ValueError(f"max_steps must be >= 1 or None, got {max_steps}")
        if eval_every is not None and (eval_every < 1 or val_loader is None):
            raise ValueError("eval_every needs val_loader and a value >= 1 (optimizer steps)")
        if is_plateau(self.scheduler) and val_loader is None:
            raise ValueError(
                "ReduceLROnPlateau steps on the validation loss: pass val_loader to fit (it is "
                "stepped after each epoch's evaluation, and every eval_every steps)"
            )
        if loader_state.persistent_workers(train_loader) and (
            self.checkpoint_dir is not None or self.global_step > 0
        ):
            # Checkpoints promise an exact resume, which these workers' RNG states break.
            raise ValueError(
                f"the training DataLoader has persistent_workers=True and this fit "
                f"{'writes checkpoints' if self.global_step == 0 else 'resumes from a checkpoint'}: "
                f"{loader_state.PERSISTENT_WORKERS}"
            )
        history = self._history = FitHistory()
        if self.seed is None:
            self.seed = self._agree_seed()
        self._verify_pending = bool(self.verify_window) and self.global_step == 0
        self._verify_ran = False
        self.callbacks.on_fit_start(self)
        if not self.model.training:
            # Only a model left in eval mode as a whole is switched: submodules the user put
            # in eval mode on purpose (a frozen BatchNorm) stay as they are.
            self.model.train()
        self._warn_batchnorm()
        self._warn_inexact_resume(train_loader)
        metrics.reset_peak_memory(self.device)
        ended = "epochs"
        while self.epoch < epochs:
            if max_steps is not None and self.global_step >= max_steps:
                ended = "max_steps"
                break
            ended = self._train_epoch(train_loader, val_loader, max_steps, eval_every)
            if ended != "epoch":
                break
            if val_loader is not None:
                self._evaluate(val_loader, scheduled=True)
            self.epoch += 1
            self.batch_in_epoch = self.window_in_epoch = self.samples_in_epoch = 0
            # The next epoch starts from here: its loader's generators as they are now.
            self._epoch_start = None  # (freed first: the capture copies RNG states)
            self._epoch_start = loader_state.capture(train_loader)
        history.stopped = ended == "stopped"
        history.skipped_steps = self.skipped_steps
        if not history.stopped:
            if ended == "max_steps" and val_loader is not None and self._last_eval_step != self.global_step:
                # Not a scheduled evaluation: a run resumed from here must not see it either.
                self._evaluate(val_loader, scheduled=False)
            if self.checkpoint_dir is not None and self._last_checkpoint_step != self.global_step:
                self._write_checkpoint()
        self.callbacks.on_fit_end(self, history)
        return history

    def _train_epoch(
        self,
        loader: Iterable[Any],
        val_loader: Iterable[Any] | None,
        max_steps: int | None,
        eval_every: int | None,
    ) -> str:
        steps_per_window = self.schedule.at(self.epoch)
        may_stop = self.callbacks.can_stop
        stateful = self._stateful_dataset = loader_state.stateful_dataset(loader)
        batches = self._epoch_batches(loader, may_stop)
        batches_per_epoch = loader_state.batches_per_epoch(loader)
        sizes = self._window_sizes  # a windowed sampler's: this rank's share of each global window
        while True:
            started = time.perf_counter()
            if may_stop and self._rng_at_boundary is None:
                # A stop inside the window leaves the RNGs past the boundary. (The first window
                # of an epoch has its boundary from before the loader's iterator was created.)
                self._rng_at_boundary = capture_rng_state()
            if stateful is not None:  # ... and the dataset's position too
                self._dataset_at_boundary = stateful.state_dict()
            if sizes is None:
                size = steps_per_window
            else:  # under DDP a rank may have none in a window (or none left): it joins with none
                size = sizes[self.window_in_epoch] if self.window_in_epoch < len(sizes) else 0
            window = list(itertools.islice(batches, size))
            if not window and not self._ddp:
                return "epoch"  # under DDP the ranks agree on that in the window's all-reduce
            left = None
            if sizes is not None:
                left = max(len(sizes) - self.window_in_epoch - 1, 0)
            elif self._ddp and batches_per_epoch is not None:
                left = math.ceil(max(batches_per_epoch - self.batch_in_epoch - len(window), 0) / steps_per_window)
            outcome = self._run_window(window, left, self._rng_keys(len(window)))
            if outcome == STOPPED:
                return "stopped"
            if outcome == EXHAUSTED:
                return "epoch"
            assert isinstance(outcome, StepOutcome)
            self.batch_in_epoch += len(window)
            self.window_in_epoch += 1
            self.samples_in_epoch += round(float(outcome.samples))
            window = []  # free this window's batches before the next window is read
            step_metrics = self._step(outcome, started)
            self._rng_at_boundary = self._dataset_at_boundary = None
            self._history.steps.append(step_metrics)
            self.callbacks.on_step(self, step_metrics)
            if self.checkpoint_every and self.global_step % self.checkpoint_every == 0:
                self._write_checkpoint()
            if eval_every and val_loader is not None and self.global_step % eval_every == 0:
                self._evaluate(val_loader, scheduled=True)
            if max_steps is not None and self.global_step >= max_steps:
                return "max_steps"
            if self._window_was_last:
                return "epoch"  # DDP: every rank's loader length says so; no all-reduce to learn it

    def _epoch_batches(self, loader: Iterable[Any], may_stop: bool) -> Iterator[Any]:
        """The epoch's batches from the current position, drawing what the uninterrupted run
        drew (docs/accumulation.md rule 9, ``accumcore.loader_state``)."""
        batch_sampler: Any = getattr(loader, "batch_sampler", None)
        sampler: Any = getattr(loader, "sampler", None)
        if self._pending_sampler is not None and hasattr(batch_sampler, "load_state_dict"):
            batch_sampler.load_state_dict(self._pending_sampler)
        self._pending_sampler = None
        if hasattr(batch_sampler, "set_epoch"):
            batch_sampler.set_epoch(self.epoch)
        elif hasattr(sampler, "set_epoch"):
            sampler.set_epoch(self.epoch)  # e.g. DistributedSampler
        self._place_in_windows(epoch_windows.windowed_sampler(loader))
        self._sampler_state = (
            batch_sampler.state_dict() if hasattr(batch_sampler, "state_dict") else None
        )
        pending_rng, pending_loader = self._pending_rng, self._pending_loader
        pending_dataset, self._pending_dataset = self._pending_dataset, None
        self._pending_rng = self._pending_loader = None
        skip = self.batch_in_epoch
        if skip and pending_dataset is not None and self._stateful_dataset is not None:
            # Inside an epoch, an IterableDataset that saved its position continues from it
            # (its next __iter__ does, by the protocol): nothing to skip. At an epoch's start
            # it starts a new pass, as it did in the uninterrupted run.
            self._stateful_dataset.load_state_dict(pending_dataset)
            skip = 0
        if self.batch_in_epoch == 0:
            # The epoch's start is a window boundary: (resumed) its RNG and generator states,
            # then record them before the iterator draws from them.
            if pending_rng is not None:
                restore_rng_state(pending_rng)
            if pending_loader is not None:
                loader_state.restore_generators(loader, pending_loader)
            self._epoch_start = None  # (freed first: the capture copies RNG states)
            self._epoch_start = loader_state.capture(loader)
            self._rng_at_boundary = capture_rng_state() if may_stop else None
            return self._iterate(loader, 0)
        # Resumed inside the epoch: replay the epoch's start (what the iterator draws when it
        # is created, and the permutation at its first batch) and the skipped batches, then
        # continue from the boundary's RNG states.
        if pending_loader is not None:
            loader_state.restore(loader, pending_loader)
            self._epoch_start = pending_loader
        batches = self._iterate(loader, skip)
        if pending_rng is not None:
            restore_rng_state(pending_rng)
        self._rng_at_boundary = None
        return batches

    def _place_in_windows(self, sampler: Any | None) -> None:
        """Tell a windowed sampler this epoch's accumulation steps; on a resume inside the
        epoch, start from the checkpoint's window, found by its global position (rule 14), so
        that a checkpoint of 2 ranks resumes on 1 or 3 with the next global window."""
        position, self._pending_position = self._pending_position, None
        if position is not None and int(position.get("batch_in_epoch", 0)) > 0:
            _check_world_carries_over(position, sampler is not None and epoch_windows.covers_world(sampler))
        if sampler is None:
            self._window_sizes = self._layout = None
            return
        layout = epoch_windows.configure(sampler, self.schedule.at(self.epoch), self._ddp)
        self._window_sizes = layout.sizes()
        global_order = epoch_windows.covers_world(sampler)
        self._layout = layout if global_order else None  # a per-rank shard's positions are not global
        if position is None or not (self.batch_in_epoch or position.get("window_in_epoch")):
            return
        self.window_in_epoch = epoch_windows.resume_window(layout, position, self.batch_in_epoch, global_order)
        self.batch_in_epoch = sum(self._window_sizes[: self.window_in_epoch])
        if global_order:
            self.samples_in_epoch = layout.samples_before(self.window_in_epoch)

    def _agree_seed(self) -> int:
        """``torch.initial_seed()``, rank 0's under DDP/FSDP (ranks seeded apart still key
        micro-batches alike): one object all-gather, at the first fit only."""
        seed = torch.initial_seed()
        ranks = distributed.gather_objects(seed) if self._ddp else None
        return int(ranks[0]) if ranks else seed

    def _rng_keys(self, count: int) -> list[int]:
        """The RNG keys of the window's ``count`` loaded batches: seed, epoch and each one's
        global micro-batch position (a windowed sampler's layout), the same on any number of
        ranks. Another loader numbers its batches per rank: its keys add the rank."""
        assert self.seed is not None
        base = epoch_key(self.seed, self.epoch)
        layout = self._layout
        if layout is not None:
            positions = layout.rank_batches(self.window_in_epoch)
            if len(positions) == count:
                return [micro_batch_seed(base, position) for position in positions]
        stream = distributed.rank()
        return [micro_batch_seed(base, self.batch_in_epoch + i, stream) for i in range(count)]

    def _micro_batch_positions(self, count: int) -> list[int]:
        """Global positions of this rank's micro-batches in the window (the layout's, each
        split in ``oom_split`` pieces after an out-of-memory back-off), to order them."""
        assert self._layout is not None
        positions = list(self._layout.rank_batches(self.window_in_epoch))
        if len(positions) != count:
            positions = list(range(count))
        split = self.oom_split
        return [position * split + part for position in positions for part in range(split)]

    def _iterate(self, loader: Iterable[Any], skip: int) -> Iterator[Any]:
        """A new iterator over the loader, past its first ``skip`` batches (skipped now)."""
        loader = host_loader(loader)  # not a CudaPrefetcher's: it would put the window on the device
        batch_sampler: Any = getattr(loader, "batch_sampler", None)
        source = target_source(loader, self._custom_counter, self.ignore_index, self.count_items)
        if source is not None:
            # W from the targets; each micro-batch's inputs loaded just before its forward.
            return source.batches(skip)
        if skip and hasattr(batch_sampler, "skip_batches"):
            batch_sampler.skip_batches(skip)
            return iter(loader)
        # Any other loader: consume the batches already trained on (exact if its order is
        # deterministic; use accumcore.data.make_loader to get that, and to skip for free).
        batches = iter(loader)
        for _ in range(skip):
            next(batches, None)
        return batches

    def _run_window(
        self, window: list[Any], windows_left: int | None = None, keys: list[int] | None = None
    ) -> StepOutcome | str:
        """Run the window and close it with one optimizer step; on out-of-memory (on any rank,
        under DDP) split every batch in two and start the window over."""
        try:
            return self._run_window_once(window, windows_left, keys)
        finally:
            if self._batchnorm is not None:
                self._batchnorm.close()  # its hooks live for one window: the model stays picklable

    def _run_window_once(
        self, window: list[Any], windows_left: int | None, keys: list[int] | None
    ) -> StepOutcome | str:
        self._window_was_last = False
        if window:
            self._largest_batch = max(self._largest_batch, *(_batch_samples(b) for b in window))
        if self._detect_shift and (window or self._ddp):
            self._set_shift_labels(window)
        # Under DDP/FSDP with a global order (rule 14): BatchNorm's running statistics
        # replayed in that order on every rank at the window's end (``batchnorm_sync``).
        batchnorm = self._batchnorm if self._layout is not None and self._batchnorm is not None else None
        if batchnorm is not None and not batchnorm.active():
            batchnorm = None
        self._runner.batchnorm = batchnorm
        while True:
            # What can fail on one rank alone, before the window's collectives: under DDP/FSDP
            # the error is agreed by every rank (issue 41 item 4), none left waiting in a
            # collective the failing rank never joins.
            error: Exception | None = None
            micro_batches: list[Any] = []
            try:
                micro_batches = make_micro_batches(window, self.oom_split, self.count_items, keys)
                if self._check_loss_scale:
                    self._check_loss_scale = not check_mean_over_items(
                        distributed.unwrap(self.model), self.loss_fn, micro_batches, self.count_items, self.device
                    )
            except Exception as exc:  # noqa: BLE001  (re-raised: alone, or on every rank)
                if not self._ddp:
                    raise
                error, micro_batches = exc, []
            # Before the first optimizer step, and while the result is pending before steps 1, 2,
            # 4, 8, ...: a bounded number of looks (under DDP each is one small all-reduce), not
            # one per window for a run whose windows can never tell (rule 16).
            step = self.global_step
            if self._verify_pending and (not self._verify_ran or step & (step - 1) == 0):
                if self._ddp:  # the check's collectives come first: agree on errors before them
                    distributed.agree_on_error(error, distributed.comm_device(self.model))
                self._verify_pending = verify(self, micro_batches, first=not self._verify_ran)
                self._verify_ran = True
            if batchnorm is not None:
                window_positions = self._layout.global_batches(self.window_in_epoch)  # type: ignore[union-attr]
                batchnorm.start_window(self._micro_batch_positions(len(window)),
                                       window_positions.start * self.oom_split, len(window_positions) * self.oom_split)
            try:
                # A rank that failed joins the window's all-reduce only to say so (its flag).
                result = self._runner.run(micro_batches, windows_left, failed=error is not None)
            except RuntimeError as exc:
                if not is_oom(exc):
                    raise
                result = None  # handled below, outside the except block, so the traceback is freed
            if result == FAILED:
                distributed.raise_agreed(error)
            if isinstance(result, str):  # STOPPED, or EXHAUSTED (DDP: no rank has data left)
                self.optimizer.zero_grad(set_to_none=True)
                if batchnorm is not None:
                    batchnorm.discard()
                return result
            outcome = None if result is None else self._stepper.step(result)
            if outcome is not None and outcome.failed:
                distributed.raise_agreed(result.error if result is not None else None)
            if outcome is not None and not outcome.oom:
                if batchnorm is not None:
                    batchnorm.finish_window(distributed.comm_device(self.model))  # a collective: every rank's outcome is the same
                self._window_was_last = result is not None and result.last_window
                return outcome
            self.optimizer.zero_grad(set_to_none=True)
            largest = max((mb.samples for mb in micro_batches), default=0)
            del micro_batches
            release_memory()
            if outcome is None:
                self.oom_split = next_split(self.oom_split, largest)
            elif outcome.oom_fatal:  # every rank raises: the one that could not split says why
                raise MicroBatchTooSmall(
                    "out of memory with a micro-batch of 1 sample on a DDP rank; the model does not "
                    "fit this device. Use precision='bf16' or 'fp16', a smaller model, or a device "
                    "with more memory"
                )
            else:
                self.oom_split *= 2  # every rank, as the stepper's all-reduce told them to
            data = {
                "micro_batch_size": math.ceil(self._largest_batch / self.oom_split),
                "accumulation_steps": self.schedule.at(self.epoch) * self.oom_split,
                "split": self.oom_split,
                "step": self.global_step,
            }
            self.emit(
                "oom_backoff",
                f"out of memory: micro-batch size now {data['micro_batch_size']}, "
                f"{data['accumulation_steps']} micro-batches per step (same effective batch)",
                data,
            )

    def _set_shift_labels(self, window: list[Any]) -> None:
        """``shift_labels`` from what the model's own loss scores (``accumcore.label_shift``).
        Under DDP/FSDP the ranks agree (one object all-gather, every rank, at the window that
        first has data on some rank): a rank's error is raised on every rank, and the first
        rank with data decides. A sharded model's forward is a collective: a rank without a
        micro-batch then runs it on 0 rows another rank shares."""
        error: Exception | None = None
        shift: bool | None = None
        has_data = bool(window)
        try:
            if window:
                batch = window[0]
                if isinstance(batch, PendingBatch):
                    rng = capture_rng_state()  # loading draws random transforms: the window loads it again
                    batch = batch.source.load(batch.indices)
                    restore_rng_state(rng)
                if self.sharded:
                    self._shift_shapes(batch)
                shift = label_shift.detect(distributed.unwrap(self.model), batch, self.device, self.ignore_index)
            elif self.sharded:
                self._shift_shapes(None)
        except Exception as exc:  # noqa: BLE001  (re-raised: alone, or on every rank)
            if not self._ddp:
                raise
            error = exc
        if self._ddp:
            gathered = distributed.gather_objects((error is not None, has_data, shift)) or []
            if any(failed for failed, _, _ in gathered):
                distributed.raise_agreed(error)
            with_data = [s for _, data, s in gathered if data]
            if not with_data:
                return  # no rank had a micro-batch: the next window decides
            shift = with_data[0]
        self._detect_shift = False
        if shift is None:
            return
        self.shift_labels = shift
        if isinstance(self.count_items, items.ItemCounter):
            self.count_items.shift = shift
        self.emit(
            "shift_labels_detected",
            f"the model's own loss scores its labels {'shifted (labels[..., 1:])' if shift else 'in place'}: "
            f"counting them so (pass Trainer(shift_labels=...) to set it)",
            {"shift_labels": shift},
        )

    def _shift_shapes(self, batch: Any | None) -> None:
        """FSDP: every rank runs the label-shift detection's forward (a collective) where the
        ranks with a batch do (their batches' labels apply); a rank without a batch runs it on
        the first row of the first rank's (shared by ``sharding.shared_empty_rows``; a row, not
        0 rows: some models cannot reshape an empty batch), its output unused."""
        offer = None
        if batch is not None:
            inputs, targets = items.unpack(batch)
            offer = (label_shift.applies(inputs, targets), items.one_row(inputs))
        shared = sharding.shared_empty_rows(offer)
        if batch is None and shared is not None and shared[0]:
            module = distributed.unwrap(self.model)
            modes = [(m, m.training) for m in module.modules()]
            rng = capture_rng_state()
            module.eval()
            try:
                with torch.no_grad():
                    items.forward(module, items.to_device(shared[1], self.device))
            finally:
                for m, training in modes:
                    m.training = training
                restore_rng_state(rng)

    def _step(self, outcome: StepOutcome, started: float) -> dict[str, float]:
        self.global_step += 1
        if outcome.empty:
            self.emit(
                "empty_window",
                "a window without items (every target ignore_index): no optimizer step, no "
                "scheduler step",
                {"step": self.global_step, "epoch": self.epoch},
            )
        elif outcome.nonfinite is not None:
            metric, value = outcome.nonfinite
            if self.on_nonfinite == "fail":
                raise self._nonfinite_error(f"step {self.global_step}: {metric} is {value}", metric, value)
            self._count_skip()
            self.emit(
                "nonfinite_step_skipped",
                f"step {self.global_step} skipped: {metric} is {value} (no optimizer or "
                "scheduler step)",
                {"step": self.global_step, "metric": metric, "value": value,
                 "consecutive": self.consecutive_skips},
            )
        elif outcome.skipped:
            self._count_skip()
            self.emit(
                "fp16_step_skipped",
                "fp16 step skipped: inf/nan gradients; the loss scale was lowered",
                {"step": self.global_step, "loss_scale": outcome.loss_scale or 0.0},
            )
        else:
            self.consecutive_skips = 0
        if self.consecutive_skips >= self.max_consecutive_skips:
            metric, value = outcome.nonfinite or ("grad_norm", outcome.grad_norm or math.inf)
            raise self._nonfinite_error(
                f"{self.consecutive_skips} consecutive steps skipped for non-finite values, up to "
                f"step {self.global_step} ({metric} is {value}): the run has diverged",
                metric, value,
            )
        elapsed = max(time.perf_counter() - started, 1e-9)
        step_metrics = {
            "step": float(self.global_step),
            "epoch": float(self.epoch),
            "loss": outcome.loss,
            "lr": outcome.lr,
            "samples_per_s": outcome.samples / elapsed,
            "items_per_s": outcome.items / elapsed,
            "step_time_s": elapsed,
        }
        if outcome.grad_norm is not None:
            step_metrics["grad_norm"] = outcome.grad_norm
        peak = metrics.take_peak_memory(self.device)  # this step's own peak
        if peak is not None:
            step_metrics["peak_memory_bytes"] = peak
            step_metrics.update(metrics.rank_peaks(peak, self.device))
        if outcome.loss_scale is not None:
            step_metrics["loss_scale"] = outcome.loss_scale
        self._last_metrics = step_metrics
        return step_metrics

    def _count_skip(self) -> None:
        self.skipped_steps += 1
        self.consecutive_skips += 1

    def _nonfinite_error(self, what: str, metric: str, value: float) -> NonFiniteError:
        """The error for a non-finite window, naming the last checkpoint with finite values."""
        step = self._last_checkpoint_step
        path = None
        if step is None:
            where = "no checkpoint was written before it"
        elif self.checkpoint_dir is not None:
            path = self.checkpoint_dir / (str(step) if self.sharded else f"{step}.pt")
            where = f"the last checkpoint with finite values is {path} (step {step})"
        else:
            where = f"the last finite state is the one this run resumed from (step {step})"
        # Skipping is advice only to a run that does not skip already.
        skip = " or pass on_nonfinite='skip' to skip such steps" if self.on_nonfinite == "fail" else ""
        return NonFiniteError(
            f"{what}; {where}. Lower the learning rate or clip gradients (grad_clip_norm){skip}",
            step=self.global_step, metric=metric, value=value, checkpoint=path,
        )

    # --------------------------------------------------------------- eval, events, files
    def _evaluate(self, val_loader: Iterable[Any], scheduled: bool) -> dict[str, float]:
        values = evaluate(
            self.model, val_loader, self.loss_fn, self.precision, self.device,
            self.count_items, self.ignore_index, bool(self.shift_labels),
        )
        if scheduled and is_plateau(self.scheduler):
            assert self.scheduler is not None
            self.scheduler.step(values["val_loss"])
        eval_metrics = {"step": float(self.global_step), "epoch": float(self.epoch), **values}
        peak = metrics.take_peak_memory(self.device)  # the evaluation's, apart from the steps'
        if peak is not None:
            eval_metrics["val_peak_memory_bytes"] = peak
        self._last_eval_step = self.global_step
        self._history.evals.append(eval_metrics)
        self.callbacks.on_eval(self, eval_metrics)
        return eval_metrics

    def emit(self, kind: str, message: str, data: dict[str, Any]) -> None:
        """Record a notable event in the fit's history (``FitHistory.events``) and pass it to
        every callback's ``on_event``; a callback may emit its own (``CompileWatch`` does)."""
        self._history.events.append({"kind": kind, "message": message, "data": data})
        self.callbacks.on_event(self, kind, message, data)

    def _warn_batchnorm(self) -> None:
        batchnorm = torch.nn.modules.batchnorm._BatchNorm
        if self.schedule.max_steps > 1 and any(
            isinstance(m, batchnorm) and m.training for m in self.model.modules()
        ):
            self.emit(
                "batchnorm_warning",
                "the model has BatchNorm layers: in train mode they normalise each micro-batch "
                "on its own statistics, so accumulation is not exactly equivalent to the big batch",
                {"accumulation_steps": self.schedule.max_steps},
            )

    def _warn_inexact_resume(self, loader: Iterable[Any]) -> None:
        reason = loader_state.inexact_reason(loader)
        self._resume_exact = reason is None
        if reason is not None:
            self.emit(
                "resume_inexact",
                f"a run resumed from this run's checkpoints will not be bitwise the same: {reason}",
                {"reason": reason},
            )

    def checkpoint(self) -> CheckpointInfo | None:
        """Write ``checkpoint_dir/<step>.pt`` (sharded: the directory ``<step>/``) of the last window boundary now, e.g. after a
        ``fit`` that ``should_stop`` ended (the window it stopped in is dropped: ``state_dict``
        is that boundary's). Nothing when no step was trained yet, or this step already has
        its checkpoint (written by ``fit`` or the one it resumed from); None on other ranks."""
        if self.checkpoint_dir is None:
            raise ValueError("checkpoint() needs checkpoint_dir: pass Trainer(checkpoint_dir=...)")
        if self.global_step == 0 or self._last_checkpoint_step == self.global_step:
            return None
        return self._write_checkpoint()

    def _write_checkpoint(self) -> CheckpointInfo | None:
        assert self.checkpoint_dir is not None
        self._last_checkpoint_step = self.global_step
        if self.sharded:
            return self._write_sharded_checkpoint()
        ranks = self._gather_rank_states()
        if not distributed.is_main_process():
            return None
        state = _with_rank_states(self.state_dict(), ranks)
        info = save_checkpoint(
            state, self.checkpoint_dir / f"{self.global_step}.pt",
            metrics=self._last_metrics, fsync=self.checkpoint_fsync,
        )
        self._history.checkpoints.append(info)
        self.callbacks.on_checkpoint(self, info)
        return info

    def _write_sharded_checkpoint(self) -> CheckpointInfo | None:
        """FSDP: ``checkpoint_dir/<step>/``, every rank writing its own shards (a collective);
        the trainer state (with every rank's RNG states) in the same directory."""
        assert self.checkpoint_dir is not None
        state = _with_rank_states(self.state_dict(include_model=False), self._gather_rank_states())
        state["progress"]["world_size"] = distributed.world_size()
        info = sharded_checkpoint.save(
            self.checkpoint_dir / str(self.global_step), self.model, self.optimizer, state,
            metrics=self._last_metrics, fsync=self.checkpoint_fsync,
        )
        files = sharded_checkpoint.rank_files(self.checkpoint_dir / str(self.global_step), distributed.rank())
        self.callbacks.on_shards(self, self.global_step, files)
        if info is None:
            return None
        self._history.checkpoints.append(info)
        self.callbacks.on_checkpoint(self, info)
        return info

    def _gather_rank_states(self) -> list[dict[str, Any]] | None:
        """Every rank's RNG states and sampler state (shards differ in size by up to one
        sample), for rank 0's checkpoint; one collective, on every rank; None in one process."""
        return distributed.gather_objects({
            "rng": serialise_rng_state(self._rng_at_boundary or capture_rng_state()),
            "sampler": self._sampler_state,
        })

    # -------------------------------------------------------------------------- state
    def state_dict(self, include_model: bool = True) -> dict[str, Any]:
        """Everything needed for exact resume, as of the last window boundary (a sharded
        model's and its optimizer's entries hold this rank's shards). ``include_model=False``:
        without the model and optimizer (None), which a sharded checkpoint stores apart."""
        return {
            "format": STATE_FORMAT,
            "model": model_state(distributed.unwrap(self.model), self.checkpoint_frozen) if include_model else None,
            "optimizer": self.optimizer.state_dict() if include_model else None,
            "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
            "scaler": self.precision.state_dict(),
            "rng": serialise_rng_state(self._rng_at_boundary or capture_rng_state()),
            "progress": {
                "epoch": self.epoch,
                "batch_in_epoch": self.batch_in_epoch,
                "window_in_epoch": self.window_in_epoch,
                "samples_in_epoch": self.samples_in_epoch,
                "step": self.global_step,
                "skipped_steps": self.skipped_steps,
                "consecutive_skips": self.consecutive_skips,
                "rng_seed": self.seed,  # the micro-batches' RNG keys (``seed``)
            },
            "sampler": self._sampler_state,
            "loader": {"epoch_start": self._epoch_start, "exact": self._resume_exact,
                       "dataset": self._dataset_state()},
            "accumulation": {"schedule": dict(self.schedule.schedule), "oom_split": self.oom_split},
        }

    def _dataset_state(self) -> dict[str, Any] | None:
        if self._dataset_at_boundary is not None:
            return self._dataset_at_boundary
        return self._stateful_dataset.state_dict() if self._stateful_dataset is not None else None

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a ``state_dict()``; the next ``fit`` continues exactly where it stopped."""
        check_state(state, self.schedule.schedule, has_scheduler=self.scheduler is not None)
        load_model_state(distributed.unwrap(self.model), state["model"])  # may lack frozen parameters
        self.optimizer.load_state_dict(state["optimizer"])
        if self.scheduler is not None:
            self.scheduler.load_state_dict(state["scheduler"])
        self.precision.load_state_dict(state["scaler"])
        self._stepper.reload_loss_scale()
        progress = state["progress"]
        self.epoch = int(progress["epoch"])
        self.batch_in_epoch = int(progress["batch_in_epoch"])
        # Absent before format 2 gained them: then found from batch_in_epoch (epoch_windows).
        self.window_in_epoch = int(progress.get("window_in_epoch", 0))
        self.samples_in_epoch = int(progress.get("samples_in_epoch", 0))
        self._pending_position = dict(progress)
        self.global_step = int(progress["step"])
        self.skipped_steps = int(progress["skipped_steps"])
        self.consecutive_skips = int(progress.get("consecutive_skips", 0))  # format 1 had none
        if progress.get("rng_seed") is not None:  # absent before keyed RNG: this trainer's own
            self.seed = int(progress["rng_seed"])
        self.oom_split = int(state["accumulation"]["oom_split"])
        self._rng_at_boundary = state["rng"]
        self._pending_rng = state["rng"]
        # Under DDP each rank resumes its own shard's sampler (rank 0's is ``sampler``).
        by_rank = (state.get("loader") or {}).get("sampler_ranks")
        sampler = by_rank[distributed.rank()] if by_rank and distributed.rank() < len(by_rank) else state["sampler"]
        self._pending_sampler = sampler
        self._sampler_state = sampler
        # Format 1 saved no loader states: it resumed make_loader's loaders exactly, as now.
        loader = state.get("loader")
        self._pending_loader = loader["epoch_start"] if loader else None
        self._epoch_start = self._pending_loader
        self._pending_dataset = self._dataset_at_boundary = loader.get("dataset") if loader else None
        self._last_checkpoint_step = self.global_step
        self._last_eval_step = None


def _shift_labels(loss_fn: Any, shift_labels: bool | None) -> bool | None:
    """Whether labels are scored shifted (causal LM) as given, False for a user's loss_fn
    (which says so with shift_labels=True), None for the model's own loss: told at fit start."""
    if shift_labels is not None or loss_fn is not None:
        return bool(shift_labels)
    return None


def _check_model_and_optimizer(model: Any, optimizer: Any, loss_fn: Any) -> None:
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__ if model is not None else None}")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(
            "optimizer must be a torch.optim.Optimizer built on the model's parameters, e.g. "
            f"torch.optim.AdamW(model.parameters(), lr=1e-3); got {type(optimizer).__name__ if optimizer is not None else None}"
        )
    own = {id(p) for p in model.parameters()}
    if isinstance(loss_fn, torch.nn.Module):
        own |= {id(p) for p in loss_fn.parameters()}  # a loss with learnable weights
    held = [p for group in optimizer.param_groups for p in group["params"]]
    if held and not any(id(p) in own for p in held):
        raise ValueError(
            "none of the optimizer's parameters belong to the model: it would train nothing. "
            "Build the optimizer on this model's parameters (after copying or wrapping it), "
            "e.g. torch.optim.SGD(model.parameters(), lr=0.1)"
        )


def _with_rank_states(state: dict[str, Any], ranks: list[dict[str, Any]] | None) -> dict[str, Any]:
    if ranks:
        state["rng"]["ranks"] = [own["rng"] for own in ranks]
        state["loader"]["sampler_ranks"] = [own["sampler"] for own in ranks]
    return state


def _check_settings(
    *, on_nonfinite: str, max_consecutive_skips: int, verify_memory_limit_bytes: int | None,
    grad_clip_norm: float | None, checkpoint_every: int | None, checkpoint_dir: str | Path | None,
) -> None:
    """The Trainer's numeric and policy arguments, each refused with what it takes."""
    if on_nonfinite not in NONFINITE_POLICIES:
        raise ValueError(f"on_nonfinite must be 'fail' or 'skip', got {on_nonfinite!r}")
    if max_consecutive_skips < 1:
        raise ValueError(f"max_consecutive_skips must be >= 1, got {max_consecutive_skips}")
    if verify_memory_limit_bytes is not None and verify_memory_limit_bytes < 1:
        raise ValueError(f"verify_memory_limit_bytes must be >= 1 or None, got {verify_memory_limit_bytes}")
    if grad_clip_norm is not None and not grad_clip_norm > 0:
        raise ValueError(f"grad_clip_norm must be > 0 or None, got {grad_clip_norm}")
    if checkpoint_every is not None and checkpoint_every < 1:
        raise ValueError(f"checkpoint_every must be >= 1 optimizer steps, got {checkpoint_every}")
    if checkpoint_every is not None and checkpoint_dir is None:
        raise ValueError("checkpoint_every needs checkpoint_dir: pass Trainer(checkpoint_dir=...)")


def _check_world_carries_over(progress: dict[str, Any], global_order: bool) -> None:
    """A checkpoint written inside an epoch by another number of ranks resumes only with a
    loader that orders every rank's data (make_loader(rank=, world=)): a rank's position in its
    own shard does not carry over."""
    saved_world = int(progress.get("world_size", distributed.world_size()))
    if saved_world == distributed.world_size() or global_order:
        return
    raise ValueError(
        f"this checkpoint was written by {saved_world} ranks inside an epoch (step "
        f"{progress['step']}); each rank's position in its own shard does not carry over to "
        f"{distributed.world_size()} ranks: resume it with {saved_world} ranks, from a checkpoint "
        "at an epoch's end, or train with make_loader(rank=..., world=...), whose global order "
        "does carry over"
    )


def _check_sharded(model: torch.nn.Module, precision: str, verify_window: bool | str) -> None:
    """Refuse what a sharded (FSDP) model cannot do exactly, naming what it can."""
    if precision == "fp16":
        raise ValueError(
            "precision='fp16' (GradScaler) is not supported on a sharded (FSDP) model; use "
            "precision='bf16', or shard with mixed_precision=True (bf16 parameters, fp32 reductions)"
        )


def _batch_samples(batch: Any) -> int:
    if isinstance(batch, PendingBatch):
        return len(batch.indices)
    return items.first_dim(items.unpack(batch)[0])
