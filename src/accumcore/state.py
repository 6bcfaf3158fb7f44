"""The layout of a trainer state (``Trainer.state_dict()``), and the checks made on loading.

Loading refuses what cannot resume exactly, with the fix: another file format, unknown or
missing keys, a different accumulation schedule, a scheduler on one side only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

STATE_FORMAT = "accumcore.trainer/1"
STATE_KEYS = frozenset(
    {"format", "model", "optimizer", "scheduler", "scaler", "rng", "progress", "sampler", "accumulation"}
)


def check_state(state: Mapping[str, Any], schedule: dict[int, int], has_scheduler: bool) -> None:
    keys = set(state)
    if state.get("format") != STATE_FORMAT or keys != STATE_KEYS:
        raise ValueError(
            f"not an accumcore trainer state (format {state.get('format')!r}; unexpected "
            f"keys {sorted(keys - STATE_KEYS)}, missing {sorted(STATE_KEYS - keys)}); "
            "pass what Trainer.state_dict() or load_checkpoint(path) returned"
        )
    saved = {int(k): int(v) for k, v in state["accumulation"]["schedule"].items()}
    if saved != schedule:
        raise ValueError(
            f"the checkpoint used accumulation_steps={saved}, this trainer has {schedule}; "
            "resume with the same accumulation_steps"
        )
    if (state["scheduler"] is None) == has_scheduler:
        raise ValueError(
            "the checkpoint and this trainer disagree on having an LR scheduler; "
            "build the trainer with the same scheduler setting as the run that saved it"
        )
