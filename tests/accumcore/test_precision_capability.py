"""bf16 is refused on GPUs without native bfloat16 (compute capability < 8.0), with an error
naming fp16; allowed on Ampere and newer, and on the CPU. No GPU here: torch.cuda's
capability and name queries are replaced by a stand-in for each GPU."""

from __future__ import annotations

import pytest
import torch

from accumcore.precision import Precision, UnsupportedPrecision


def gpu_stand_in(monkeypatch: pytest.MonkeyPatch, name: str, capability: tuple[int, int]) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)


@pytest.mark.parametrize(("name", "capability"), [("Tesla V100-SXM2-16GB", (7, 0)), ("Tesla T4", (7, 5))])
def test_bf16_is_refused_below_compute_capability_8_naming_fp16(
    monkeypatch: pytest.MonkeyPatch, name: str, capability: tuple[int, int]
) -> None:
    gpu_stand_in(monkeypatch, name, capability)
    with pytest.raises(UnsupportedPrecision, match=rf"{name} is {capability[0]}\.{capability[1]}.*precision='fp16'"):
        Precision("bf16", torch.device("cuda"))


@pytest.mark.parametrize(("name", "capability"), [("NVIDIA A100-SXM4-80GB", (8, 0)), ("NVIDIA H100 80GB HBM3", (9, 0))])
def test_bf16_is_allowed_on_ampere_and_newer(monkeypatch: pytest.MonkeyPatch, name: str, capability: tuple[int, int]) -> None:
    gpu_stand_in(monkeypatch, name, capability)
    assert Precision("bf16", torch.device("cuda")).name == "bf16"


def test_fp16_and_fp32_are_not_checked_and_cpu_bf16_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    gpu_stand_in(monkeypatch, "Tesla T4", (7, 5))
    assert Precision("fp32", torch.device("cuda")).name == "fp32"
    assert Precision("bf16", torch.device("cpu")).name == "bf16"
