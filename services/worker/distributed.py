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
import socket
from dataclasses import asdict
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from services.artifacts import open_store
from services.settings import Settings
from services.spec import JobSpec, parse_spec
from services.worker.heartbeat import Heartbeat
from services.worker.runner import Attempt, checkpoint_uploads, node_cache, prepare_resume
from services.worker.training import outcome

POLL_S = 0.1


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def train_distributed(
    settings: Any, spec: JobSpec, attempt: Attempt, heartbeat: Heartbeat
) -> str | None:
    """Run ``spec.gpus`` ranks; returns ``succeeded``, ``cancelled``, ``HANDED_BACK`` (worker
    shutdown), or None (lease lost)."""
    from services.worker.db import session_factory

    world = spec.gpus
    if torch.cuda.is_available() and torch.cuda.device_count() < world:
        raise ValueError(
            f"the job asks for gpus={world} but this worker sees {torch.cuda.device_count()} "
            "GPUs; start its worker with enough GPUs visible (--gpus 0,1,...) or lower gpus"
        )
    cache = node_cache(settings)
    path = prepare_resume(session_factory(settings), attempt, open_store(settings.artifacts_url), cache)
    checkpoint = str(path) if path is not None else None
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
    return "succeeded"


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
    from torch.nn.parallel import DistributedDataParallel

    from accumcore import load_checkpoint
    from services.worker.build import build_run
    from services.worker.callbacks import StoreCallback
    from services.worker.db import session_factory

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
                uploads=checkpoint_uploads(settings, attempt, None),
                max_owner_bytes=settings.max_artifact_bytes_per_owner,
                retry_for_s=settings.lease_timeout_s,  # rank 0 has no heartbeat of its own
            )
            callbacks.append(store_callback)
        run = build_run(
            spec,
            callbacks=callbacks,
            checkpoint_dir=node_cache(settings).staging_dir(attempt.job_id),
            data_root_default=settings.home / "data",
            device=device,
            rank=rank,
            world=world,
            wrap_model=lambda m: DistributedDataParallel(m, device_ids=[rank] if cuda else None),
        )
        if store_callback is not None:
            store_callback.total_steps = run.total_steps
        if checkpoint is not None:
            run.trainer.load_state_dict(load_checkpoint(checkpoint, map_location=device))
        run.trainer.fit(run.train_loader, **run.fit_kwargs)
    finally:
        if store_callback is not None:
            store_callback.close()
        dist.destroy_process_group()
