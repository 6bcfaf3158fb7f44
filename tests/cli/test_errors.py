"""The CLI's errors at 80 columns: one line in its own words (each field error once, by the
spec's path; commands, not API routes), a metric that does not exist, `--version`, a bad
output path, and the commands that train without the `[worker]` extra."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import accum_env, assert_fits, one_entry, unwrapped
from cli_helpers import accum_in_process as accum

from accum import AccumClient


def write_spec(tmp_path: Path, spec: dict[str, Any]) -> str:
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    return str(path)


def test_each_field_error_is_said_once_by_its_spec_path(
    cli_env: Any, capsys: pytest.CaptureFixture[str], tmp_path: Path, tiny_spec: dict[str, Any]
) -> None:
    spec = {**tiny_spec, "micro_batch_size": 0, "optimizer": {"name": "sgd", "lr": -1}}
    code, out, err = accum(capsys, "submit", write_spec(tmp_path, spec))

    assert code == 1 and out == ""
    assert_fits(err)
    head, *fields = err.splitlines()
    assert head == "accum submit: 422 Invalid request (2 fields):"
    # One field a line (a wrapped one indented under it), each named once.
    starts = [line for line in fields if not line.startswith("    ")]
    assert [line.split(":")[0] for line in starts] == ["  micro_batch_size", "  optimizer.lr"]
    assert starts[0].startswith("  micro_batch_size: must be an integer from 1")
    assert err.count("micro_batch_size") == 1
    assert "body." not in err


def test_a_misspelt_field_and_the_submitted_line_fit_80_columns(
    cli_env: Any, capsys: pytest.CaptureFixture[str], tmp_path: Path, tiny_spec: dict[str, Any]
) -> None:
    code, _, err = accum(capsys, "submit", write_spec(tmp_path, {**tiny_spec, "epochz": 1}))
    assert code == 1
    assert_fits(err)
    assert unwrapped(err) == "accum submit: 422 Invalid request: epochz: unknown field 'epochz'; did you mean epochs?"

    named = {**tiny_spec, "name": "a-rather-long-experiment-name-for-the-submitted-line"}
    code, out, _ = accum(capsys, "submit", write_spec(tmp_path, named))
    assert code == 0
    assert_fits(out)
    first, *rest = out.splitlines()
    assert first.startswith("submitted job ") and rest and all(r.startswith("  ") for r in rest)
    words = " ".join(line.strip() for line in out.splitlines()).split()
    assert f"({named['name']}):" in words and ["effective", "batch", "16", "x", "4", "x", "CPU", "=", "64"][-1] in words


def test_an_unknown_model_names_the_closest_not_all_eighty(
    cli_env: Any, capsys: pytest.CaptureFixture[str], tmp_path: Path, tiny_spec: dict[str, Any]
) -> None:
    code, _, err = accum(capsys, "submit", write_spec(tmp_path, {**tiny_spec, "model": "resnet-18"}))

    assert code == 1 and len(err.splitlines()) <= 4
    assert_fits(err)
    err = " ".join(line.strip() for line in err.splitlines())
    assert "model: unknown model 'resnet-18'; did you mean resnet18" in err
    assert "choices: " in err and "`accum catalog` lists them" in err
    assert err.count("vgg") == 0 and len(err) < 400


def test_a_missing_job_points_at_the_command_not_the_route(
    cli_env: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = accum(capsys, "status", "0" * 26)

    assert code == 1 and one_entry(err)
    assert "list yours with `accum jobs`" in unwrapped(err) and "/v1/" not in err


def test_a_metric_the_job_lacks_is_an_error_listing_those_it_has(
    cli_env: Any, capsys: pytest.CaptureFixture[str], job_with_metrics: str
) -> None:
    code, out, err = accum(capsys, "metrics", job_with_metrics, "--name", "nosuch")

    assert code == 1 and out == ""
    assert unwrapped(err) == f"accum metrics: job {job_with_metrics} has no metric 'nosuch'; it has: loss, lr"


def test_catalog_lists_models_and_datasets_in_80_columns(
    cli_env: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = accum(capsys, "catalog")

    assert code == 0
    assert out.splitlines()[0].split() == ["MODEL", "DESCRIPTION"]
    assert any(line.startswith("resnet18 ") for line in out.splitlines())
    assert "DATASET" in out and "digits" in out
    assert all(len(line) <= 80 for line in out.splitlines())


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    from accum import __version__

    with pytest.raises(SystemExit) as done:
        accum(capsys, "--version")
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == f"accum {__version__}"


def test_a_bad_output_path_is_one_line(
    cli_env: Any, capsys: pytest.CaptureFixture[str], client: AccumClient, seed: Any,
    tiny_spec: dict[str, Any], tmp_path: Path,
) -> None:
    job = client.submit(tiny_spec)
    seed.checkpoint(job["id"], 4, b"weights")
    target = tmp_path / "no" / "such" / "model.pt"

    code, out, err = accum(capsys, "download", job["id"], "-o", str(target))

    assert code == 1 and out == ""
    assert unwrapped(err) == f"accum download: cannot save to {target}: there is no directory {target.parent}"
    assert not target.parent.exists()


def test_commands_that_train_name_the_worker_extra_when_torch_is_missing(tmp_path: Path) -> None:
    """`pip install accum` without `[worker]`: one line each, nothing started or written."""
    script = ("import sys; sys.modules['torch'] = None\n"  # `import torch` fails, as uninstalled
              "from services.cli.main import main\n"
              "print([main([command]) for command in ('demo', 'up', 'worker')])")
    ran = subprocess.run([sys.executable, "-c", script], env=accum_env(tmp_path / "home"),
                         cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False)
    assert ran.stdout.strip() == "[1, 1, 1]", ran.stdout + ran.stderr
    assert ran.stderr.splitlines() == [
        f"accum {command}: needs torch, not installed here: pip install 'accum[worker]'"
        for command in ("demo", "up", "worker")
    ]
    assert list(tmp_path.iterdir()) == []


def test_a_yaml_mistake_is_said_by_line_and_column_in_one_short_line(
    cli_env: Any, capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    Path("spec.yaml").write_text("model: mlp\ndataset: digits\n  micro_batch_size: 16\n")

    code, out, err = accum(capsys, "submit", "spec.yaml")

    assert code == 2 and out == ""
    assert err.splitlines() == ["accum submit: spec.yaml:3:19: invalid YAML: mapping values are "
                                "not allowed here;", "  check the indentation"]
    assert_fits(err)


def test_wrong_types_say_what_the_field_takes_in_our_words(
    cli_env: Any, capsys: pytest.CaptureFixture[str], tmp_path: Path, tiny_spec: dict[str, Any]
) -> None:
    spec = {**tiny_spec, "epochs": 1.5, "seed": "x", "optimizer": {"name": "sgd"}}
    code, _, err = accum(capsys, "submit", write_spec(tmp_path, spec))

    assert code == 1
    assert_fits(err)
    said = unwrapped(err)
    assert "epochs: must be an integer from 1 to 10,000; got 1.5" in said
    assert 'seed: must be an integer from 0 to ' in said and '; got "x"' in said
    assert "optimizer.lr: required: give a number greater than 0 and at most 10" in said
    assert "Input should" not in said and "Field required" not in said


def test_a_misspelt_field_is_said_once_with_the_name_meant(
    cli_env: Any, capsys: pytest.CaptureFixture[str], tmp_path: Path, tiny_spec: dict[str, Any]
) -> None:
    """`max_step` for `max_steps`: not also "give epochs or max_steps"; a field written a level
    too high is pointed at where it belongs."""
    spec = {k: v for k, v in tiny_spec.items() if k != "epochs"}
    code, _, err = accum(capsys, "submit", write_spec(tmp_path, {**spec, "max_step": 3, "lr": 0.1}))

    assert code == 1
    assert_fits(err)
    head, *fields = err.splitlines()
    assert head == "accum submit: 422 Invalid request (2 fields):"
    assert [unwrapped(line) for line in fields] == [
        "max_step: unknown field 'max_step'; did you mean max_steps?",
        "lr: unknown field 'lr'; did you mean optimizer.lr?",
    ]


def test_a_batch_larger_than_the_dataset_is_refused_with_the_numbers(
    cli_env: Any, capsys: pytest.CaptureFixture[str], tmp_path: Path, tiny_spec: dict[str, Any]
) -> None:
    spec = {**tiny_spec, "micro_batch_size": 4096, "accumulation_steps": 4}
    code, _, err = accum(capsys, "submit", write_spec(tmp_path, spec))

    assert code == 1
    assert_fits(err)
    assert unwrapped(err) == (
        "accum submit: 422 Invalid request: micro_batch_size: 4,096 x "
        "accumulation_steps 4 = 16,384 samples a step is more than the 1,437 training samples "
        "of dataset 'digits' (one micro-batch holds them all): every step would see those "
        "1,437, not 16,384. Lower micro_batch_size so that a step takes at most 1,437")


def test_resume_names_its_options_not_the_apis_fields(
    cli_env: Any, capsys: pytest.CaptureFixture[str], client: AccumClient, tiny_spec: dict[str, Any]
) -> None:
    job_id = str(client.submit(tiny_spec)["id"])

    code, _, err = accum(capsys, "resume", job_id, "--from-step", "7")

    assert code == 1
    assert_fits(err)
    assert unwrapped(err) == (
        f"accum resume: 422 Invalid request: --from-step: job {job_id} has no checkpoint at step "
        "7; it has none (or resume with --from-scratch)")
