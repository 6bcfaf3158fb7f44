"""The service's own limits on a valid spec: what this deployment allows and can hold.

    from services.spec.limits import SpecLimits, limit_refusals
    refusals = limit_refusals(spec, SpecLimits.from_settings(settings))   # each at its field

`JobSpec` holds the bounds that are the same everywhere (its field maxima); these depend on
settings (`ACCUM_MAX_RESTARTS`, `ACCUM_MAX_GPUS`, `ACCUM_MAX_DEVICE_MEMORY_BYTES`,
`ACCUM_MIN_CHECKPOINT_EVERY`: what the artifact store can take) or need the
catalog's sizes: the run's optimizer steps, and the floor of one device's memory for a step
(`services.catalog.sizes`), so a job that cannot fit is refused with the numbers instead of
taking a worker down. `limit_errors` gives them as pydantic-shaped dicts with `loc` under
`body`; the admission pipeline (services/admission) runs them at submit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from services.catalog import DatasetInfo, configured_dataset, require_model
from services.catalog.sizes import MemoryEstimate, estimate_memory, gib
from services.spec.batching import (
    batch_over_data,
    micro_batch_size,
    steps_per_epoch,
    total_optimizer_steps,
    world_size,
)
from services.spec.fields import MAX_STEPS
from services.spec.job import JobSpec
from services.spec.refusal import Refusal

DEFAULT_MAX_DEVICE_MEMORY_BYTES = 80 * 2**30  # an 80 GB H100/A100


@dataclass(frozen=True)
class SpecLimits:
    """This deployment's maxima and minima (the settings of the same names)."""

    max_restarts: int = 10
    max_gpus: int = 8
    max_device_memory_bytes: int = DEFAULT_MAX_DEVICE_MEMORY_BYTES
    max_job_seconds: int = 7 * 86400
    min_checkpoint_every: int = 1
    trackers: tuple[str, ...] = ()  # ACCUM_TRACKERS: the ones this deployment's workers log to

    @classmethod
    def from_settings(cls, settings: Any) -> SpecLimits:
        return cls(
            max_restarts=settings.max_restarts,
            max_gpus=settings.max_gpus,
            max_device_memory_bytes=settings.max_device_memory_bytes,
            max_job_seconds=settings.max_job_seconds,
            min_checkpoint_every=settings.min_checkpoint_every,
            trackers=tuple(settings.trackers),
        )


def with_defaults(spec: JobSpec, limits: SpecLimits) -> JobSpec:
    """`spec` with the service's defaults filled in (a `timeout` of ACCUM_MAX_JOB_SECONDS, so
    the stored spec says how long the job may run; a `checkpoint_every` it did not give raised
    to ACCUM_MIN_CHECKPOINT_EVERY)."""
    update: dict[str, Any] = {}
    if spec.timeout is None:
        update["timeout"] = limits.max_job_seconds
    if "checkpoint_every" not in spec.model_fields_set and spec.checkpoint_every < limits.min_checkpoint_every:
        update["checkpoint_every"] = limits.min_checkpoint_every
    return spec.model_copy(update=update) if update else spec


def _refusal(field: str | tuple[str | int, ...], message: str, value: Any, kind: str = "limit",
             allowed: tuple[str, ...] | None = None) -> Refusal:
    return Refusal(field if isinstance(field, tuple) else (field,), message, value, allowed, kind)


def tracker_refusals(spec: JobSpec, offered: tuple[str, ...]) -> list[Refusal]:
    """A refusal at each tracker the spec names that this deployment does not log to."""
    return [
        _refusal(("trackers", index),
               f"tracker {name!r} is not offered on this service (ACCUM_TRACKERS); "
               + (f"choose from: {', '.join(offered)}" if offered else
                  "it offers none: leave trackers out, or ask an admin to set ACCUM_TRACKERS"),
               name, "not_allowed", offered)
        for index, name in enumerate(spec.trackers) if name not in offered
    ]


def step_memory(spec: JobSpec, data: DatasetInfo | None = None) -> MemoryEstimate:
    """The floor of one device's memory for a step of `spec` ("auto": one sample); `data` is
    its configured dataset, when the caller has it already."""
    data = data or configured_dataset(spec.dataset.name, spec.dataset.options)
    return estimate_memory(
        spec.model.name,
        spec.model.options,
        data,
        micro_batch=micro_batch_size(spec) or 1,
        precision=spec.precision,
        optimizer=spec.optimizer.name,
        momentum=spec.optimizer.momentum or 0.0,
        shards=weight_shards(spec),
    )


