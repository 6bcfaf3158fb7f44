"""One rank of one attempt, whatever the world size: ``run_attempt``.

    stopped = run_attempt(place, settings, spec, attempt, checkpoint=path, heartbeat=heartbeat)

A single-process job runs it in the worker's process as rank 0 of a world of 1, with no process
group; a ``gpus: k`` job runs it in each of k spawned ranks, inside their process group
(``services.worker.launch`` starts them and decides the outcome). Its steps: the writer's
callbacks (rank 0: metrics, progress and checkpoint rows; the job's trackers), the run built
from the spec (its micro-batch decided by ``services.worker.micro_batch``, its model shared by
``services.worker.strategy``), the warm start and build notes recorded, the checkpoint
restored, ``fit``, the checkpoint where a stop ended it, then the writer's close.

The trainer writes checkpoints into this node's staging directory; ``CheckpointUploads`` sends
them to the artifact store behind training, and the last one (final, or where a SIGTERM, a
cancel or a timeout stopped the job) is in the store before this returns. A sharded (FSDP)
model's checkpoint is stored by every rank, its own files (``ShardedUploads``); rank 0 writes
its row once all are stored.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from accumcore import Callback, NonFiniteError, load_checkpoint
from accumcore.checkpoint import CheckpointWriteError
from accumcore.distributed import unwrap
from services.jobdb.sessions import session_factory
from services.jobdb.status import resume_hint
from services.settings import Settings
from services.spec import JobSpec
from services.worker import levers, micro_batch, phases
from services.worker.attempt import Attempt, Flags, Outcome, outcome
from services.worker.build import Run, build_data, build_model_on, build_run
from services.worker.callbacks import StoreCallback
from services.worker.checkpoints.fetch import fetch_checkpoint
from services.worker.checkpoints.metrics import observe_fetch
from services.worker.checkpoints.resume import checkpoint_uploads
from services.worker.checkpoints.shards import ShardedUploads, side_gather
from services.worker.checkpoints.stores import artifact_store, node_cache
from services.worker.heartbeat import Heartbeat
from services.worker.place import Place
from services.worker.pulse import Abandoned, BeatingLoader, RankLink
from services.worker.strategy import model_wrapper, sharded
from services.worker.system_metrics import SystemMetrics
from services.worker.trackers.callback import TrackerCallback
from services.worker.trackers.job import job_trackers
from services.worker.warm_start import describe, job_initial_weights

# How an attempt's end ends the job's tracker runs; the others leave them open for the next.
TRACKED_END = {Outcome.SUCCEEDED: "succeeded", Outcome.CANCELLED: "cancelled",
               Outcome.TIMED_OUT: "failed"}


def run_attempt(place: Place, settings: Settings, spec: JobSpec, attempt: Attempt, *,
                checkpoint: Path | None, heartbeat: Heartbeat | None = None,
                stop: RankLink | None = None) -> bool:
    """Train this rank; returns whether a stop ended ``fit`` early (checkpointed there).

    Args:
        checkpoint: the local copy of the checkpoint to resume from (``resume.prepare_resume``).
        heartbeat: the attempt's lease and flags, where this rank runs in the process that
            holds them (a world of 1): a cancel, a shutdown, a timeout stop it, and a lost lease
            writes nothing more. Spawned ranks have none: the parent holds it.
        stop: the rank's link to its supervisor (``services.worker.pulse``): its progress
            beats; in a spawned rank, the stop the supervisor raises for every rank at once,
            and why (a world of 1 in the worker's process: never raised, the heartbeat's flags
            stop it).
    """
    writer = Writer.open(place, settings, spec, attempt, heartbeat)
    # The system metrics first: each sample joins a step's metrics before the store and the
    # trackers read them.
    callbacks = [c for c in (stop, writer.system, writer.store, writer.trackers, writer.shards)
                 if c is not None]
    try:
        run = build_run(
            spec, callbacks=callbacks,
            checkpoint_dir=node_cache(settings).staging_dir(attempt.job_id),
            data_root_default=settings.home / "data",
            device=place.device, rank=place.rank, world=place.world,
            wrap_model=model_wrapper(spec, place),
            init_weights=job_initial_weights(session_factory(settings), spec, attempt.job_id,
                                             fetcher(settings)),
            chosen=attempt.micro_batch,
        )
        gather_warm_start(run, place)
        if stop is not None and run.fit_kwargs.get("val_loader") is not None:  # its batches beat too
            run.fit_kwargs["val_loader"] = BeatingLoader(run.fit_kwargs["val_loader"], stop)
        writer.record_start(run, spec, attempt)
        if checkpoint is not None:
            run.trainer.load_state_dict(restored(run, checkpoint))
        phases.mark("build")
        stopped = fit(run, attempt, settings, lease_lost=lambda: heartbeat is not None and heartbeat.lease_lost)
        if not stopped and spec.peft is not None and spec.peft.merge:
            # Rank 0 stores it; a sharded model is gathered whole first, with every rank, into
            # the spec's model rebuilt unsharded on rank 0's CPU (levers.store_merged).
            peft = spec.peft
            levers.store_merged(
                unwrap(run.trainer.model), writer.store.uploads if writer.store is not None else None,
                attempt.job_id, rebuild=lambda: levers.add_lora(
                    build_model_on(spec, build_data(spec, settings.home / "data"), "cpu", None).module, peft))
    except Abandoned:
        raise  # its supervisor recorded the attempt hung: nothing is written, trackers left open
    except BaseException:
        writer.fail()
        raise
    # on_fit_end closed it, unless a stop's checkpoint followed: that one is uploaded now,
    # before the job is handed back or finished. An upload that failed raises here.
    writer.close(stopped, heartbeat if heartbeat is not None else stop)
    return stopped


def fit(run: Run, attempt: Attempt, settings: Settings, lease_lost: Callable[[], bool]) -> bool:
    """``trainer.fit``, then the checkpoint where a stop (not a lost lease) ended it; its
    errors name where the job's checkpoints are and how to go on."""
    try:
        history = run.trainer.fit(run.train_loader, **run.fit_kwargs)
        if history.stopped and not lease_lost():
            # Where it stopped (the last finished window: on every rank the same, a stop is
            # all-reduced), so a hand-back or a `resume` continues from there with the metrics
            # up to it kept, not from an older checkpoint or the start. With k ranks a
            # collective: each rank's RNG states go into rank 0's file.
            run.trainer.checkpoint()
        return bool(history.stopped)
    except CheckpointWriteError as exc:
        message = f"{exc.strerror or exc}; then {resume_hint(attempt.job_id)} continues from there"
        raise CheckpointWriteError.of(exc.errno, message) from exc
    except NonFiniteError as exc:
        raise in_store(exc, f"{artifact_store(settings).url}/{attempt.job_id}/") from exc


