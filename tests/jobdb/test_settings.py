"""Settings: ACCUM_* environment variables, defaults under ACCUM_HOME, clear errors."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from services.settings import Settings, get_settings


def test_defaults_live_under_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("DATABASE_URL", "BROKER_URL", "ARTIFACTS_DIR"):
        monkeypatch.delenv(f"ACCUM_{name}", raising=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ACCUM_HOME", "state")
    settings = get_settings()
    home = tmp_path / "state"
    assert settings.home == home.resolve() and settings.home.is_absolute()
    assert settings.database_url == f"sqlite:///{home.resolve() / 'accum.sqlite'}"
    assert settings.broker_url == f"sqlite:///{home.resolve() / 'broker.sqlite'}"
    assert settings.artifacts_path == home.resolve() / "artifacts"
    assert settings.lease_timeout_s == 60 and settings.max_body_bytes == 1024 * 1024


def test_environment_overrides_each_value(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("ACCUM_HOME", str(tmp_path))
    monkeypatch.setenv("ACCUM_DATABASE_URL", "postgresql://u@db:5432/accum")
    monkeypatch.setenv("ACCUM_BROKER_URL", "redis://r:6379/0")
    monkeypatch.setenv("ACCUM_ARTIFACTS_DIR", str(tmp_path / "blobs"))
    monkeypatch.setenv("ACCUM_LEASE_TIMEOUT_S", "30")
    settings = get_settings()
    # The bare scheme would need psycopg2, which is not installed: it is rewritten to psycopg 3.
    assert settings.database_url == "postgresql+psycopg://u@db:5432/accum"
    assert settings.broker_url == "redis://r:6379/0"
    assert settings.artifacts_path == tmp_path / "blobs"
    assert settings.lease_timeout_s == 30


def test_settings_are_read_when_built_not_at_import(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCUM_LEASE_TIMEOUT_S", "41")
    assert get_settings().lease_timeout_s == 41
    monkeypatch.setenv("ACCUM_LEASE_TIMEOUT_S", "42")
    assert get_settings().lease_timeout_s == 42


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"database_url": "mysql://x/y"}, "ACCUM_DATABASE_URL"),
        ({"broker_url": "kafka://x"}, "ACCUM_BROKER_URL"),
        ({"lease_timeout_s": 0}, "lease_timeout_s"),
        ({"lease_timeout_s": 3, "heartbeat_interval_s": 2}, "ACCUM_HEARTBEAT_INTERVAL_S"),
        ({"max_body_bytes": -1}, "max_body_bytes"),
        ({"sqlite_busy_timeout_s": "soon"}, "sqlite_busy_timeout_s"),
    ],
)
def test_nonsense_fails_naming_the_setting(
    tmp_path: Path, values: dict[str, object], message: str
) -> None:
    with pytest.raises(ValidationError, match=message):
        Settings(home=tmp_path, **values)  # type: ignore[arg-type]


@pytest.mark.parametrize(("name", "value", "words"), [
    ("ACCUM_RENDEZVOUS_PORTS", "29600-29500", "low to high"),
    ("ACCUM_RENDEZVOUS_PORTS", "80-90", "from 1024 to 65535"),
    ("ACCUM_RENDEZVOUS_PORTS", "29500,29501", "such as 29500-29599"),
    ("ACCUM_ADVERTISE_ADDRESS", "0.0.0.0", "names no single node"),
    ("ACCUM_ADVERTISE_ADDRESS", "node 2", "neither an IP address nor a host name"),
    ("ACCUM_GANG_FORM_TIMEOUT_S", "0", "greater than 0"),
])
def test_multi_node_settings_are_checked_at_start_up(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, name: str, value: str, words: str,
) -> None:
    monkeypatch.setenv("ACCUM_HOME", str(tmp_path))
    monkeypatch.setenv(name, value)
    with pytest.raises(ValidationError, match=words):
        get_settings()


def test_multi_node_settings_default_to_one_machine(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    monkeypatch.setenv("ACCUM_HOME", str(tmp_path))
    for name in ("ADVERTISE_ADDRESS", "RENDEZVOUS_PORTS", "GANG_FORM_TIMEOUT_S"):
        monkeypatch.delenv(f"ACCUM_{name}", raising=False)
    settings = get_settings()
    assert (settings.advertise_address, settings.rendezvous_ports) == ("127.0.0.1", "29500-29599")
    monkeypatch.setenv("ACCUM_ADVERTISE_ADDRESS", "node2.example.org")
    monkeypatch.setenv("ACCUM_RENDEZVOUS_PORTS", "40000")
    settings = get_settings()
    assert (settings.advertise_address, settings.rendezvous_ports) == ("node2.example.org", "40000")


def test_every_setting_is_in_the_configuration_page() -> None:
    page = (Path(__file__).resolve().parents[2] / "docs" / "configuration.md").read_text()
    missing = [name for name in Settings.model_fields if f"`ACCUM_{name.upper()}`" not in page]
    assert missing == [], "add a row to docs/configuration.md for each"


def test_every_accum_variable_the_code_names_is_in_the_configuration_page() -> None:
    """Not only the settings' fields: ACCUM_URL and ACCUM_TOKEN (the CLI's), and a name in a
    message or a docstring must be one a reader can look up (a stale one is caught here)."""
    root = Path(__file__).resolve().parents[2]
    page = (root / "docs" / "configuration.md").read_text()
    named = {name for folder in ("services", "src") for path in (root / folder).rglob("*.py")
             for name in re.findall(r"\bACCUM_[A-Z0-9_]*[A-Z0-9]\b", path.read_text())}
    assert sorted(name for name in named if f"`{name}`" not in page) == []
