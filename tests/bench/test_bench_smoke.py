"""Every bench script runs in --quick mode and prints one valid JSON object describing the
machine and its figure; the peers are never installed here (they report "peer not
installed"); run_all renders the table from result rows and skips smoke rows.

The scripts run in this process (importing torch once for all of them), except the DDP one,
which spawns its own processes and so runs as a subprocess, as `make bench` runs it.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench import run_all

ROOT = Path(__file__).resolve().parents[2]
IN_PROCESS = ["trainer_vs_loop", "trainer_vs_lightning", "exactness", "memory",
              "accumulation_cost", "auto_micro_batch", "resnet50_h100", "prefetch_memory", "host_cost",
              "fit_setup", "job_start",
              pytest.param("memory_levers", marks=pytest.mark.slow)]  # ~20 s: importing timm under load
PEERS_HERE = all(importlib.util.find_spec(name) for name in ("lightning", "accelerate"))


def _run_in_process(name: str, argv: list[str], capsys: pytest.CaptureFixture[str],
                    monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    module_name = run_all.bench_modules()[name]
    monkeypatch.setattr(sys, "argv", [module_name, *argv])
    module = importlib.import_module(module_name)
    capsys.readouterr()  # drop anything printed while importing
    module.main()
    lines = [line for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert len(lines) == 1, f"{name} must print exactly one JSON line, got {lines}"
    return json.loads(lines[0])


def _check_common(result: dict[str, Any], name: str) -> None:
    assert result["bench"] == name and result["quick"] is True
    machine = result["machine"]
    assert machine["cores"] >= 1 and machine["cpu"] and machine["torch"] and machine["device"] in ("cpu", "cuda")
    assert "figure" in result and "target" in result and "verdict" in result


@pytest.mark.parametrize("name", IN_PROCESS)
def test_bench_script_prints_valid_json_in_quick_mode(name: str, capsys, monkeypatch, tmp_path) -> None:
    result = _run_in_process(name, ["--quick", "--out", str(tmp_path)], capsys, monkeypatch)
    _check_common(result, name)
    # --out appends the same object as one row.
    rows = (tmp_path / f"{name}.jsonl").read_text().splitlines()
    assert json.loads(rows[-1]) == result
    if name in ("trainer_vs_lightning", "exactness") and not PEERS_HERE:
        reason = result["peers_status"] if name == "trainer_vs_lightning" else result["errors"]["lightning"]["status"]
        assert reason.startswith("peer not installed")
    if name == "exactness":
        # Even in quick mode the figure is real: ours is exact, the tutorial loop is not.
        assert result["measured"] <= 1e-6
        assert result["errors"]["tutorial_loop"]["short_last_window"] > 0.1
        # 2 DDP ranks (forked under exactness_fsdp._run's timeout), one without a micro-batch in the last window.
        assert result["corners"]["ddp_uneven_shards"]["accum"]["error"] <= 1e-12, result["corners"]
        # Issue 29: FSDP on 2 gloo ranks with shards of 7 and 6, both sync modes, equals the big batch.
        fsdp = result["corners"]["fsdp_uneven_shards"]
        assert max(fsdp[mode]["error"] for mode in ("accum", "accum_window_sync")) <= 1e-12, fsdp
        # Issue 28: the LM head's shift told from its loss; every mistake caught with its fix.
        lm_head = result["unshifted_lm_head"]
        assert lm_head["accum"]["max_abs_diff"] <= 1e-12 < lm_head["accum_name_guess"]["max_abs_diff"]
        assert result["one_micro_batch_first_window"]["accum"]["check_status"] == "passed"
        fixes = {"reduction": "reduction='mean'", "count_items": "count_items=", "shift_labels": "shift_labels="}
        for name, row in result["detection"].items():
            if name == "row_mean_on_full_rows_only":  # no mistake on this data: never "passed"
                assert row["status"] == "pending" and row["pending"], row
            else:
                assert row["caught"] and fixes[row["cause"]] in row["fix"], (name, row)
        assert result["detection"]["row_mean_counted_as_tokens_first_window_full_rows"]["at_window"] == 2
    if name == "job_start":  # a job through the worker's run_job, its phases as the worker timed them
        embedded = result["figures"]["embedded"]
        assert 0 < embedded["first_step_s"] < embedded["total_s"]
        assert {"claim", "build", "train", "finish"} <= set(embedded["phases"])
        assert run_all.job_start_rows(result)[0][2] == f"{embedded['first_step_s']:.3f}"
    if name == "prefetch_memory":  # the device-resident peak no longer grows with N
        assert result["measured"] < result["before_fix_max_ratio"]
    if name == "resnet50_h100" and result["machine"]["device"] == "cpu":
        assert result["measured"] is None and result["skipped"].startswith("no GPU")


def test_ddp_bench_runs_two_gloo_processes_in_quick_mode(tmp_path) -> None:
    completed = subprocess.run(
        [sys.executable, "-m", "bench.trainer.ddp_no_sync", "--quick"],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )
    assert completed.returncode == 0, completed.stderr[-2000:]
    result = json.loads(completed.stdout.strip().splitlines()[-1])
    _check_common(result, "ddp_no_sync")
    assert result["step_s_no_sync"] > 0 and result["step_s_sync_every"] > 0


def test_world_invariance_bench_runs_gloo_ranks_in_quick_mode() -> None:
    completed = subprocess.run(
        [sys.executable, "-m", "bench.trainer.world_invariance", "--quick"],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )
    assert completed.returncode == 0, completed.stderr[-2000:]
    result = json.loads(completed.stdout.strip().splitlines()[-1])
    _check_common(result, "world_invariance")
    # Even in quick mode the figure is real: 2 and 3 ranks, and the resumes, match in float64.
    assert set(result["float64"]["world_vs_one_process"]) == {"2", "3"}
    assert result["measured"] <= 1e-12 and result["verdict"] == "pass"


@pytest.mark.slow
def test_fsdp_memory_bench_runs_each_mode_on_two_gloo_processes_in_quick_mode() -> None:
    completed = subprocess.run(
        [sys.executable, "-W", "ignore::UserWarning", "-m", "bench.trainer.fsdp_memory", "--quick"],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )
    assert completed.returncode == 0, completed.stderr[-2000:]
    result = json.loads(completed.stdout.strip().splitlines()[-1])
    _check_common(result, "fsdp_memory")
    by_world = result["by_world"]["2"]
    assert set(by_world["peak_mb"]) == {"ddp", "micro_batch", "window"}
    assert all(value > 0 for value in [*by_world["peak_mb"].values(), *by_world["step_s"].values()])


def test_run_all_renders_the_latest_real_row_of_each_bench(tmp_path, monkeypatch) -> None:
    results = tmp_path / "results"
    results.mkdir()
    machine = {"cpu": "Test CPU", "cores": 2, "torch": "x", "device": "cpu"}
    rows = [
        {"bench": "memory", "quick": False, "when": "T1", "machine": machine, "target": 1.02,
         "measured": 1.5, "verdict": "miss", "big_batch_ratio": 0.3},
        {"bench": "memory", "quick": False, "when": "T2", "machine": machine, "target": 1.02,
         "measured": 1.01, "verdict": "pass", "big_batch_ratio": 0.27},
        {"bench": "memory", "quick": True, "when": "T3", "machine": machine, "target": 1.02,
         "measured": 9.0, "verdict": "miss", "big_batch_ratio": 0.9},
    ]
    (results / "memory.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    monkeypatch.setattr(run_all, "RESULTS", results)
    doc = tmp_path / "benchmarks.md"
    run_all.write_doc(["memory", "exactness"], doc)
    text = doc.read_text()
    assert "| memory | peak(m,N) / peak(m,1), Trainer, small_cnn | <= 1.02 | 1.010 | pass | Test CPU x2 cores" in text
    assert "T3" not in text and "T1" not in text  # smoke rows and older rows are not shown
    assert "| exactness | - | - | - | not run yet |" in text


def test_run_all_shows_the_newest_row_of_each_device_and_drops_the_cpu_rows_gpu_placeholder(
    tmp_path, monkeypatch
) -> None:
    results = tmp_path / "results"
    results.mkdir()
    cpu = {"cpu": "Test CPU", "cores": 2, "torch": "x", "device": "cpu"}
    gpu = {"cpu": "Test CPU", "cores": 16, "torch": "x", "device": "cuda", "gpu": "Test GPU"}
    rows = [
        {"bench": "resnet50_h100", "quick": False, "when": "T1", "machine": cpu, "target": 3000.0,
         "measured": None, "verdict": "not measured", "skipped": "no GPU: torch.cuda.is_available() is False"},
        {"bench": "resnet50_h100", "quick": False, "when": "T2", "machine": gpu, "target": 3000.0,
         "measured": 3500.0, "verdict": "pass"},
        {"bench": "memory", "quick": False, "when": "T3", "machine": gpu, "target": 1.02,
         "measured": 1.0, "verdict": "pass", "big_batch_ratio": 0.22},
        {"bench": "memory", "quick": False, "when": "T4", "machine": cpu, "target": 1.02,
         "measured": 1.01, "verdict": "pass", "big_batch_ratio": 0.27},
    ]
    for name in ("resnet50_h100", "memory"):
        (results / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows if r["bench"] == name))
    monkeypatch.setattr(run_all, "RESULTS", results)
    doc = tmp_path / "benchmarks.md"
    run_all.write_doc(["resnet50_h100", "memory"], doc)
    text = doc.read_text()
    assert "| 3500.000 | pass | Test GPU" in text
    assert "T1" not in text  # the CPU run's "no GPU" line: the GPU row holds that figure
    assert "| 1.010 | pass | Test CPU" in text and "| 1.000 | pass | Test GPU" in text  # a later CPU run hides no GPU row