def restored(run: Run, checkpoint: Path) -> dict[str, Any]:
    """The trainer state to resume from; a sharded model (and its optimizer) gets its shards
    loaded in place first (from a sharded checkpoint's folder: DCP reshards it to this world
    size; or from a full file)."""
    trainer = run.trainer
    if trainer.sharded or checkpoint.is_dir():  # a sharded one into a world of 1 too (a node lost)
        return load_checkpoint(checkpoint, model=trainer.model, optimizer=trainer.optimizer)
    return load_checkpoint(checkpoint, map_location=trainer.device)


def fetcher(settings: Settings) -> Callable[[str, str], Path]:
    """Fetch a checkpoint (key, sha256) through this node's cache: a file, or a sharded one's folder."""
    return lambda key, sha: observe_fetch(
        lambda: fetch_checkpoint(artifact_store(settings), node_cache(settings), key, sha))


def gather_warm_start(run: Run, place: Place) -> None:
    """Every rank's hash of the weights it loaded, for the writer's ``warm_start`` event."""
    if run.warm_start is None or not place.grouped:
        return
    import torch.distributed as dist  # lazy: only ranks in a process group get here

    hashes: list[Any] = [None] * place.world
    dist.all_gather_object(hashes, run.warm_start["weights_sha256"][0])
    run.warm_start["weights_sha256"] = hashes


