"""Nothing a user or a job wrote drives the terminal of whoever views the job (issue 42 item 2).

A job stored before the API refused control characters (its name, notes, tags and data_root
written past the API here), its error, an event and a line its training printed each carry a
window-title, an OSC 52 clipboard write, a clear-screen and a C1 CSI. Every command that prints
them (status, jobs, events, logs, watch, and an error from the API) shows them escaped, as git
and kubectl do; newlines and tabs stay.
"""

from __future__ import annotations

from typing import Any

from cli_helpers import Server, accum_in_process
from sqlalchemy import update

from accum import AccumClient
from services.jobdb.models import Job

RAW = ("\x1b]0;pwned\x07", "\x1b]52;c;ZWNobyBoaQ==\x07", "\x1b[2J", "\x9b31m")
SHOWN = ("\\x1b]0;pwned\\x07", "\\x1b]52;c;ZWNobyBoaQ==\\x07", "\\x1b[2J", "\\x9b31m")
EVIL = "".join(RAW)


def inert(text: str) -> bool:
    return not any(char in text for char in "\x1b\x07\x9b")


def test_escape_sequences_come_out_inert_in_every_command(
    cli_env: Server, client: AccumClient, seed: Any, tiny_spec: dict[str, Any], capsys: Any
) -> None:
    job = client.submit(tiny_spec)
    job_id, spec = job["id"], job["spec"]
    with seed.sessions.begin() as session:  # stored before the API's check, or past it
        spec["dataset"] = {**spec["dataset"], "name": "mnist", "data_root": f"/data/{EVIL}"}
        session.execute(update(Job).where(Job.id == job_id).values(
            name=f"n{EVIL}", notes=f"see\n\t{EVIL}", tag_text=f",t{EVIL},", spec=spec))
    seed.claim(job_id, "w1")
    seed.event(job_id, "note", f"event {EVIL}", {"at": EVIL}, attempt=1)
    seed.prints(job_id, 1, [("stdout", f"printed {EVIL}")])
    seed.finish(job_id, "w1", "failed", {"type": "ValueError", "message": f"bad {EVIL}"})

    commands = [("status", job_id), ("jobs",), ("events", job_id), ("logs", job_id), ("watch", job_id)]
    for args in commands:
        code, out, err = accum_in_process(capsys, *args)
        assert inert(out + err), (args, out, err)
        assert any(shown in out for shown in SHOWN), (args, out)  # shown, escaped, not dropped
    _, out, _ = accum_in_process(capsys, "status", job_id)
    assert all(shown in out for shown in SHOWN) and "see" in out

    # An error the API answers (the note itself is refused now: 422 at body.notes).
    code, out, err = accum_in_process(capsys, "edit", job_id, "--notes", EVIL)
    assert code == 1 and "notes: control character" in err and inert(out + err), err
