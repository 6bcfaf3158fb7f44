"""`accum status`: the memory levers a job turned on and each rank's peak memory (the API's
`levers` and `peak_memory_bytes_per_rank`), one line each; the per-rank peak metrics are not
listed again one by one."""

from __future__ import annotations

from services.cli.jobs import describe_job
from tests.cli.test_status_phases import job


def test_status_shows_the_levers_and_each_ranks_peak_on_one_line_each() -> None:
    latest = {"loss": 1.5, "peak_memory_bytes": 3 * 2**20, "peak_memory_bytes_rank0": 3 * 2**20,
              "peak_memory_bytes_rank1": 2 * 2**20}
    fields = dict(describe_job(job(levers=["activation_checkpointing", "lora (r 8, alpha 16, merge)"],
                                   peak_memory_bytes_per_rank=[3 * 2**20, 2 * 2**20], latest_metrics=latest)))
    assert fields["levers"] == "activation_checkpointing, lora (r 8, alpha 16, merge)"
    assert fields["peak memory"] == "rank 0: 3.0 MiB, rank 1: 2.0 MiB"
    assert "peak_memory_bytes_rank0" not in fields and "peak_memory_bytes" in fields


def test_status_of_a_job_without_levers_or_a_peak_has_neither_line() -> None:
    fields = dict(describe_job(job(levers=[], peak_memory_bytes_per_rank=None)))
    assert "levers" not in fields and "peak memory" not in fields