def weight_shards(spec: JobSpec) -> int:
    """Over how many devices the weights, gradients and optimizer states are spread: every
    rank of every node under strategy fsdp, none of them (0) with its CPU offload, else 1
    (DDP replicas)."""
    if spec.strategy != "fsdp" or spec.fsdp is None:
        return 1
    return 0 if spec.fsdp.cpu_offload else world_size(spec)


def sized_by_catalog(spec: JobSpec, data: DatasetInfo) -> bool:
    """Whether the torch-free size formulas cover this job: a built-in or torchvision model on
    a dataset whose shape is known at submit (own data is sized when the worker reads it;
    `timm:`, `hf:` and plugin models have no formula here)."""
    model = require_model(spec.model.name)
    return model.source in ("builtin", "torchvision") and data.train_size is not None and (
        model.source != "torchvision" or (data.image_size is not None and data.num_classes is not None)
    )


def limit_errors(spec: JobSpec, limits: SpecLimits) -> list[dict[str, Any]]:
    """Every way `spec` exceeds `limits` or the run-length bound, as 422 field errors."""
    return [refusal.as_error() for refusal in limit_refusals(spec, limits)]


def limit_refusals(spec: JobSpec, limits: SpecLimits) -> list[Refusal]:
    """Every way `spec` exceeds `limits` or the run-length bound (the admission check
    `service_limits` answers them)."""
    refusals = tracker_refusals(spec, limits.trackers)
    if spec.max_restarts > limits.max_restarts:
        refusals.append(
            _refusal(
                "max_restarts",
                f"max_restarts must be at most {limits.max_restarts} on this service "
                f"(ACCUM_MAX_RESTARTS); got {spec.max_restarts}",
                spec.max_restarts,
            )
        )
    if spec.gpus > limits.max_gpus:
        refusals.append(
            _refusal(
                "gpus",
                f"gpus must be at most {limits.max_gpus} on this service (ACCUM_MAX_GPUS); "
                f"got {spec.gpus}",
                spec.gpus,
            )
        )
    # Only a value the spec gives: a default below the floor is raised to it (with_defaults).
    if "checkpoint_every" in spec.model_fields_set and spec.checkpoint_every < limits.min_checkpoint_every:
        refusals.append(
            _refusal(
                "checkpoint_every",
                f"checkpoint_every must be at least {limits.min_checkpoint_every} optimizer steps "
                f"on this service (ACCUM_MIN_CHECKPOINT_EVERY: what its artifact store can take); "
                f"got {spec.checkpoint_every}",
                spec.checkpoint_every,
            )
        )
    if spec.timeout is not None and int(spec.timeout) > limits.max_job_seconds:
        refusals.append(
            _refusal(
                "timeout",
                f"timeout must be at most {limits.max_job_seconds} s on this service "
                f"(ACCUM_MAX_JOB_SECONDS); got {spec.timeout} s",
                spec.timeout,
            )
        )
    data = configured_dataset(spec.dataset.name, spec.dataset.options)  # once: ~45 us
    steps = total_optimizer_steps(spec, data.train_size) if spec.epochs is not None else None
    if steps is not None and steps > MAX_STEPS:
        refusals.append(
            _refusal(
                "epochs",
                f"{spec.epochs} epochs of {steps_per_epoch(spec, 0, data.train_size):,} "
                "optimizer steps are "
                f"{steps:,} steps; at most {MAX_STEPS:,} are allowed: lower epochs or raise "
                "the batch",
                spec.epochs,
            )
        )
    if data.train_size is not None and (over := batch_over_data(spec, data.train_size)):
        field, message = over  # own data: the worker says it at the job's start (an event)
        refusals.append(_refusal(field, message, getattr(spec, field), "batch_over_data"))
    if not sized_by_catalog(spec, data):
        return refusals  # own models and data: the worker checks them at the job's start
    estimate = step_memory(spec, data)
    if estimate.total_bytes > limits.max_device_memory_bytes:
        # The model alone too large: its options are the fix; else the micro-batch is.
        weights_alone = estimate.weights_bytes > limits.max_device_memory_bytes
        field = "model" if weights_alone else "micro_batch_size"
        fix = (
            'choose a smaller model or smaller model options, or shard it: strategy "fsdp" over '
            "more gpus, or with fsdp.cpu_offload"
            if weights_alone
            else 'lower micro_batch_size (or use "auto"), or precision bf16'
        )
        refusals.append(
            _refusal(
                field,
                f"this job cannot fit on one device: {estimate.describe()}, above the "
                f"{gib(limits.max_device_memory_bytes)} of the largest device "
                f"(ACCUM_MAX_DEVICE_MEMORY_BYTES = {limits.max_device_memory_bytes}); {fix}",
                spec.model.name if weights_alone else spec.micro_batch_size,
            )
        )
    return refusals
