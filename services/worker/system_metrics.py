"""System metrics beside a job's step metrics: the host's CPU and memory use and the training
process's resident memory (psutil), and the training GPU's utilisation, memory and power
(NVML, where present).

    system = SystemMetrics()                  # rank 0's, first in the trainer's callbacks
    note = system.start(trainer.device)       # what it samples, and what not and why (an event)
    ...                                       # each sample joins the next step's metrics dict
    system.close()

A thread samples every ``SAMPLE_EVERY_S``; the training thread only takes the latest sample,
once, into the metrics of the optimizer step after it (in place, so the store and the trackers
that follow in the callback list record it alike: charted and tracked like the others). The
step loop pays one attribute read a step, and a dict update a second (~1 us).
GPU figures are read through NVML, never through torch.cuda, which would need a CUDA context
(``offer.describe_gpu`` says why that matters). Nothing is logged that cannot be read: no
made-up zeros; the job's ``system_metrics`` event says what is missing and why.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from typing import Any

from accumcore import Callback
from services.worker.registry import open_nvml, visible

log = logging.getLogger(__name__)

UTILIZATION = "gpu_utilization_percent"  # the share of the last sample period a kernel ran
MEMORY_USED = "gpu_memory_used_bytes"  # on the whole device (every process), as nvidia-smi shows
POWER = "gpu_power_watts"
NAMES = (UTILIZATION, MEMORY_USED, POWER)
HOST_CPU = "host_cpu_percent"  # every core of the host, over the last sample period
HOST_MEMORY = "host_memory_percent"  # the host's memory in use (psutil's virtual_memory)
PROCESS_RSS = "process_rss_bytes"  # the training process's resident memory (rank 0's)
HOST_NAMES = (HOST_CPU, HOST_MEMORY, PROCESS_RSS)
SAMPLE_EVERY_S = 1.0


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


class SystemMetrics(Callback):
    """Host and GPU figures sampled on a thread, each sample added to the next step's metrics."""

    def __init__(self, every_s: float = SAMPLE_EVERY_S) -> None:
        self.every_s = every_s
        self._fresh: dict[str, float] | None = None
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self._gpu: GpuSampler | None = None
        self._psutil: Any = None
        self._process: Any = None

    def start(self, device: Any) -> str:
        """Take the first sample (the first step records it) and start the thread; returns
        what is sampled, and what is not and why, for the job's ``system_metrics`` event."""
        try:
            import psutil
        except ImportError:  # the worker extra installs it
            psutil = None
        self._psutil = psutil
        if psutil is not None:
            self._process = psutil.Process()
            psutil.cpu_percent(None)  # the first call only sets the reference time
        self._gpu = gpu_sampler(device)
        names = list(HOST_NAMES if psutil is not None else ()) + list(NAMES if self._gpu else ())
        missing = [] if psutil is not None else ["host CPU and memory: psutil is not installed "
                                                 "(pip install 'accum[worker]')"]
        if self._gpu is None:
            cuda = getattr(device, "type", str(device).split(":")[0]) == "cuda"
            missing.append("GPU utilisation and memory: " + (
                "NVML is not available on this worker (pip install 'accum[gpu]', a driver)"
                if cuda else f"the job trains on {device}, not a GPU"))
        if names:
            self._fresh = self._sample()
            self._thread = threading.Thread(target=self._loop, name="accum-system-metrics", daemon=True)
            self._thread.start()
        sampled = f"every {self.every_s:g} s: {', '.join(names)}" if names else "none"
        return f"system metrics {sampled}" + "".join(f"; not recorded: {m}" for m in missing)

    def on_step(self, trainer: Any, metrics: dict[str, float]) -> None:
        if self._fresh is None:  # most steps: nothing new since the last one took it
            return
        with self._lock:
            sample, self._fresh = self._fresh, None
        if sample:
            metrics.update(sample)

    def close(self) -> None:
        self._stopped.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        if self._gpu is not None:
            self._gpu.close()
            self._gpu = None

    def _loop(self) -> None:
        while not self._stopped.wait(self.every_s):
            sample = self._sample()
            with self._lock:
                self._fresh = sample

    def _sample(self) -> dict[str, float]:
        out: dict[str, float] = {}
        if self._psutil is not None:
            try:
                out[HOST_CPU] = float(self._psutil.cpu_percent(None))
                out[HOST_MEMORY] = float(self._psutil.virtual_memory().percent)
                out[PROCESS_RSS] = float(self._process.memory_info().rss)
            except self._psutil.Error:  # a reading the host refuses is left out
                log.debug("psutil sample failed", exc_info=True)
        if self._gpu is not None:
            out.update(self._gpu.sample())
        return out
