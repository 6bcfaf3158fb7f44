"""The parent of DDP ranks (``services.worker.distributed.watch_ranks``) with real spawned
processes: a rank that dies in teardown after every rank finished (the gloo/NCCL abort at
exit) does not fail the job and no finishing rank is signalled; a rank that dies before it
finished ends the attempt with the reason (``RankFailed``; a lost peer when it was killed by a
signal or said it died of its process group failing, which ``spawn_ranks`` turns into
``NodeLost``: the job resumes with a restart counted; else the job fails); a cancel, timeout or shutdown raises the ranks' shared
stop flag (its value says which: the trackers' runs end by it), and ranks that do not stop within the grace period (or any rank, once the lease
is lost) are terminated. A rank that stops beating (``services.worker.pulse``) past its deadline, or
that its peers failed waiting for while it was silent, is hung: every rank is ended and the
error names its node and rank. Then a real ``gpus: 2`` job, 20 times in a row."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from collections.abc import Callable
from types import SimpleNamespace

import pytest
import stand_in_ranks as ranks

from services.jobdb import jobs
from services.jobdb.sessions import session_factory
from services.settings import Settings
from services.worker.attempt import RankHung
from services.worker.distributed import STOPPED, Node, RankFailed, watch_ranks
from services.worker.pulse import ARMED_AT, CANCEL, TIMEOUT, BeatingLoader, Pulse, RankLink
from services.worker.runner import run_job


class Running:
    """A heartbeat that never asks to stop (the lease is held, nobody cancels)."""

    lease_lost = cancel_requested = shutting_down = False

    def should_stop(self) -> bool:
        return False


def _start(target: Callable[..., None], *extra):
    """Two stand-in ranks (tests/worker/stand_in_ranks.py) under a context shaped like
    torch's ``ProcessContext`` (``processes``, ``error_files``: none written here)."""
    spawn = multiprocessing.get_context("spawn")
    finished = spawn.Array("b", 2, lock=False)
    exits = spawn.Array("b", 2, lock=False)
    processes = [spawn.Process(target=target, args=(rank, finished, exits, *extra)) for rank in range(2)]
    for process in processes:
        process.start()
    context = SimpleNamespace(processes=processes, error_files=[f"/nonexistent/rank{r}" for r in range(2)])
    return context, finished, exits


def _flag():
    return multiprocessing.get_context("spawn").Value("b", 0, lock=False)


class Stopping(Running):
    """A heartbeat whose job was cancelled, timed out, or whose lease was lost."""

    timed_out = False

    def __init__(self, **flags: bool) -> None:
        for name, value in flags.items():
            setattr(self, name, value)

    def should_stop(self) -> bool:
        return True


@pytest.mark.parametrize(("flags", "expected", "reason"), [
    ({"cancel_requested": True}, "cancelled", CANCEL),
    ({"timed_out": True}, "timed_out", TIMEOUT),
])
def test_a_stop_raises_the_shared_flag_and_the_ranks_stop_themselves(
    flags: dict[str, bool], expected: str, reason: int,
) -> None:
    stop = _flag()
    context, finished, exits = _start(ranks.stop_when_asked, stop, STOPPED)
    assert watch_ranks(context, finished, Stopping(**flags), grace_s=30, stop=stop) == expected
    assert stop.value == reason and list(finished) == [STOPPED, STOPPED]
    assert list(exits) == [1, 1] and [p.exitcode for p in context.processes] == [0, 0]  # not signalled


def test_ranks_that_do_not_stop_within_the_grace_period_are_terminated() -> None:
    stop = _flag()
    context, finished, exits = _start(ranks.never_stop, stop, STOPPED)
    started = time.monotonic()
    assert watch_ranks(context, finished, Stopping(cancel_requested=True), grace_s=1, stop=stop) == "cancelled"
    assert time.monotonic() - started < 30 and stop.value == 1
    assert list(exits) == [0, 0] and not any(p.is_alive() for p in context.processes)


def test_a_lost_lease_terminates_the_ranks_without_asking_them_to_stop() -> None:
    stop = _flag()
    context, finished, exits = _start(ranks.stop_when_asked, stop, STOPPED)
    assert watch_ranks(context, finished, Stopping(lease_lost=True), grace_s=30, stop=stop) == "lease_lost"
    assert stop.value == 0  # no checkpoint: another worker may hold the job now
    assert list(exits) == [0, 0] and not any(p.is_alive() for p in context.processes)


def test_a_rank_dying_in_teardown_after_every_rank_finished_is_not_a_failure() -> None:
    context, finished, exits = _start(ranks.finish_then_abort)
    assert watch_ranks(context, finished, Running(), grace_s=30, stop=_flag()) == "succeeded"
    assert list(finished) == [1, 1]
    assert exits[0] == 1 and context.processes[0].exitcode == 0  # rank 0 ran to its end
    assert context.processes[1].exitcode == -signal.SIGABRT


def test_a_rank_dying_before_it_finished_ends_the_attempt_and_stops_the_others() -> None:
    context, finished, exits = _start(ranks.abort_before_finishing)
    with pytest.raises(RuntimeError, match="a training rank died: .*SIGABRT"):
        watch_ranks(context, finished, Running(), grace_s=30, stop=_flag())
    assert not any(p.is_alive() for p in context.processes)
    assert exits[0] == 0  # stopped, not left training


def test_a_rank_killed_by_a_signal_is_a_lost_peer() -> None:
    context, finished, _ = _start(ranks.abort_before_finishing)
    with pytest.raises(RankFailed) as failed:
        watch_ranks(context, finished, Running(), grace_s=30, stop=_flag())
    assert failed.value.peer_lost


