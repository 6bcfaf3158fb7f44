"""Multi-GPU jobs (``gpus: k > 1``): k DDP processes on this worker's GPUs (gloo on CPU).

The worker process keeps the lease and the heartbeat; it spawns k ranks and watches them.
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

import logging
import multiprocessing.connection
import os
import pickle
import signal
import time
from dataclasses import asdict
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel

from accumcore import Callback, load_checkpoint
from services.artifacts import open_store
from services.ports import free_port
from services.settings import Settings
from services.spec import JobSpec, parse_spec
from services.store.sessions import session_factory
from services.worker.attempt import Attempt, Outcome
from services.worker.build import build_run
from services.worker.callbacks import StoreCallback
from services.worker.heartbeat import Heartbeat
from services.worker.micro_batch import record_choice, recorded_choice
from services.worker.resume import checkpoint_uploads, node_cache, prepare_resume
from services.worker.store_metrics import observe_fetch
from services.worker.trackers import job_trackers
from services.worker.training import outcome
from services.worker.warm_start import describe, job_initial_weights

POLL_S = 0.1
log = logging.getLogger(__name__)


def train_distributed(
    settings: Settings, spec: JobSpec, attempt: Attempt, heartbeat: Heartbeat
) -> Outcome:
    """Run ``spec.gpus`` ranks; returns ``SUCCEEDED``, ``CANCELLED``, ``HANDED_BACK`` (worker
    shutdown), or ``LEASE_LOST``."""
    world = spec.gpus
    if torch.cuda.is_available() and torch.cuda.device_count() < world:
        raise ValueError(
            f"the job asks for gpus={world} but this worker sees {torch.cuda.device_count()} "
            "GPUs; start its worker with enough GPUs visible (--gpus 0,1,...) or lower gpus"
        )
    cache = node_cache(settings)
    path = prepare_resume(session_factory(settings), attempt, open_store(settings.artifacts_url), cache)
    checkpoint = str(path) if path is not None else None
    chosen = recorded_choice(session_factory(settings), attempt.job_id) if spec.micro_batch_size == "auto" else None
    port = free_port()
    # finished[r]: FINISHED once rank r's fit returned, STOPPED when ``stop`` ended it (on rank 0,
    # after its last checkpoint and metrics are recorded): from then on a rank that dies in
    # teardown does not fail the job. ``stop`` is raised by this process (watch_ranks).
    spawn = mp.get_context("spawn")
    finished = spawn.Array("b", world, lock=False)
    stop = spawn.Value("b", 0, lock=False)
    context = mp.start_processes(
        _rank_main,
        args=(world, port, settings.model_dump(mode="json"), attempt.spec, asdict(attempt), checkpoint,
              finished, chosen, stop),
        nprocs=world,
        join=False,
        start_method="spawn",  # never fork a process that may hold CUDA or DB connections
    )
    return watch_ranks(context, finished, heartbeat, grace_s=settings.lease_timeout_s, stop=stop)


FINISHED, STOPPED = 1, 2  # finished[rank]: fit returned at its end / stopped by the stop flag


def watch_ranks(context: Any, finished: Any, heartbeat: Any, grace_s: float, stop: Any) -> Outcome:
    """Wait for the ranks; raise when one fails while training. On a cancel, a timeout or a
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
        failed = next((i for i, p in enumerate(processes) if p.exitcode not in (None, 0)), None)
        if failed is not None:
            return _rank_failed(context, failed, finished, grace_s)
        alive = [p for p in processes if p.exitcode is None]
        if not alive:
            if any(flag == STOPPED for flag in finished):
                return outcome(True, heartbeat)  # cancelled, timed out or handed back
            return Outcome.SUCCEEDED
        if heartbeat.should_stop() and not any(finished):
            if heartbeat.lease_lost or (deadline is not None and time.monotonic() > deadline):
                _terminate(context)
                return outcome(True, heartbeat)
            if deadline is None:
                stop.value = 1  # every rank stops at its next window boundary and checkpoints it
                deadline = time.monotonic() + grace_s
        multiprocessing.connection.wait([p.sentinel for p in alive], timeout=POLL_S)


def _rank_failed(context: Any, index: int, finished: Any, grace_s: float) -> Outcome:
    if any(finished):
        _await_exit(context, grace_s)  # finishing ranks are writing or tearing down
    reason = _failure(context, index)
    if all(finished):
        log.warning("a DDP rank failed in teardown after every rank finished: %s", reason)
        return Outcome.SUCCEEDED
    _terminate(context)
    raise RuntimeError(reason)


