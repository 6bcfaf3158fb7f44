"""A GPU's own figures per optimizer step, through NVML: utilisation, memory, power.

    sampler = gpu_sampler(trainer.device)     # None on CPU, or without nvidia-ml-py / a driver
    sampler.sample() if sampler else {}       # {"gpu_utilization_percent": 97.0, ...}

Logged by the store callback with the step's metrics (so charted like the others) for the
device the metrics' rank trains on (rank 0 under DDP). Read through NVML, never through
torch.cuda, which would need a CUDA context (``runner.describe_gpu`` says why that matters).
Nothing is logged where NVML is absent: no made-up zeros.
"""

from __future__ import annotations

import contextlib
import logging
import os
from typing import Any

from services.worker.registry import open_nvml, visible

log = logging.getLogger(__name__)

UTILIZATION = "gpu_utilization_percent"  # the share of the last sample period a kernel ran
MEMORY_USED = "gpu_memory_used_bytes"  # on the whole device (every process), as nvidia-smi shows
POWER = "gpu_power_watts"
NAMES = (UTILIZATION, MEMORY_USED, POWER)


class GpuSampler:
    """One NVML device handle, sampled on demand; a failing reading is left out."""

    def __init__(self, nvml: Any, handle: Any) -> None:
        self.nvml, self.handle = nvml, handle

    def sample(self) -> dict[str, float]:
        readings = {
            UTILIZATION: lambda: self.nvml.nvmlDeviceGetUtilizationRates(self.handle).gpu,
            MEMORY_USED: lambda: self.nvml.nvmlDeviceGetMemoryInfo(self.handle).used,
            POWER: lambda: self.nvml.nvmlDeviceGetPowerUsage(self.handle) / 1000.0,  # milliwatts
        }
        out: dict[str, float] = {}
        for name, read in readings.items():
            try:
                out[name] = float(read())
            except self.nvml.NVMLError:  # not supported on this device (power on some boards)
                continue
        return out

    def close(self) -> None:
        with contextlib.suppress(self.nvml.NVMLError):
            self.nvml.nvmlShutdown()


def gpu_sampler(device: Any) -> GpuSampler | None:
    """The sampler of ``device`` (a torch device, or its string) when it is a CUDA device and
    NVML is at hand; its index is among the visible devices (``CUDA_VISIBLE_DEVICES``)."""
    if getattr(device, "type", str(device).split(":")[0]) != "cuda":
        return None
    pynvml = open_nvml()
    if pynvml is None:
        return None
    try:
        index = getattr(device, "index", None) or 0
        every = [{"index": i, "uuid": _text(pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i)))}
                 for i in range(pynvml.nvmlDeviceGetCount())]
        mine = visible(every, os.environ.get("CUDA_VISIBLE_DEVICES"))
        handle = pynvml.nvmlDeviceGetHandleByIndex(mine[index]["index"])
    except (pynvml.NVMLError, IndexError, KeyError):
        log.warning("no NVML handle for %s: its system metrics are not logged", device, exc_info=True)
        pynvml.nvmlShutdown()
        return None
    return GpuSampler(pynvml, handle)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
