"""docker-compose.yml and the Dockerfiles, checked without a Docker engine.

The compose file is parsed with PyYAML and checked for the services a GPU node needs, their
healthchecks, start-up order, volumes and GPU reservations; every command must name an entry
point this package really has (a console script whose arguments parse, or an importable
`module:attribute`), and every file a Dockerfile copies must exist.
"""

from __future__ import annotations

import importlib
import re
import shlex
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from services.cli.main import build_parser

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES: dict[str, Any] = COMPOSE["services"]
OUR_SERVICES = [name for name, svc in SERVICES.items() if str(svc.get("image", "")).startswith("accum-")]
WORKERS = [name for name in SERVICES if name.startswith("worker")]


def gpu_reservations(service: dict[str, Any]) -> list[dict[str, Any]]:
    return (service.get("deploy") or {}).get("resources", {}).get("reservations", {}).get("devices", [])


# One worker per GPU (a device id each), the worker of every GPU (count: all), the CPU worker.
ONE_GPU_WORKERS = [n for n in WORKERS if any("device_ids" in d for d in gpu_reservations(SERVICES[n]))]
ALL_GPUS_WORKERS = [n for n in WORKERS if any(d.get("count") == "all" for d in gpu_reservations(SERVICES[n]))]
SCRIPTS: dict[str, str] = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]


def command_of(service: dict[str, Any]) -> list[str]:
    command = service.get("command")
    assert command, "every service built from this repository states its command"
    return shlex.split(command) if isinstance(command, str) else [str(c) for c in command]


def volume_sources(service: dict[str, Any]) -> dict[str, str]:
    """Named volume -> mount path."""
    mounts = {}
    for entry in service.get("volumes", []):
        source, _, target = str(entry).partition(":")
        mounts[source] = target.split(":")[0]
    return mounts


def depends(service: dict[str, Any], on: str) -> str | None:
    return (service.get("depends_on") or {}).get(on, {}).get("condition")


def test_the_services_a_gpu_node_needs_are_there() -> None:
    assert {"postgres", "redis", "migrate", "api", "worker"} <= SERVICES.keys()
    assert set(OUR_SERVICES) >= {"migrate", "api", *WORKERS}
    assert ONE_GPU_WORKERS and ALL_GPUS_WORKERS and "worker-cpu" in WORKERS


def test_postgres_keeps_its_data_in_a_volume_and_reports_health() -> None:
    postgres = SERVICES["postgres"]
    mounts = volume_sources(postgres)
    assert mounts.get("pgdata") == "/var/lib/postgresql/data"
    assert "pgdata" in COMPOSE["volumes"]
    assert "pg_isready" in " ".join(postgres["healthcheck"]["test"])


def test_redis_reports_health() -> None:
    assert "ping" in SERVICES["redis"]["healthcheck"]["test"]


def test_start_up_order_migrates_before_api_and_workers() -> None:
    assert depends(SERVICES["migrate"], "postgres") == "service_healthy"
    assert SERVICES["migrate"].get("restart") == "no"
    assert command_of(SERVICES["migrate"])[:3] == ["accum", "db", "upgrade"]
    for name in ["api", *WORKERS]:
        assert depends(SERVICES[name], "migrate") == "service_completed_successfully", name
        assert depends(SERVICES[name], "redis") == "service_healthy", name


def test_api_healthcheck_asks_readyz() -> None:
    healthcheck = SERVICES["api"]["healthcheck"]
    assert "/readyz" in " ".join(healthcheck["test"])
    assert healthcheck.get("start_period")


def test_every_one_gpu_worker_reserves_exactly_one_distinct_nvidia_gpu() -> None:
    assert len(ONE_GPU_WORKERS) >= 2, "show how a second worker is pinned to GPU 1"
    claimed: list[str] = []
    for name in ONE_GPU_WORKERS:
        devices = gpu_reservations(SERVICES[name])
        assert len(devices) == 1, name
        device = devices[0]
        assert device["driver"] == "nvidia"
        assert "gpu" in device["capabilities"]
        assert len(device["device_ids"]) == 1, f"{name}: one GPU per worker"
        claimed.extend(device["device_ids"])
    assert len(claimed) == len(set(claimed)), "two workers reserve the same GPU"


