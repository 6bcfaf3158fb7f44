"""What this worker offers a job: ``describe_gpu`` (the claim records it), ``ranks_here`` (the
ranks a ``gpus: k`` job gets here: its GPUs, else ``--cpu-ranks``). Read by the claim, a gang's
seat, and every node's pre-flight (``services.worker.node_start``). Torch-free unless NVML is
missing.
"""

from __future__ import annotations

import os

from services.settings import Settings
from services.worker.registry import nvml_devices, visible


def describe_gpu() -> str:
    """``cpu``, or the visible GPUs' names, e.g. ``2x NVIDIA H100 (CUDA_VISIBLE_DEVICES=0,1)``.

    Read through NVML (the registry's ``nvml_devices``, filtered by ``CUDA_VISIBLE_DEVICES`` as
    CUDA does), never through torch.cuda's device queries: those create a CUDA context in this
    Celery process, which then holds memory on GPU 0 for as long as it lives, while rank 0 of a
    job trains there (and ``micro_batch_size: "auto"`` sizes m on what is free). Without NVML
    the count comes from ``torch.cuda.device_count()``, which creates no context, and the name
    is left out."""
    names = visible_gpu_names()
    if not names:
        return "cpu"
    mask = os.environ.get("CUDA_VISIBLE_DEVICES")
    label = f"{len(names)}x {names[0]}"
    return f"{label} (CUDA_VISIBLE_DEVICES={mask})" if mask is not None else label


def visible_gpu_names() -> list[str]:
    """The names of the GPUs this process may use (``describe_gpu`` says why through NVML)."""
    devices = nvml_devices()
    if devices is not None:
        return [device["name"] for device in visible(devices, os.environ.get("CUDA_VISIBLE_DEVICES"))]
    import torch

    return ["GPU"] * (torch.cuda.device_count() if torch.cuda.is_available() else 0)


def ranks_here(settings: Settings) -> int:
    """The ranks this worker offers a ``gpus: k`` job: its GPUs, else ``--cpu-ranks``."""
    return len(visible_gpu_names()) or settings.cpu_ranks

