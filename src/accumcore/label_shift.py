"""Whether a model that returns its own loss scores its labels shifted, told from what it does.

A causal LM (GPT-2, Llama) scores ``labels[..., 1:]`` against ``logits[..., :-1, :]``; other
LM-head models score their labels in place (XLNet's ``XLNetLMHeadModel``). The class name does
not say which: counting the shifted labels of a model that scores them in place weighs each
micro-batch by the wrong item count (4.3e-3 off after 3 steps on a tiny XLNet, silently). So,
once at fit start, the trainer computes the first micro-batch's loss from the model's own
logits both ways, in float64, and keeps the one equal to the model's own loss. Neither, or
both (the two values indistinguishable): a ``ValueError`` asking for ``shift_labels``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch.nn import functional as F

from accumcore import items
from accumcore.rng import capture_rng_state, restore_rng_state

# The model's own loss is computed in float32 at best (Hugging Face casts logits to float32):
# a mean of cross-entropies rounds to ~1e-7 relative; 1e-5 leaves room for long sequences.
_MATCH = 1e-5


def applies(inputs: Any, targets: Any) -> bool:
    """True for keyword inputs with integer sequence labels: the only case where it matters."""
    return (isinstance(inputs, Mapping) and isinstance(targets, torch.Tensor) and targets.dim() >= 2
            and not (targets.is_floating_point() or targets.is_complex()))


def detect(model: torch.nn.Module, batch: Any, device: torch.device, ignore_index: int) -> bool | None:
    """True (shifted) or False (in place) for the model on ``batch``; None when the batch has
    no integer sequence labels (nothing to count differently). Eval mode, no gradients, every
    RNG and module mode put back: training does not see it."""
    inputs, targets = items.unpack(batch)
    if not applies(inputs, targets):
        return None
    modes = [(m, m.training) for m in model.modules()]
    rng = capture_rng_state()
    model.eval()
    try:
        with torch.no_grad(), torch.autocast(device.type, enabled=False):
            outputs = items.forward(model, items.to_device(inputs, device))
    finally:
        for module, training in modes:
            module.training = training
        restore_rng_state(rng)
    own = _field(outputs, "loss")
    logits = _field(outputs, "logits")
    if not isinstance(own, torch.Tensor):
        return False  # no loss of its own: the trainer's cross-entropy scores labels in place
    if not isinstance(logits, torch.Tensor) or logits.shape[:-1] != targets.shape:
        raise ValueError(
            "cannot tell whether the model shifts its labels before its loss: its output has no "
            f"logits of shape {list(targets.shape)} + [vocabulary]. Pass Trainer(shift_labels=True) "
            "if it scores labels[..., 1:] (a causal LM), Trainer(shift_labels=False) if it scores "
            "them in place"
        )
    labels = targets.to(logits.device)
    logits64 = logits.detach().double()
    in_place = _mean_ce(logits64, labels, ignore_index)
    shifted = _mean_ce(logits64[..., :-1, :], labels[..., 1:], ignore_index)
    value = float(own.detach().double())
    matches = [abs(value - float(c)) <= _MATCH * max(abs(value), 1e-12) for c in (in_place, shifted)]
    if matches == [False, True]:
        return True
    if matches == [True, False]:
        return False
    found = "both" if all(matches) else "neither"
    raise ValueError(
        f"cannot tell whether the model shifts its labels before its loss: its own loss "
        f"({value:.10g}) matches {found} of the token-mean cross-entropies of its logits against "
        f"the labels in place ({float(in_place):.10g}) and shifted, labels[..., 1:] "
        f"({float(shifted):.10g}). Pass Trainer(shift_labels=True) if it scores labels[..., 1:] "
        "(a causal LM), Trainer(shift_labels=False) if it scores them in place; or pass loss_fn"
    )


def _field(outputs: Any, name: str) -> Any:
    return outputs.get(name) if isinstance(outputs, Mapping) else getattr(outputs, name, None)


def _mean_ce(logits: torch.Tensor, labels: torch.Tensor, ignore_index: int) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=ignore_index)
