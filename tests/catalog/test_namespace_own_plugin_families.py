"""What a job may name, torch-free: namespaces, own data, plugins; the spec's field errors for
unknown names and bad options, and the `GET /v1/catalog` listings."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
from pydantic import ValidationError

from services.catalog import (
    check_compatible,
    configured_dataset,
    configured_model,
    datasets_listing,
    models_listing,
    require_model,
    served_names,
)
from services.catalog.option_types import from_declaration
from services.spec import parse_spec
from tests.job_specs import MINIMAL_SPEC
from tests.own_data_files import ensure_example_plugin


def errors_of(spec: dict[str, Any]) -> list[dict[str, Any]]:
    with pytest.raises(ValidationError) as info:
        parse_spec(spec)
    return info.value.errors()


def test_namespaces_resolve_without_torch() -> None:
    code = (
        "import sys, services.catalog as c; c.require_model('timm:resnet18'); c.require_model('hf:gpt2');"
        "c.configured_dataset('files', {'data_files': 'a.jsonl', 'tokenizer': 'bytes'}); c.models_listing();"
        "heavy = [m for m in ('torch', 'timm', 'transformers', 'datasets') if m in sys.modules];"
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_namespace_models_and_their_tasks() -> None:
    timm = require_model("timm:resnet18")
    assert (timm.source, timm.task) == ("timm", "classification") and "checkpoint_path" not in timm.options
    hf = require_model("hf:gpt2")
    assert (hf.source, hf.task) == ("hf", None)  # the task follows from the dataset
    saved = require_model("hf:/data/models/tiny")
    assert saved.source == "hf" and not saved.options


@pytest.mark.parametrize("name", ["torchhub:resnet18", "timm:", "timm:a b", "hf:GPT 2", "nosuchmodel"])
def test_unknown_models_list_what_is_served(name: str) -> None:
    with pytest.raises(ValueError) as info:
        require_model(name)
    assert "timm:<name>" in str(info.value) and "hf:<model_type>" in str(info.value)


def test_unknown_namespace_is_a_field_error_listing_the_served_names() -> None:
    [error] = errors_of({**MINIMAL_SPEC, "model": "torchhub:resnet18"})
    assert error["loc"] == ("model",)
    assert "namespace 'torchhub' is not one of: timm, hf" in error["msg"]
    assert error["ctx"]["allowed"] == served_names("model")


def test_model_options() -> None:
    assert configured_model("timm:resnet18", {"pretrained": False, "drop_rate": 0.1}).source == "timm"
    with pytest.raises(ValueError, match="pretrained must be true or false"):
        configured_model("timm:resnet18", {"pretrained": "yes"})
    with pytest.raises(ValueError, match="weights needs pretrained: true"):
        configured_model("timm:resnet18", {"weights": "/data/w.pt"})
    with pytest.raises(ValueError, match="absolute path"):
        configured_model("timm:resnet18", {"pretrained": True, "weights": "w.pt"})
    with pytest.raises(ValueError, match="does not accept option"):
        configured_model("hf:/data/models/tiny", {"n_layer": 2})


@pytest.mark.parametrize(("model", "key"), [
    ({"name": "timm:resnet18", "checkpoint_path": "/data/alice/5.pt"}, "checkpoint_path"),
    ({"name": "timm:resnet18", "pretrained_cfg_overlay": {"file": "/etc/passwd"}}, "pretrained_cfg_overlay"),
    ({"name": "hf:gpt2", "name_or_path": "/data/alice/model"}, "name_or_path"),
    ({"name": "hf:/data/bob/model", "cache_dir": "/data/alice"}, "cache_dir"),
    ({"name": "example_mlp", "path": "/etc/passwd"}, "path"),
])
def test_options_outside_a_familys_allow_list_are_refused_at_their_field(model: dict[str, Any], key: str) -> None:
    """Issue 25, item 1: free options reached timm, transformers and plugins, and named files."""
    ensure_example_plugin()
    [error] = errors_of({**MINIMAL_SPEC, "model": model})
    assert error["loc"] == ("model", key) and error["type"] == "unknown_option"
    assert f"does not accept option {key!r}" in error["msg"] and key not in error["ctx"]["allowed"]
    assert error["ctx"]["allowed"] == list(require_model(model["name"]).options)


def test_option_values_are_checked_against_their_type_and_bounds() -> None:
    [error] = errors_of({**MINIMAL_SPEC, "model": {"name": "timm:resnet18", "global_pool": "/etc/passwd"}})
    assert error["loc"] == ("model", "global_pool") and "must be one of 'avg'" in error["msg"]
    assert error["ctx"]["allowed"] == ["avg", "max", "avgmax", "catavgmax", "token"]
    [error] = errors_of({**MINIMAL_SPEC, "model": {"name": "hf:gpt2", "n_layer": 0}})
    assert error["loc"] == ("model", "n_layer") and "must be integer 1..1048576; got 0" in error["msg"]


def test_a_plugin_takes_the_options_it_declares_and_no_other() -> None:
    ensure_example_plugin()
    assert require_model("example_mlp").options == ("hidden",)
    assert configured_model("example_mlp", {"hidden": 8}).source == "plugin"
    with pytest.raises(ValueError, match="option size must be integer 2..1000000; got 1"):
        configured_dataset("example_blobs", {"size": 1})
    assert from_declaration("x", {"hidden": {"type": "integer", "minimum": 1}})["hidden"].accepts(3)
    for bad in ({"hidden": {"type": "data_file"}}, {"hidden": {"type": "string"}}, {"act": {"type": "choice"}}, []):
        with pytest.raises(ValueError, match="plugin x"):
            from_declaration("plugin x", bad)


def test_own_datasets_need_a_data_root_and_checked_options() -> None:
    spec = {**MINIMAL_SPEC, "model": "small_cnn", "dataset": {"name": "imagefolder"}}
    [error] = errors_of(spec)
    assert error["loc"] == ("dataset",) and "give data_root" in error["msg"]
    bad = {"name": "imagefolder", "data_root": "/data/x", "image_size": 0}
    [error] = errors_of({**spec, "dataset": bad})
    assert "image_size must be an integer from 1 to 4096; got 0" in error["msg"]
    files = {"name": "files", "data_root": "/data/x", "data_files": "../etc/passwd", "tokenizer": "bytes"}
    [error] = errors_of({**MINIMAL_SPEC, "model": "tiny_transformer", "dataset": files})
    assert "relative to data_root, without '..'" in error["msg"]


def test_files_task_follows_the_columns() -> None:
    text = configured_dataset("files", {"data_files": "a.jsonl", "tokenizer": "bytes"})
    assert text.task == "language_modeling"
    table = configured_dataset("files", {"data_files": "a.csv", "columns": {"features": ["x", "y"], "label": "t"}})
    assert table.task == "classification"
    with pytest.raises(ValueError, match="needs tokenizer"):
        configured_dataset("files", {"data_files": "a.jsonl"})
    with pytest.raises(ValueError, match="exactly one input role"):
        configured_dataset("files", {"data_files": "a.csv", "columns": {"label": "t"}})
    with pytest.raises(ValueError, match="unknown role"):
        configured_dataset("files", {"data_files": "a.csv", "columns": {"txt": "t"}})
    assert check_compatible("timm:resnet18", "files", {"data_files": "a.jsonl", "tokenizer": "bytes"})
    assert check_compatible("hf:gpt2", "files", {"data_files": "a.jsonl", "tokenizer": "bytes"}) is None
    assert check_compatible("small_cnn", "imagefolder") is None


def test_text_and_label_columns_are_sequence_classification_for_hf_models_only() -> None:
    options = {"data_files": "a.jsonl", "tokenizer": "bytes", "columns": {"text": "body", "label": "y"}, "max_len": 48}
    info = configured_dataset("files", options)
    assert (info.task, info.max_seq_len, info.text_classification) == ("classification", 48, True)
    assert not configured_dataset("files", {**options, "columns": {"text": "body"}}).text_classification
    with pytest.raises(ValueError, match="sequence classification: one row per document, so packing must be false"):
        configured_dataset("files", {**options, "packing": True})
    assert configured_dataset("files", {**options, "packing": False}).text_classification
    assert check_compatible("hf:bert", "files", options) is None
    assert check_compatible("hf:/data/models/tiny", "hf_disk", {k: v for k, v in options.items() if k != "data_files"}) is None
    spec = {**MINIMAL_SPEC, "dataset": {"name": "files", "data_root": "/data/reviews", **options}}
    for model in ("mlp", "tiny_transformer", "timm:resnet18"):
        [error] = errors_of({**spec, "model": model})
        assert error["loc"] == ("dataset",) and "is sequence classification, which model" in error["msg"]
        assert "use an hf: model such as hf:bert or hf:gpt2" in error["msg"]
    assert parse_spec({**spec, "model": {"name": "hf:gpt2", "n_layer": 2}}).dataset.options["columns"]["label"] == "y"


def test_own_data_has_no_size_at_submit() -> None:
    from services.spec import total_optimizer_steps

    spec = parse_spec({**MINIMAL_SPEC, "model": "small_cnn",
                       "dataset": {"name": "imagefolder", "data_root": "/data/pets"}})
    assert total_optimizer_steps(spec) is None  # the worker counts it when it reads the folder
    assert total_optimizer_steps(parse_spec({**spec.normalised(), "epochs": None, "max_steps": 7})) == 7


def test_listings_show_namespaces_and_own_data() -> None:
    models = {item["name"]: item for item in models_listing()}
    assert models["timm:"]["source"] == "timm" and models["hf:"]["source"] == "hf"
    assert "imagefolder" in models["timm:"]["compatible_datasets"]
    datasets = {item["name"]: item for item in datasets_listing()}
    assert datasets["imagefolder"]["needs_data_root"] and datasets["imagefolder"]["train_size"] is None
    assert datasets["files"]["source"] == "own" and "data_files" in datasets["files"]["options"]
    for name in ("files", "hf_disk"):  # what each column mapping trains, the label column's included
        mappings = datasets[name]["column_mappings"]
        assert mappings['{"text": "body", "label": "y"}'].startswith("sequence classification")
        assert mappings['{"text": "body"}'].startswith("language modelling")
    assert "column_mappings" not in datasets["imagefolder"]


def test_init_from_needs_exactly_one_source() -> None:
    [error] = errors_of({**MINIMAL_SPEC, "init_from": {"strict": False}})
    assert error["loc"] == ("init_from",) and "exactly one of job" in error["msg"]
    [error] = errors_of({**MINIMAL_SPEC, "init_from": {"uri": "weights.pt"}})
    assert "absolute path" in error["msg"]
    spec = parse_spec({**MINIMAL_SPEC, "init_from": {"job": "01abc", "strict": False}})
    assert spec.normalised()["init_from"] == {"job": "01abc", "strict": False}
    assert "init_from" not in parse_spec(MINIMAL_SPEC).normalised()  # old specs hash the same


def test_local_paths_are_every_file_a_job_reads() -> None:
    spec = parse_spec({**MINIMAL_SPEC, "model": {"name": "timm:resnet18", "pretrained": True, "weights": "/w/r.pt"},
                       "dataset": {"name": "imagefolder", "data_root": "/data/pets"},
                       "init_from": {"uri": "/w/start.pt"}})
    assert spec.local_paths() == [(("dataset", "data_root"), "/data/pets"), (("model", "weights"), "/w/r.pt"),
                                  (("init_from", "uri"), "/w/start.pt")]
