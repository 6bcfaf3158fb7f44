"""Helpers every command shares: the client from the resolved config, spec files, job ids,
and API messages put in the CLI's words."""

from __future__ import annotations

import importlib.util
import re
import sys
from typing import Any

from accum import AccumClient
from accum.spec_file import SpecFileError, parse_spec_text, read_spec

FINAL_STATUSES = frozenset({"succeeded", "failed", "cancelled"})
# `accum watch` exits with the job's final status: scripts can tell the outcomes apart.
EXIT_CODES = {"succeeded": 0, "failed": 3, "cancelled": 4}
FULL_ID = 26
SHORT_ID = 6  # services.jobdb.types.SHORT_LEN
MIN_PREFIX = 4
ID_CHARACTERS = re.compile(r"[0-9a-z]+")


class UsageError(Exception):
    """Bad command-line input (exit code 2), e.g. a spec file that cannot be read."""


class CommandError(Exception):
    """A command that cannot do what was asked (exit code 1), said in one line."""


# What `pip install 'accum[worker]'` adds (pyproject): the commands that train need them.
WORKER_PACKAGES = ("torch", "torchvision", "numpy")


def require_worker_extra() -> None:
    """One line naming the extra, where `accum demo|up|worker` would end in a traceback."""
    missing = []
    for name in WORKER_PACKAGES:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            missing.append(name)
    if missing:
        raise CommandError(f"needs {' and '.join(missing)}, not installed here: "
                           "pip install 'accum[worker]'")


def make_client() -> AccumClient:
    """URL and token found as accum.config says (its errors say where they came from)."""
    return AccumClient()


def load_spec(path: str) -> dict[str, Any]:
    """Read a job spec from a .yaml/.yml/.json file, or '-' for stdin (JSON or YAML)."""
    try:
        if path == "-":
            return parse_spec_text(sys.stdin.read(), "-")
        return read_spec(path)
    except SpecFileError as exc:
        raise UsageError(str(exc)) from exc


def format_progress(job: dict[str, Any]) -> str:
    progress = job.get("progress") or {}
    step, total = progress.get("optimizer_step"), progress.get("total_optimizer_steps")
    if step is None:
        return "-"
    return f"{step}/{total}" if total else str(step)


def short_id(job_id: str) -> str:
    """A job's short id, what tables show and what `resolve_job_id` takes: the last characters
    of its id, random and unique among its owner's jobs (the first ten are the creation time,
    shared by every job of a few minutes); the full id or a prefix of it is accepted too."""
    return job_id[-SHORT_ID:]


def resolve_job_id(client: AccumClient, given: str) -> str:
    """A job id from its full form or a unique prefix of it (as git takes commit ids): the API
    resolves prefixes, and names the candidates of an ambiguous one."""
    text = given.strip().lower()
    if len(text) >= FULL_ID or not ID_CHARACTERS.fullmatch(text):
        return given  # the API says whether such a job exists
    if len(text) < MIN_PREFIX:
        raise UsageError(f"job id {given!r} is too short: give at least {MIN_PREFIX} characters")
    return str(client.job(text)["id"])


# The API's answers name its routes; a CLI user wants the command that does the same.
_ROUTES_AS_COMMANDS = [
    (re.compile(r"(?:GET|POST) /v1/jobs/([0-9a-z]+)/checkpoints\b"), r"`accum checkpoints \1`"),
    (re.compile(r"POST /v1/jobs/([0-9a-z]+)/resume\b"), r"`accum resume \1`"),
    (re.compile(r"POST /v1/jobs/([0-9a-z]+)/cancel\b"), r"`accum cancel \1`"),
    (re.compile(r"GET /v1/jobs/([0-9a-z]+)\b"), r"`accum status \1`"),
    (re.compile(r"GET /v1/jobs\b"), "`accum jobs`"),
    (re.compile(r"GET /v1/tokens\b"), "`accum token list`"),
    (re.compile(r"GET /v1/catalog/(models|datasets)\b"), r"`accum catalog \1`"),
    # POST .../resume's fields are `accum resume`'s options
    (re.compile(r"\bfrom_scratch: true\b"), "--from-scratch"),
    (re.compile(r"(?<![\w-])from_step: "), "--from-step: "),
]


def in_cli_words(message: str) -> str:
    """An API message with its route names replaced by the commands that do the same."""
    for pattern, command in _ROUTES_AS_COMMANDS:
        message = pattern.sub(command, message)
    if re.search(r"\b(model|dataset): .*\(\d+ choices: ", message):
        message += "; `accum catalog` lists them"
    return message
