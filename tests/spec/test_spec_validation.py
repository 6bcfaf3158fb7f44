"""JobSpec validation: every bad-input case of issue 3 fails at its field path, with the fix.

The catalog (`services.catalog`) is the oracle for names and compatibility, so the tests
follow it rather than hard-coding its contents.
"""

from __future__ import annotations

import math
import sys
from typing import Any

import pytest
from job_specs import MINIMAL_SPEC
from pydantic import ValidationError

from services.catalog import DATASETS, MODELS, OWN_DATASETS, check_compatible, served_names
from services.catalog.families.builtin_datasets import DATASET_OPTION_RANGE
from services.catalog.families.builtin_models import MODEL_OPTION_RANGE
from services.spec import JobSpec, parse_spec
from services.spec.fields import MAX_STEPS
from services.spec.job import MAX_EPOCHS, MAX_GPUS, MAX_KEEP_CHECKPOINTS, MAX_RESTARTS
from services.spec.parts import MAX_LR

DROP = object()


def spec_with(**changes: Any) -> dict[str, Any]:
    spec = {**MINIMAL_SPEC}
    for key, value in changes.items():
        if value is DROP:
            spec.pop(key, None)
        else:
            spec[key] = value
    return spec


def errors_of(raw: Any) -> list[dict[str, Any]]:
    with pytest.raises(ValidationError) as caught:
        parse_spec(raw)
    return caught.value.errors(include_url=False)


def only_error(raw: Any) -> dict[str, Any]:
    errors = errors_of(raw)
    assert len(errors) == 1, errors
    return errors[0]


def allowed(error: dict[str, Any]) -> list[Any] | None:
    return (error.get("ctx") or {}).get("allowed")


def an_incompatible_pair() -> tuple[str, str]:
    return next((m, d) for m in MODELS for d in DATASETS if check_compatible(m, d) is not None)


def test_minimal_spec_from_the_issue_is_valid() -> None:
    spec = parse_spec(MINIMAL_SPEC)
    assert (spec.model.name, spec.dataset.name) == ("mlp", "digits")
    assert (spec.micro_batch_size, spec.accumulation_steps, spec.epochs) == (16, 4, 1)


def test_json_text_is_parsed_like_a_dict() -> None:
    import json

    assert parse_spec(json.dumps(MINIMAL_SPEC)) == parse_spec(MINIMAL_SPEC)


@pytest.mark.parametrize("field", ["model", "dataset"])
@pytest.mark.parametrize("shape", ["string", "object"])
def test_unknown_model_or_dataset_lists_the_catalog_names(field: str, shape: str) -> None:
    value: Any = "no_such_thing" if shape == "string" else {"name": "no_such_thing"}
    error = only_error(spec_with(**{field: value}))
    assert error["loc"] == (field,)
    names = served_names(field)  # the catalog's names, the namespaces, own data, plugins
    assert allowed(error) == names
    assert "no_such_thing" in error["msg"] and names[0] in error["msg"]


def test_incompatible_pair_fails_at_dataset_with_the_compatible_datasets() -> None:
    model, dataset = an_incompatible_pair()
    error = only_error(spec_with(model=model, dataset=dataset))
    assert error["loc"] == ("dataset",)
    assert error["type"] == "incompatible"
    # Own data (files, hf_disk) counts where some column mapping fits the model: features and a
    # label for a classifier (the README's CSV job on mlp).
    features = {"columns": {"features": ["x"], "label": "y"}}
    compatible = [d for d in sorted([*DATASETS, *OWN_DATASETS]) if check_compatible(model, d) is None
                  or d in ("files", "hf_disk") and check_compatible(
                      model, d, {**features, **({"data_files": "t.csv"} if d == "files" else {})}) is None]
    assert allowed(error) == compatible
    assert check_compatible(model, dataset) in error["msg"]


@pytest.mark.parametrize("micro", [0, -1, 1.5, "16", True, None, "big"])
def test_micro_batch_size_must_be_a_positive_int_or_auto(micro: Any) -> None:
    error = only_error(spec_with(micro_batch_size=micro))
    assert error["loc"] == ("micro_batch_size",)
    assert '"auto"' in error["msg"]


@pytest.mark.parametrize("steps", [0, -3, 65537, 2.0, "4", False])
def test_accumulation_steps_out_of_range(steps: Any) -> None:
    error = only_error(spec_with(accumulation_steps=steps))
    assert error["loc"] == ("accumulation_steps",)
    assert "65536" in error["msg"]


def test_accumulation_steps_bounds_are_inclusive() -> None:
    assert parse_spec(spec_with(accumulation_steps=1)).accumulation_steps == 1
    assert parse_spec(spec_with(accumulation_steps=65536)).accumulation_steps == 65536


