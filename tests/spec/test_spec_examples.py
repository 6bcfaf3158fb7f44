"""Every example job spec in examples/ is valid as shipped."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from accum import read_spec
from services.spec import parse_spec

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.[jy]*"))


# What examples/run_examples.py sets for the specs: where their data is, the warm start's job.
SCRIPT_VARIABLES = {"ACCUM_EXAMPLES": "/data/examples", "ACCUM_WARM_START_JOB": "01jd0000000000000000000000"}


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_parses(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in SCRIPT_VARIABLES.items():
        monkeypatch.setenv(name, value)
    spec = parse_spec(read_spec(path))
    assert spec.normalised()["model"]["name"] == spec.model.name
    assert "/datasets/" not in path.read_text()  # data the examples make themselves


def test_the_own_data_examples_are_shipped() -> None:
    names = {p.name for p in EXAMPLES}
    assert {"imagefolder_timm.yaml", "causal_lm_hf.yaml", "finetune_warm_start.yaml",
            "sequence_classification_hf.yaml"} <= names


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_the_settings_an_example_names_exist(path: Path) -> None:
    from services.settings import Settings

    known = {f"ACCUM_{name.upper()}" for name in Settings.model_fields}
    named = set(re.findall(r"\bACCUM_[A-Z0-9_]+", path.read_text())) - set(SCRIPT_VARIABLES)
    assert named <= known, f"{path.name} names settings that do not exist: {sorted(named - known)}"
