"""Issue 44's "done when": a pretrained causal LM and a sequence classifier, both `hf:<dir>`
(a tiny GPT-2 saved with save_pretrained, which the test makes: no download), fine-tuned with
`activation_checkpointing: true` and `peft: lora` through the CLI as a user runs it: `accum
submit spec.yaml` to a real API and worker, `accum status` naming the levers, `accum download
--merged` giving the causal LM's merged model, which loads with `from_pretrained`.

2 optimizer steps a job: the least that trains adapters and writes the final checkpoint; the
exactness of the levers is tested in tests/worker/test_levers.py and test_levers_fsdp.py."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from cli_service import cli_service

from services.artifacts import open_store
from tests.own_data_files import save_gpt2, write_labelled_text, write_text

ACCUM = shutil.which("accum", path=str(Path(sys.executable).parent)) or "accum"
LEVERS = {"activation_checkpointing": True,
          "peft": {"method": "lora", "r": 2, "alpha": 4, "target_modules": ["c_attn"]}}


def accum(env: dict[str, str], *args: str) -> str:
    ran = subprocess.run([ACCUM, *args], env=env, capture_output=True, text=True, timeout=120, check=False)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    return ran.stdout


@pytest.mark.slow
def test_a_causal_lm_and_a_classifier_from_a_saved_model_fine_tune_with_both_levers_from_the_cli(
    request: pytest.FixtureRequest, tmp_path: Path,
) -> None:
    with cli_service(request, tmp_path, "tuner", COLUMNS="200") as (stack, env):
        data = stack.settings.home / "data"  # the default data root
        write_text(data / "text", "jsonl", repeat=2)
        write_labelled_text(data / "labelled", "jsonl", rows=24)
        model = data / "models" / "gpt2"
        save_gpt2(model)
        common: dict[str, Any] = {"model": f"hf:{model}", "micro_batch_size": 2, "accumulation_steps": 2,
                                  "max_steps": 2, "gpus": 0, "queue": stack.queue,
                                  "optimizer": {"name": "adamw", "lr": 0.01}, **LEVERS}
        specs = {
            "causal-lm": {**common, "name": "lora-lm", "peft": {**LEVERS["peft"], "merge": True},
                          "dataset": {"name": "files", "data_root": str(data / "text"), "data_files": "text.jsonl",
                                      "columns": {"text": "body"}, "tokenizer": "bytes", "max_len": 32}},
            "classifier": {**common, "name": "lora-classifier",
                           "dataset": {"name": "files", "data_root": str(data / "labelled"),
                                       "data_files": "labelled.jsonl", "columns": {"text": "body", "label": "y"},
                                       "tokenizer": "bytes", "max_len": 32}},
        }
        ids = {}
        for name, spec in specs.items():
            path = tmp_path / f"{name}.yaml"
            path.write_text(yaml.safe_dump(spec))
            ids[name] = yaml.safe_load(accum(env, "submit", str(path), "--json"))["id"]
        for name, job_id in ids.items():
            job = stack.wait(job_id, timeout=300)
            assert job.status == "succeeded", (name, job.error, stack.worker_logs())
            status = accum(env, "status", job_id)
            merge = ", merge" if name == "causal-lm" else ""
            assert f"activation_checkpointing, lora (r 2, alpha 4{merge})" in status, status
        # Checkpoints hold the adapters (and the classifier's re-made head) only.
        store = open_store(stack.settings.artifacts_url)
        for name, job_id in ids.items():
            store.get(f"{job_id}/2.pt", tmp_path / f"{name}.pt")
            state = torch.load(tmp_path / f"{name}.pt", weights_only=True)["model"]
            head = ".score." if name == "classifier" else "lora_"
            assert state and all("lora_" in key or head in key for key in state), sorted(state)[:4]
            assert any(head in key for key in state)  # the classifier's head: trained in full
        accum(env, "download", ids["causal-lm"], "--merged", "-o", str(tmp_path / "merged.tar"))
    with tarfile.open(tmp_path / "merged.tar") as tar:
        tar.extractall(tmp_path / "download", filter="data")
    from transformers import GPT2LMHeadModel

    merged = GPT2LMHeadModel.from_pretrained(tmp_path / "download" / "merged")
    assert merged.config.n_layer == 2 and not any("lora_" in name for name, _ in merged.named_parameters())
