"""Multi-GPU jobs (``gpus: k > 1``): k DDP processes on this worker's GPUs (gloo on CPU).

The worker process keeps the lease and the heartbeat; it spawns k ranks and watches them.
Rank 0 writes metrics, progress and checkpoints; every rank trains its shard of the data, so
the effective batch is m x N x k. A cancel (or a lost lease) terminates the ranks at once:
they are stopped together, never one rank alone (which would leave the others waiting in a
collective), and nothing is checkpointed, as for a single-process cancel. A worker shutdown
stops them the same way and hands the job back from its latest periodic checkpoint.
"""

from __future__ import annotations

import os
from dataclasses import asdict
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel

from accumcore import load_checkpoint
from services.ports import free_port
from services.settings import Settings
from services.spec import JobSpec, parse_spec
from services.store.sessions import session_factory
from services.worker.attempt import Attempt, Outcome, prepare_resume
from services.worker.build import build_run
from services.worker.callbacks import StoreCallback
from services.worker.heartbeat import Heartbeat
from services.worker.training import outcome
from services.worker.warm_start import describe, job_initial_weights

POLL_S = 0.1


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
    checkpoint_dir = settings.artifacts_path / attempt.job_id
    checkpoint = prepare_resume(session_factory(settings), attempt, checkpoint_dir)
    port = free_port()
    context = mp.start_processes(
        _rank_main,
        args=(world, port, settings.model_dump(mode="json"), attempt.spec, asdict(attempt), checkpoint),
        nprocs=world,
        join=False,
        start_method="spawn",  # never fork a process that may hold CUDA or DB connections
    )
    try:
        while not context.join(timeout=POLL_S):
            if heartbeat.should_stop():
                _terminate(context)
                return outcome(True, heartbeat)
    except mp.ProcessRaisedException as exc:
        _terminate(context)
        # The rank's traceback is the message; keep its last line as the error.
        last = str(exc).strip().splitlines()[-1] if str(exc).strip() else repr(exc)
        raise RuntimeError(f"a DDP rank failed: {last}") from exc
    except mp.ProcessExitedException as exc:
        _terminate(context)
        raise RuntimeError(f"a DDP rank died: {exc}") from exc
    return Outcome.SUCCEEDED


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
) -> None:
    """One rank: join the process group, build the run, restore, fit."""
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
        callbacks = []
        store_callback = None
        if rank == 0:  # one writer: metrics are the same on every rank (the loss is all-reduced)
            store_callback = StoreCallback(
                session_factory(settings), attempt.job_id, attempt.attempt, attempt.worker_id,
                total_steps=0, keep_checkpoints=spec.keep_checkpoints,
                retry_for_s=settings.lease_timeout_s,  # rank 0 has no heartbeat of its own
            )
            callbacks.append(store_callback)
        run = build_run(
            spec,
            callbacks=callbacks,
            checkpoint_dir=settings.artifacts_path / attempt.job_id,
            data_root_default=settings.home / "data",
            device=device,
            rank=rank,
            world=world,
            wrap_model=lambda m: DistributedDataParallel(m, device_ids=[rank] if cuda else None),
            init_weights=job_initial_weights(session_factory(settings), spec, attempt.job_id),
        )
        if store_callback is not None:
            store_callback.total_steps = run.total_steps
            if run.warm_start is not None:
                store_callback.on_event(run.trainer, "warm_start", describe(run.warm_start), run.warm_start)
        if checkpoint is not None:
            run.trainer.load_state_dict(load_checkpoint(checkpoint, map_location=device))
        run.trainer.fit(run.train_loader, **run.fit_kwargs)
    finally:
        if store_callback is not None:
            store_callback.close()
        dist.destroy_process_group()
