"""Closing a window: unscale, clip, one optimizer step, one scheduler step, zero the grads.

Rules 4-6 of ACCUMULATION.md. The window's metrics are read here with one device sync; an
fp16 step skipped by the GradScaler (inf/nan gradients) is recognised by the lowered loss
scale and does not advance the scheduler.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from accumcore import distributed, metrics
from accumcore.precision import Precision
from accumcore.window import WindowResult


@dataclass(frozen=True)
class StepOutcome:
    loss: float  # the exact window mean: sum of item losses / W
    items: float
    samples: float
    grad_norm: float | None  # before clipping; None when not computed (Trainer(grad_norm=False))
    lr: float  # the learning rate this step used
    skipped: bool  # fp16 overflow: no optimizer or scheduler step
    loss_scale: float | None  # fp16 only


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
        self.scheduler = scheduler
        self.precision = precision
        self.grad_clip_norm = grad_clip_norm
        self.track_grad_norm = track_grad_norm
        self.device = device
        self.params = [p for group in optimizer.param_groups for p in group["params"]]
        self.loss_scale = precision.loss_scale()
        self.ddp = distributed.ddp_wrapped(model)  # as WindowRunner: fixed for the trainer's life

    def step(self, result: WindowResult) -> StepOutcome:
        lr = float(self.optimizer.param_groups[0]["lr"])
        grad_norm = self.precision.unscale_and_clip(
            self.optimizer, self.params, self.grad_clip_norm, want_norm=self.track_grad_norm
        )
        self.precision.optimizer_step(self.optimizer)
        loss_sum = result.loss_sum if result.loss_sum is not None else 0.0
        if self.ddp:
            loss_sum = distributed.all_reduce_sum([loss_sum], distributed.comm_device(self.model))[0]
        read = {"loss_sum": loss_sum, "items": result.items, "samples": result.samples}
        if grad_norm is not None:
            read["grad_norm"] = grad_norm
        values = metrics.to_floats(read)  # the window's one device sync
        skipped = False
        if self.precision.scaler is not None:
            previous, self.loss_scale = self.loss_scale, self.precision.loss_scale()
            # GradScaler lowers the scale exactly when it skipped the step for inf/nan grads.
            skipped = previous is not None and self.loss_scale is not None and self.loss_scale < previous
        if not skipped and self.scheduler is not None:
            self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return StepOutcome(
            loss=values["loss_sum"] / max(values["items"], 1.0),
            items=values["items"],
            samples=values["samples"],
            grad_norm=values.get("grad_norm"),
            lr=lr,
            skipped=skipped,
            loss_scale=self.loss_scale,
        )

    def reload_loss_scale(self) -> None:
        """After loading a GradScaler state, compare the next step with the loaded scale."""
        self.loss_scale = self.precision.loss_scale()