class Writer:
    """What rank 0 records of the attempt (the other ranks have none): the store callback
    (metrics, progress, checkpoint rows and uploads), the job's trackers and the system metrics
    sampled beside them; and on every rank of a sharded (FSDP) attempt, the store of its own
    checkpoint files."""

    def __init__(self, store: StoreCallback | None, trackers: TrackerCallback | None,
                 shards: ShardCallback | None = None, system: SystemMetrics | None = None) -> None:
        self.store, self.trackers, self.shards, self.system = store, trackers, shards, system

    @classmethod
    def open(cls, place: Place, settings: Settings, spec: JobSpec, attempt: Attempt,
             heartbeat: Heartbeat | None) -> Writer:
        uploads = checkpoint_uploads(settings, attempt, heartbeat) if place.writes or sharded(spec) else None
        shards = None
        if uploads is not None and sharded(spec):  # a world of 1 too: its group of one
            # Every rank, at the same point: a collective. Its gathers wait for the slowest
            # rank's upload (a store outage is waited out for a lease timeout) and more.
            gather = side_gather(settings.lease_timeout_s * 2 + settings.collective_timeout_s)
            shards = ShardedUploads(uploads, place.rank, gather, settings.consolidate_max_bytes)
        if not place.writes:
            return cls(None, None, ShardCallback(shards) if shards is not None else None)
        assert uploads is not None
        sessions = session_factory(settings)
        store = StoreCallback(
            sessions, attempt.job_id, attempt.attempt, attempt.worker_id,
            total_steps=0, keep_checkpoints=spec.keep_checkpoints, uploads=uploads,
            heartbeat=heartbeat, max_owner_bytes=settings.max_artifact_bytes_per_owner,
            retry_for_s=settings.lease_timeout_s,  # a spawned rank 0 has no heartbeat of its own
            shards=shards,
        )
        return cls(store, job_trackers(settings, sessions, attempt, spec, uploads),
                   system=SystemMetrics(settings.system_metrics_every_s))

    def record_start(self, run: Run, spec: JobSpec, attempt: Attempt) -> None:
        """The run's size, the micro-batch ``"auto"`` chose (once per job), the warm start and
        what building decided, as the job's events."""
        if self.store is None:
            return
        micro_batch.remember(self.store.sessions, spec, attempt, run.micro_batch_size, run.accumulation_steps)
        self.store.total_steps = run.total_steps
        if self.system is not None:
            note = self.system.start(run.trainer.device)
            self.store.on_event(run.trainer, "system_metrics", note, {"every_s": self.system.every_s})
        if run.warm_start is not None:
            self.store.on_event(run.trainer, "warm_start", describe(run.warm_start), run.warm_start)
        for kind, message, data in run.notes:
            self.store.on_event(run.trainer, kind, message, data)

    def close(self, stopped: bool, flags: Flags | None) -> None:
        """The last rows and upload written; the trackers' runs ended as the attempt ended,
        told by ``flags``: the heartbeat in the worker's process, the supervisor's stop and its
        reason in a spawned rank (a lost lease and a hand-back leave them open for the next
        attempt)."""
        if self.system is not None:
            self.system.close()
        if self.store is not None:
            self.store.close()
        if self.shards is not None:
            self.shards.shards.wait()
        phases.mark("final_writes")
        if self.trackers is not None:
            if flags is not None:
                self.trackers.end(TRACKED_END.get(outcome(stopped, flags)))
            else:
                self.trackers.end(None if stopped else "succeeded")
            phases.mark("tracker_end")

    def fail(self) -> None:
        if self.system is not None:
            self.system.close()
        if self.store is not None:
            with contextlib.suppress(Exception):  # the first error is the one to report
                self.store.close()  # stop the writer thread
        if self.trackers is not None:
            self.trackers.end("failed")


class ShardCallback(Callback):
    """A rank other than 0 of a sharded attempt: its files of each checkpoint to the store."""

    def __init__(self, shards: ShardedUploads) -> None:
        self.shards = shards

    def on_shards(self, trainer: Any, step: int, files: list[Path]) -> None:
        self.shards.submit(step, files)


def in_store(exc: NonFiniteError, prefix: str) -> NonFiniteError:
    """The error naming its last finite checkpoint where everyone finds it, the store, not
    this node's staging directory."""
    if exc.checkpoint is None:
        return exc
    # A sharded checkpoint's staging directory <step>/ is stored as the objects under <step>/.
    stored = exc.checkpoint.name if exc.checkpoint.suffix else f"{exc.checkpoint.name}/"
    return NonFiniteError(str(exc).replace(str(exc.checkpoint), prefix + stored),
                          step=exc.step, metric=exc.metric, value=exc.value,
                          checkpoint=exc.checkpoint)