@pytest.mark.parametrize(
    ("schedule", "says"),
    [
        ({"1": 2}, "epoch 0"),
        ({}, "epoch 0"),
        ({"0": 2, "x": 3}, "'x'"),
        ({"0": 2, "-1": 3}, "'-1'"),
        ({"0": 2, "3": 0}, "accumulation_steps['3']"),
        ({"0": 2, "3": 70000}, "65536"),
        ({"0": 2, 0: 3}, "twice"),
    ],
)
def test_bad_epoch_schedules(schedule: dict[Any, Any], says: str) -> None:
    error = only_error(spec_with(accumulation_steps=schedule))
    assert error["loc"] == ("accumulation_steps",)
    assert says in error["msg"]


def test_epoch_schedule_is_normalised_to_sorted_string_keys() -> None:
    spec = parse_spec(spec_with(accumulation_steps={4: 2, "0": 8, "10": 1}))
    assert spec.accumulation_steps == {"0": 8, "4": 2, "10": 1}
    assert list(spec.normalised()["accumulation_steps"]) == ["0", "4", "10"]


def test_both_accumulation_steps_and_effective_batch_is_an_error() -> None:
    error = only_error(spec_with(effective_batch_size=64))
    assert error["loc"] == ("effective_batch_size",)
    assert "not both" in error["msg"]


def test_neither_accumulation_steps_nor_effective_batch_is_an_error() -> None:
    error = only_error(spec_with(accumulation_steps=DROP))
    assert "accumulation_steps" in error["msg"] and "effective_batch_size" in error["msg"]


def test_effective_batch_not_divisible_by_micro_batch_lists_divisors() -> None:
    error = only_error(
        spec_with(accumulation_steps=DROP, effective_batch_size=100, micro_batch_size=16)
    )
    assert error["loc"] == ("effective_batch_size",)
    divisors = allowed(error)
    assert divisors == [d for d in range(1, 101) if 100 % d == 0]
    assert "16" in error["msg"] and "25" in error["msg"]


def test_effective_batch_with_several_gpus_divides_by_micro_batch_times_gpus() -> None:
    ok = parse_spec(spec_with(accumulation_steps=DROP, effective_batch_size=64, gpus=2))
    assert ok.effective_batch_size == 64
    error = only_error(spec_with(accumulation_steps=DROP, effective_batch_size=48, gpus=2))
    assert allowed(error) == [d for d in range(1, 25) if 24 % d == 0]  # 48 / 2 GPUs per rank


def test_auto_micro_batch_needs_effective_batch() -> None:
    error = only_error(spec_with(micro_batch_size="auto"))
    assert "effective_batch_size" in error["msg"]
    spec = parse_spec(
        spec_with(micro_batch_size="auto", accumulation_steps=DROP, effective_batch_size=96)
    )
    assert spec.micro_batch_size == "auto"


@pytest.mark.parametrize("epochs", [0, -1, 1.5, "2"])
def test_epochs_must_be_positive_int(epochs: Any) -> None:
    assert only_error(spec_with(epochs=epochs))["loc"] == ("epochs",)


@pytest.mark.parametrize("max_steps", [0, -5])
def test_max_steps_must_be_positive(max_steps: Any) -> None:
    error = errors_of(spec_with(epochs=DROP, max_steps=max_steps))
    assert [e["loc"] for e in error] == [("max_steps",)]


def test_exactly_one_of_epochs_and_max_steps() -> None:
    assert "not both" in only_error(spec_with(max_steps=10))["msg"]
    error = only_error(spec_with(epochs=DROP))
    assert "epochs" in error["msg"] and "max_steps" in error["msg"]
    assert parse_spec(spec_with(epochs=DROP, max_steps=10)).max_steps == 10


@pytest.mark.parametrize(
    "lr", [0, -0.1, math.nan, math.inf, -math.inf, float("1e999"), "0.1", None]
)
def test_lr_must_be_positive_and_finite(lr: Any) -> None:
    error = only_error(spec_with(optimizer={"name": "sgd", "lr": lr}))
    assert error["loc"] == ("optimizer", "lr")


def test_lr_overflowing_in_json_text_is_rejected() -> None:
    text = (
        '{"model": "mlp", "dataset": "digits", "micro_batch_size": 16, "accumulation_steps": 4,'
        ' "epochs": 1, "optimizer": {"name": "sgd", "lr": 1e999}}'
    )
    assert only_error(text)["loc"] == ("optimizer", "lr")


