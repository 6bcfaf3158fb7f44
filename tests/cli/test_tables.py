"""What the CLI prints about jobs, at 80 columns: `jobs` (short ids, times to the second, an
OWNER column for admins, long names cut), `status` (model, m x N x GPUs, queue, ETA, NaN by
name), `checkpoints` (short sha256), `metrics` (a summary, `--all`, CSV), ids by unique
prefix, and epochs counted from 1 everywhere."""

from __future__ import annotations

import csv
import io
import math
import re
from typing import Any

import pytest
from cli_helpers import accum_in_process as accum
from cli_helpers import assert_fits, unwrapped

from accum import AccumClient

SECONDS = re.compile(r"\b\d\d:\d\d:\d\d\b")


def test_jobs_fit_80_columns_with_short_ids_and_an_owner_column_for_admins(
    cli_env: Any, capsys: pytest.CaptureFixture[str], client: AccumClient,
    tiny_spec: dict[str, Any], admin_token: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    long_name = "a-rather-long-experiment-name-that-says-everything-about-its-settings"
    ids = [client.submit({**tiny_spec, "name": f"{long_name}-{i}"})["id"] for i in range(14)]

    code, out, _ = accum(capsys, "jobs", "--limit", "14")
    assert code == 0
    assert_fits(out)
    lines = out.splitlines()
    assert lines[0].split() == ["ID", "NAME", "STATUS", "STEP", "CREATED"]
    assert [line[:6] for line in lines[1:15]] == [i[-6:] for i in reversed(ids)]
    assert all("…" in line and SECONDS.search(line) for line in lines[1:15])
    assert not re.search(r"\d\d:\d\d:\d\d\.\d", out), "no fractions of a second"

    monkeypatch.setenv("ACCUM_TOKEN", admin_token)
    code, out, _ = accum(capsys, "jobs", "--limit", "14")
    assert code == 0
    assert_fits(out)
    assert out.splitlines()[0].split()[-1] == "OWNER"
    assert all(line.rstrip().endswith("cli-tests") for line in out.splitlines()[1:15])


def test_status_shows_model_batch_queue_eta_and_nan_by_name(
    cli_env: Any, capsys: pytest.CaptureFixture[str], client: AccumClient, seed: Any,
    tiny_spec: dict[str, Any],
) -> None:
    spec = {k: v for k, v in tiny_spec.items() if k != "epochs"}
    job = client.submit({**spec, "name": "diverging", "max_steps": 400})
    seed.claim(job["id"], "w1")
    seed.progress(job["id"], 100, {"loss": math.nan, "samples_per_s": 640.0, "val_loss": 0.5}, epoch=0)

    code, out, _ = accum(capsys, "status", job["id"][:12])

    assert code == 0
    assert_fits(out)
    fields = {line.split("  ", 1)[0].strip(): line.split("  ", 1)[1].strip()
              for line in out.split("\nattempts\n")[0].splitlines() if not line.startswith(" ")}
    assert fields["id"] == job["id"]
    assert fields["model"] == "mlp on digits"
    assert fields["batch"] == "16 x 4 x 1 GPU = 64  (m x N x GPUs)"
    assert fields["queue"] == "default"
    assert fields["progress"] == "step 100/400 (25%), epoch 1"
    assert fields["eta"] == "30 s (at 640 samples/s)"  # 300 steps x 64 samples / 640 per s
    assert fields["loss"] == "NaN" and fields["val_loss"] == "0.5"
    assert SECONDS.search(fields["started"])


def test_a_run_stopped_by_nan_shows_the_nan_where_it_stopped(
    cli_env: Any, capsys: pytest.CaptureFixture[str], client: AccumClient, seed: Any,
    tiny_spec: dict[str, Any],
) -> None:
    job = client.submit(tiny_spec)
    seed.claim(job["id"], "w1")
    seed.progress(job["id"], 6, {"loss": 1.76e18})  # the last finite window before the NaN
    seed.finish(job["id"], "w1", "failed", {
        "type": "NonFiniteError", "message": "step 7: loss is nan; ...",
        "nonfinite": {"step": 7, "metric": "loss", "value": "NaN"},
    })

    listed = next(j for j in client.jobs(limit=50)["items"] if j["id"] == job["id"])
    for answer in (listed, client.job(job["id"])):
        assert answer["latest_metrics"]["loss"] is None and answer["nonfinite_metrics"]["loss"] == "NaN"
        assert answer["error"]["nonfinite"] == {"step": 7, "metric": "loss", "value": "NaN"}

    code, out, _ = accum(capsys, "status", job["id"])
    assert code == 0
    assert_fits(out)
    loss = next(line for line in out.splitlines() if line.startswith("loss "))
    assert loss.split(None, 1)[1] == "NaN at step 7 (stopped the run)"
    assert "1.76e+18" not in out


def test_status_prints_the_exactness_check_on_one_line(
    cli_env: Any, capsys: pytest.CaptureFixture[str], client: AccumClient, seed: Any,
    tiny_spec: dict[str, Any],
) -> None:
    def line(job_id: str) -> list[str]:  # the value of the `exactness` line(s)
        code, out, _ = accum(capsys, "status", job_id)
        assert code == 0
        assert_fits(out)
        return [row.split("  ", 1)[1].strip() for row in out.splitlines() if row.startswith("exactness")]

    job = client.submit(tiny_spec)
    assert line(job["id"]) == ["not checked yet"]
    seed.event(job["id"], "exactness_check", "first window = big batch: relative error 3.1e-08",
               {"rel_error": 3.1e-8, "tolerance": 1e-6, "passed": True}, attempt=1)
    assert line(job["id"]) == ["first window = big batch, rel. error 3.1e-08"]
    seed.event(job["id"], "exactness_check", "first window != big batch: relative error 0.67",
               {"rel_error": 0.67, "tolerance": 1e-6, "passed": False}, attempt=2)
    assert line(job["id"]) == ["NOT exact, rel. error 0.67 > 1e-06 (cause: accum watch ID)"]


def test_ids_are_taken_by_unique_prefix(
    cli_env: Any, capsys: pytest.CaptureFixture[str], client: AccumClient,
    tiny_spec: dict[str, Any],
) -> None:
    first, second = client.submit(tiny_spec), client.submit(tiny_spec)
    common = next(i for i in range(26) if first["id"][i] != second["id"][i])

    code, out, _ = accum(capsys, "cancel", second["id"][: common + 1])
    assert code == 0 and out.strip() == f"job {second['id']}: cancelled"

    code, _, err = accum(capsys, "status", first["id"][:common])
    assert code == 1 and "is ambiguous" in unwrapped(err) and "give more characters" in unwrapped(err)
    code, _, err = accum(capsys, "status", "zzzzzz")
    assert code == 1 and "no job id starts with 'zzzzzz'" in unwrapped(err)
    code, _, err = accum(capsys, "status", "01")
    assert code == 2 and "at least 4 characters" in err


def test_checkpoints_show_short_sha256_sizes_and_epochs_from_1(
    cli_env: Any, capsys: pytest.CaptureFixture[str], client: AccumClient, seed: Any,
    tiny_spec: dict[str, Any],
) -> None:
    job = client.submit(tiny_spec)
    seed.checkpoint(job["id"], 23, b"w" * 3000)

    code, out, _ = accum(capsys, "checkpoints", job["id"])

    assert code == 0
    assert_fits(out)
    header, row = out.splitlines()[:2]
    assert header.split() == ["STEP", "EPOCH", "SIZE", "VAL_LOSS", "SHA256", "CREATED"]
    cells = row.split()
    assert cells[:5] == ["23", "*", "1", "2.9", "KiB"]  # stored epoch 0 is the first epoch
    assert re.fullmatch(r"[0-9a-f]{12}", cells[6])
    assert SECONDS.search(row)
    assert out.splitlines()[-1] == "* best val_loss (kept beside the latest ones)"


def test_metrics_summary_all_rows_and_csv_count_epochs_from_1(
    cli_env: Any, capsys: pytest.CaptureFixture[str], client: AccumClient, seed: Any,
    tiny_spec: dict[str, Any],
) -> None:
    job = client.submit(tiny_spec)
    values = [2.0, 0.5, 1.0, math.nan]
    seed.rows(job["id"], [
        {"name": "loss", "step": s, "epoch": (s - 1) // 2, "value": v}
        for s, v in enumerate(values, start=1)
    ] + [{"name": "lr", "step": s, "epoch": (s - 1) // 2, "value": 0.1} for s in range(1, 5)])

    code, out, _ = accum(capsys, "metrics", job["id"])
    assert code == 0
    assert_fits(out)
    assert [line.split() for line in out.splitlines()] == [
        ["NAME", "LAST", "STEP", "LAST", "MIN", "MAX"],
        ["loss", "4", "NaN", "0.5", "2"],
        ["lr", "4", "0.1", "0.1", "0.1"],
    ]

    code, out, _ = accum(capsys, "metrics", job["id"], "--all")
    assert code == 0
    rows = [line.split() for line in out.splitlines()]
    assert rows[0] == ["NAME", "STEP", "EPOCH", "VALUE"] and len(rows) == 9
    assert rows[1:5] == [["loss", "1", "1", "2"], ["loss", "2", "1", "0.5"],
                         ["loss", "3", "2", "1"], ["loss", "4", "2", "NaN"]]

    code, out, _ = accum(capsys, "metrics", job["id"], "--name", "loss", "--csv")
    assert code == 0
    table = list(csv.DictReader(io.StringIO(out)))
    assert [(r["step"], r["epoch"], r["value"]) for r in table] == [
        ("1", "1", "2.0"), ("2", "1", "0.5"), ("3", "2", "1.0"), ("4", "2", "NaN"),
    ]


def test_edit_names_tags_and_notes_a_job_and_jobs_filters_by_them(
    cli_env: Any, capsys: pytest.CaptureFixture[str], client: AccumClient,
    tiny_spec: dict[str, Any],
) -> None:
    job = client.submit(tiny_spec)
    other = client.submit({**tiny_spec, "name": "not-this-one"})
    code, out, _ = accum(capsys, "edit", job["id"][:12], "--name", "baseline-cli", "--tag", "cli-sweep",
                         "--tag", "lr:0.1", "--notes", "the reference run")
    assert code == 0 and out.strip() == f"job {job['id']}: name baseline-cli, tags cli-sweep, lr:0.1"
    code, out, _ = accum(capsys, "status", job["id"])
    fields = {line.split("  ", 1)[0]: line.split("  ", 1)[1].strip() for line in out.splitlines()
              if not line.startswith(" ")}
    assert (fields["tags"], fields["notes"]) == ("cli-sweep, lr:0.1", "the reference run")

    code, out, _ = accum(capsys, "jobs", "--tag", "cli-sweep")
    assert code == 0 and "baseline-cli" in out and other["id"][-6:] not in out
    assert [j["id"] for j in client.jobs(q="REFERENCE RUN")["items"]] == [job["id"]]
    code, out, _ = accum(capsys, "jobs", "--search", "no-such-text-anywhere")
    assert out.strip() == "no jobs with those tags or text"
    code, _, err = accum(capsys, "edit", job["id"])
    assert code == 2 and "--name, --tag or --notes" in err
    assert accum(capsys, "edit", job["id"], "--tag", "")[0] == 0
    assert client.job(job["id"])["tags"] == []
