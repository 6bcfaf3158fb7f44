"""The memory levers beside accumulation: `activation_checkpointing` and `peft` (LoRA).

    "activation_checkpointing": true              # every transformer block (or top-level child)
    "activation_checkpointing": {"every": 2}      # every other block
    "peft": {"method": "lora", "r": 8, "alpha": 16, "dropout": 0.05,
             "target_modules": ["c_attn"], "merge": true}

Both keep the run exact (docs/accumulation.md, rule 16): checkpointing recomputes each block's
forward on the RNG state it had; LoRA trains adapters on a frozen `hf:` model, whose
checkpoints hold the adapters (the base is rebuilt from the model's own source), and
`merge: true` also stores the merged weights of the final model (`save_pretrained`; under
`strategy: "fsdp"` gathered from the shards first, at the job's end). The
8-bit optimizer (`optimizer: {"name": "adamw8bit"}`) is refused for CPU jobs at submit
(services/admission/checks.py). Torch-free.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, ValidatorFunctionWrapHandler, WrapValidator

from services.spec.errors import one_of, spec_error
from services.spec.fields import SPEC_CONFIG, Bool, NonNegativeFloat, PositiveInt

MAX_EVERY = 1024  # more blocks than any model has: every=k past the depth checkpoints nothing
PEFT_METHODS = ("lora",)
MAX_LORA_RANK = 4096
MAX_LORA_ALPHA = 1 << 16
MAX_TARGET_MODULES = 64
ALL_LINEAR = "all-linear"
_MODULE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.]{0,199}")
HF_MODELS = ("hf:<model_type>", "hf:<directory>")


class CheckpointingOptions(BaseModel):
    """`{"every": k}`: checkpoint every k-th block (1: all of them)."""

    model_config = SPEC_CONFIG

    every: Annotated[PositiveInt, Field(le=MAX_EVERY)] = 1


def _checkpointing(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
    """true -> {"every": 1}; false/null -> off (None); {"every": k} as given."""
    if value is None or value is False:
        return None
    if value is True:
        return CheckpointingOptions()
    if isinstance(value, CheckpointingOptions):
        return value
    every = value.get("every", 1) if isinstance(value, Mapping) and set(value) <= {"every"} else None
    if isinstance(every, int) and not isinstance(every, bool) and 1 <= every <= MAX_EVERY:
        return CheckpointingOptions(every=every)
    raise spec_error(
        "activation_checkpointing",
        f"activation_checkpointing must be true (every transformer block, or every top-level "
        f'child of other models), false, or {{"every": k}} with k an integer from 1 to {MAX_EVERY} '
        f"(every k-th block); got {value!r}",
        [True, False, {"every": 2}],
    )


ActivationCheckpointing = Annotated[
    CheckpointingOptions | None,
    WrapValidator(_checkpointing, json_schema_input_type=bool | CheckpointingOptions | None),
]


def _target_modules(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
    if value is None or value == ALL_LINEAR:
        return value
    if (isinstance(value, list) and 0 < len(value) <= MAX_TARGET_MODULES
            and all(isinstance(name, str) and _MODULE_NAME.fullmatch(name) for name in value)):
        return list(dict.fromkeys(value))
    raise spec_error(
        "peft_target_modules",
        f"peft.target_modules must be a list of 1 to {MAX_TARGET_MODULES} module names (letters, "
        f'digits, "_" and ".", as in ["c_attn"] or ["q_proj", "v_proj"]), "{ALL_LINEAR}", or left '
        f"out for peft's default for the model type; got {value!r}",
    )


class PeftOptions(BaseModel):
    """`{"method": "lora", "r", "alpha", "dropout", "target_modules", "merge"}`: LoRA adapters
    on a frozen `hf:` model (peft's `LoraConfig`: r, lora_alpha, lora_dropout, target_modules)."""

    model_config = SPEC_CONFIG

    method: Annotated[Literal["lora"], one_of("peft.method", PEFT_METHODS)] = "lora"
    r: Annotated[PositiveInt, Field(le=MAX_LORA_RANK, description="the adapters' rank")] = 8
    alpha: Annotated[PositiveInt, Field(le=MAX_LORA_ALPHA, description="scaling: alpha / r")] = 16
    dropout: Annotated[NonNegativeFloat, Field(lt=1, description="dropout on the adapters' input")] = 0.0
    target_modules: Annotated[list[str] | Literal["all-linear"] | None, WrapValidator(_target_modules)] = None
    merge: Annotated[Bool, Field(description="also store the final model with the adapters merged "
                                 "(save_pretrained) for download")] = False

    def normalised(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude_none=True)


def check_peft(options: PeftOptions | None, data: Mapping[str, Any]) -> PeftOptions | None:
    """`peft` applies to `hf:` models (a transformers model to fit adapters into)."""
    model = data.get("model")
    if options is None or model is None:
        return options  # off, or the model failed validation and has its own error
    if not model.name.startswith("hf:"):
        raise spec_error(
            "field_not_applicable",
            f"peft (LoRA adapters) applies to Hugging Face models only (hf:<model_type> or "
            f"hf:<directory of a saved model>); model is {model.name!r}: remove peft or choose an "
            "hf: model",
            HF_MODELS,
        )
    return options
