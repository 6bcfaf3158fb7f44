"""`strategy` and `fsdp`: defaults, normalisation, and a 422-ready error at the field path
(with the allowed values) for every option that cannot apply."""

from __future__ import annotations

from job_specs import MINIMAL_SPEC
from job_specs import only_spec_error as only_error

from services.spec import parse_spec, spec_hash
from services.spec.sharding import DEFAULT_FSDP_SYNC, FSDP_SYNC_MODES, STRATEGIES


def test_ddp_is_the_default_and_leaves_the_normalised_spec_and_its_hash_unchanged() -> None:
    spec = parse_spec({**MINIMAL_SPEC, "gpus": 2})
    assert (spec.strategy, spec.fsdp) == ("ddp", None)
    normalised = spec.normalised()
    assert "strategy" not in normalised and "fsdp" not in normalised
    explicit = parse_spec({**MINIMAL_SPEC, "gpus": 2, "strategy": "ddp"}).normalised()
    assert spec_hash(explicit) == spec_hash(normalised)


def test_fsdp_fills_its_defaults_and_round_trips() -> None:
    spec = parse_spec({**MINIMAL_SPEC, "gpus": 2, "strategy": "fsdp"})
    assert spec.fsdp is not None
    assert spec.fsdp.model_dump() == {
        "sync": DEFAULT_FSDP_SYNC, "reshard_after_forward": True, "cpu_offload": False, "mixed_precision": False,
    }
    normalised = spec.normalised()
    assert normalised["strategy"] == "fsdp" and normalised["fsdp"]["sync"] == DEFAULT_FSDP_SYNC
    assert parse_spec(normalised).normalised() == normalised
    other = {**MINIMAL_SPEC, "gpus": 2, "strategy": "fsdp", "fsdp": {"sync": "window"}}
    assert spec_hash(parse_spec(other).normalised()) != spec_hash(normalised)


def test_unknown_strategy_and_sync_list_the_allowed_values() -> None:
    error = only_error({**MINIMAL_SPEC, "gpus": 2, "strategy": "zero3"})
    assert error["loc"] == ("strategy",) and error["ctx"]["allowed"] == list(STRATEGIES)
    error = only_error({**MINIMAL_SPEC, "gpus": 2, "strategy": "fsdp", "fsdp": {"sync": "step"}})
    assert error["loc"] == ("fsdp", "sync") and error["ctx"]["allowed"] == list(FSDP_SYNC_MODES)
    error = only_error({**MINIMAL_SPEC, "gpus": 2, "strategy": "fsdp", "fsdp": {"offload": True}})
    assert error["loc"] == ("fsdp", "offload")


def test_fsdp_options_with_strategy_ddp_are_refused_at_fsdp() -> None:
    error = only_error({**MINIMAL_SPEC, "gpus": 2, "fsdp": {"sync": "window"}})
    assert error["loc"] == ("fsdp",)
    assert 'strategy "fsdp"' in error["msg"] and error["ctx"]["allowed"] == list(STRATEGIES)


def test_fsdp_on_one_gpu_needs_cpu_offload() -> None:
    error = only_error({**MINIMAL_SPEC, "gpus": 1, "strategy": "fsdp"})
    assert error["loc"] == ("fsdp",) and "cpu_offload" in error["msg"] and "gpus >= 2" in error["msg"]
    spec = parse_spec({**MINIMAL_SPEC, "gpus": 1, "strategy": "fsdp", "fsdp": {"cpu_offload": True}})
    assert spec.fsdp is not None and spec.fsdp.cpu_offload


def test_fsdp_spans_nodes_and_one_gpu_per_node_has_ranks_to_shard_over() -> None:
    assert parse_spec({**MINIMAL_SPEC, "gpus": 2, "nodes": 2, "strategy": "fsdp"}).nodes == 2
    spec = parse_spec({**MINIMAL_SPEC, "gpus": 1, "nodes": 2, "strategy": "fsdp"})
    assert spec.fsdp is not None and not spec.fsdp.cpu_offload  # 2 ranks: one per node
    error = only_error({**MINIMAL_SPEC, "gpus": 1, "nodes": 1, "strategy": "fsdp"})
    assert error["loc"] == ("fsdp",) and "no ranks to shard over" in error["msg"]


def test_fsdp_on_the_cpu_is_refused_even_with_offload() -> None:
    error = only_error({**MINIMAL_SPEC, "gpus": 0, "strategy": "fsdp", "fsdp": {"cpu_offload": True}})
    assert error["loc"] == ("fsdp",) and "gpus >= 1" in error["msg"]


def test_fsdp_mixed_precision_excludes_autocast_precisions() -> None:
    raw = {**MINIMAL_SPEC, "gpus": 2, "strategy": "fsdp", "precision": "bf16", "fsdp": {"mixed_precision": True}}
    error = only_error(raw)
    assert error["loc"] == ("fsdp",) and error["ctx"]["allowed"] == ["fp32"]
    spec = parse_spec({**raw, "precision": "fp32"})
    assert spec.fsdp is not None and spec.fsdp.mixed_precision


def test_fsdp_booleans_are_strict() -> None:
    error = only_error({**MINIMAL_SPEC, "gpus": 2, "strategy": "fsdp", "fsdp": {"cpu_offload": "yes"}})
    assert error["loc"] == ("fsdp", "cpu_offload")