def test_the_all_gpus_worker_serves_the_multi_gpu_queue_and_is_opt_in() -> None:
    """`gpus: k` jobs need one worker holding k GPUs: it reserves them all, on its own queue,
    behind a profile (it would claim the GPUs the one-GPU workers reserve)."""
    (name,) = ALL_GPUS_WORKERS
    service = SERVICES[name]
    assert service["profiles"] and gpu_reservations(service)[0]["driver"] == "nvidia"
    argv = build_parser().parse_args(
        [re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", a) for a in command_of(service)[1:]]
    )
    assert argv.queues == "multi-gpu"
    assert not gpu_reservations(SERVICES["worker-cpu"]) and SERVICES["worker-cpu"]["profiles"]


def test_api_and_workers_share_the_s3_store_and_no_artefacts_volume() -> None:
    url = SERVICES["api"]["environment"]["ACCUM_ARTIFACTS_URL"]
    assert re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", url) == "s3://accum/artifacts"
    for name in ["api", *WORKERS]:
        env = SERVICES[name]["environment"]
        assert env["ACCUM_ARTIFACTS_URL"] == url, name
        assert "minio:9000" in env["AWS_ENDPOINT_URL"] and env["AWS_ACCESS_KEY_ID"], name
        assert "artifacts" not in volume_sources(SERVICES[name]), name
        assert "bucket" in SERVICES[name]["depends_on"], f"{name} starts before the bucket exists"
    assert "artifacts" not in COMPOSE["volumes"]
    assert "healthcheck" in SERVICES["minio"]


def test_services_use_postgres_and_redis_not_the_embedded_defaults() -> None:
    for name in OUR_SERVICES:
        env = SERVICES[name]["environment"]
        assert env["ACCUM_DATABASE_URL"].startswith("postgresql+psycopg://"), name
        assert "@postgres:5432/" in env["ACCUM_DATABASE_URL"], name
        assert env["ACCUM_BROKER_URL"].startswith("redis://redis:6379"), name


@pytest.mark.parametrize("name", OUR_SERVICES)
def test_commands_name_real_entry_points(name: str) -> None:
    argv = command_of(SERVICES[name])
    # Compose substitutes ${VAR:-default} before running; parse what it would run by default.
    argv = [re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", arg) for arg in argv]
    program, args = argv[0], argv[1:]
    if program in SCRIPTS:
        assert SCRIPTS[program] == "services.cli.main:main"
        parsed = build_parser().parse_args(args)  # SystemExit(2) on an unknown command
        assert callable(parsed.func)
    elif program == "uvicorn":
        module, _, attribute = args[0].partition(":")
        assert getattr(importlib.import_module(module), attribute) is not None
    else:
        pytest.fail(f"{name} runs {program!r}, which is neither a console script nor uvicorn")


def test_every_required_variable_is_in_env_example() -> None:
    text = (ROOT / "docker-compose.yml").read_text()
    required = set(re.findall(r"\$\{(\w+):\?", text))
    example = {
        line.split("=", 1)[0]
        for line in (ROOT / ".env.example").read_text().splitlines()
        if "=" in line and not line.startswith("#")
    }
    assert required, "POSTGRES_PASSWORD must be required, not defaulted"
    assert required <= example
    # Optional ones too: .env.example is where an operator learns what can be set.
    assert set(re.findall(r"\$\{(\w+)", text)) <= example


def dockerfile(name: str) -> str:
    return (ROOT / "docker" / name).read_text()


@pytest.mark.parametrize("name", ["Dockerfile", "standins.Dockerfile"])
def test_dockerfiles_copy_files_that_exist(name: str) -> None:
    sources = []
    for line in dockerfile(name).splitlines():
        if line.startswith("COPY ") and "--from=" not in line:
            parts = [p for p in line.split()[1:] if not p.startswith("--")]
            sources.extend(parts[:-1])
    assert sources
    for source in sources:
        assert (ROOT / source).exists(), f"{name} copies {source}, which does not exist"


def test_our_images_are_built_here_from_dockerfiles_that_exist() -> None:
    for name in OUR_SERVICES:
        build = SERVICES[name].get("build")
        assert build, f"{name} would be pulled from a registry instead of built"
        text = (ROOT / build.get("context", ".") / build["dockerfile"]).read_text()
        assert f" AS {build['target']}\n" in text, f"{name}: no stage {build['target']}"


def stage(name: str) -> str:
    """The lines of docker/Dockerfile's stage `name`."""
    text = dockerfile("Dockerfile")
    start = text.index(f" AS {name}\n")
    end = text.find("\nFROM ", start)
    return text[start: end if end > 0 else None]


def test_images_install_the_wheel_with_pyprojects_requirements_and_the_pins() -> None:
    """No second dependency list: the images install what pyproject asks for, with
    constraints.txt (the torch CI tests), then the wheel the `wheel` stage built."""
    assert re.search(r"^ARG BASE_IMAGE=python:3\.11-slim$", dockerfile("Dockerfile"), re.M)
    assert "install.sh --wheel-of . /dist" in stage("wheel")
    install = dockerfile("install.sh")
    assert "pip install -c /tmp/accum/constraints.txt" in install and "pip check" in install
    for name, extras in (("api", "s3"), ("worker", "worker,models,s3,gpu,trackers,finetune")):
        text = stage(name)
        assert f"install.sh -r /tmp/accum/{name}.txt" in text, name
        assert f"requirements.py pyproject.toml {extras} > {name}.txt" in stage("requirements")
        assert "from=wheel" in text and "constraints.txt" in text, name
        assert "install.sh --wheel /dist" in text, name
        assert "USER accum" in text, f"{name} runs as root"
    assert not list((ROOT / "docker").glob("*requirements*.txt"))


def test_api_image_installs_no_torch_and_proves_it_at_build() -> None:
    text = stage("api")
    assert '! python -c "import torch"' in text
    assert "'torch' not in sys.modules" in text, "the build proves the API imports no torch"


def test_worker_image_checks_the_torch_pin_and_runs_a_worker() -> None:
    text = stage("worker")
    assert "s/^torch==//p' /tmp/accum/constraints.txt" in text and "torch.__version__" in text
    command = re.search(r"^CMD (\[.*\])", text, re.M)
    assert command
    argv = yaml.safe_load(command.group(1))
    assert argv[0] in SCRIPTS and build_parser().parse_args(argv[1:]).command == "worker"
