"""`strategy` and `fsdp`: how a `gpus: k` job spreads over its ranks.

`strategy: "ddp"` (the default) replicates the model on every rank; `"fsdp"` shards its
parameters, gradients and optimizer states over the ranks (PyTorch FSDP2,
``accumcore.shard``), with the options in `fsdp`. Options that cannot apply are refused
with the fix: `fsdp` options with strategy ddp, FSDP on one GPU of one node without CPU
offload (nothing to shard over), FSDP's bf16 parameters together with an autocast precision.
FSDP on several nodes shards over every rank of every node (world = nodes x gpus); each rank
stores its own checkpoint shards (services.worker.checkpoints.shards).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel

from services.spec.errors import one_of, spec_error
from services.spec.fields import SPEC_CONFIG, Bool
from services.spec.world import world_of

STRATEGIES = ("ddp", "fsdp")
FSDP_SYNC_MODES = ("window", "micro_batch")
# docs/benchmarks.md "FSDP": reduce-scatter after every micro-batch holds sharded gradients
# only (the memory FSDP is for) at a step time close to the once-per-window mode.
DEFAULT_FSDP_SYNC: Literal["window", "micro_batch"] = "micro_batch"


class FsdpOptions(BaseModel):
    """`{"sync": "window"|"micro_batch", "reshard_after_forward", "cpu_offload",
    "mixed_precision"}`: see docs/multi-gpu.md."""

    model_config = SPEC_CONFIG

    sync: Annotated[Literal["window", "micro_batch"], one_of("fsdp.sync", FSDP_SYNC_MODES)] = DEFAULT_FSDP_SYNC
    reshard_after_forward: Bool = True
    cpu_offload: Bool = False
    mixed_precision: Bool = False


Strategy = Annotated[Literal["ddp", "fsdp"], one_of("strategy", STRATEGIES)]


def check_fsdp(options: FsdpOptions | None, data: dict[str, Any]) -> FsdpOptions | None:
    """The `fsdp` options as they apply to the spec's earlier fields (`gpus`, `precision`,
    `strategy`): filled with defaults under strategy fsdp, refused where they cannot apply."""
    strategy = data.get("strategy")
    if strategy is None:
        return options  # strategy failed validation and has its own error
    if strategy == "ddp":
        if options is not None:
            raise spec_error(
                "field_not_applicable",
                'fsdp options apply only to strategy "fsdp"; remove fsdp or set strategy: "fsdp"',
                STRATEGIES,
            )
        return None
    options = options if options is not None else FsdpOptions()
    gpus, nodes = data.get("gpus"), data.get("nodes")
    if isinstance(gpus, int) and gpus == 0:
        raise spec_error(
            "not_applicable",
            'strategy "fsdp" needs gpus >= 1 (fsdp.cpu_offload moves states from the GPU to host '
            'memory; a CPU job has them there already): set gpus, or strategy "ddp"',
        )
    ranks = world_of(gpus, nodes) if isinstance(gpus, int) and isinstance(nodes, int) else None
    if ranks is not None and ranks <= 1 and not options.cpu_offload:
        raise spec_error(
            "not_applicable",
            f'strategy "fsdp" with gpus {gpus} has no ranks to shard over: use gpus >= 2 (or '
            'nodes >= 2), set fsdp.cpu_offload: true (parameters and optimizer states in host '
            'memory), or strategy "ddp"',
            [True],
        )
    precision = data.get("precision")
    if options.mixed_precision and precision not in (None, "fp32"):
        raise spec_error(
            "not_applicable",
            f"fsdp.mixed_precision computes in bf16 through FSDP's own policy (reductions in fp32); "
            f"with it precision must stay \"fp32\", got {precision!r}: drop one of the two",
            ["fp32"],
        )
    return options
