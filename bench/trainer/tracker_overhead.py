"""What logging a job to each experiment tracker costs its training, as a throughput ratio.

    .venv/bin/python -m bench.trainer.tracker_overhead [--quick] [--repeats 5] [--threads 1] [--out]

The worker's own path: ``services.worker.trackers.job.job_trackers`` builds the callback for a
job row in a real store (SQLite), the trainer calls it every step, a thread of the training
process hands each ACCUM_TRACKER_FLUSH_EVERY_S (2 s, the default) of steps over to the
attempt's tracker host process (``services.worker.trackers.host``), where each tracker's sink
delivers from its own thread through the real client: an MLflow tracking server started here
(SQLite backend), TensorBoard event files (services.worker.trackers.tensorboard_events), W&B
in offline mode (its own service process writes the run file).
``ratio[tracker]`` = steps/s with that tracker / steps/s with none, medians of interleaved
repeats of one epoch of an MLP (the smallest step the service runs: the worst case for a
per-step cost), timed from the first step to the last once the runs are open: what training
loses while its points are delivered beside it (an epoch of several flush periods, so most of
the delivering happens inside it). Target >= 0.99 (logging under 1 % of step time).
``delivered_lag_s``: after the epoch, flushed at once, the seconds until the tracker had every
step (points arrive a flush period or two behind training otherwise; a delay, not a cost).
Outside training, once per attempt: ``open_s`` (the host process starts and imports
the client, W&B starts its service process, MLflow creates the run) and ``end_s`` (the last
batch, W&B's run closing). What each process pays, as CPU us a step: the training process's
hand-over thread (``handover_cpu_us_per_step``) and the host process, all of it from its
clients' set-up on (``host_cpu_us_per_step``: another core's work, not the training's).
"""

from __future__ import annotations

import os
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import torch
from torch import nn

from accumcore import Trainer
from accumcore.data import make_loader
from bench.harness import common
from bench.harness.mlflow_server import MlflowServer
from services.jobdb import jobs, tokens
from services.jobdb.migrate import upgrade
from services.jobdb.sessions import session_factory
from services.ports import free_port
from services.settings import Settings
from services.spec import parse_spec, total_optimizer_steps
from services.worker.attempt import Attempt
from services.worker.checkpoints.resume import checkpoint_uploads
from services.worker.trackers.job import job_trackers

BENCH = "tracker_overhead"
TRACKERS = ("mlflow", "tensorboard", "wandb")
TARGET = 0.99
SPEC = {"model": "mlp", "dataset": "digits", "micro_batch_size": 16, "accumulation_steps": 2,
        "max_steps": 1000, "optimizer": {"name": "sgd", "lr": 0.05}, "gpus": 0}


class Jobs:
    """Job rows in a throwaway store, one per timed run (each gets its own tracker runs)."""

    def __init__(self, settings: Settings) -> None:
        upgrade(settings.database_url)
        self.settings, self.sessions = settings, session_factory(settings)
        with self.sessions.begin() as session:
            self.owner, _ = tokens.create_owner_with_token(session, f"bench-{uuid.uuid4().hex[:6]}")

    def callback(self, tracker: str) -> Any:
        spec = parse_spec({**SPEC, "trackers": [tracker]})
        with self.sessions.begin() as session:
            job, _ = jobs.create_job(session, owner=self.owner, spec=spec.normalised(),
                                     queue="default", max_restarts=0,
                                     total_optimizer_steps=total_optimizer_steps(spec))
            job_id = job.id
        attempt = Attempt(job_id, 1, "bench", None, spec.normalised())
        uploads = checkpoint_uploads(self.settings, attempt, None)
        return job_trackers(self.settings, self.sessions, attempt, spec, uploads)


def opened(callback: Any) -> float:
    """Start the host and wait for its runs to open (the host imports the client, W&B starts
    its service process, MLflow creates the run): a one-off cost at a job's start, outside
    the per-step figure."""
    start = time.perf_counter()
    callback.on_fit_start(None)
    while not all(sink.opened for sink in callback.host.status.values()):
        time.sleep(0.01)
    return time.perf_counter() - start


def one_epoch(data: Any, callback: Any) -> tuple[float, ...]:
    """Steps/s of one epoch with ``callback`` (None: no tracker), the seconds its runs took to
    open before it, the end's wait after it, and CPU seconds a step (less noisy than the ratio
    on a loaded machine): the host's sinks' threads, all of it (opening, delivering, ending the
    run) and the delivering alone; the training process's hand-over thread; the host process.
    Last, the delivery lag: seconds from the epoch's end (flushed at once) until the trackers
    had every step but the last."""
    open_s = opened(callback) if callback is not None else 0.0
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))
    trainer = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.05), loss_fn=nn.CrossEntropyLoss(),
                      accumulation_steps=2, callbacks=[callback] if callback else [])
    loader = make_loader(data, 16, seed=0)
    history: list[Any] = []

    def fit() -> None:
        history.append(trainer.fit(loader, epochs=1))

    # --clock cpu: this process's CPU time, the hand-over thread included (the tracker host,
    # W&B's service process and the MLflow server are other processes): steady where other
    # work loads the machine.
    seconds = common.timed(fit)
    lag_start = time.perf_counter()
    if callback is not None:  # every step but the last (held until the end) delivered
        callback.host.flush()  # now: not up to two flush periods later
        last = len(history[0].steps) - 1
        while any(sink.delivered_step < last for sink in callback.host.status.values()):
            time.sleep(0.01)  # asleep: no CPU time
    lag_s = time.perf_counter() - lag_start
    steps = len(history[0].steps)
    end_start = time.perf_counter()
    sink_s = deliver_s = handover_s = host_s = 0.0
    if callback is not None:
        callback.end("succeeded")
        sinks = callback.host.status.values()
        sink_s = sum(sink.cpu_s for sink in sinks)
        deliver_s = sink_s - sum(sink.open_end_cpu_s for sink in sinks)
        handover_s, host_s = callback.host.handover_cpu_s, callback.host.host_cpu_s
    return (steps / seconds, open_s, time.perf_counter() - end_start, sink_s / steps,
            deliver_s / steps, handover_s / steps, host_s / steps, lag_s)


