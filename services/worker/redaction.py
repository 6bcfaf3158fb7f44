"""Secrets a worker holds, kept out of what a job's owner reads (its captured output).

    redact = Redactor.of_worker(settings, os.environ)
    redact("connecting with hunter2-long-secret")   # 'connecting with [redacted AWS_SECRET_ACCESS_KEY]'

A secret is the value of an environment variable whose name says so (``*SECRET*``,
``*TOKEN*``, ``*PASSWORD*``, ``*API_KEY*``, ``*ACCESS_KEY*``, ``*CREDENTIAL*``, ...), and the
password of any URL in the environment or in the database and broker settings. Values shorter
than ``MIN_SECRET_CHARS`` are left alone (``1`` or ``true`` would redact every line). The
node's synced data cache is named by the s3 root it came from, as in errors
(``services.worker.datasets.named_as_synced``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from urllib.parse import unquote, urlsplit

from services.settings import Settings
from services.worker.datasets import named_as_synced

MIN_SECRET_CHARS = 6
SECRET_NAME = re.compile(
    r"SECRET|TOKEN|PASSWORD|PASSWD|_PASS$|API_?KEY|ACCESS_KEY|PRIVATE|CREDENTIAL|AUTH|SESSION",
    re.IGNORECASE,
)
_URL = re.compile(r"[a-z][a-z0-9+.-]*://[^\s'\"]+", re.IGNORECASE)


class Redactor:
    """Replaces each secret by ``[redacted NAME]``, longest first."""

    def __init__(self, secrets: Mapping[str, str], settings: Settings | None = None) -> None:
        kept = {value: name for name, value in secrets.items() if len(value) >= MIN_SECRET_CHARS}
        self.secrets = sorted(kept.items(), key=lambda item: -len(item[0]))
        self.settings = settings
        self.longest = max((len(value.encode()) for value in kept), default=0)

    @classmethod
    def of_worker(cls, settings: Settings, environ: Mapping[str, str]) -> Redactor:
        secrets: dict[str, str] = {}
        sources = [*environ.items(), ("ACCUM_DATABASE_URL", settings.database_url),
                   ("ACCUM_BROKER_URL", settings.broker_url)]
        for name, value in sources:
            if SECRET_NAME.search(name):
                secrets[name] = value
            for url in _URL.findall(value or ""):
                password = _password(url)
                if password:
                    secrets[f"{name} password"] = password
                    if unquote(password) != password:  # as a client would print it
                        secrets[f"{name} password (decoded)"] = unquote(password)
        return cls(secrets, settings)

    def __call__(self, text: str) -> str:
        for value, name in self.secrets:
            if value in text:
                text = text.replace(value, f"[redacted {name}]")
        return named_as_synced(self.settings, text) if self.settings is not None else text


def _password(url: str) -> str | None:
    try:
        return urlsplit(url).password
    except ValueError:
        return None
