"""Shared field types and model config for the job spec (strict, JSON-shaped)."""

from __future__ import annotations

from typing import Annotated

from pydantic import ConfigDict, Field, Strict

# Unknown keys fail with their path; numbers must be finite; values are not coerced from
# strings or booleans ("16" or true is a mistake in a spec, not a micro-batch size).
SPEC_CONFIG = ConfigDict(extra="forbid", allow_inf_nan=False)

# Run lengths in optimizer steps (max_steps, warm-up, step_size): 100 million is more than
# any job this service is for (a month at 40 steps/s); ACCUM_MAX_JOB_SECONDS bounds the time.
MAX_STEPS = 100_000_000

PositiveInt = Annotated[int, Strict(), Field(gt=0)]
NonNegativeInt = Annotated[int, Strict(), Field(ge=0)]
Float = Annotated[float, Strict()]  # strict floats still accept JSON integers
PositiveFloat = Annotated[float, Strict(), Field(gt=0)]
NonNegativeFloat = Annotated[float, Strict(), Field(ge=0)]
Bool = Annotated[bool, Strict()]
