"""The tracker host: a process of its own (one per attempt, rank 0's) that delivers a job's
points to its trackers, so the clients' encoding and requests never take the training
process's GIL or core.

Started by ``handover.TrackerHost`` with the ``spawn`` method: a fresh interpreter that never
imports torch (nothing here does). It runs the attempt's ``TrackerSink``\\ s as the training
process once did (their threads, outage events, resume without double steps, the final
checkpoint), fed by the training process's batches: ``(metrics dicts, commands)`` a flush
period at a time, one pickle a batch. It reports each sink's progress back (``SinkStatus``)
and ``DONE`` once every sink has delivered and finished; then it exits. A tracker still down
when the attempt ends keeps it running, delivering once the tracker is back, for as long as
the worker lives (it dies with the worker: ``PR_SET_PDEATHSIG``). The training side gone
without an end (its pipe closed) ends the sinks as an attempt handed back would: delivered,
the runs left open.
"""

from __future__ import annotations

import importlib
import os
import sys
import threading
import time
from dataclasses import dataclass
from multiprocessing import AuthenticationError
from multiprocessing.connection import Connection, Listener
from typing import Any

from services.artifacts import merged_key
from services.jobdb.sessions import session_factory
from services.settings import Settings
from services.spec import JobSpec, parse_spec
from services.worker.checkpoints.stores import artifact_store, node_cache
from services.worker.checkpoints.uploads import CheckpointUploads
from services.worker.parent_death import die_with_parent
from services.worker.trackers.base import RunIdentity, Tracker
from services.worker.trackers.sink import TrackerSink

REPORT_S = 0.1  # how often progress goes back to the training process while it changes
DONE = "done"


@dataclass(frozen=True)
class HostStarted:
    """The host's first message: its pid, whether torch got in (it must not: tests) and the
    niceness it runs at (ACCUM_TRACKER_HOST_NICE above the training process's)."""

    pid: int
    torch_imported: bool
    niceness: int


@dataclass(frozen=True)
class SinkStatus:
    """One sink's progress as the training process sees it (the bench reads the CPU times)."""

    opened: bool = False
    delivered_step: int = -1
    cpu_s: float = 0.0  # the sink's thread, all of it
    open_end_cpu_s: float = 0.0  # of which opening and finishing the run


def make_tracker(name: str, settings: Settings, spec: JobSpec, uploads: CheckpointUploads) -> Tracker:
    if name == "mlflow":
        from services.worker.trackers.mlflow_tracker import MergedModel, MlflowTracker

        merged = (MergedModel(uploads.store, merged_key(uploads.job_id))
                  if spec.peft is not None and spec.peft.merge else None)  # a LoRA job's merged model
        return MlflowTracker(settings.mlflow_tracking_uri, settings.mlflow_experiment,
                             spec.register_model, merged)
    if name == "tensorboard":
        from services.worker.trackers.tensorboard_tracker import TensorBoardTracker

        local_root = (settings.artifacts_path if not settings.artifacts_on_s3
                      else uploads.cache.staging_dir(uploads.job_id))
        return TensorBoardTracker(uploads.store, local_root, settings.tensorboard_url)
    from services.worker.trackers.wandb_tracker import WandbTracker

    return WandbTracker(settings.wandb_mode, settings.wandb_project, settings.wandb_entity,
                        settings.wandb_path / uploads.job_id, settings.wandb_base_url)


