"""`accum` commands against a real API server: output, exit codes, one-line errors.

Commands run in-process through `services.cli.main.main` (the console script's target);
`test_console_script_*` run the installed `accum` executable once each.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from cli_helpers import accum_in_process, one_entry, unwrapped

from accum import AccumClient


def accum(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    return accum_in_process(capsys, *args)


def write_spec(tmp_path: Path, spec: dict[str, Any], suffix: str) -> Path:
    path = tmp_path / f"spec{suffix}"
    path.write_text(json.dumps(spec) if suffix == ".json" else yaml.safe_dump(spec))
    return path


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_submit_then_status_and_jobs(
    cli_env: Any, capsys: pytest.CaptureFixture[str], tmp_path: Path, tiny_spec: dict[str, Any],
    suffix: str,
) -> None:
    spec = {**tiny_spec, "name": f"from-{suffix[1:]}"}
    code, out, _ = accum(capsys, "submit", str(write_spec(tmp_path, spec, suffix)), "--json")
    assert code == 0
    job = json.loads(out)
    assert job["name"] == spec["name"] and job["status"] == "queued"

    code, out, _ = accum(capsys, "status", job["id"])
    assert code == 0
    fields = dict(line.split(None, 1) for line in out.splitlines() if line.startswith(("id", "status")))
    assert fields == {"id": job["id"], "status": "queued"}

    code, out, _ = accum(capsys, "jobs", "--limit", "50")
    assert code == 0
    row = next(line for line in out.splitlines() if line.startswith(job["id"][-6:]))
    assert spec["name"] in row and "queued" in row


def test_status_of_a_multi_node_job_shows_its_gang(
    cli_env: Any, capsys: pytest.CaptureFixture[str], tmp_path: Path, tiny_spec: dict[str, Any],
) -> None:
    spec = {**tiny_spec, "name": "two-nodes", "nodes": 2, "gpus": 0}
    code, out, _ = accum(capsys, "submit", str(write_spec(tmp_path, spec, ".json")), "--json")
    assert code == 0, out
    code, out, _ = accum(capsys, "status", json.loads(out)["id"])
    assert code == 0
    fields = dict(line.split(None, 1) for line in out.splitlines() if line.startswith(("batch", "nodes")))
    assert fields["nodes"] == "0 of 2 joined, gang forming"
    m, n = tiny_spec["micro_batch_size"], tiny_spec["accumulation_steps"]
    assert fields["batch"] == f"{m} x {n} x CPU x 2 nodes = {m * n * 2}  (m x N x GPUs x nodes)"


def test_cancel_prints_the_new_status(
    cli_env: Any, capsys: pytest.CaptureFixture[str], client: AccumClient, tiny_spec: dict[str, Any]
) -> None:
    job = client.submit(tiny_spec)
    code, out, _ = accum(capsys, "cancel", job["id"])
    assert code == 0 and "cancelled" in out
    assert client.job(job["id"])["status"] == "cancelled"
    code, out, _ = accum(capsys, "watch", job["id"])
    assert code == 4, "watch exits 4 for a cancelled job"


def test_metrics_csv(
    cli_env: Any, capsys: pytest.CaptureFixture[str], job_with_metrics: str
) -> None:
    code, out, _ = accum(capsys, "metrics", job_with_metrics, "--name", "loss", "--csv")
    assert code == 0
    rows = list(csv.DictReader(io.StringIO(out)))
    assert [int(r["step"]) for r in rows] == [1, 2, 3, 4]
    assert {r["name"] for r in rows} == {"loss"}
    assert float(rows[1]["value"]) == pytest.approx(0.5)


def test_checkpoints_and_download(
    cli_env: Any, capsys: pytest.CaptureFixture[str], client: AccumClient, seed: Any,
    tiny_spec: dict[str, Any], tmp_path: Path,
) -> None:
    job = client.submit(tiny_spec)
    content = b"weights" * 5000
    seed.checkpoint(job["id"], 7, content)
    code, out, _ = accum(capsys, "checkpoints", job["id"])
    assert code == 0 and hashlib.sha256(content).hexdigest()[:12] in out
    target = tmp_path / "model.pt"
    code, out, _ = accum(capsys, "download", job["id"], "7", "-o", str(target))
    assert code == 0 and "sha256 verified" in out
    assert target.read_bytes() == content


def test_download_of_a_corrupted_checkpoint_fails(
    cli_env: Any, capsys: pytest.CaptureFixture[str], client: AccumClient, seed: Any,
    tiny_spec: dict[str, Any], tmp_path: Path,
) -> None:
    job = client.submit(tiny_spec)
    seed.checkpoint(job["id"], 3, b"bytes", sha256="f" * 64)
    code, _, err = accum(capsys, "download", job["id"], "-o", str(tmp_path / "x.pt"))
    assert code == 1 and "sha256" in err and one_entry(err)
    assert not (tmp_path / "x.pt").exists()


def test_bad_spec_is_one_line_naming_the_field(
    cli_env: Any, capsys: pytest.CaptureFixture[str], tmp_path: Path, tiny_spec: dict[str, Any]
) -> None:
    spec = write_spec(tmp_path, {**tiny_spec, "accumulation_steps": 0}, ".json")
    code, out, err = accum(capsys, "submit", str(spec))
    assert code == 1 and out == ""
    assert one_entry(err)
    assert err.startswith("accum submit: 422") and "accumulation_steps" in err


def test_unknown_job_is_one_line_404(cli_env: Any, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = accum(capsys, "status", "does-not-exist")
    assert code == 1 and out == ""
    assert err.startswith("accum status: 404") and one_entry(err)


def test_unreadable_spec_is_a_usage_error(
    cli_env: Any, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    bad = tmp_path / "spec.yaml"
    bad.write_text("model: [unclosed\n")
    code, _, err = accum(capsys, "submit", str(bad))
    assert code == 2 and unwrapped(err) == (
        f"accum submit: {bad}:2:1: invalid YAML: expected ',' or ']', but got '<stream end>'; "
        "the [ list opened at line 1")
    code, _, err = accum(capsys, "submit", str(tmp_path / "spec.txt"))
    assert code == 2 and ".yaml, .yml or .json" in err


# Numbers as people write them; YAML 1.1 (PyYAML's default) reads the first two as strings.
NUMBERS_AS_WRITTEN = (
    "model: mlp\ndataset: digits\nmicro_batch_size: 16\naccumulation_steps: 4\nepochs: 1\n"
    "optimizer: {name: sgd, lr: 3e-4, weight_decay: 1e-2, momentum: .5}\n"
)


def test_yaml_numbers_with_an_exponent_are_numbers(
    cli_env: Any, capsys: pytest.CaptureFixture[str], tmp_path: Path, client: AccumClient
) -> None:
    path = tmp_path / "exponents.yaml"
    path.write_text(NUMBERS_AS_WRITTEN)
    code, out, err = accum(capsys, "submit", str(path), "--json")
    assert code == 0, err
    optimizer = json.loads(out)["spec"]["optimizer"]
    assert (optimizer["lr"], optimizer["weight_decay"], optimizer["momentum"]) == (3e-4, 1e-2, 0.5)
    # The client reads a spec file with the same loader.
    job = client.submit(path)
    assert client.job(job["id"])["spec"]["optimizer"]["lr"] == 3e-4


def test_the_cli_finds_the_service_from_any_folder(
    api_server: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """ACCUM_URL / ACCUM_TOKEN, else ./.accum/local.json or the nearest parent folder's, else
    the per-user record `accum up` or `accum login` writes; a file's token goes only to its
    own URL."""
    from accum.config import resolve_client_config, user_config_path, write_local_config

    for key in ("ACCUM_URL", "ACCUM_TOKEN", "ACCUM_HOME"):
        monkeypatch.delenv(key, raising=False)
    project = tmp_path / "project"
    (project / "src" / "deep").mkdir(parents=True)
    monkeypatch.chdir(project / "src" / "deep")
    nothing = resolve_client_config()
    assert (nothing.url, nothing.token, nothing.source) == ("http://127.0.0.1:8000", None, "defaults")
    assert "start one with `accum up`" in nothing.unreachable_hint()

    code, _, err = accum(capsys, "login", api_server.url, "--token", "accum_not-a-token")
    assert code == 1 and "401" in err and not user_config_path().exists()  # checked first
    code, _, err = accum(capsys, "login", api_server.url, "--token", api_server.token)
    record = user_config_path()
    assert code == 0 and f"as cli-tests; saved in {record}" in unwrapped(err)
    assert record.stat().st_mode & 0o777 == 0o600, "the token file is private"
    assert accum(capsys, "jobs")[0] == 0  # the service `accum up` recorded, from any folder
    monkeypatch.setenv("ACCUM_URL", api_server.url)
    assert accum(capsys, "jobs")[0] == 0  # the URL given, the record's token for it

    stale = write_local_config("http://127.0.0.1:9", "accum_elsewhere", project / ".accum")
    assert accum(capsys, "jobs")[0] == 0, "the folder's token is not sent to another URL"
    monkeypatch.delenv("ACCUM_URL")
    code, _, err = accum(capsys, "jobs")  # a parent folder's .accum wins over the record
    assert code == 1 and "cannot reach the accum API at http://127.0.0.1:9" in unwrapped(err)
    assert f"the URL is from {stale}, written by `accum up`" in unwrapped(err)

    record.unlink()
    monkeypatch.setenv("ACCUM_URL", api_server.url)
    code, _, err = accum(capsys, "jobs")
    assert code == 1 and f"no token for {api_server.url} (from ACCUM_URL): set ACCUM_TOKEN" in unwrapped(err)
    monkeypatch.setenv("ACCUM_TOKEN", "accum_not-a-token")
    code, _, err = accum(capsys, "jobs")
    assert code == 1 and "401" in err and "refused ACCUM_TOKEN" in unwrapped(err)
    monkeypatch.setenv("ACCUM_TOKEN", api_server.token)
    assert accum(capsys, "jobs")[0] == 0


def test_console_script_usage_error_exits_2(api_server: Any) -> None:
    accum_script = Path(sys.executable).parent / "accum"
    result = subprocess.run(
        [str(accum_script), "status"], env=api_server.env, capture_output=True, text=True,
        timeout=60, check=False,
    )
    assert result.returncode == 2 and "usage: accum status" in result.stderr


def test_token_create_makes_no_database_and_says_what_to_run(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for key in ("ACCUM_DATABASE_URL", "ACCUM_HOME"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.chdir(tmp_path)  # no .accum here or above, no `accum up` recorded
    code, out, err = accum(capsys, "token", "create", "bob")
    assert code == 1 and out == "" and not (tmp_path / ".accum").exists()
    assert "no accum service found" in err and "run `accum up` first" in unwrapped(err)

    monkeypatch.setenv("ACCUM_HOME", str(tmp_path / "fresh"))
    code, out, err = accum(capsys, "token", "create", "bob")
    assert code == 1 and out == "" and not (tmp_path / "fresh" / "accum.sqlite").exists()
    assert "run `accum db upgrade` first" in unwrapped(err)
    assert accum(capsys, "db", "upgrade")[0] == 0
    code, out, _ = accum(capsys, "token", "create", "bob")
    assert code == 0 and out.startswith("accum_")


def test_bad_configuration_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("ACCUM_DATABASE_URL", "mysql://db/accum")
    code, _, err = accum(capsys, "db", "upgrade")
    assert code == 1 and one_entry(err)
    assert "ACCUM_DATABASE_URL" in err and "postgresql+psycopg://" in err


def test_up_refuses_a_port_in_use(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import socket

    monkeypatch.setenv("ACCUM_HOME", str(tmp_path / "home"))
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        code, _, err = accum(capsys, "up", "--port", str(port))
    assert code == 1 and "choose another port with --port" in unwrapped(err)
    assert not (tmp_path / "home" / "local.json").exists()


def test_resume_without_a_checkpoint_says_it_starts_over(
    cli_env: Any, capsys: pytest.CaptureFixture[str], client: AccumClient, tiny_spec: dict[str, Any]
) -> None:
    job = client.submit(tiny_spec)
    client.cancel(job["id"])
    code, out, _ = accum(capsys, "resume", job["id"][:12])
    assert code == 0
    assert unwrapped(out) == (f"job {job['id']}: queued, from the start: it has no checkpoint "
                              "(a job keeps one every checkpoint_every steps)")


def test_resume_from_an_older_step_or_from_scratch_then_delete(
    cli_env: Any, capsys: pytest.CaptureFixture[str], client: AccumClient, seed: Any,
    tiny_spec: dict[str, Any],
) -> None:
    job = client.submit(tiny_spec)
    for step in (4, 8):
        seed.checkpoint(job["id"], step, b"w" * step)
    seed.claim(job["id"], "w1")
    seed.finish(job["id"], "w1", "failed", {"type": "RuntimeError", "message": "x"})
    code, _, err = accum(capsys, "resume", job["id"], "--from-step", "5")
    assert code == 1 and "--from-step: " in unwrapped(err) and "at steps 4, 8" in unwrapped(err)  # the retained steps
    code, _, err = accum(capsys, "resume", job["id"], "--timeout", "2 fortnights")
    assert code == 1 and "timeout" in err
    code, out, _ = accum(capsys, "resume", job["id"])  # a plain resume names its checkpoint
    assert code == 0 and unwrapped(out).endswith("queued, from its latest checkpoint (step 8)")
    client.cancel(job["id"])
    code, out, _ = accum(capsys, "resume", job["id"], "--from-step", "4", "--timeout", "2h")
    assert code == 0 and "queued, from checkpoint step 4, timeout 7200 s" in unwrapped(out)
    assert client.job(job["id"])["spec"]["timeout"] == 7200
    assert [c["step"] for c in client.checkpoints(job["id"])] == [4]  # 8 dropped
    code, _, err = accum(capsys, "delete", job["id"])
    assert code == 1 and "cancel it first" in unwrapped(err)
    client.cancel(job["id"])
    code, out, _ = accum(capsys, "delete", job["id"])
    assert code == 0 and "deleted" in out
    assert not (seed.settings.artifacts_path / job["id"]).exists() or not any(
        (seed.settings.artifacts_path / job["id"]).iterdir())
    code, _, err = accum(capsys, "status", job["id"])
    assert code == 1


def complete(script: str, *words: str) -> list[str]:
    """What bash offers for `accum WORDS` (the last word being typed) with the script loaded."""
    line = " ".join(f"'{w}'" for w in ("accum", *words))
    ran = subprocess.run(["bash", "-c", f'{script}\nCOMP_WORDS=({line}); COMP_CWORD={len(words)}; '
                          '_accum; printf "%s\\n" "${COMPREPLY[@]}"'],
                         capture_output=True, text=True, check=True)
    return ran.stdout.split()


def test_completion_offers_the_commands_and_each_ones_options(capsys: pytest.CaptureFixture[str]) -> None:
    code, script, _ = accum(capsys, "completion", "bash")
    assert code == 0 and "complete -o default -F _accum accum" in script
    assert complete(script, "su") == ["submit"]
    assert complete(script, "jobs", "--s") == ["--status", "--search"]
    assert "--watch" in complete(script, "submit", "--")
    assert complete(script, "ed") == ["edit"] and complete(script, "ev") == ["events"]
