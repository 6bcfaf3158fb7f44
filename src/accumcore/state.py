"""The layout of a trainer state (``Trainer.state_dict()``), and the checks made on loading.

Loading refuses what cannot resume exactly, with the fix: another file format, unknown or
missing keys, a different accumulation schedule, a scheduler on one side only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

STATE_FORMAT = "accumcore.trainer/2"
STATE_KEYS = frozenset(
    {"format", "model", "optimizer", "scheduler", "scaler", "rng", "progress", "sampler", "accumulation",
     "loader"}
)
# Earlier formats that still load, and their keys. 1: no "loader" (the loader's epoch-start
# RNG states) and no progress["consecutive_skips"]; it resumes make_loader's loaders exactly.
READABLE_FORMATS = {STATE_FORMAT: STATE_KEYS, "accumcore.trainer/1": STATE_KEYS - {"loader"}}


def check_state(state: Mapping[str, Any], schedule: dict[int, int], has_scheduler: bool) -> None:
    keys = set(state)
    expected = READABLE_FORMATS.get(state.get("format"))  # type: ignore[arg-type]
    if expected is None or keys != expected:
        expected = expected or STATE_KEYS
        raise ValueError(
            f"not an accumcore trainer state (format {state.get('format')!r}, this version reads "
            f"{', '.join(sorted(READABLE_FORMATS))}; unexpected keys {sorted(keys - expected)}, "
            f"missing {sorted(expected - keys)}); pass what Trainer.state_dict() or "
            "load_checkpoint(path) returned"
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
