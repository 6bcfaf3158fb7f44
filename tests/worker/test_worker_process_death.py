"""How a worker words the death of the prefork child that ran a job: the exit status Celery
reports, and the kernel's OOM killer when the cgroup's ``oom_kill`` counter rose."""

from __future__ import annotations

from pathlib import Path

from billiard.exceptions import WorkerLostError

from services.worker.process_death import cause_of, oom_kills


def test_the_exit_status_becomes_the_cause() -> None:
    killed = WorkerLostError("Worker exited prematurely: signal 9 (SIGKILL) Job: 0.")
    assert cause_of(killed, 0, 0) == "killed by signal 9 (SIGKILL)"
    exited = WorkerLostError("Worker exited prematurely: exitcode 3.")
    assert cause_of(exited, None, None) == "exited with code 3"
    assert cause_of(ValueError("a failure the child reported itself"), 0, 0) is None


def test_a_risen_oom_kill_counter_names_the_oom_killer() -> None:
    killed = WorkerLostError("Worker exited prematurely: signal 9 (SIGKILL) Job: 4.")
    assert cause_of(killed, 2, 3) == "out of memory (the kernel's OOM killer): killed by signal 9 (SIGKILL)"
    assert cause_of(killed, None, 3) == "killed by signal 9 (SIGKILL)"  # no reading before


def test_oom_kills_reads_the_counter_or_none(tmp_path: Path) -> None:
    events = tmp_path / "memory.events"
    events.write_text("low 0\nhigh 0\nmax 12\noom 2\noom_kill 2\noom_group_kill 0\n")
    assert oom_kills(events) == 2
    assert oom_kills(tmp_path / "absent") is None
    events.write_text("low 0\n")
    assert oom_kills(events) is None