@pytest.mark.parametrize(
    ("changes", "loc", "choices"),
    [
        ({"optimizer": {"name": "adam", "lr": 0.1}}, ("optimizer", "name"), ["sgd", "adamw", "adamw8bit"]),
        ({"precision": "fp8"}, ("precision",), ["fp32", "bf16", "fp16"]),
        ({"on_nonfinite": "ignore"}, ("on_nonfinite",), ["fail", "skip"]),
        ({"verify_window": "yes"}, ("verify_window",), [True, False, "warn", "strict"]),
        ({"verify_window": 1}, ("verify_window",), [True, False, "warn", "strict"]),
        ({"scheduler": "linear"}, ("scheduler", "name"), ["none", "cosine", "step"]),
        ({"scheduler": {"name": "onecycle"}}, ("scheduler", "name"), ["none", "cosine", "step"]),
    ],
)
def test_closed_sets_report_allowed_values(
    changes: dict[str, Any], loc: tuple[str, ...], choices: list[str]
) -> None:
    error = only_error(spec_with(**changes))
    assert error["loc"] == loc
    assert allowed(error) == choices


@pytest.mark.parametrize(
    ("changes", "loc"),
    [
        ({"batch_size": 32}, ("batch_size",)),
        ({"optimizer": {"name": "sgd", "lr": 0.1, "nesterov": True}}, ("optimizer", "nesterov")),
        ({"scheduler": {"name": "cosine", "T_max": 10}}, ("scheduler", "T_max")),
        ({"dataset": {"name": "digits", "dowload": True}}, ("dataset",)),
        ({"model": {"name": "mlp", "widht": 3}}, ("model",)),
    ],
)
def test_unknown_fields_fail_with_their_path(changes: dict[str, Any], loc: tuple[str, ...]) -> None:
    error = only_error(spec_with(**changes))
    assert error["loc"] == loc


def test_unknown_option_lists_the_options_the_entry_accepts() -> None:
    name = next(n for n, info in MODELS.items() if info.options)
    dataset = next(d for d in DATASETS if check_compatible(name, d) is None)
    error = only_error(spec_with(model={"name": name, "no_such_option": 1}, dataset=dataset))
    assert allowed(error) == list(MODELS[name].options)
    option = MODELS[name].options[0]
    spec = parse_spec(spec_with(model={"name": name, option: 3}, dataset=dataset))
    assert spec.normalised()["model"] == {"name": name, option: 3}


@pytest.mark.parametrize(
    ("optimizer", "field"),
    [
        ({"name": "sgd", "lr": 0.1, "betas": [0.9, 0.99]}, "betas"),
        ({"name": "adamw", "lr": 0.1, "momentum": 0.9}, "momentum"),
    ],
)
def test_optimizer_fields_of_the_other_optimizer_are_refused(
    optimizer: dict[str, Any], field: str
) -> None:
    error = only_error(spec_with(optimizer=optimizer))
    assert error["loc"] == ("optimizer",) and field in error["msg"]


def test_step_scheduler_needs_step_size_and_others_refuse_it() -> None:
    assert "step_size" in only_error(spec_with(scheduler="step"))["msg"]
    assert "step_size" in only_error(spec_with(scheduler={"name": "cosine", "step_size": 5}))["msg"]
    spec = parse_spec(spec_with(scheduler={"name": "step", "step_size": 5}))
    assert spec.scheduler.gamma is not None and 0 < spec.scheduler.gamma <= 1


@pytest.mark.parametrize(
    ("changes", "loc"),
    [
        ({"queue": "Bad Queue"}, ("queue",)),
        ({"queue": "-x"}, ("queue",)),
        ({"name": "   "}, ("name",)),
        ({"name": "a\nb"}, ("name",)),
        ({"gpus": -1}, ("gpus",)),
        ({"keep_checkpoints": 0}, ("keep_checkpoints",)),
        ({"keep_checkpoints": 101}, ("keep_checkpoints",)),
        ({"checkpoint_every": 0}, ("checkpoint_every",)),
        ({"eval_every": 0}, ("eval_every",)),
        ({"max_restarts": -1}, ("max_restarts",)),
        ({"grad_clip_norm": 0}, ("grad_clip_norm",)),
        ({"seed": -1}, ("seed",)),
        ({"compile": "yes"}, ("compile",)),
    ],
)
def test_other_fields_are_range_checked(changes: dict[str, Any], loc: tuple[str, ...]) -> None:
    assert only_error(spec_with(**changes))["loc"] == loc


