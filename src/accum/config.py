"""Where the client and the CLI find the server (`AccumClient()` with no arguments, and every
`accum` command), the first that is there:

1. ACCUM_URL / ACCUM_TOKEN (each on its own: ACCUM_TOKEN alone keeps the URL found below);
2. ACCUM_HOME/local.json when ACCUM_HOME is set (and nothing else);
3. ./.accum/local.json, else the nearest parent folder's (a project's `accum up`);
4. the per-user record, $XDG_CONFIG_HOME/accum/local.json (default ~/.config/accum/): the
   service `accum up` started last, from whichever folder, or the server of `accum login`;
5. http://127.0.0.1:8000 and no token.

`accum up` writes its ACCUM_HOME/local.json and the per-user record (mode 0600: the token is a
credential). A file's token goes only to that file's URL: ACCUM_URL naming another server gets
the token of the record for that URL, if any, never another server's.
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
    source: str  # where the URL came from, for messages
    token_source: str = ""  # where the token came from ("" when there is none)

    def unreachable_hint(self) -> str:
        """What to do when nothing answers at `url`."""
        if self.source == "ACCUM_URL":
            return "is a server running there? Unset ACCUM_URL to use the one `accum up` recorded"
        if self.source == "defaults":
            return (f"no service found: no .accum/local.json here or in a parent folder, nor "
                    f"{user_config_path()}; start one with `accum up`, or set ACCUM_URL and "
                    "ACCUM_TOKEN")
        return (f"the URL is from {self.source}, written by `accum up`: start it again there, "
                "or set ACCUM_URL")

    def refused_hint(self) -> str:
        """What to do when the server answers 401."""
        if not self.token:
            return (f"no token for {self.url} (from {self.source}): set ACCUM_TOKEN, which "
                    "`accum token create NAME` makes where the service's database is")
        if self.token_source == "ACCUM_TOKEN":
            return f"{self.url} refused ACCUM_TOKEN: set it to a live token of that server"
        return (f"{self.url} refused the token in {self.token_source}: `accum up` writes a "
                "new one when it starts; or set ACCUM_TOKEN")


def accum_home() -> Path:
    return Path(os.environ.get("ACCUM_HOME") or DEFAULT_HOME)


def local_config_path(home: Path | None = None) -> Path:
    return (home or accum_home()) / LOCAL_CONFIG


def user_config_path() -> Path:
    """The per-user record: $XDG_CONFIG_HOME/accum/local.json, default ~/.config/accum/."""
    base = os.environ.get("XDG_CONFIG_HOME", "")
    root = Path(base) if base and Path(base).is_absolute() else Path.home() / ".config"
    return root / "accum" / LOCAL_CONFIG


def read_local_config(home: Path | None = None) -> dict[str, str]:
    return read_config_file(local_config_path(home))


def read_config_file(path: Path) -> dict[str, str]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}; delete it and run `accum up` again") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"cannot read {path}: not a JSON object; delete it and run `accum up` again")
    return {k: str(v) for k, v in data.items() if isinstance(v, str | int)}


def write_config_file(path: Path, values: dict[str, str]) -> Path:
    """Write `values` readable by the owner only (a token is a credential)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump(values, out, indent=2)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)
    return path


def write_local_config(url: str, token: str, home: Path | None = None) -> Path:
    return write_config_file(local_config_path(home), {"url": url, "token": token})


def folder_homes() -> list[Path]:
    """./.accum and the .accum of every parent folder, nearest first (those that exist)."""
    here = Path.cwd()
    return [home for folder in (here, *here.parents) if (home := folder / DEFAULT_HOME).is_dir()]


def find_local_config() -> tuple[Path | None, dict[str, str]]:
    """The file the CLI reads (steps 2-4 above) and its values; (None, {}) when there is none."""
    if os.environ.get("ACCUM_HOME"):
        path = local_config_path()
        return path, read_config_file(path)
    candidates = [home / LOCAL_CONFIG for home in folder_homes()] + [user_config_path()]
    for path in candidates:
        if path.is_file():
            return path, read_config_file(path)
    return None, {}


def same_server(a: str, b: str) -> bool:
    def norm(url: str) -> str:
        return url.strip().rstrip("/").lower().replace("://localhost", "://127.0.0.1")

    return bool(a and b) and norm(a) == norm(b)


def resolve_client_config(url: str | None = None) -> ClientConfig:
    """The URL and token to use (the order in this module's docstring); `url` given (as
    `AccumClient(url)` does) counts as ACCUM_URL."""
    path, found = find_local_config()
    given = url or os.environ.get("ACCUM_URL")
    url = given or found.get("url") or DEFAULT_URL
    if given:
        source = "the URL given" if url != os.environ.get("ACCUM_URL") else "ACCUM_URL"
    else:
        source = str(path) if found.get("url") else "defaults"
    token, token_source = os.environ.get("ACCUM_TOKEN") or None, "ACCUM_TOKEN"
    if token is None:
        token_source = ""
        records = [(path, found)]
        if given and path != user_config_path():
            records.append((user_config_path(), read_config_file(user_config_path())))
        for record_path, record in records:
            if record.get("token") and same_server(record.get("url", ""), url):
                token, token_source = record["token"], str(record_path)
                break
    return ClientConfig(url=url.rstrip("/"), token=token, source=source, token_source=token_source)
