"""Normalisation fills every default, round-trips through parse_spec, and hashes stably."""

from __future__ import annotations

import json

from job_specs import MINIMAL_SPEC

from services.spec import JobSpec, parse_spec, spec_hash
from services.spec.job import stored


def test_defaults_are_filled_and_names_become_objects() -> None:
    normalised = parse_spec(MINIMAL_SPEC).normalised()
    # init_from, trackers and register_model are left out when absent or empty, strategy (ddp)
    # and fsdp when the default, and nodes and min_nodes for one node, so specs stored before
    # them hash the same. tags and notes are the job row's (editable), never the spec's.
    left_out = {"init_from", "trackers", "register_model", "strategy", "fsdp", "nodes", "min_nodes",
                "tags", "notes", "activation_checkpointing", "peft"}
    assert set(normalised) == set(JobSpec.model_fields) - left_out
    assert normalised["name"] == "mlp-digits"
    assert normalised["model"] == {"name": "mlp"}
    assert normalised["dataset"] == {"name": "digits", "data_root": None, "download": False}
    assert normalised["optimizer"] == {
        "name": "sgd",
        "lr": 0.1,
        "momentum": 0.0,
        "weight_decay": 0.0,
    }
    assert normalised["scheduler"] == {"name": "none", "warmup_steps": 0}
    assert normalised["precision"] == "fp32"
    assert normalised["fast_path"] is True and normalised["compile"] is False
    assert normalised["data_on_device"] is False
    assert normalised["on_nonfinite"] == "fail"
    assert normalised["queue"] == "default"
    assert normalised["effective_batch_size"] is None and normalised["max_steps"] is None
    json.dumps(normalised, allow_nan=False)  # JSON-ready


def test_multi_node_specs_keep_nodes_and_round_trip() -> None:
    spec = parse_spec({**MINIMAL_SPEC, "nodes": 3})
    normalised = spec.normalised()
    assert (normalised["nodes"], normalised["min_nodes"]) == (3, 3)  # min_nodes defaults to nodes
    assert parse_spec(normalised) == spec
    assert spec_hash(normalised) != spec_hash(parse_spec(MINIMAL_SPEC).normalised())
    assert parse_spec({**MINIMAL_SPEC, "nodes": 1, "min_nodes": 1}).normalised() == parse_spec(
        MINIMAL_SPEC).normalised()


def test_trackers_are_kept_once_each_and_round_trip() -> None:
    spec = parse_spec({**MINIMAL_SPEC, "trackers": ["wandb", "mlflow", "wandb"],
                       "register_model": "digits-mlp"})
    normalised = spec.normalised()
    assert normalised["trackers"] == ["wandb", "mlflow"]
    assert normalised["register_model"] == "digits-mlp"
    assert parse_spec(normalised) == spec
    assert spec_hash(parse_spec(MINIMAL_SPEC).normalised()) != spec_hash(normalised)


def test_adamw_and_step_scheduler_defaults() -> None:
    normalised = parse_spec(
        {
            **MINIMAL_SPEC,
            "optimizer": {"name": "adamw", "lr": 1e-3},
            "scheduler": {"name": "step", "step_size": 10},
        }
    ).normalised()
    assert normalised["optimizer"] == {
        "name": "adamw",
        "lr": 1e-3,
        "weight_decay": 0.0,
        "betas": [0.9, 0.999],
    }
    assert set(normalised["scheduler"]) == {"name", "warmup_steps", "step_size", "gamma"}


def test_normalised_spec_parses_back_to_the_same_spec() -> None:
    for raw in (
        MINIMAL_SPEC,
        {
            **MINIMAL_SPEC,
            "accumulation_steps": None,
            "effective_batch_size": 64,
            "micro_batch_size": "auto",
        },
        {**MINIMAL_SPEC, "accumulation_steps": {"0": 8, "2": 2}, "scheduler": "cosine", "name": "run 1"},
        {
            **MINIMAL_SPEC,
            "epochs": None,
            "max_steps": 7,
            "dataset": {"name": "digits", "data_root": "/data"},
        },
    ):
        spec = parse_spec(raw)
        again = parse_spec(spec.normalised())
        assert again == spec
        assert again.normalised() == spec.normalised()


def test_hash_is_stable_under_key_order_and_shorthand() -> None:
    reordered = dict(reversed(list(MINIMAL_SPEC.items())))
    spelled_out = {
        **MINIMAL_SPEC,
        "model": {"name": "mlp"},
        "precision": "fp32",
        "optimizer": {"lr": 0.1, "name": "sgd", "momentum": 0},
    }
    hashes = {spec_hash(parse_spec(raw).normalised()) for raw in (MINIMAL_SPEC, reordered, spelled_out)}
    assert len(hashes) == 1
    assert len(hashes.pop()) == 64


def test_hash_changes_with_any_setting() -> None:
    base = spec_hash(parse_spec(MINIMAL_SPEC).normalised())
    for change in (
        {"seed": 1},
        {"epochs": 2},
        {"optimizer": {"name": "sgd", "lr": 0.2}},
        {"name": "other"},
    ):
        assert spec_hash(parse_spec({**MINIMAL_SPEC, **change}).normalised()) != base


def test_hash_ignores_key_order_of_the_normalised_dict_itself() -> None:
    normalised = parse_spec(MINIMAL_SPEC).normalised()
    assert spec_hash(dict(reversed(list(normalised.items())))) == spec_hash(normalised)


def test_readers_of_a_stored_spec_get_the_defaults_normalised_left_out() -> None:
    """``normalised`` drops later fields at their defaults (nodes, strategy, trackers, ...):
    ``stored`` gives each back as the spec has it, the one source of those defaults."""
    spec = parse_spec(MINIMAL_SPEC)
    data, full = spec.normalised(), spec.model_dump(mode="json")
    left_out = set(JobSpec.model_fields) - set(data)
    assert {"nodes", "min_nodes", "strategy", "trackers"} <= left_out
    assert {name: stored(data, name) for name in left_out} == {name: full[name] for name in left_out}
    two = parse_spec({**MINIMAL_SPEC, "nodes": 2, "micro_batch_size": 4, "accumulation_steps": 1})
    assert (stored(two.normalised(), "nodes"), stored(two.normalised(), "min_nodes")) == (2, 2)
