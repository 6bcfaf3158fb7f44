"""Checkpoints without the frozen parameters: what LoRA (and any partly frozen model) trains.

``Trainer(checkpoint_frozen=False)`` writes the model's state without the parameters whose
``requires_grad`` is False (a LoRA job's base model: hundreds of MB for a few MB of adapters);
the run that resumes rebuilds the same frozen base (the same pretrained files, or the same
seed) and loads the rest. ``load_model_state`` takes either kind of state: a parameter may be
missing only if it is frozen here, so a state that lost trainable weights is still refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn


def frozen_names(module: nn.Module) -> set[str]:
    """State-dict keys of ``module``'s frozen parameters (the keys ``state_dict`` uses, so a
    ``checkpoint_wrapper``'s or DDP's own prefixes are already left out)."""
    held = module.state_dict(keep_vars=True)
    return {name for name, value in held.items() if isinstance(value, nn.Parameter) and not value.requires_grad}


def model_state(module: nn.Module, frozen: bool = True) -> dict[str, Any]:
    """``module.state_dict()``, without its frozen parameters unless ``frozen``."""
    state = module.state_dict()
    if frozen:
        return state
    leave_out = frozen_names(module)
    return {name: value for name, value in state.items() if name not in leave_out}


def load_model_state(module: nn.Module, state: Mapping[str, Any]) -> None:
    """``module.load_state_dict(state)`` where ``state`` may lack frozen parameters.

    Raises:
        RuntimeError: keys ``module`` does not have, or trainable parameters (or buffers) the
            state lacks, as ``load_state_dict`` would.
    """
    missing, unexpected = module.load_state_dict(state, strict=False)
    # Missing keys come in the modules' own names (a checkpoint_wrapper's prefix kept), which
    # named_parameters gives; the state's keys are state_dict's (prefix left out).
    frozen = frozen_names(module) | {name for name, p in module.named_parameters() if not p.requires_grad}
    absent = sorted(set(missing) - frozen) if missing else []
    if absent or unexpected:
        raise RuntimeError(
            f"the checkpoint's model state does not fit this model: missing {absent[:8]}, "
            f"unexpected {list(unexpected)[:8]} (a state written with checkpoint_frozen=False lacks "
            "only frozen parameters; build the model as the run that wrote it did)"
        )


def trainable(module: nn.Module) -> list[torch.nn.Parameter]:
    """The parameters an optimizer should step: those with ``requires_grad``."""
    return [parameter for parameter in module.parameters() if parameter.requires_grad]
