"""The worker's own row in the registry (``services.jobdb.workers``): what it is, renewed.

    registration = Registration(settings, name="gpu0@node1", queues=["a100"]).start()
    ...                                   # a thread renews last_seen every heartbeat interval
    registration.stop()                   # clean shutdown: listed as stopped, not lost

``start_worker`` does this around the Celery worker. What a worker says about itself is
read without importing torch or touching CUDA (a prefork parent must fork CUDA-free, and
registering must not cost the worker's start-up a torch import): GPUs through NVML
(``nvidia-ml-py``, the ``gpu`` extra) or else ``nvidia-smi``, library versions from the
installed packages' metadata, and the catalog's names.

A ``--pool prefork`` worker forks its pool's children from the process this thread runs in:
a fork taken while the thread is mid-write would copy the locks it holds (the session-factory
cache's, SQLAlchemy's, psycopg's) into the child, locked for good there. So a fork waits for
a renewal in progress (``os.register_at_fork``), as the lease reaper's passes do.
"""

from __future__ import annotations

import logging
import os
import platform
import shutil
import socket
import subprocess
import threading
import weakref
from collections.abc import Callable, Iterable, Sequence
from importlib import metadata
from typing import Any

from services.catalog import DATASETS, MODELS, OWN_DATASETS
from services.catalog.families.plugins import DATASET_GROUP, MODEL_GROUP, installed
from services.jobdb import workers as store_workers
from services.jobdb.sessions import session_factory

log = logging.getLogger(__name__)

# Libraries whose versions a worker reports (the optional model libraries when installed).
LIBRARIES = ("torch", "torchvision", "timm", "transformers", "celery")
# The model namespaces (services.catalog.families: timm, hf) a worker serves when their library is
# installed, advertised as the patterns `served_names` lists; services/fleet.py matches them.
NAMESPACE_PATTERNS = {"timm": ("timm:<name>",), "transformers": ("hf:<model_type>", "hf:<directory>")}
# Own data that reads files through Hugging Face datasets (imagefolder needs torchvision only).
DATASETS_LIBRARY_OWN = ("files", "hf_disk")
NVIDIA_SMI_TIMEOUT_S = 10.0
FORK_WAIT_S = 30.0


def package_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def library_versions(names: Iterable[str] = LIBRARIES) -> dict[str, str]:
    """Installed versions, from package metadata (nothing is imported)."""
    found = {name: package_version(name) for name in names}
    return {"python": platform.python_version(), **{k: v for k, v in found.items() if v}}


def visible(devices: list[dict[str, Any]], mask: str | None) -> list[dict[str, Any]]:
    """The GPUs ``CUDA_VISIBLE_DEVICES`` (``mask``) leaves this process, in its order: indices
    or ``GPU-<uuid>`` prefixes; unset = all; empty or ``-1`` = none."""
    if mask is None:
        return devices
    chosen: list[dict[str, Any]] = []
    for item in (part.strip() for part in mask.split(",")):
        if not item or item.startswith("-"):
            break  # CUDA ignores everything from the first invalid entry on
        match = [d for d in devices if (str(d["index"]) == item if item.isdigit()
                                        else str(d.get("uuid", "")).startswith(item))]
        if not match:
            break
        chosen.append(match[0])
    return chosen


def open_nvml() -> Any | None:
    """``pynvml``, initialised (the caller shuts it down); None without ``nvidia-ml-py`` or a
    driver."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return None
    return pynvml


def nvml_devices() -> list[dict[str, Any]] | None:
    """Every GPU the driver sees, through NVML; None without ``nvidia-ml-py`` or a driver."""
    pynvml = open_nvml()
    if pynvml is None:
        return None
    try:
        devices = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            name, uuid = pynvml.nvmlDeviceGetName(handle), pynvml.nvmlDeviceGetUUID(handle)
            devices.append({
                "kind": "gpu", "index": index,
                "name": name.decode() if isinstance(name, bytes) else str(name),
                "uuid": uuid.decode() if isinstance(uuid, bytes) else str(uuid),
                "memory_bytes": int(pynvml.nvmlDeviceGetMemoryInfo(handle).total),
            })
        return devices
    finally:
        pynvml.nvmlShutdown()


def parse_nvidia_smi(text: str) -> list[dict[str, Any]]:
    """``nvidia-smi --query-gpu=index,uuid,name,memory.total --format=csv,noheader,nounits``
    lines (memory in MiB) as device dicts."""
    devices = []
    for line in text.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 4 or not parts[0].isdigit():
            continue
        index, uuid, name, mib = parts
        memory = int(float(mib)) * 2**20 if mib.replace(".", "", 1).isdigit() else None
        devices.append({"kind": "gpu", "index": int(index), "name": name, "uuid": uuid,
                        "memory_bytes": memory})
    return devices


def nvidia_smi_devices() -> list[dict[str, Any]] | None:
    command = shutil.which("nvidia-smi")
    if command is None:
        return None
    try:
        out = subprocess.run(
            [command, "--query-gpu=index,uuid,name,memory.total", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=NVIDIA_SMI_TIMEOUT_S, check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return parse_nvidia_smi(out)


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "cpu"


def detect_devices(
    sources: Sequence[Callable[[], list[dict[str, Any]] | None]] = (nvml_devices, nvidia_smi_devices),
) -> list[dict[str, Any]]:
    """The GPUs this worker may use (after ``CUDA_VISIBLE_DEVICES``), else its CPU."""
    for source in sources:
        found = source()
        if found is not None:
            gpus = visible(found, os.environ.get("CUDA_VISIBLE_DEVICES"))
            if gpus:
                return [{k: v for k, v in d.items() if k != "uuid"} for d in gpus]
            break
    return [{"kind": "cpu", "name": cpu_name(), "cores": os.cpu_count() or 1}]


def plugin_names() -> list[str]:
    """Names of installed model and dataset plugins (entry points in ``accum.models`` and
    ``accum.datasets``: services.catalog.families.plugins); the plugins themselves are imported only by
    the job that uses one."""
    return sorted({*installed(MODEL_GROUP), *installed(DATASET_GROUP)})


def served_models() -> list[str]:
    """The catalog's models, then the namespace patterns whose library is installed."""
    patterns = [p for library, found in NAMESPACE_PATTERNS.items() if package_version(library)
                for p in found]
    return [*sorted(MODELS), *patterns]


