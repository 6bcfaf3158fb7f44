"""`activation_checkpointing`, `peft` and `optimizer: adamw8bit` at submit: defaults, the
normalised form (left out when off, so older specs hash the same), and a 422-ready error at the
field path with the allowed values (adamw8bit's refusal for CPU jobs:
tests/admission/test_admission_pipeline.py)."""

from __future__ import annotations

from typing import Any

import pytest
from job_specs import MINIMAL_SPEC
from job_specs import only_spec_error as only_error

from services.spec import parse_spec, spec_hash

GPT2 = {"name": "hf:gpt2", "n_layer": 2, "n_embd": 16, "n_head": 2}
HF = {**MINIMAL_SPEC, "model": GPT2, "dataset": "text"}


def test_levers_off_leave_the_normalised_spec_and_its_hash_unchanged() -> None:
    plain = parse_spec(MINIMAL_SPEC).normalised()
    off = parse_spec({**MINIMAL_SPEC, "activation_checkpointing": False}).normalised()
    assert "activation_checkpointing" not in off and "peft" not in off
    assert spec_hash(off) == spec_hash(plain)


def test_checkpointing_true_is_every_block_and_round_trips() -> None:
    spec = parse_spec({**MINIMAL_SPEC, "activation_checkpointing": True})
    assert spec.normalised()["activation_checkpointing"] == {"every": 1}
    again = parse_spec({**MINIMAL_SPEC, "activation_checkpointing": {"every": 2}})
    assert parse_spec(again.normalised()) == again


@pytest.mark.parametrize("value", [0, "yes", {"every": 0}, {"every": True}, {"each": 2}, [1]])
def test_a_bad_checkpointing_value_names_the_field_and_the_allowed_ones(value: Any) -> None:
    error = only_error({**MINIMAL_SPEC, "activation_checkpointing": value})
    assert error["loc"] == ("activation_checkpointing",)
    assert '{"every": k}' in error["msg"] and error["ctx"]["allowed"] == [True, False, {"every": 2}]


def test_peft_fills_lora_defaults_for_an_hf_model() -> None:
    spec = parse_spec({**HF, "peft": {"method": "lora"}})
    assert spec.normalised()["peft"] == {"method": "lora", "r": 8, "alpha": 16, "dropout": 0.0, "merge": False}


def test_peft_on_a_model_that_is_not_hf_is_refused_with_the_fix() -> None:
    error = only_error({**MINIMAL_SPEC, "peft": {"method": "lora"}})
    assert error["loc"] == ("peft",) and "hf:" in error["msg"] and "'mlp'" in error["msg"]
    assert error["ctx"]["allowed"] == ["hf:<model_type>", "hf:<directory>"]


@pytest.mark.parametrize(("peft", "loc"), [
    ({"method": "ia3"}, ("peft", "method")),
    ({"r": 0}, ("peft", "r")),
    ({"dropout": 1.0}, ("peft", "dropout")),
    ({"target_modules": ["c attn"]}, ("peft", "target_modules")),
    ({"target_modules": []}, ("peft", "target_modules")),
])
def test_bad_peft_options_are_refused_at_their_path(peft: dict[str, Any], loc: tuple[str, ...]) -> None:
    assert only_error({**HF, "peft": peft})["loc"] == loc
