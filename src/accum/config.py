"""Where the client and the CLI find the server: ACCUM_URL / ACCUM_TOKEN, else
ACCUM_HOME/local.json (`AccumClient()` with no arguments, and every `accum` command).

`accum up` writes local.json (mode 0600) with the URL it serves on and the local token, so a
second terminal needs no configuration. Each value is resolved on its own: ACCUM_URL alone
overrides the URL and keeps the token from local.json.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

DEFAULT_HOME = ".accum"  # the same default as services.settings.Settings.home
DEFAULT_URL = "http://127.0.0.1:8000"
LOCAL_CONFIG = "local.json"


class ConfigError(Exception):
    """The CLI cannot tell which server or token to use."""


@dataclass(frozen=True)
class ClientConfig:
    url: str
    token: str | None
    source: str  # where the values came from, for messages


def accum_home() -> Path:
    return Path(os.environ.get("ACCUM_HOME") or DEFAULT_HOME)


def local_config_path(home: Path | None = None) -> Path:
    return (home or accum_home()) / LOCAL_CONFIG


def read_local_config(home: Path | None = None) -> dict[str, str]:
    path = local_config_path(home)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}; delete it and run `accum up` again") from exc
    return {k: str(v) for k, v in data.items() if isinstance(v, str | int)}


def write_local_config(url: str, token: str, home: Path | None = None) -> Path:
    """Write url + token readable by the owner only (the token is a credential)."""
    path = local_config_path(home)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump({"url": url, "token": token}, out, indent=2)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)
    return path


def resolve_client_config() -> ClientConfig:
    """ACCUM_URL / ACCUM_TOKEN first, then ACCUM_HOME/local.json, then the default URL."""
    local = read_local_config()
    url = os.environ.get("ACCUM_URL") or local.get("url") or DEFAULT_URL
    token = os.environ.get("ACCUM_TOKEN") or local.get("token") or None
    if os.environ.get("ACCUM_URL") or os.environ.get("ACCUM_TOKEN"):
        source = "environment"
    elif local:
        source = str(local_config_path())
    else:
        source = "defaults"
    return ClientConfig(url=url.rstrip("/"), token=token, source=source)
