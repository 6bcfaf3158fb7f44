"""`accum submit --tag X --notes TEXT` against a real API: the flags add to the spec file's
`tags` and replace its `notes`; `accum status` shows them and `accum jobs --tag` finds the job."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from cli_helpers import accum_in_process

from accum import AccumClient


def test_submit_tags_and_notes_from_the_spec_and_the_flags(
    cli_env: Any, capsys: pytest.CaptureFixture[str], client: AccumClient, tmp_path: Path,
    tiny_spec: dict[str, Any],
) -> None:
    path = tmp_path / "tagged.yaml"
    path.write_text(yaml.safe_dump({**tiny_spec, "name": "tagged-cli", "tags": ["from-file"],
                                    "notes": "replaced by --notes"}))
    code, out, _ = accum_in_process(capsys, "submit", str(path), "--tag", "cli-tag-1", "--tag", "lr:0.1",
                                    "--notes", "baseline\nfor the sweep", "--json")
    assert code == 0
    job = client.job(yaml.safe_load(out)["id"])
    assert (job["tags"], job["notes"]) == (["cli-tag-1", "from-file", "lr:0.1"], "baseline\nfor the sweep")

    code, out, _ = accum_in_process(capsys, "status", job["id"][-6:])
    fields = dict(line.split(None, 1) for line in out.splitlines()[:4])
    assert fields["tags"] == "cli-tag-1, from-file, lr:0.1" and fields["notes"] == "baseline for the sweep"
    code, out, _ = accum_in_process(capsys, "jobs", "--tag", "cli-tag-1")
    assert code == 0 and [line.split()[0] for line in out.splitlines()[1:]] == [job["id"][-6:]]

    code, _, err = accum_in_process(capsys, "submit", str(path), "--tag", "two words")
    assert code != 0 and "tags[1]: a tag is 1 to 40 letters" in " ".join(err.split())