def served_datasets() -> list[str]:
    """The catalog's datasets and the own-data kinds this worker can read."""
    with_datasets = package_version("datasets") is not None
    own = [n for n in OWN_DATASETS if with_datasets or n not in DATASETS_LIBRARY_OWN]
    return sorted([*DATASETS, *own])


def with_cpu_ranks(devices: list[dict[str, Any]], cpu_ranks: int) -> list[dict[str, Any]]:
    """The devices with the CPU ranks this worker offers ``gpus: k`` jobs on its CPU device
    (``accum worker --cpu-ranks K``). Refused beside GPUs: a job's ranks are its GPUs there."""
    if not cpu_ranks:
        return devices
    gpus = [d for d in devices if d["kind"] == "gpu"]
    if gpus:
        raise ValueError(
            f"--cpu-ranks {cpu_ranks} (ACCUM_CPU_RANKS) is for a worker without GPUs; this one "
            f"sees {len(gpus)}: drop --cpu-ranks (its jobs run one rank per GPU), or hide the "
            "GPUs with CUDA_VISIBLE_DEVICES= to train on CPU ranks"
        )
    return [{**d, "ranks": cpu_ranks} if d["kind"] == "cpu" else d for d in devices]


def describe(name: str, queues: Sequence[str], cpu_ranks: int = 0) -> dict[str, Any]:
    """This worker's registry row (every column but the times); ``cpu_ranks``: see
    ``with_cpu_ranks`` (raises ValueError on a worker with GPUs)."""
    devices = with_cpu_ranks(detect_devices(), cpu_ranks)
    return {
        "name": name,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "queues": list(dict.fromkeys(queues)),
        "devices": devices,
        "gpus": sum(d["kind"] == "gpu" for d in devices),
        "models": served_models(),
        "datasets": served_datasets(),
        "plugins": plugin_names(),
        "versions": library_versions(),
        "accum_version": package_version("accum") or "0+unknown",
    }


class Registration:
    """Registers the worker now and renews its row every ``settings.heartbeat_interval_s``
    on a daemon thread; ``stop`` marks it stopped."""

    def __init__(
        self, settings: Any, name: str, queues: Sequence[str],
        description: dict[str, Any] | None = None, on_beat: Callable[[], object] | None = None,
    ) -> None:
        self.settings = settings
        self.on_beat = on_beat  # more upkeep on the same beat (the node cache's sweep)
        self.name = name
        self.description = description or describe(name, queues)
        self.interval_s = float(settings.heartbeat_interval_s)
        self.registered = False
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="accum-registry", daemon=True)
        self.lock = threading.Lock()  # held for a write, and by a fork of this process

    def start(self) -> Registration:
        _running.add(self)
        self.beat()
        self._thread.start()
        return self

    def beat(self) -> None:
        """Register (first, or after the row vanished) or renew; a database blip is logged
        and retried at the next beat."""
        with self.lock:
            try:
                with session_factory(self.settings).begin() as session:
                    if not (self.registered and store_workers.renew(session, self.name)):
                        store_workers.register(session, self.description)
                self.registered = True
            except Exception:
                log.warning("worker registry: could not write %s's row; retrying in %.1fs",
                            self.name, self.interval_s, exc_info=True)
            if self.on_beat is not None:
                try:
                    self.on_beat()
                except Exception:
                    log.warning("worker %s: upkeep on the heartbeat failed; retrying at the next",
                                self.name, exc_info=True)

    def stop(self) -> None:
        self._stopped.set()
        _running.discard(self)
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        if not self.registered:
            return  # never got as far as consuming (or never reached the database)
        try:
            with self.lock, session_factory(self.settings).begin() as session:
                store_workers.mark_stopped(session, self.name)
        except Exception:  # it will show as lost after the lease timeout instead
            log.warning("worker registry: could not mark %s stopped", self.name, exc_info=True)

    def _run(self) -> None:
        while not self._stopped.wait(self.interval_s):
            self.beat()


_running: weakref.WeakSet[Registration] = weakref.WeakSet()
_held: list[threading.Lock] = []


def _before_fork() -> None:
    for registration in list(_running):
        if registration.lock.acquire(timeout=FORK_WAIT_S):
            _held.append(registration.lock)


def _after_fork_in_parent() -> None:
    while _held:
        _held.pop().release()


def _after_fork_in_child() -> None:
    _after_fork_in_parent()
    _running.clear()  # the thread stays in the parent; the child registers nothing


os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent,
                    after_in_child=_after_fork_in_child)
