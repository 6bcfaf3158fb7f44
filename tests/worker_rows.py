"""Worker registry rows for tests of the store, the API and the submit checks."""

from __future__ import annotations

from typing import Any


def worker_row(name: str, queues: list[str], gpus: int = 0, **extra: Any) -> dict[str, Any]:
    """A worker's registry row (as ``services.worker.registry.describe`` makes one) with
    ``gpus`` A100s, or a 4-core CPU; ``extra`` overrides columns (models, datasets, ...)."""
    devices = ([{"kind": "gpu", "index": i, "name": "NVIDIA A100", "memory_bytes": 80 * 2**30}
                for i in range(gpus)] or [{"kind": "cpu", "name": "cpu", "cores": 4}])
    return {
        "name": name, "host": "node1", "pid": 1234, "queues": queues, "devices": devices,
        "gpus": gpus, "models": ["mlp"], "datasets": ["digits"], "plugins": [],
        "versions": {"torch": "2.14.1"}, "accum_version": "0.1.0", **extra,
    }