def per_step_us(results: dict[str, list[tuple[float, ...]]], index: int) -> dict[str, float]:
    return {name: round(common.median([r[index] for r in results[name]]) * 1e6, 1)
            for name in TRACKERS}


def main() -> None:
    parser = common.base_parser(__doc__ or "")
    args = parser.parse_args()
    common.configure(args)
    os.environ.update(WANDB_MODE="offline", WANDB_SILENT="true", WANDB_DISABLE_GIT="true",
                      WANDB_DISABLE_CODE="true", WANDB_ERROR_REPORTING="false")
    samples = 1024 if args.quick else 12288 * 32  # an epoch of several flush periods (5-10 s)
    generator = torch.Generator().manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(samples, 64, generator=generator),
                                          torch.randint(0, 10, (samples,), generator=generator))
    repeats = 1 if args.quick else (args.repeats or 5)
    with tempfile.TemporaryDirectory() as tmp:
        server = MlflowServer(Path(tmp) / "mlflow", free_port())
        server.start()
        try:
            settings = Settings(home=Path(tmp) / "home", trackers=list(TRACKERS),
                                mlflow_tracking_uri=server.uri, wandb_mode="offline",
                                tracker_end_wait_s=120)
            store = Jobs(settings)
            runners = {name: (lambda name=name: one_epoch(data, store.callback(name) if name != "none" else None))
                       for name in ("none", *TRACKERS)}
            results: dict[str, list[tuple[float, ...]]] = {
                name: [] for name in runners}
            for _ in range(common.warmups(args)):
                for run in runners.values():
                    run()
            for index in range(repeats):
                for name in list(runners) if index % 2 == 0 else reversed(list(runners)):
                    results[name].append(runners[name]())
        finally:
            server.stop()
    rates = {name: [rate for rate, *_ in values] for name, values in results.items()}
    ratios = {name: round(common.paired_ratio(rates[name], rates["none"]), 4) for name in TRACKERS}
    worst = min(ratios.values())
    step_s = 1 / common.median(rates["none"])
    common.emit(BENCH, {
        "machine": common.machine("cpu"),
        "clock": args.clock,
        "figure": "steps/s logging to a tracker / steps/s without, worst of mlflow, tensorboard, wandb",
        "workload": f"mlp 64-256-10, m=16, N=2, {samples // 32} steps an epoch, CPU",
        "flush_every_s": settings.tracker_flush_every_s,
        "steps_per_s_without": round(common.median(rates["none"]), 1),
        "ratios": ratios,
        "open_s": {name: round(common.median([o for _, o, *_ in results[name]]), 3) for name in TRACKERS},
        # The ratio as a cost per step: logging is under 1 % of any step 100x longer than it.
        "cost_per_step_us": {name: round(max(1 / ratio - 1, 0.0) * step_s * 1e6, 1)
                             for name, ratio in ratios.items()},
        "end_s": {name: round(common.median([e for _, _, e, *_ in results[name]]), 3) for name in TRACKERS},
        # Seconds from the epoch's end, flushed at once, until the tracker had its steps: how
        # far behind training a run's points are (the MLflow server's own ingestion shows here).
        "delivered_lag_s": {name: round(common.median([r[7] for r in results[name]]), 3) for name in TRACKERS},
        # CPU us a step, medians of the repeats. What the training process pays beyond the
        # ~0.2 us append: its hand-over thread (one pickle a flush's batch).
        "handover_cpu_us_per_step": per_step_us(results, 5),
        # What another core pays: the host process from its clients' set-up to its exit
        # (unpickling, the sinks, the clients' own threads; W&B's service process and the
        # MLflow server are further processes), and of it the sinks' threads: all of theirs,
        # and without opening and finishing the run (once an attempt, whatever its length).
        "host_cpu_us_per_step": per_step_us(results, 6),
        "sink_cpu_us_per_step": per_step_us(results, 3),
        "sink_deliver_cpu_us_per_step": per_step_us(results, 4),
        "target": TARGET,
        "measured": worst,
        "verdict": common.verdict(worst, TARGET, higher_is_better=True),
    }, args)


if __name__ == "__main__":
    main()
