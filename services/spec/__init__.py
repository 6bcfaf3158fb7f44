"""The job spec: validation, normalisation, batch geometry and a stable hash (no torch).

from services.spec import parse_spec, spec_hash, effective_batch_size, total_optimizer_steps
spec = parse_spec(body)                     # pydantic.ValidationError on bad input
normalised = spec.normalised()              # stored with the job
key = spec_hash(normalised)                 # idempotency: same spec, same hash
effective_batch_size(spec), total_optimizer_steps(spec)
"""

from services.spec.batching import (
    accumulation_at,
    effective_batch_size,
    micro_batch_size,
    steps_per_epoch,
    total_optimizer_steps,
    world_size,
)
from services.spec.hashing import canonical_json, spec_hash
from services.spec.job import PRECISIONS, JobSpec, parse_spec
from services.spec.parts import OPTIMIZERS, SCHEDULERS, OptimizerSpec, SchedulerSpec
from services.spec.refs import DatasetRef, ModelRef

__all__ = [
    "OPTIMIZERS",
    "PRECISIONS",
    "SCHEDULERS",
    "DatasetRef",
    "JobSpec",
    "ModelRef",
    "OptimizerSpec",
    "SchedulerSpec",
    "accumulation_at",
    "canonical_json",
    "effective_batch_size",
    "micro_batch_size",
    "parse_spec",
    "spec_hash",
    "steps_per_epoch",
    "total_optimizer_steps",
    "world_size",
]