@pytest.mark.parametrize("said_lost", [1, 0], ids=["its peers lost", "its own error"])
def test_a_rank_that_raised_is_a_lost_peer_only_when_it_said_so(said_lost: int) -> None:
    context, finished, exits = _start(ranks.exit_on_an_error, said_lost)
    with pytest.raises(RankFailed, match="exit code 1") as failed:
        watch_ranks(context, finished, Running(), grace_s=30, stop=_flag(), peer_lost=exits)
    assert failed.value.peer_lost is bool(said_lost)
    assert not any(p.is_alive() for p in context.processes)


def _beating(target: Callable[..., None], base_s: float) -> tuple[SimpleNamespace, object, Pulse]:
    pulse = Pulse.of(multiprocessing.get_context("spawn"), 2, base_s=base_s, margin_s=0.5)
    context, finished, _ = _start(target, pulse.last, pulse.beats)
    deadline = time.monotonic() + 60
    while min(pulse.beats) < ARMED_AT + 1:  # both watched: past their first window
        assert time.monotonic() < deadline and all(p.is_alive() for p in context.processes)
        time.sleep(0.01)
    return context, finished, pulse


def test_a_stopped_rank_is_hung_past_its_deadline_and_every_rank_is_ended() -> None:
    context, finished, pulse = _beating(ranks.beat_on, base_s=0.5)  # + the margin: 1.0 s
    os.kill(context.processes[1].pid, signal.SIGSTOP)  # a stopped process handles no SIGTERM
    stopped = time.monotonic()
    with pytest.raises(RankHung, match=r"^node 1 of 2: rank 3 \(pid \d+, \d+ beats\) made no progress "
                                       r"for 1\.\d s \(past its deadline of 1\.0 s"):
        watch_ranks(context, finished, Running(), grace_s=30, stop=_flag(), pulse=pulse,
                    node=Node(1, 2, 2, collective_timeout_s=0.5))
    assert time.monotonic() - stopped < 5  # the deadline and a poll, on a loaded machine
    assert not any(p.is_alive() for p in context.processes)
    assert context.processes[1].exitcode == -signal.SIGKILL


def test_a_silent_rank_its_peer_failed_waiting_for_is_hung() -> None:
    context, finished, pulse = _beating(ranks.fail_waiting_for_a_silent_peer, base_s=60.0)
    lost = multiprocessing.get_context("spawn").Array("b", [1, 0], lock=False)  # rank 0 says so
    with pytest.raises(RankHung, match=r"^node 0 of 1: rank 1 .*\(its peers' collective timed out waiting for it"):
        watch_ranks(context, finished, Running(), grace_s=30, stop=_flag(), peer_lost=lost, pulse=pulse,
                    node=Node(0, 1, 0, collective_timeout_s=1.0))
    assert not any(p.is_alive() for p in context.processes)


class ExitingWhileRead:
    """A rank that dies of an error while the parent looks at it: its sentinel is ready (the
    process closed its end at exit) but the first reading of ``exitcode`` is still None, the
    next one its code, as when the parent wakes before the kernel lets it reap the child."""

    def __init__(self) -> None:
        self.readings = 0
        read_end, write_end = os.pipe()
        os.close(write_end)  # at end of file: ready at once, as a dead child's sentinel is
        self.sentinel = read_end

    @property
    def exitcode(self) -> int | None:
        self.readings += 1
        return None if self.readings == 1 else 1

    def is_alive(self) -> bool:
        return False

    def join(self, timeout: float | None = None) -> None:
        pass


def test_a_rank_that_exits_while_the_parent_reads_it_fails_the_job_not_succeeds() -> None:
    rank = ExitingWhileRead()
    context = SimpleNamespace(processes=[rank], error_files=["/nonexistent/rank0"])
    spawn = multiprocessing.get_context("spawn")
    finished, lost = spawn.Array("b", 1, lock=False), spawn.Array("b", [1], lock=False)
    try:
        with pytest.raises(RankFailed, match="exit code 1") as failed:
            watch_ranks(context, finished, Running(), grace_s=1, stop=_flag(), peer_lost=lost)
    finally:
        os.close(rank.sentinel)
    assert failed.value.peer_lost  # it said so: the gang's job resumes (NodeLost), never "succeeded"


@pytest.mark.reliability_slow
@pytest.mark.timeout(2400)  # 20 jobs of two spawned ranks each: minutes on a loaded 2-core machine
def test_a_gpus_2_job_succeeds_20_times_in_a_row(settings: Settings, make_job: Callable[..., str]) -> None:
    spec = {"model": "mlp", "dataset": "digits", "micro_batch_size": 64, "accumulation_steps": 2,
            "max_steps": 4, "eval_every": 4, "optimizer": {"name": "sgd", "lr": 0.1}, "gpus": 2,
            "checkpoint_every": 4, "keep_checkpoints": 1}
    outcomes = []
    for _ in range(20):
        job_id = make_job(spec)
        outcomes.append(run_job(settings, job_id, "ddp-worker"))
        with session_factory(settings)() as session:
            job = jobs.load_job(session, job_id)
            assert job is not None and job.status == "succeeded", job.error if job else None
    assert outcomes == ["succeeded"] * 20


def test_an_evaluation_beats_at_every_batch() -> None:
    pulse = Pulse.of(multiprocessing.get_context("spawn"), 1, base_s=1.0, margin_s=0.5)
    loader = BeatingLoader([10, 20, 30], RankLink(pulse, _flag(), 0))
    assert len(loader) == 3 and list(loader) == [10, 20, 30] and pulse.beats[0] == 3
    assert loader.count(20) == 1  # the loader's own attributes
