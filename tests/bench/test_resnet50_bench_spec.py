"""The GPU job that bench/service/resnet50_h100.py submits is a valid spec: its figure is only
taken on a GPU, so a spec that drifted from the schema would first fail there (it did: the
dataset options had moved out of an ``options`` object)."""

from __future__ import annotations

from bench.service.resnet50_h100 import cpu_spec, gpu_spec
from services.spec.job import parse_spec


def test_the_gpu_job_of_the_resnet50_bench_parses_as_submitted() -> None:
    spec = parse_spec(gpu_spec(steps=60))
    assert spec.model.name == "resnet50" and spec.precision == "bf16" and spec.gpus == 1
    assert spec.dataset.name == "fake" and spec.max_steps == 60


def test_the_cpu_pipeline_job_of_the_resnet50_bench_parses_as_submitted() -> None:
    assert parse_spec(cpu_spec()).gpus == 0
