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
GPU_WORKERS = [name for name in SERVICES if name.startswith("worker")]
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
    assert set(OUR_SERVICES) >= {"migrate", "api", *GPU_WORKERS}


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
    for name in ["api", *GPU_WORKERS]:
        assert depends(SERVICES[name], "migrate") == "service_completed_successfully", name
        assert depends(SERVICES[name], "redis") == "service_healthy", name


def test_api_healthcheck_asks_readyz() -> None:
    healthcheck = SERVICES["api"]["healthcheck"]
    assert "/readyz" in " ".join(healthcheck["test"])
    assert healthcheck.get("start_period")


def test_every_worker_reserves_exactly_one_distinct_nvidia_gpu() -> None:
    assert len(GPU_WORKERS) >= 2, "show how a second worker is pinned to GPU 1"
    claimed: list[str] = []
    for name in GPU_WORKERS:
        devices = SERVICES[name]["deploy"]["resources"]["reservations"]["devices"]
        assert len(devices) == 1, name
        device = devices[0]
        assert device["driver"] == "nvidia"
        assert "gpu" in device["capabilities"]
        ids = device.get("device_ids")
        assert ids is not None or device.get("count") == 1, f"{name}: one GPU per worker"
        if ids is not None:
            assert len(ids) == 1, f"{name}: one GPU per worker"
            claimed.extend(ids)
    assert len(claimed) == len(set(claimed)), "two workers reserve the same GPU"


def test_api_and_workers_share_the_s3_store_and_no_artefacts_volume() -> None:
    url = SERVICES["api"]["environment"]["ACCUM_ARTIFACTS_URL"]
    assert re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", url) == "s3://accum/artifacts"
    for name in ["api", *GPU_WORKERS]:
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


@pytest.mark.parametrize("name", ["api.Dockerfile", "worker.Dockerfile"])
def test_dockerfiles_copy_files_that_exist(name: str) -> None:
    sources = []
    for line in dockerfile(name).splitlines():
        if line.startswith("COPY "):
            parts = [p for p in line.split()[1:] if not p.startswith("--")]
            sources.extend(parts[:-1])
    assert sources
    for source in sources:
        assert (ROOT / source).exists(), f"{name} copies {source}, which does not exist"


def test_our_images_are_built_here_from_dockerfiles_that_exist() -> None:
    for name in OUR_SERVICES:
        build = SERVICES[name].get("build")
        assert build, f"{name} would be pulled from a registry instead of built"
        assert (ROOT / build.get("context", ".") / build["dockerfile"]).is_file()


def test_api_image_is_slim_and_installs_no_torch() -> None:
    text = dockerfile("api.Dockerfile")
    base = re.search(r"^FROM (\S+)", text, re.M)
    assert base and "slim" in base.group(1) and "torch" not in base.group(1)
    assert "--no-deps" in text and "api-requirements.txt" in text
    requirements = (ROOT / "docker" / "api-requirements.txt").read_text().lower()
    for heavy in ("torch", "torchvision", "numpy", "scikit-learn"):
        assert not re.search(rf"^{heavy}\b", requirements, re.M), heavy
    assert "'torch' not in sys.modules" in text, "the build proves the API imports no torch"


def test_worker_image_is_built_on_a_cuda_pytorch_base() -> None:
    text = dockerfile("worker.Dockerfile")
    base = re.search(r"^ARG BASE=(\S+)", text, re.M)
    assert base and base.group(1).startswith("pytorch/pytorch:") and "cuda" in base.group(1)
    assert "FROM ${BASE}" in text
    command = re.search(r"^CMD (\[.*\])", text, re.M)
    assert command
    argv = yaml.safe_load(command.group(1))
    assert argv[0] in SCRIPTS and build_parser().parse_args(argv[1:]).command == "worker"