def host_main(inbox: Connection, outbox: Connection, settings_data: dict[str, Any],
              spec_data: dict[str, Any], attempt: int, identities: dict[str, RunIdentity],
              own_process: bool = True) -> None:
    """The host process's body (``spawn``: its arguments pickled once, at its start); in the
    worker's shared host (``server_main``), one attempt's thread (``own_process=False``)."""
    settings, spec = Settings(**settings_data), parse_spec(spec_data)
    if own_process:
        die_with_parent()
        os.nice(settings.tracker_host_nice)  # before the clients start their threads and processes
    job_id = next(iter(identities.values())).job_id
    uploads = CheckpointUploads(artifact_store(settings), node_cache(settings), job_id,
                                retry_for_s=settings.lease_timeout_s)
    sessions = session_factory(settings)
    sinks = {name: TrackerSink(make_tracker(name, settings, spec, uploads), sessions, identity,
                               attempt, settings.tracker_flush_every_s,
                               settings.tracker_buffer_max_steps)
             for name, identity in identities.items()}
    started_cpu = time.process_time()  # after the imports and the clients' set-up
    for sink in sinks.values():
        sink.start()
    reporter = Reporter(outbox)
    reporter.send(HostStarted(os.getpid(), "torch" in sys.modules, os.nice(0)))
    ending, listening = False, True
    while not (ending and all(sink.done.is_set() for sink in sinks.values())):
        batch = None
        try:
            if listening and inbox.poll(REPORT_S):
                batch = inbox.recv()
            elif not listening:
                time.sleep(REPORT_S)
        except (EOFError, OSError):  # the training side closed its end: after ``end``, or gone
            listening = False
            if not ending:  # gone without an end: delivered, the runs left open
                ending = True
                for sink in sinks.values():
                    sink.end(None, None)
        if batch is not None:
            raw, commands = batch
            for sink in sinks.values():
                for metrics in raw:
                    sink.push(metrics)
            for command, *args in commands:
                for sink in sinks.values():
                    getattr(sink, command)(*args)  # tag(key, value), flush(), end(status, checkpoint)
                ending = ending or command == "end"
        reporter.report(sinks, time.process_time() - started_cpu)
    reporter.report(sinks, time.process_time() - started_cpu)
    reporter.send(DONE)


def server_main(address: str, authkey: bytes, settings_data: dict[str, Any], ready: Connection) -> None:
    """The worker's shared tracker host (``handover.share_host``): one process for every
    attempt of the worker, its clients imported once. It listens on ``address`` (a Unix
    socket, ``authkey``); each attempt connects, sends ``(settings, spec, attempt,
    identities)`` and is then served by ``host_main`` on a thread of its own, over that one
    connection, as a host process of its own would serve it (its sinks outlive the attempt
    while a tracker is down). It dies with the worker (``PR_SET_PDEATHSIG``)."""
    die_with_parent()
    settings = Settings(**settings_data)
    os.nice(settings.tracker_host_nice)
    listener = Listener(address, family="AF_UNIX", authkey=authkey)
    ready.send(os.getpid())
    ready.close()
    threading.Thread(target=import_clients, args=(settings.trackers,), name="accum-tracker-imports",
                     daemon=True).start()
    while True:
        try:
            connection = listener.accept()
        except (OSError, EOFError, AuthenticationError):  # a client gone mid-handshake
            continue
        threading.Thread(target=serve_attempt, args=(connection,), name="accum-tracker-attempt",
                         daemon=True).start()


def serve_attempt(connection: Connection) -> None:
    """One attempt, on the shared host: its sinks fed over ``connection`` until they are done."""
    try:
        settings_data, spec_data, attempt, identities = connection.recv()
        host_main(connection, connection, settings_data, spec_data, attempt, identities, own_process=False)
    except (EOFError, OSError):  # the training side gone before its first message
        pass
    finally:
        connection.close()


def import_clients(trackers: list[str]) -> None:
    """The offered trackers' clients, imported once as the shared host starts (~3 s for
    MLflow's on a quiet machine, which a host of the attempt's own paid at every attempt); an
    attempt's sink that needs one meanwhile waits on the same import."""
    modules = {"mlflow": ("mlflow.tracking", "mlflow.utils.rest_utils", "mlflow.utils.credentials",
                          "mlflow.entities"),
               "tensorboard": ("services.worker.trackers.tensorboard_tracker",),
               "wandb": ("services.worker.trackers.wandb_tracker", "wandb")}
    for name in trackers:
        for module in modules.get(name, ()):
            try:
                importlib.import_module(module)
            except Exception:  # noqa: BLE001 - not installed: the sink reports it, as before
                break


class Reporter:
    """Progress to the training process: what changed, as it changes; nothing once that side
    has closed its end (an attempt that stopped waiting)."""

    def __init__(self, outbox: Connection) -> None:
        self.outbox, self.closed = outbox, False
        self.last: dict[str, SinkStatus] = {}

    def report(self, sinks: dict[str, TrackerSink], host_cpu_s: float) -> None:
        now = {name: SinkStatus(s.opened, s.delivered_step, s.cpu_s, s.open_end_cpu_s)
               for name, s in sinks.items()}
        if now != self.last:
            self.last = now
            self.send((now, host_cpu_s))

    def send(self, message: object) -> None:
        if self.closed:
            return
        try:
            self.outbox.send(message)
        except OSError:  # BrokenPipeError: nobody listens any more
            self.closed = True