@pytest.mark.parametrize(
    ("changes", "loc", "bound"),
    [
        ({"optimizer": {"name": "sgd", "lr": 1e308}}, ("optimizer", "lr"), MAX_LR),
        ({"epochs": MAX_EPOCHS + 1}, ("epochs",), MAX_EPOCHS),
        ({"epochs": DROP, "max_steps": MAX_STEPS + 1}, ("max_steps",), MAX_STEPS),
        ({"keep_checkpoints": MAX_KEEP_CHECKPOINTS + 1}, ("keep_checkpoints",), MAX_KEEP_CHECKPOINTS),
        ({"max_restarts": MAX_RESTARTS + 1}, ("max_restarts",), MAX_RESTARTS),
        ({"gpus": MAX_GPUS + 1}, ("gpus",), MAX_GPUS),
        (
            {"scheduler": {"name": "cosine", "warmup_steps": MAX_STEPS + 1}},
            ("scheduler", "warmup_steps"),
            MAX_STEPS,
        ),
    ],
)
def test_every_size_has_a_maximum_named_in_the_error(
    changes: dict[str, Any], loc: tuple[str, ...], bound: float
) -> None:
    error = only_error(spec_with(**changes))
    assert error["loc"] == loc and error["ctx"] == {"le": bound}
    assert f"less than or equal to {bound:.15g}" in error["msg"]


@pytest.mark.parametrize(
    ("model", "dataset", "loc", "key"),
    [
        ({"name": "mlp", "hidden": 10**12, "depth": 1}, "digits", ("model",), "hidden"),
        ({"name": "mlp", "depth": 10**6}, "digits", ("model",), "depth"),
        ({"name": "small_cnn", "width": 10**5}, "digits", ("model",), "width"),
        ({"name": "tiny_transformer", "d_model": 10**6}, "text", ("model",), "d_model"),
        ("mlp", {"name": "fake", "size": 10**30}, ("dataset",), "size"),
        ("mlp", {"name": "fake", "image_size": 10**6}, ("dataset",), "image_size"),
        ("tiny_transformer", {"name": "text", "max_len": 10**9}, ("dataset",), "max_len"),
    ],
)
def test_model_and_dataset_options_have_maxima(
    model: Any, dataset: Any, loc: tuple[str, ...], key: str
) -> None:
    error = only_error(spec_with(model=model, dataset=dataset))
    low, high = {**MODEL_OPTION_RANGE, **DATASET_OPTION_RANGE}[key]
    assert error["loc"] == loc and f"option {key} must be an integer from {low} to {high}" in error["msg"]


def test_several_errors_are_reported_together() -> None:
    locs = {e["loc"] for e in errors_of(spec_with(micro_batch_size=0, epochs=0, extra=1))}
    assert locs == {("micro_batch_size",), ("epochs",), ("extra",)}


def test_spec_must_be_an_object() -> None:
    assert errors_of([1, 2])[0]["loc"] == ()


def test_importing_the_spec_does_not_import_torch() -> None:
    import subprocess

    code = "import sys, services.spec; services.spec.parse_spec; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_json_schema_is_generated_for_openapi() -> None:
    schema = JobSpec.model_json_schema()
    assert schema["additionalProperties"] is False
    assert {"model", "dataset", "micro_batch_size", "optimizer"} <= set(schema["required"])


def test_schedule_epochs_are_bounded_like_epochs() -> None:
    error = only_error(spec_with(accumulation_steps={"0": 2, "1" + "0" * 40: 3}))
    assert error["loc"] == ("accumulation_steps",)


@pytest.mark.parametrize("value", [0, -1, 2.5, "64", True, [64], {"x": 1}])
def test_option_values_must_be_positive_integers(value: Any) -> None:
    error = only_error(spec_with(model={"name": "mlp", "hidden": value}))
    assert error["loc"] == ("model",) and "hidden" in error["msg"]


def test_mlp_depth_may_be_zero() -> None:
    assert parse_spec(spec_with(model={"name": "mlp", "depth": 0})).model.options == {"depth": 0}


def test_openapi_schema_documents_the_name_shorthand() -> None:
    model = JobSpec.model_json_schema()["properties"]["model"]
    assert {"type": "string"} in model["anyOf"]


@pytest.mark.parametrize(
    ("dataset", "option"), [({"name": "fake", "num_classes": 1}, "num_classes"), ({"name": "text", "max_len": 1}, "max_len")]
)
def test_dataset_option_values_the_catalog_would_refuse_are_refused_at_submit(
    dataset: dict[str, Any], option: str
) -> None:
    # The same check the worker's build_dataset makes, so the job fails at submit, not later.
    model = "tiny_transformer" if dataset["name"] == "text" else "mlp"
    error = only_error(spec_with(model=model, dataset=dataset))
    assert error["loc"] == ("dataset",) and option in error["msg"]