def _failure(context: Any, index: int) -> str:
    """What rank ``index`` died of: the last line of its traceback, or its signal/exit code."""
    path = context.error_files[index]
    if os.access(path, os.R_OK) and os.path.getsize(path):
        with open(path, "rb") as handle:
            text = str(pickle.load(handle)).strip()  # the rank's traceback, written by torch's wrapper
        return f"a DDP rank failed: {text.splitlines()[-1] if text else 'no message'}"
    code = context.processes[index].exitcode
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"a DDP rank died: process {index} terminated with signal {name}"
    return f"a DDP rank died: process {index} terminated with exit code {code}"


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
    rank: int,
    world: int,
    port: int,
    settings_data: dict[str, Any],
    spec_data: dict[str, Any],
    attempt_data: dict[str, Any],
    checkpoint: str | None,
    finished: Any,
    chosen: tuple[int, int] | None,
    stop: Any,
) -> None:
    """One rank: join the process group, build the run, restore, fit (until its end or the
    parent's ``stop``, then checkpoint where every rank stopped), then tear down in order
    (every rank at a barrier, then ``destroy_process_group``), so no rank closes its
    connections while another still uses them (an abort at exit)."""
    settings = Settings(**settings_data)
    spec = parse_spec(spec_data)
    attempt = Attempt(**attempt_data)
    cuda = torch.cuda.is_available()
    device = f"cuda:{rank}" if cuda else "cpu"
    if cuda:
        torch.cuda.set_device(rank)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world)
    try:
        callbacks: list[Callback] = [SharedStop(stop)]
        store_callback = trackers = None
        if rank == 0:  # one writer: metrics are the same on every rank (the loss is all-reduced)
            uploads = checkpoint_uploads(settings, attempt, None)
            store_callback = StoreCallback(
                session_factory(settings), attempt.job_id, attempt.attempt, attempt.worker_id,
                total_steps=0, keep_checkpoints=spec.keep_checkpoints,
                uploads=uploads,
                max_owner_bytes=settings.max_artifact_bytes_per_owner,
                retry_for_s=settings.lease_timeout_s,  # rank 0 has no heartbeat of its own
            )
            callbacks.append(store_callback)
            trackers = job_trackers(settings, session_factory(settings), attempt, spec, uploads)
            if trackers is not None:
                callbacks.append(trackers)
        run = build_run(
            spec,
            callbacks=callbacks,
            checkpoint_dir=node_cache(settings).staging_dir(attempt.job_id),
            data_root_default=settings.home / "data",
            device=device,
            rank=rank,
            world=world,
            wrap_model=lambda m: DistributedDataParallel(m, device_ids=[rank] if cuda else None),
            init_weights=job_initial_weights(
                session_factory(settings), spec, attempt.job_id,
                lambda key, sha: observe_fetch(
                    lambda: node_cache(settings).fetch(open_store(settings.artifacts_url), key, sha)),
            ),
            chosen=chosen,
        )
        if run.warm_start is not None:  # every rank's hash of what it loaded, for rank 0's event
            hashes: list[Any] = [None] * world
            dist.all_gather_object(hashes, run.warm_start["weights_sha256"][0])
            run.warm_start["weights_sha256"] = hashes
        if rank == 0 and spec.micro_batch_size == "auto" and chosen is None:
            record_choice(session_factory(settings), attempt.job_id, attempt.attempt,
                          run.micro_batch_size, int(run.accumulation_steps))  # type: ignore[arg-type]
        if store_callback is not None:
            store_callback.total_steps = run.total_steps
            if run.warm_start is not None:
                store_callback.on_event(run.trainer, "warm_start", describe(run.warm_start), run.warm_start)
            for kind, message, data in run.notes:
                store_callback.on_event(run.trainer, kind, message, data)
        if checkpoint is not None:
            run.trainer.load_state_dict(load_checkpoint(checkpoint, map_location=device))
        history = run.trainer.fit(run.train_loader, **run.fit_kwargs)
        if history.stopped:
            # Where every rank stopped (the same window: a stop is all-reduced), so `resume`
            # or the next attempt continues from there with the metrics up to it kept. A
            # collective: each rank's RNG states go into rank 0's file.
            run.trainer.checkpoint()
        if store_callback is not None:
            store_callback.close()  # rank 0's last metrics and checkpoint rows are written
            store_callback = None
        if trackers is not None:
            # A stop (cancel, timeout, shutdown) is told apart by the parent: the runs stay
            # open for a resume or the next attempt either way.
            trackers.end(None if history.stopped else "succeeded")
            trackers = None
        finished[rank] = STOPPED if history.stopped else FINISHED
        dist.barrier()  # every rank is done before any closes its connections
    finally:
        if store_callback is not None:
            store_callback.close()
        if trackers is not None:
            trackers.end("failed")
        dist.destroy_process_group()


class SharedStop(Callback):
    """A rank's stop: the flag its parent raises on a cancel, a timeout or a shutdown."""

    def __init__(self, flag: Any) -> None:
        self.flag = flag

    def should_stop(self) -> bool:
        return bool(self.flag.value)
