"""Multi-GPU jobs (``gpus: k > 1``): k DDP processes on this worker's GPUs (gloo on CPU).

The worker process keeps the lease and the heartbeat; it spawns k ranks and watches them
(``spawn_ranks``, called by ``services.worker.launch``). Each rank joins the process group and
runs ``services.worker.rank.run_attempt``, the same function a single-process job runs.
Rank 0 writes metrics, progress and checkpoints; every rank trains its shard of the data, so
the effective batch is m x N x k. A cancel, the job's timeout or a worker shutdown (SIGTERM)
raises a flag the ranks share (``stop``): every rank stops at the same window boundary (the
trainer all-reduces a stop), they write that boundary's checkpoint together (rank 0 the file,
every rank its RNG states), rank 0 records it, and the job is cancelled, failed as
``timeout`` or handed back from there, as a single process does. A lost lease, or ranks that
have not stopped within the grace period, are terminated at once and nothing is written
(another worker may hold the job now); a rank is never stopped alone, which would leave the
others waiting in a collective.

At the end every rank meets the others at a barrier before ``destroy_process_group``, and
says it finished (``finished[rank]``) first: the parent never signals a rank from then on,
and a rank that still dies in teardown does not fail a job whose final checkpoint and
metrics are recorded (``watch_ranks``).
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing.connection
import os
import pickle
import signal
import time
from dataclasses import asdict, replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from services.fleet import too_few_ranks
from services.settings import Settings
from services.spec import JobSpec, parse_spec
from services.spec.world import enough_ranks, ranks_per_node
from services.worker.attempt import Attempt, NodeLost, Outcome, RankHung, outcome
from services.worker.heartbeat import Heartbeat
from services.worker.parent_death import die_with_parent
from services.worker.peer_loss import killed, lost_peer
from services.worker.place import LOOPBACK, Place
from services.worker.pulse import Node, Pulse, RankLink, Silent, deadline_s, margin_s, stop_reason
from services.worker.rank import run_attempt
from services.worker.rendezvous import ANY_PORT, join_store, open_server

POLL_S = 0.1
log = logging.getLogger(__name__)


def spawn_ranks(
    settings: Settings, spec: JobSpec, attempt: Attempt, heartbeat: Heartbeat, checkpoint: Path | None,
    *, rank_offset: int = 0, world: int | None = None, master: tuple[str, int, str] | None = None,
) -> Outcome:
    """Run this node's ``spec.gpus`` ranks; returns ``SUCCEEDED``, ``CANCELLED``,
    ``HANDED_BACK`` (worker shutdown), ``TIMED_OUT`` or ``LEASE_LOST``.

    ``rank_offset``, ``world`` and ``master`` place them in a larger world (ranks on several
    nodes: the address, port and secret of the store node 0's worker serves, ``services.worker.gang``);
    by default this node is the whole world, and this process serves its rendezvous on a port
    the OS picks, bound until the ranks are gone (``services.worker.rendezvous``)."""
    here = ranks_per_node(spec.gpus)  # a node of a multi-node job runs one process at least
    seen = torch.cuda.device_count() if torch.cuda.is_available() else None
    if seen is not None and not enough_ranks(spec.gpus, seen):
        raise ValueError(too_few_ranks(spec.gpus, spec.queue, None, offered=seen,
                                       here=f"this worker sees {seen} GPUs (CUDA_VISIBLE_DEVICES); "))
    if master is None:  # this node is the whole world: its rendezvous is served from here
        server = open_server([ANY_PORT], timeout_s=settings.collective_timeout_s,
                             what="a port the OS picks on this node")
        try:
            return spawn_ranks(settings, spec, attempt, heartbeat, checkpoint, rank_offset=rank_offset,
                               world=world, master=(LOOPBACK, server.port, server.secret))
        finally:
            server.close()  # every rank is gone
    first = Place(rank=rank_offset, world=world or here, master_addr=master[0], master_port=master[1],
                  master_secret=master[2])
    # finished[r]: FINISHED once rank r's fit returned, STOPPED when ``stop`` ended it (on rank 0,
    # after its last checkpoint and metrics are recorded): from then on a rank that dies in
    # teardown does not fail the job. ``stop`` is raised by this process (watch_ranks).
    spawn = mp.get_context("spawn")
    finished = spawn.Array("b", here, lock=False)
    # peer_lost[r]: rank r died of its process group failing (``peer_loss.lost_peer``).
    peer_lost = spawn.Array("b", here, lock=False)
    # stop: why this process stopped them (``pulse.stop_reason``); pulse: their progress.
    stop = spawn.Value("b", 0, lock=False)
    pulse = Pulse.of(spawn, here, deadline_s(settings, spec), margin_s(settings))
    context = mp.start_processes(
        _rank_main,
        args=(asdict(first), settings.model_dump(mode="json"), attempt.spec, asdict(attempt),
              str(checkpoint) if checkpoint is not None else None, finished, stop, peer_lost, pulse),
        nprocs=here,
        join=False,
        start_method="spawn",  # never fork a process that may hold CUDA or DB connections
    )
    node = Node(rank_offset // here, (world or here) // here, rank_offset, settings.collective_timeout_s)
    try:
        return watch_ranks(context, finished, heartbeat, grace_s=settings.lease_timeout_s, stop=stop,
                           peer_lost=peer_lost, pulse=pulse, node=node)
    except RankFailed as exc:
        # A rank killed (the OOM killer, a signal) or lost with its process group is a lost
        # node, on one node as on several: the attempt ends, the job resumes from its last
        # checkpoint with a restart counted, as after a worker killed while training in its own
        # process. A rank's own error fails the job.
        if exc.peer_lost:
            raise NodeLost(f"node {node.index} of {node.nodes}: {exc}") from exc
        raise


class RankFailed(RuntimeError):
    """A rank failed while training; ``peer_lost``: of its process group losing a peer (a c10d
    error, a collective timeout, or the rank killed by a signal: ``services.worker.peer_loss``),
    not of an error in training."""

    def __init__(self, reason: str, peer_lost: bool) -> None:
        super().__init__(reason)
        self.peer_lost = peer_lost


FINISHED, STOPPED = 1, 2  # finished[rank]: fit returned at its end / stopped by the stop flag


def watch_ranks(context: Any, finished: Any, heartbeat: Any, grace_s: float, stop: Any,
                peer_lost: Any = None, pulse: Pulse | None = None, node: Node | None = None) -> Outcome:
    """Wait for the ranks; raise ``RankFailed`` when one fails while training (``peer_lost``:
    what each rank said it died of), ``RankHung`` when one made no progress past its deadline
    (``pulse``: their beats; or its peers failed of a lost peer while it, alive, was silent).
    On a cancel, a timeout or a
    shutdown (the heartbeat's flags) raise ``stop``: the ranks stop at one window boundary
    and checkpoint it, and the outcome follows; ranks still running ``grace_s`` later, or a
    lost lease, are terminated together at once. Once any
    rank has finished its fit the others are past their last collective: they are never sent
    a signal, and when every rank finished, a rank that dies in teardown (a gloo/NCCL abort
    at exit) is logged, not a failure. (``ProcessContext.join`` is not used: it SIGTERMs
    every other rank as soon as one exits with an error, a rank 0 still writing its final
    checkpoint included.)"""
    processes = context.processes
    deadline: float | None = None
    while True:
        # One reading per pass: a rank that exits between two readings (its sentinel is ready
        # before it can be reaped) would be neither failed nor alive, and the job "succeeded".
        codes = [p.exitcode for p in processes]
        failed = next((i for i, code in enumerate(codes) if code not in (None, 0)), None)
        if failed is not None:
            return _rank_failed(context, failed, finished, grace_s, peer_lost, pulse, node)
        alive = [p for p, code in zip(processes, codes, strict=True) if code is None]
        if pulse is not None and not any(finished):
            silent = pulse.stale(alive_ranks(codes))
            if silent:
                raise _hung(context, silent, node, f"past its deadline of {silent[0].deadline_s:.1f} s")
        if not alive:
            if any(flag == STOPPED for flag in finished):
                return outcome(True, heartbeat)  # cancelled, timed out or handed back
            return Outcome.SUCCEEDED
        if heartbeat.should_stop() and not any(finished):
            if heartbeat.lease_lost or (deadline is not None and time.monotonic() > deadline):
                # A follower whose attempt ended elsewhere (a peer lost): a silent rank here
                # is who the others waited for; say so, and SIGKILL it (a stopped process
                # would take _terminate's 10 s).
                silent = pulse.behind(alive_ranks(codes), node.collective_timeout_s / 2) if pulse and node else []
                if silent:
                    _hung(context, silent, node, "the attempt ended on its other nodes")
                _terminate(context)
                return outcome(True, heartbeat)
            if deadline is None:
                # every rank stops at its next window boundary and checkpoints it; the value
                # says why (its trackers' runs end by it)
                stop.value = stop_reason(heartbeat)
                deadline = time.monotonic() + grace_s
        multiprocessing.connection.wait([p.sentinel for p in alive], timeout=POLL_S)


def alive_ranks(codes: list[int | None]) -> list[int]:
    return [i for i, code in enumerate(codes) if code is None]


def _hung(context: Any, silent: list[Silent], node: Node | None, after: str) -> RankHung:
    """End every rank (the silent ones by SIGKILL: a stopped process never handles a SIGTERM)
    and say which hung."""
    for s in silent:
        with contextlib.suppress(ProcessLookupError):
            context.processes[s.local_rank].kill()
    _terminate(context)
    node = node or Node(0, 1, 0, 0.0)
    error = node.hung(silent, [p.pid for p in context.processes], after)
    log.warning("%s", error)
    return error


def _rank_failed(context: Any, index: int, finished: Any, grace_s: float, peer_lost: Any,
                 pulse: Pulse | None = None, node: Node | None = None) -> Outcome:
    lost = _of_lost_peers(context, peer_lost)  # before this process ends any rank itself
    if lost and pulse is not None and node is not None and not any(finished):
        # A peer failed waiting for someone: a rank of this node still alive and silent for
        # half the collective timeout is who it waited for (a stopped rank fails nothing).
        alive = [i for i, p in enumerate(context.processes) if p.exitcode is None]
        silent = pulse.behind(alive, node.collective_timeout_s / 2)
        if silent:
            raise _hung(context, silent, node, "its peers' collective timed out waiting for it")
    if any(finished):
        _await_exit(context, grace_s)  # finishing ranks are writing or tearing down
    reason = _failure(context, index)
    if all(finished):
        log.warning("a DDP rank failed in teardown after every rank finished: %s", reason)
        return Outcome.SUCCEEDED
    _terminate(context)
    raise RankFailed(reason, lost)


def _of_lost_peers(context: Any, peer_lost: Any) -> bool:
    """Whether the ranks that failed here all failed of a lost peer: one that raised an error
    of its own (its peers then lose it) makes the failure a training error."""
    failed = [i for i, p in enumerate(context.processes) if p.exitcode not in (None, 0)]
    return bool(failed) and all(
        killed(context.processes[i].exitcode) or (peer_lost is not None and peer_lost[i])
        for i in failed
    )


def _failure(context: Any, index: int) -> str:
    """What rank ``index`` died of: the last line of its traceback, or its signal/exit code."""
    path = context.error_files[index]
    if os.access(path, os.R_OK) and os.path.getsize(path):
        with open(path, "rb") as handle:
            text = str(pickle.load(handle)).strip()  # the rank's traceback, written by torch's wrapper
        return f"a training rank failed: {text.splitlines()[-1] if text else 'no message'}"
    code = context.processes[index].exitcode
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"a training rank died: process {index} terminated with signal {name}"
    return f"a training rank died: process {index} terminated with exit code {code}"


def _await_exit(context: Any, timeout_s: float) -> None:
    """Let the ranks that are still alive exit by themselves; kill what is left at the end."""
    deadline = time.monotonic() + timeout_s
    for process in context.processes:
        process.join(timeout=max(0.0, deadline - time.monotonic()))
    _terminate(context)  # only ranks stuck past the deadline are left


def _terminate(context: Any) -> None:
    for process in context.processes:
        if process.is_alive():
            process.terminate()
    for process in context.processes:
        process.join(timeout=10)
        if process.is_alive():
            process.kill()


def _rank_main(
    local_rank: int,
    first: dict[str, Any],
    settings_data: dict[str, Any],
    spec_data: dict[str, Any],
    attempt_data: dict[str, Any],
    checkpoint: str | None,
    finished: Any,
    stop: Any,
    peer_lost: Any,
    pulse: Pulse,
) -> None:
    """One spawned rank: join the process group, ``run_attempt`` (until its end or the parent's
    ``stop``, then checkpointed where every rank stopped), then tear down in order (every rank
    at a barrier, then ``destroy_process_group``), so no rank closes its connections while
    another still uses them (an abort at exit)."""
    cuda = torch.cuda.is_available()
    place = replace(Place(**first), rank=first["rank"] + local_rank, local_rank=local_rank,
                    device=f"cuda:{local_rank}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(local_rank)
    die_with_parent()
    settings = Settings(**settings_data)
    attempt = Attempt(**attempt_data)
    try:
        # The store its worker serves (node 0's, for a gang), joined with the attempt's secret;
        # the attempt's keys under its own prefix. A dead or hung peer fails this rank's
        # collective within ACCUM_COLLECTIVE_TIMEOUT_S.
        store = join_store(place.master_addr, int(place.master_port or 0), f"{attempt.job_id}/{attempt.attempt}/",
                           place.master_secret, settings.collective_timeout_s)
        dist.init_process_group("nccl" if cuda else "gloo", store=store, rank=place.rank,
                                world_size=place.world, timeout=timedelta(seconds=settings.collective_timeout_s))
        try:
            stopped = run_attempt(
                place, settings, parse_spec(spec_data), attempt,
                checkpoint=Path(checkpoint) if checkpoint is not None else None,
                stop=RankLink(pulse, stop, local_rank),
            )
            finished[local_rank] = STOPPED if stopped else FINISHED
            dist.barrier()  # every rank is done before any closes its connections
        finally:
            dist.destroy_process_group()
    except BaseException as exc:
        peer_lost[local_rank] = lost_peer(exc)  # the parent tells a lost peer from a training error
        raise

