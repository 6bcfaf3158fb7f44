"""`accum demo`'s last lines: where the results are and how to read them again, at the URL
`accum up` serves them on (the demo's own service ran on a free port and is stopped), with no
token printed (one would stay in the terminal's scrollback and in CI logs)."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.cli.demo import _report
from services.settings import Settings


def test_the_demo_ends_with_accum_ups_url_and_no_secret(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    job = {"id": "01jdemo0000000000000000000", "status": "succeeded"}
    _report(Settings(home=tmp_path), job, 0.9556, [{"step": 92}], elapsed_s=42.0)
    out = capsys.readouterr().out

    assert "final validation accuracy: 95.56%" in out
    assert "at http://127.0.0.1:8000, the dashboard too" in out
    assert f"'http://127.0.0.1:8000/v1/jobs/{job['id']}/metrics?name=val_accuracy'" in out
    assert 'Bearer $TOKEN' in out and "TOKEN=$(accum token create my-curl)" in out
    assert "Bearer accum_" not in out  # the report is given no token: nothing to leak
