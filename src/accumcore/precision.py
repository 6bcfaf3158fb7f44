"""Mixed precision: autocast per micro-batch, and the fp16 GradScaler at the window boundary.

Rule 6 of docs/accumulation.md: fp16 scales every micro-batch's backward, unscales once per
window (before clipping), and a step skipped for inf/nan does not advance the scheduler.
bf16 needs no scaler; gradients accumulate in the fp32 parameters either way.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable
from typing import Any

import torch
from torch.distributed.tensor import DTensor

PRECISIONS = ("fp32", "bf16", "fp16")
_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
# Loss dtypes whose ``loss * w`` backward seeds the loss with exactly ``tensor(w, dtype)``.
_EXACT_SEED = (torch.float32, torch.float64)


def total_norm(grads: list[torch.Tensor]) -> torch.Tensor:
    """L2 norm of all gradients together; of every rank's shards for a sharded (FSDP) model."""
    first = grads[0]
    if all(g.device == first.device and g.dtype == first.dtype for g in grads):
        # One fused kernel; get_total_norm's grouping by device and dtype costs more than the
        # norm itself on small models.
        norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads, 2.0)), 2.0)
    else:
        norm = torch.nn.utils.get_total_norm(grads, 2.0)
    # DTensor gradients (FSDP): the norm of the local shards is a partial result; full_tensor
    # reduces it across the ranks (a collective) into the global norm.
    return norm.full_tensor() if isinstance(norm, DTensor) else norm


# bfloat16 tensor cores arrived with Ampere; torch.cuda.is_bf16_supported() also counts the
# emulation older GPUs run many times slower, so the capability is what is checked.
NATIVE_BF16_CAPABILITY = (8, 0)


class UnsupportedPrecision(ValueError):
    """The device cannot run this precision natively."""


def check_native_bf16(device: torch.device) -> None:
    """Refuse bf16 on a CUDA device without native bfloat16 (compute capability < 8.0: V100,
    T4, ...), naming fp16, which those GPUs run natively. CPUs run bf16 autocast as is."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return
    capability = torch.cuda.get_device_capability(device)
    if tuple(capability) < NATIVE_BF16_CAPABILITY:
        name = torch.cuda.get_device_name(device)
        raise UnsupportedPrecision(
            f"precision='bf16' needs a GPU with native bfloat16 (compute capability >= 8.0, "
            f"e.g. A100, L4, H100); {name} is {capability[0]}.{capability[1]} and would emulate "
            "it slowly. Use precision='fp16' (loss scaling is automatic) or 'fp32', or send the "
            "job to a queue of newer GPUs"
        )


class Precision:
    def __init__(self, name: str, device: torch.device) -> None:
        if name not in PRECISIONS:
            raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}; got {name!r}")
        if name == "bf16":
            check_native_bf16(device)
        self.name = name
        self.device_type = device.type
        self.scaler: torch.amp.GradScaler | None = (
            torch.amp.GradScaler(device.type) if name == "fp16" else None
        )
        self._null = contextlib.nullcontext()
        self._seed: torch.Tensor | None = None  # the last backward seed (backward_weighted)
        self._seed_weight = 0.0

    def autocast(self) -> Any:
        if self.name == "fp32":
            return self._null  # nullcontext is reusable: no allocation per micro-batch
        return torch.autocast(self.device_type, dtype=_DTYPES[self.name])

    def backward(self, loss: torch.Tensor) -> None:
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
        else:
            loss.backward()

    def backward_weighted(self, loss: torch.Tensor, weight: float | torch.Tensor) -> None:
        """Backpropagate ``loss * weight``. Without a scaler, a Python-number weight and a
        float32/float64 loss, ``weight`` is passed as the loss's gradient instead: the same
        float reaches every parameter (the product's backward computes 1 x weight rounded to
        the loss's dtype), one multiply and torch's ``ones_like`` seed fewer a micro-batch."""
        if self.scaler is None and not isinstance(weight, torch.Tensor) and loss.dtype in _EXACT_SEED:
            loss.backward(self._seed_for(weight, loss))
        else:
            self.backward(loss * weight)

    def _seed_for(self, weight: float, loss: torch.Tensor) -> torch.Tensor:
        """``weight`` as a 0-d tensor of the loss's dtype and device: the last seed again when
        it matches (micro-batches of equal counts share one weight), not a new tensor (~2 us
        of dispatch on the CPU) a micro-batch. Autograd never writes into a seed it does not
        hold alone (it adds in place, or makes a gradient its .grad, only at a use count of 1),
        and this one is held here."""
        seed = self._seed
        if seed is None or self._seed_weight != weight or seed.dtype != loss.dtype or seed.device != loss.device:
            seed = self._seed = torch.full((), weight, dtype=loss.dtype, device=loss.device)
            self._seed_weight = weight
        return seed

    def unscale_and_clip(
        self,
        optimizer: torch.optim.Optimizer,
        params: Iterable[torch.Tensor],
        max_norm: float | None,
        want_norm: bool = True,
    ) -> torch.Tensor | None:
        """Unscale (fp16) once, then clip; returns the pre-clip total gradient norm (a tensor),
        or None when it is neither wanted nor needed for clipping (no pass over the grads)."""
        if self.scaler is not None:
            self.scaler.unscale_(optimizer)
        clip = max_norm is not None and not math.isinf(max_norm)
        if not (want_norm or clip):
            return None
        params = list(params)
        grads = [p.grad for p in params if p.grad is not None]
        if not grads:
            return torch.zeros(())
        # Norm first, clip only when asked: clip_grad_norm_ with an infinite bound would still
        # rescale every gradient (a wasted pass over all of them per step).
        total = total_norm(grads)
        if max_norm is not None and clip:
            torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)  # (skips grads of None)
        return total

    def optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        if self.scaler is not None:
            self.scaler.step(optimizer)
            self.scaler.update()
        else:
            optimizer.step()

    def abandon_step(self) -> None:
        """Close a window without an optimizer step. fp16: ``unscale_`` ran on this window, and
        the scaler refuses the next one until ``update()`` (which also lowers the scale when
        the window's gradients were inf/nan, as a skipped step would)."""
        if self.scaler is not None:
            self.scaler.update()

    def loss_scale(self) -> float | None:
        """Current fp16 loss scale (a device sync; called once per window at most)."""
        return None if self.scaler is None else float(self.scaler.get_scale())

    def state_dict(self) -> dict[str, Any] | None:
        return None if self.scaler is None else self.scaler.state_dict()

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        if self.scaler is None:
            if state:
                raise ValueError(
                    "the checkpoint holds an fp16 GradScaler state but this trainer is "
                    f"precision={self.name!r}; resume with precision='fp16'"
                )
            return
        if state:
            self.scaler.load_state_dict(state)
