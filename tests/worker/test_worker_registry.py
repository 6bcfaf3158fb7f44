"""What a worker says about itself in the registry: GPUs after CUDA_VISIBLE_DEVICES (from
NVML or nvidia-smi, never torch), its CPU otherwise, library versions from package metadata,
the catalog's names; and the registration's life (register, renew, stopped on shutdown)."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
from sqlalchemy import delete

from services.jobdb import workers as store_workers
from services.jobdb.models import Worker
from services.jobdb.sessions import session_factory
from services.settings import Settings
from services.worker import registry

SMI = """0, GPU-aaaa1111, NVIDIA H100 80GB HBM3, 81559
1, GPU-bbbb2222, NVIDIA H100 80GB HBM3, 81559
2, GPU-cccc3333, NVIDIA A100-SXM4-40GB, 40960
"""


def test_nvidia_smi_output_parses_to_devices_with_memory_in_bytes() -> None:
    devices = registry.parse_nvidia_smi(SMI)
    assert [d["index"] for d in devices] == [0, 1, 2]
    assert devices[2]["name"] == "NVIDIA A100-SXM4-40GB"
    assert devices[2]["memory_bytes"] == 40960 * 2**20
    assert registry.parse_nvidia_smi("No devices were found\n") == []


@pytest.mark.parametrize(
    ("mask", "indices"),
    [(None, [0, 1, 2]), ("2,0", [2, 0]), ("GPU-bbbb", [1]), ("", []), ("-1", []), ("1,7,2", [1])],
)
def test_cuda_visible_devices_picks_the_gpus_in_its_order(mask: str | None, indices: list[int]) -> None:
    devices = registry.parse_nvidia_smi(SMI)
    assert [d["index"] for d in registry.visible(devices, mask)] == indices


def test_a_pinned_worker_lists_only_its_gpus_and_a_gpu_less_one_its_cpu(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    found = registry.detect_devices([lambda: registry.parse_nvidia_smi(SMI)])
    assert found == [{"kind": "gpu", "index": 1, "name": "NVIDIA H100 80GB HBM3",
                      "memory_bytes": 81559 * 2**20}]
    # No driver (no source answers), or a worker pinned to no GPU: the CPU and its cores.
    for sources in ([lambda: None], [lambda: registry.parse_nvidia_smi(SMI)]):
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "" if sources[0]() else "0")
        (cpu,) = registry.detect_devices(sources)
        assert cpu["kind"] == "cpu" and cpu["cores"] >= 1 and cpu["name"]


def test_cpu_ranks_go_on_the_cpu_device_and_are_refused_beside_gpus() -> None:
    cpu = [{"kind": "cpu", "name": "cpu", "cores": 2}]
    assert registry.with_cpu_ranks(cpu, 2) == [{**cpu[0], "ranks": 2}]
    assert registry.with_cpu_ranks(cpu, 0) == cpu  # no ranks: one process per job
    assert store_workers.ranks_offered(0, registry.with_cpu_ranks(cpu, 2)) == 2
    assert store_workers.ranks_offered(0, cpu) == 0
    gpus = registry.detect_devices([lambda: registry.parse_nvidia_smi(SMI)])
    assert store_workers.ranks_offered(len(gpus), gpus) == len(gpus)
    with pytest.raises(ValueError, match="CUDA_VISIBLE_DEVICES= to train on CPU ranks"):
        registry.with_cpu_ranks(gpus, 2)


def test_describing_the_worker_imports_no_torch_and_lists_the_catalog() -> None:
    code = (
        "import sys, json\n"
        "from services.worker.registry import describe\n"
        "row = describe('w@n', ['default', 'a100', 'default'])\n"
        "print(json.dumps({'torch': 'torch' in sys.modules, 'row': row}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    import json

    result = json.loads(out.stdout)
    row = result["row"]
    assert result["torch"] is False
    assert row["queues"] == ["default", "a100"]
    assert {"mlp", "small_cnn", "resnet18"} <= set(row["models"]) and "digits" in row["datasets"]
    assert row["versions"]["torch"] and row["versions"]["torchvision"] and row["accum_version"]
    assert row["gpus"] == sum(d["kind"] == "gpu" for d in row["devices"])


def test_registration_registers_renews_and_marks_the_worker_stopped(tmp_path: Any) -> None:
    from services.jobdb.migrate import upgrade

    settings = Settings(home=tmp_path / "home", lease_timeout_s=2, heartbeat_interval_s=0.05)
    upgrade(settings.database_url)
    registration = registry.Registration(settings, "w@n", ["default"]).start()
    try:
        with session_factory(settings)() as session:
            (first,) = store_workers.list_workers(session, settings.lease_timeout_s)
        assert (first.row.name, first.state) == ("w@n", "idle")
        # The row deleted under it (an operator's clean-up): the next beat registers again.
        with session_factory(settings).begin() as session:
            session.execute(delete(Worker))
        registration.beat()
        with session_factory(settings)() as session:
            (again,) = store_workers.list_workers(session, settings.lease_timeout_s)
        assert again.row.last_seen >= first.row.last_seen
    finally:
        registration.stop()
    with session_factory(settings)() as session:
        (stopped,) = store_workers.list_workers(session, settings.lease_timeout_s)
    assert stopped.state == "stopped"
