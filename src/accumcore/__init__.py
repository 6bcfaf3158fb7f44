"""accumcore: a PyTorch trainer with exact gradient accumulation.

    from accumcore import Trainer, Callback, CheckpointInfo, save_checkpoint, load_checkpoint
    trainer = Trainer(model, optimizer, loss_fn=torch.nn.CrossEntropyLoss(), accumulation_steps=4)
    history = trainer.fit(train_loader, epochs=2, val_loader=val_loader)

The names are resolved lazily (module ``__getattr__``) so that ``import accumcore.catalog``,
which the API process uses, never imports torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from accumcore.callbacks import Callback, CheckpointInfo
    from accumcore.checkpoint import load_checkpoint, save_checkpoint
    from accumcore.trainer import FitHistory, NonFiniteError, Trainer

_EXPORTS = {
    "Trainer": "accumcore.trainer",
    "FitHistory": "accumcore.trainer",
    "NonFiniteError": "accumcore.trainer",
    "Callback": "accumcore.callbacks",
    "CheckpointInfo": "accumcore.callbacks",
    "save_checkpoint": "accumcore.checkpoint",
    "load_checkpoint": "accumcore.checkpoint",
}

__all__ = [
    "Callback", "CheckpointInfo", "FitHistory", "NonFiniteError", "Trainer", "load_checkpoint",
    "save_checkpoint",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'accumcore' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
