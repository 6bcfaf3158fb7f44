"""Helpers every command shares: the client from the resolved config, spec files, output."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import yaml

from accum import AccumClient
from services.cli.config import resolve_client_config

FINAL_STATUSES = frozenset({"succeeded", "failed", "cancelled"})
# `accum watch` exits with the job's final status: scripts can tell the outcomes apart.
EXIT_CODES = {"succeeded": 0, "failed": 3, "cancelled": 4}


class UsageError(Exception):
    """Bad command-line input (exit code 2), e.g. a spec file that cannot be read."""


def make_client() -> AccumClient:
    config = resolve_client_config()
    return AccumClient(config.url, config.token)


def load_spec(path: str) -> dict[str, Any]:
    """Read a job spec from a .yaml/.yml/.json file, or '-' for stdin (JSON or YAML)."""
    if path == "-":
        text, suffix = sys.stdin.read(), ".yaml"
    else:
        file = Path(path)
        suffix = file.suffix.lower()
        if suffix not in (".yaml", ".yml", ".json"):
            raise UsageError(f"spec file {path} must end in .yaml, .yml or .json")
        try:
            text = file.read_text()
        except OSError as exc:
            raise UsageError(f"cannot read spec file {path}: {exc.strerror}") from exc
    try:
        spec = json.loads(text) if suffix == ".json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as exc:
        raise UsageError(f"spec file {path} is not valid {suffix[1:].upper()}: {exc}") from exc
    if not isinstance(spec, dict):
        raise UsageError(f"spec file {path} must hold a mapping of fields, not {type(spec).__name__}")
    return spec


def print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, sort_keys=True, default=str))


def format_progress(job: dict[str, Any]) -> str:
    progress = job.get("progress") or {}
    step, total = progress.get("optimizer_step"), progress.get("total_optimizer_steps")
    if step is None:
        return "-"
    return f"{step}/{total}" if total else str(step)


def print_table(headers: list[str], rows: list[list[str]]) -> None:
    """Plain aligned columns: readable in a terminal, greppable in scripts (no truncation)."""
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)]
    for line in [headers, *rows]:
        print("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip())
