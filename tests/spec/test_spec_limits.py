"""The service's limits on a valid spec (services.spec.limits): restarts and GPUs against the
settings, the run's optimizer steps, and the memory floor against the largest device."""

from __future__ import annotations

from typing import Any

from job_specs import MINIMAL_SPEC

from services.catalog import configured_dataset
from services.catalog.sizes import estimate_memory
from services.settings import Settings
from services.spec import parse_spec, steps_per_epoch
from services.spec.fields import MAX_STEPS
from services.spec.limits import SpecLimits, limit_errors, step_memory, with_defaults

DEFAULTS = SpecLimits()


def errors(limits: SpecLimits = DEFAULTS, **changes: Any) -> dict[str, str]:
    spec = parse_spec({**MINIMAL_SPEC, **changes})
    return {".".join(e["loc"]): e["msg"] for e in limit_errors(spec, limits)}


def test_a_small_spec_is_within_every_limit() -> None:
    assert errors() == {}


def test_restarts_and_gpus_are_bounded_by_the_settings() -> None:
    limits = SpecLimits.from_settings(Settings(max_restarts=4, max_gpus=2))
    assert (limits.max_restarts, limits.max_gpus) == (4, 2)
    assert errors(limits, max_restarts=4, gpus=2) == {}
    found = errors(limits, max_restarts=5, gpus=4)
    assert found.keys() == {"body.max_restarts", "body.gpus"}
    assert "at most 4" in found["body.max_restarts"] and "ACCUM_MAX_RESTARTS" in found["body.max_restarts"]
    assert "at most 2" in found["body.gpus"] and "ACCUM_MAX_GPUS" in found["body.gpus"]
    assert Settings().max_restarts == 10


def test_checkpoint_every_is_refused_below_the_stores_floor() -> None:
    assert Settings().min_checkpoint_every == 1  # every spec valid by default
    limits = SpecLimits.from_settings(Settings(min_checkpoint_every=50))
    assert errors(limits, checkpoint_every=50) == {}
    found = errors(limits, checkpoint_every=49)
    assert found.keys() == {"body.checkpoint_every"}
    assert "at least 50" in found["body.checkpoint_every"]
    assert "ACCUM_MIN_CHECKPOINT_EVERY" in found["body.checkpoint_every"]
    # A spec that does not give it is not refused: it gets the floor instead of 100.
    assert errors(SpecLimits(min_checkpoint_every=500)) == {}
    assert with_defaults(parse_spec(MINIMAL_SPEC), SpecLimits(min_checkpoint_every=500)).checkpoint_every == 500
    assert with_defaults(parse_spec(MINIMAL_SPEC), limits).checkpoint_every == 100


def test_the_run_length_in_optimizer_steps_is_bounded() -> None:
    # digits at m=1, N=1: 1,437 steps an epoch, so 10,000 epochs are 14 million steps: fine;
    # a fake dataset of 10 million samples for 100 epochs is a billion steps: refused.
    spec = {"micro_batch_size": 1, "accumulation_steps": 1}
    assert errors(epochs=10_000, **spec) == {}
    big = {"name": "fake", "size": 10_000_000}
    found = errors(epochs=100, model="mlp", dataset=big, **spec)
    per_epoch = steps_per_epoch(parse_spec({**MINIMAL_SPEC, "dataset": big, **spec}), 0)
    assert list(found) == ["body.epochs"]
    assert f"{100 * per_epoch:,} steps; at most {MAX_STEPS:,}" in found["body.epochs"]


def test_a_model_too_large_for_the_device_is_refused_at_the_model_with_the_numbers() -> None:
    model = {"name": "mlp", "hidden": 65536, "depth": 64}
    found = errors(model=model)
    estimate = step_memory(parse_spec({**MINIMAL_SPEC, "model": model}))
    assert list(found) == ["body.model"]
    message = found["body.model"]
    assert f"{estimate.parameters:,} parameters" in message
    assert "80.00 GiB of the largest device" in message and "smaller model" in message


