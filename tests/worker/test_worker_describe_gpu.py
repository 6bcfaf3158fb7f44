"""``describe_gpu`` names the worker's GPUs through NVML without creating a CUDA context in the
Celery parent (which would hold memory on GPU 0 while rank 0 trains there).

No GPU or NVIDIA driver here: NVML is stood in for by a module with the nvidia-ml-py calls
the worker makes, over four GPUs, and torch.cuda's context-creating queries are replaced by
functions that fail the test if called."""

from __future__ import annotations

import sys
import types

import pytest
import torch

from services.worker.offer import describe_gpu


class NVMLError(Exception):
    pass


def nvml_stand_in(names: list[str], calls: list[str]) -> types.ModuleType:
    module = types.ModuleType("pynvml")
    uuids = {f"GPU-{i:04d}": i for i in range(len(names))}

    def record(name, result=None):
        def call(*args):
            calls.append(name)
            return result(*args) if callable(result) else result
        return call

    module.NVMLError = NVMLError  # type: ignore[attr-defined]
    module.nvmlInit = record("init")  # type: ignore[attr-defined]
    module.nvmlShutdown = record("shutdown")  # type: ignore[attr-defined]
    module.nvmlDeviceGetCount = record("count", lambda: len(names))  # type: ignore[attr-defined]
    module.nvmlDeviceGetHandleByIndex = record("by_index", lambda i: i)  # type: ignore[attr-defined]
    module.nvmlDeviceGetHandleByUUID = record("by_uuid", lambda u: uuids[u])  # type: ignore[attr-defined]
    module.nvmlDeviceGetName = record("name", lambda h: names[h].encode())  # type: ignore[attr-defined]
    module.nvmlDeviceGetUUID = record("uuid", lambda h: f"GPU-{h:04d}".encode())  # type: ignore[attr-defined]
    module.nvmlDeviceGetMemoryInfo = record(  # type: ignore[attr-defined]
        "memory", lambda h: types.SimpleNamespace(total=80 * 2**30))
    return module


@pytest.fixture
def no_cuda_context(monkeypatch: pytest.MonkeyPatch) -> None:
    def creates_a_context(*_args):
        raise AssertionError("describe_gpu created a CUDA context in the worker's parent")

    for name in ("get_device_name", "get_device_properties", "init", "current_device", "mem_get_info"):
        monkeypatch.setattr(torch.cuda, name, creates_a_context)


@pytest.mark.parametrize(("visible", "expected"), [
    (None, "4x NVIDIA H100 80GB HBM3"),
    ("2,3", "2x NVIDIA A100-SXM4-40GB (CUDA_VISIBLE_DEVICES=2,3)"),
    ("GPU-0003", "1x NVIDIA A100-SXM4-40GB (CUDA_VISIBLE_DEVICES=GPU-0003)"),
    ("1,7,2", "1x NVIDIA H100 80GB HBM3 (CUDA_VISIBLE_DEVICES=1,7,2)"),  # CUDA stops at 7
])
def test_gpus_are_named_through_nvml(monkeypatch, no_cuda_context, visible, expected) -> None:
    calls: list[str] = []
    names = ["NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-40GB", "NVIDIA A100-SXM4-40GB"]
    monkeypatch.setitem(sys.modules, "pynvml", nvml_stand_in(names, calls))
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert describe_gpu() == expected
    assert calls[0] == "init" and calls[-1] == "shutdown"


def test_no_visible_gpu_is_cpu(monkeypatch, no_cuda_context) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", nvml_stand_in(["NVIDIA H100 80GB HBM3"], []))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert describe_gpu() == "cpu"


def test_without_nvml_the_count_comes_from_torch_without_a_name(monkeypatch, no_cuda_context) -> None:
    failing = nvml_stand_in([], [])

    def no_driver():
        raise NVMLError("NVML Shared Library Not Found")

    failing.nvmlInit = no_driver  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pynvml", failing)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert describe_gpu() == "2x GPU"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert describe_gpu() == "cpu"
