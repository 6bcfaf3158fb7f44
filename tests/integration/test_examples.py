"""Every example spec in examples/ trains as shipped, through examples/run_examples.py: the
script makes their tiny data inside the service's data root, submits each in order (the warm
start from the job before it) and waits for each to succeed. --quick: 2 optimizer steps a job,
the least that trains each model on its data and writes the checkpoint the warm start reads."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from cli_service import cli_service

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted(p.name for p in (ROOT / "examples").glob("*.[jy]*"))


@pytest.mark.slow
def test_every_example_trains_as_shipped(request: pytest.FixtureRequest, tmp_path: Path) -> None:
    with cli_service(request, tmp_path, "ex") as (stack, client_env):
        data = stack.settings.home / "data" / "examples"  # inside the default data root
        ran = subprocess.run(
            [sys.executable, str(ROOT / "examples" / "run_examples.py"), "--quick", "--data", str(data),
             "--queue", stack.queue],
            env=client_env, capture_output=True, text=True, timeout=900, check=False,
        )
        logs = "\n".join(p.read_text(errors="replace")[-3000:] for p in stack.logs.glob("worker-*.log"))
        assert ran.returncode == 0, ran.stdout + ran.stderr + logs
    succeeded = [line.split(":")[0] for line in ran.stdout.splitlines() if line.endswith(" succeeded")]
    assert succeeded == [name.rsplit(".", 1)[0] for name in (
        "digits_mlp_tiny.json", "digits_small_cnn.yaml", "imagefolder_timm.yaml", "finetune_warm_start.yaml",
        "causal_lm_hf.yaml", "sequence_classification_hf.yaml", "lora_finetune_hf.yaml")]
    assert sorted(f"{n}" for n in EXAMPLES) == sorted(
        ["causal_lm_hf.yaml", "digits_mlp_tiny.json", "digits_small_cnn.yaml", "finetune_warm_start.yaml",
         "imagefolder_timm.yaml", "lora_finetune_hf.yaml", "sequence_classification_hf.yaml"]), "a new example: add it to run_examples.py"