def test_a_micro_batch_too_large_for_the_device_is_refused_at_the_micro_batch() -> None:
    spec = {"model": "resnet50", "dataset": {"name": "fake", "image_size": 1024, "size": 4096},
            "micro_batch_size": 4096, "accumulation_steps": 1}
    found = errors(**spec)
    assert list(found) == ["body.micro_batch_size"] and "lower micro_batch_size" in found[
        "body.micro_batch_size"
    ]
    # The same step fits a device that holds its estimate, and "auto" counts one sample.
    need = step_memory(parse_spec({**MINIMAL_SPEC, **spec})).total_bytes
    assert errors(SpecLimits(max_device_memory_bytes=need), **spec) == {}
    auto = {**spec, "micro_batch_size": "auto", "accumulation_steps": None,
            "effective_batch_size": 4096}
    one = estimate_memory("resnet50", {}, configured_dataset("fake", {"image_size": 1024}),
                          micro_batch=1)
    assert step_memory(parse_spec({**MINIMAL_SPEC, **auto})).total_bytes == one.total_bytes


def test_fsdp_counts_each_devices_share_of_the_weights() -> None:
    """Sharded over k GPUs a device holds 1/k of the weights, gradients and optimizer state;
    offloaded, none of them: a model refused as replicas fits then."""
    model = {"name": "mlp", "hidden": 16384, "depth": 4}
    replicas = step_memory(parse_spec({**MINIMAL_SPEC, "model": model, "gpus": 4}))
    limits = SpecLimits(max_device_memory_bytes=replicas.weights_bytes // 2, max_gpus=8)
    found = errors(limits, model=model, gpus=4)
    assert list(found) == ["body.model"] and 'strategy "fsdp"' in found["body.model"]
    sharded = {"model": model, "gpus": 4, "strategy": "fsdp"}
    estimate = step_memory(parse_spec({**MINIMAL_SPEC, **sharded}))
    assert estimate.weights_bytes == replicas.weights_bytes // 4 and estimate.shards == 4
    assert errors(limits, **sharded) == {}
    offloaded = {"model": model, "gpus": 1, "strategy": "fsdp", "fsdp": {"cpu_offload": True}}
    assert step_memory(parse_spec({**MINIMAL_SPEC, **offloaded})).weights_bytes == 0
    assert errors(SpecLimits(max_device_memory_bytes=replicas.weights_bytes // 8), **offloaded) == {}
    too_small = SpecLimits(max_device_memory_bytes=replicas.weights_bytes // 8, max_gpus=8)
    assert "per device (sharded over 4)" in errors(too_small, **sharded)["body.model"]


def test_fsdp_over_nodes_shards_over_every_rank_of_every_node() -> None:
    """gpus: 2 on nodes: 2 is a world of 4, as gpus: 4 is: the same share per device, so a cap
    between the 4-way and the 2-way share refuses neither (the nodes were ignored before: the
    multi-node job was sized as 2-way and refused)."""
    model = {"name": "mlp", "hidden": 16384, "depth": 4}
    one_node = step_memory(parse_spec({**MINIMAL_SPEC, "model": model, "gpus": 4, "strategy": "fsdp"}))
    two_nodes = step_memory(parse_spec({**MINIMAL_SPEC, "model": model, "gpus": 2, "nodes": 2,
                                        "strategy": "fsdp"}))
    assert two_nodes.shards == one_node.shards == 4
    assert two_nodes.total_bytes == one_node.total_bytes
    two_way = step_memory(parse_spec({**MINIMAL_SPEC, "model": model, "gpus": 2, "strategy": "fsdp"}))
    cap = SpecLimits(max_device_memory_bytes=(one_node.total_bytes + two_way.total_bytes) // 2)
    assert errors(cap, model=model, gpus=2, nodes=2, strategy="fsdp") == {}
    assert list(errors(cap, model=model, gpus=2, strategy="fsdp")) == ["body.model"]
