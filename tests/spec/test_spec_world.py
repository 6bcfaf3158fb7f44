"""World size and the GPU-count rule (services/spec/world.py), the one place both are computed:
the spec's validators, the memory floor, the fleet and gang checks and the worker call them."""

from __future__ import annotations

from services.spec.world import enough_ranks, ranks_per_node, world_of


def test_the_world_is_every_rank_of_every_node_and_a_cpu_job_is_one_process() -> None:
    assert [world_of(4), world_of(2, 2), world_of(0), world_of(0, 3)] == [4, 4, 1, 3]
    assert [ranks_per_node(0), ranks_per_node(1), ranks_per_node(8)] == [1, 1, 8]


def test_a_worker_must_offer_a_nodes_ranks_and_any_worker_runs_one_process() -> None:
    assert enough_ranks(0, offered=0) and enough_ranks(1, offered=0)  # one process, CPU fallback
    assert not enough_ranks(2, offered=0) and not enough_ranks(4, offered=3)
    assert enough_ranks(2, offered=2) and enough_ranks(2, offered=8)
