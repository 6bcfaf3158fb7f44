"""Run a bench script in ``--quick`` mode against this machine's PostgreSQL and Redis."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def run_quick_bench(name: str, postgres_url: str, env: dict[str, str], out: Path) -> dict[str, Any]:
    """``python -m bench.service.<name> --quick --out out`` with ``env`` added; the JSON row it printed, checked
    to be a quick row of that bench and to be the row it appended to ``out/<name>.jsonl``."""
    completed = subprocess.run(
        [sys.executable, "-m", f"bench.service.{name}", "--quick", "--out", str(out)],
        cwd=ROOT, env={**os.environ, "ACCUM_TEST_POSTGRES_URL": postgres_url, **env},
        capture_output=True, text=True, timeout=240,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    result: dict[str, Any] = json.loads(completed.stdout.strip().splitlines()[-1])
    assert result["bench"] == name and result["quick"] is True
    assert json.loads((out / f"{name}.jsonl").read_text().splitlines()[-1]) == result
    return result
