"""World size: the ranks taking part in one optimizer step, computed here and nowhere else.

    from services.spec.world import enough_ranks, ranks_per_node, world_of
    world_of(4)        # gpus: 4            -> 4 ranks
    world_of(2, 2)     # gpus: 2, nodes: 2  -> 4 ranks
    world_of(0)        # gpus: 0 (CPU)      -> 1 rank
    enough_ranks(2, offered=0)   # False: gpus: 2 on a worker with no GPU and no --cpu-ranks

Plain integers in, so the spec's validators (which see raw fields), the stored spec's readers
and the worker's launcher all call the same rule.
"""

from __future__ import annotations


def ranks_per_node(gpus: int) -> int:
    """Processes one node runs for a job of ``gpus``: one per GPU, one at least (a CPU job)."""
    return max(gpus, 1)


def world_of(gpus: int, nodes: int = 1) -> int:
    """Ranks of one optimizer step over every node: ``nodes`` x ``ranks_per_node(gpus)``."""
    return ranks_per_node(gpus) * nodes


def enough_ranks(gpus: int, offered: int) -> bool:
    """The GPU-count rule, the same at submit, at claim and at a job's start: a node of a job of
    ``gpus`` runs ``ranks_per_node(gpus)`` ranks on one worker, which ``offered`` ranks (its GPUs,
    else its ``--cpu-ranks``) must cover; any worker runs a one-process node (gpus 0 or 1)."""
    return ranks_per_node(gpus) <= max(offered, 1)
