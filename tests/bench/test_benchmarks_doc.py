"""docs/benchmarks.md is what `make bench` writes from bench/results/ and bench/notes.md.

A figure typed into the doc by hand would be deleted by the next `make bench` (and a row whose
renderer broke would show as "unreadable"): the doc must equal its regeneration, so every
figure in it comes from a result row, and every section from bench/notes.md.
"""

from __future__ import annotations

from pathlib import Path

from bench import run_all

ROOT = Path(__file__).resolve().parents[2]


def test_the_doc_is_its_own_regeneration(tmp_path: Path) -> None:
    regenerated = tmp_path / "benchmarks.md"
    run_all.write_doc(run_all.bench_names(), regenerated)
    committed = (ROOT / "docs" / "benchmarks.md").read_text()
    assert committed == regenerated.read_text(), (
        "docs/benchmarks.md differs from `python -m bench.run_all --no-run`: put narrative in "
        "bench/notes.md and figures in bench/results/<name>.jsonl, then regenerate"
    )


def test_every_result_row_renders() -> None:
    unreadable = [name for name in run_all.bench_names() for result in run_all.latest(name)
                  for figure in _rows(name, result) if "unreadable row" in figure[2]]
    assert unreadable == []


def _rows(name: str, result: dict) -> list[tuple[str, str, str, str]]:
    try:
        return run_all.rows_for(name, result)
    except (KeyError, TypeError) as error:
        return [(name, "-", f"unreadable row ({error})", "-")]
