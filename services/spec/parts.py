"""The nested objects of a job spec: optimizer and LR scheduler."""

from __future__ import annotations

from typing import Annotated, Any, Literal, Self

from pydantic import BaseModel, BeforeValidator, Field, model_validator
from pydantic_core import PydanticCustomError

from services.spec.errors import one_of, spec_error
from services.spec.fields import (
    MAX_STEPS,
    SPEC_CONFIG,
    Float,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
)

OPTIMIZERS = ("sgd", "adamw", "adamw8bit")  # adamw8bit: bitsandbytes, CUDA workers only
SCHEDULERS = ("none", "cosine", "step")
DEFAULT_BETAS = (0.9, 0.999)
DEFAULT_STEP_GAMMA = 0.1

Beta = Annotated[Float, Field(ge=0, lt=1)]
# Far above any learning rate that trains (SGD on a normalised net diverges well before);
# a value above it is a typo (1e308) that would only turn the weights into inf.
MAX_LR = 10.0


def _only_for(field: str, owner: str, kind: str) -> PydanticCustomError:
    return spec_error(
        "field_not_applicable",
        f"{field} applies only to {kind} {owner!r}; remove {field} or choose {owner!r}",
    )


class OptimizerSpec(BaseModel):
    """`{"name": "sgd"|"adamw"|"adamw8bit", "lr", "momentum" (sgd), "weight_decay", "betas"
    (adamw, adamw8bit: AdamW with 8-bit states, bitsandbytes, on CUDA workers)}`."""

    model_config = SPEC_CONFIG

    name: Annotated[Literal["sgd", "adamw", "adamw8bit"], one_of("optimizer", OPTIMIZERS)]
    lr: Annotated[PositiveFloat, Field(le=MAX_LR)]
    momentum: Annotated[Float, Field(ge=0, lt=1)] | None = None
    weight_decay: NonNegativeFloat = 0.0
    betas: tuple[Beta, Beta] | None = None

    @model_validator(mode="after")
    def _fill_per_optimizer_defaults(self) -> Self:
        if self.name == "sgd":
            if self.betas is not None:
                raise _only_for("betas", "adamw", "optimizer")
            if self.momentum is None:
                self.momentum = 0.0
        else:
            if self.momentum is not None:
                raise _only_for("momentum", "sgd", "optimizer")  # adamw and adamw8bit alike
            if self.betas is None:
                self.betas = DEFAULT_BETAS
        return self

    def normalised(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude_none=True)


class SchedulerSpec(BaseModel):
    """LR schedule in optimizer steps: `none` (constant), `cosine` (to 0), `step` (x gamma every step_size).

    All three take `warmup_steps` (linear warm-up from 0).
    """

    model_config = SPEC_CONFIG

    name: Annotated[Literal["none", "cosine", "step"], one_of("scheduler", SCHEDULERS)]
    warmup_steps: Annotated[NonNegativeInt, Field(le=MAX_STEPS)] = 0
    step_size: Annotated[PositiveInt, Field(le=MAX_STEPS)] | None = None
    gamma: Annotated[PositiveFloat, Field(le=1)] | None = None

    @model_validator(mode="after")
    def _check_step_fields(self) -> Self:
        if self.name == "step":
            if self.step_size is None:
                raise spec_error(
                    "missing_step_size",
                    'scheduler "step" needs step_size (optimizer steps between LR drops), '
                    'e.g. {"name": "step", "step_size": 1000, "gamma": 0.1}',
                )
            if self.gamma is None:
                self.gamma = DEFAULT_STEP_GAMMA
        else:
            for field in ("step_size", "gamma"):
                if getattr(self, field) is not None:
                    raise _only_for(field, "step", "scheduler")
        return self

    def normalised(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude_none=True)


def _name_to_object(value: Any) -> Any:
    """`"cosine"` is shorthand for `{"name": "cosine"}`."""
    return {"name": value} if isinstance(value, str) else value


Optimizer = OptimizerSpec
Scheduler = Annotated[
    SchedulerSpec, BeforeValidator(_name_to_object, json_schema_input_type=str | SchedulerSpec)
]


class InitFrom(BaseModel):
    """Warm start: weights loaded before training. `{"job": ID, "step": K}` (one of your own
    jobs' checkpoints; the latest when `step` is left out) or `{"uri": "/path/model.pt"}` (a
    file under a data root: a checkpoint, or a plain state dict). `strict: false` loads what
    matches and reports missing and unexpected keys in an event."""

    model_config = SPEC_CONFIG

    job: Annotated[str, Field(min_length=1, max_length=64)] | None = None
    step: PositiveInt | None = None
    uri: Annotated[str, Field(min_length=1, max_length=4096)] | None = None
    strict: bool = True

    @model_validator(mode="after")
    def _job_or_uri(self) -> Self:
        if (self.job is None) == (self.uri is None):
            raise spec_error(
                "exactly_one",
                'init_from needs exactly one of job (e.g. {"job": "<id>", "step": 100}) or uri '
                '(e.g. {"uri": "/datasets/weights/model.pt"})',
            )
        if self.step is not None and self.job is None:
            raise _only_for("step", "job", "init_from")
        if self.uri is not None and not self.uri.startswith("/"):
            raise spec_error(
                "init_from_uri",
                f"init_from.uri must be an absolute path to a file under a data root; got {self.uri!r}",
            )
        return self

    def normalised(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude_none=True)
