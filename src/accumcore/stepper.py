"""Closing a window: unscale, clip, read the window's values, then step or refuse to.

Rules 4-6 and 13-14 of docs/accumulation.md. The window's values (loss sum, W, samples, the
pre-clip gradient norm; under DDP the loss sum and the OOM flags all-reduced in the same call)
are read with one device sync, before the optimizer step, so that a window the trainer must
not step is never stepped:

- W = 0 (every target ignored): no optimizer step, no scheduler step;
- a non-finite loss or gradient norm (fp32/bf16): no step; the trainer fails or skips it;
- an out-of-memory error on any DDP rank: no step; every rank backs off together.

fp16: the GradScaler skips steps with inf/nan gradients itself (recognised by the lowered
loss scale), and a skipped step does not advance the scheduler.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import torch

from accumcore import distributed, metrics, sharding
from accumcore.oom import OptimizerStepOutOfMemory, optimizer_step_or_oom
from accumcore.precision import Precision
from accumcore.window import WindowResult


@dataclass(frozen=True)
class StepOutcome:
    loss: float  # the exact window mean: sum of item losses / W (NaN when W = 0)
    items: float
    samples: float
    grad_norm: float | None  # before clipping; None when not computed (Trainer(grad_norm=False))
    lr: float  # the learning rate this step used
    skipped: bool  # fp16 overflow: no optimizer or scheduler step
    loss_scale: float | None  # fp16 only
    empty: bool = False  # W = 0: nothing stepped
    nonfinite: tuple[str, float] | None = None  # (metric, value): nothing stepped
    oom: bool = False  # DDP: a rank ran out of memory in this window; nothing stepped
    oom_fatal: bool = False  # ... and could not split its micro-batches any further
    failed: bool = False  # DDP: a rank's micro-batch raised in this window; nothing stepped, every rank raises it


def first_nonfinite(loss_sum: float, grad_norm: float | None) -> tuple[str, float] | None:
    """The first of loss, grad_norm that is inf or NaN, as (name, value)."""
    if not math.isfinite(loss_sum):
        return "loss", loss_sum
    if grad_norm is not None and not math.isfinite(grad_norm):
        return "grad_norm", grad_norm
    return None


class WindowStepper:
    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler: Any | None,
        precision: Precision,
        grad_clip_norm: float | None,
        device: torch.device,
        track_grad_norm: bool = True,
    ) -> None:
        self.model = model
        self.optimizer = optimizer
        # ReduceLROnPlateau steps on the validation loss, after evaluations (the trainer's job).
        self.scheduler = None if is_plateau(scheduler) else scheduler
        self.precision = precision
        self.grad_clip_norm = grad_clip_norm
        self.track_grad_norm = track_grad_norm
        self.device = device
        self.loss_scale = precision.loss_scale()
        self.ddp = distributed.ddp_wrapped(model)  # as WindowRunner: fixed for the trainer's life
        self.collective = self.ddp or sharding.is_sharded(model)  # DDP or FSDP: loss sums all-reduced

    def params(self) -> list[torch.Tensor]:
        """The optimizer's parameters now: groups added after Trainer() are clipped too
        (a list of a few hundred references: microseconds per step)."""
        return [p for group in self.optimizer.param_groups for p in group["params"]]

    def step(self, result: WindowResult) -> StepOutcome:
        lr = float(self.optimizer.param_groups[0]["lr"])
        params = self.params()
        if result.manual_sync:
            # A DDP window some rank had no micro-batch for ran without DDP's hooks.
            distributed.all_reduce_grads(params, distributed.comm_device(self.model))
        grad_norm = self.precision.unscale_and_clip(
            self.optimizer, params, self.grad_clip_norm, want_norm=self.track_grad_norm
        )
        loss_sum: Any = result.loss_sum if result.loss_sum is not None else 0.0
        oom: Any = 0.0
        oom_fatal: Any = 0.0
        failed: Any = 0.0
        if self.collective:
            # The loss sum and the OOM and error flags of every rank, in one call: a rank that
            # ran out of memory (or whose micro-batch raised) has joined the window's
            # collectives, and now every rank learns it.
            reduced = distributed.all_reduce_sum(
                [loss_sum, float(result.oom), float(result.oom_fatal), float(result.error is not None)],
                distributed.comm_device(self.model),
            )
            loss_sum, oom, oom_fatal, failed = reduced[0], reduced[1], reduced[2], reduced[3]
        # The window's one device sync, before the step.
        loss_sum, items, samples, norm, oom, oom_fatal, failed = metrics.to_floats(
            [loss_sum, result.items, result.samples, grad_norm, oom, oom_fatal, failed]
        )
        outcome = StepOutcome(
            loss=loss_sum / items if items > 0 else math.nan,
            items=items, samples=samples, grad_norm=norm, lr=lr, skipped=False, loss_scale=self.loss_scale,
        )
        if failed > 0:
            self._abandon()
            return replace(outcome, failed=True)
        if oom > 0:
            self._abandon()
            return replace(outcome, oom=True, oom_fatal=oom_fatal > 0)
        if items == 0:
            self._abandon()
            return replace(outcome, empty=True)
        bad = first_nonfinite(loss_sum, norm)
        if bad is not None and self.precision.scaler is None:
            self._abandon()
            return replace(outcome, nonfinite=bad)
        if not optimizer_step_or_oom(self.optimizer, lambda: self.precision.optimizer_step(self.optimizer)):
            # Out of memory allocating the optimizer's state (undone): back off like a window.
            self._abandon()
            if self.collective:  # the other ranks have stepped: this rank cannot retry alone
                raise OptimizerStepOutOfMemory(
                    "out of memory allocating the optimizer's state on one DDP rank (the others "
                    "stepped): lower micro_batch_size, use precision='bf16', or sgd"
                )
            return replace(outcome, oom=True)
        if self.precision.scaler is None:
            if self.scheduler is not None:
                self.scheduler.step()
            self.optimizer.zero_grad(set_to_none=True)
            return outcome  # the common case: no second object (replace costs ~20 us a step)
        previous, self.loss_scale = self.loss_scale, self.precision.loss_scale()
        # GradScaler lowers the scale exactly when it skipped the step for inf/nan grads.
        skipped = previous is not None and self.loss_scale is not None and self.loss_scale < previous
        if not skipped and self.scheduler is not None:
            self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        # fp16: a non-finite loss whose gradients the scaler found finite (it stepped).
        nonfinite = bad if bad is not None and not skipped else None
        return replace(outcome, skipped=skipped, loss_scale=self.loss_scale, nonfinite=nonfinite)

    def _abandon(self) -> None:
        """Drop the window's gradients without stepping (fp16: close the scaler's step)."""
        self.precision.abandon_step()
        self.optimizer.zero_grad(set_to_none=True)

    def reload_loss_scale(self) -> None:
        """After loading a GradScaler state, compare the next step with the loaded scale."""
        self.loss_scale = self.precision.loss_scale()


def is_plateau(scheduler: Any) -> bool:
    return isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)
