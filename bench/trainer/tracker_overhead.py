"""What logging a job to each experiment tracker costs its training, as a throughput ratio.

    .venv/bin/python -m bench.trainer.tracker_overhead [--quick] [--repeats 5] [--threads 1] [--out]

The worker's own path: ``services.worker.trackers.job_trackers`` builds the callback for a
job row in a real store (SQLite), the trainer calls it every step, each tracker's sink
delivers from its own thread every ACCUM_TRACKER_FLUSH_EVERY_S (2 s, the default) through the
real client: an MLflow tracking server started here (SQLite backend), TensorBoard event files
(torch's SummaryWriter), W&B in offline mode (its own service process writes the run file).
``ratio[tracker]`` = steps/s with that tracker / steps/s with none, medians of interleaved
repeats of one epoch of an MLP (the smallest step the service runs: the worst case for a
per-step cost), timed once the runs are open. Target >= 0.99 (logging under 1 % of step
time). Outside training, once per attempt: ``open_s`` (W&B starts its service process, MLflow
creates the run) and ``end_s`` (the last batch, W&B's run closing).
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
from services.ports import free_port
from services.settings import Settings
from services.spec import parse_spec, total_optimizer_steps
from services.store import jobs, tokens
from services.store.migrate import upgrade
from services.store.sessions import session_factory
from services.worker.attempt import Attempt
from services.worker.resume import checkpoint_uploads
from services.worker.trackers import job_trackers

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
    """Start the sinks and wait for their runs to open (W&B starts its service process, MLflow
    creates the run): a one-off cost at a job's start, outside the per-step figure."""
    start = time.perf_counter()
    callback.on_fit_start(None)
    while not all(sink.opened for sink in callback.sinks):
        time.sleep(0.01)
    return time.perf_counter() - start


def one_epoch(data: Any, callback: Any) -> tuple[float, float, float]:
    """Steps/s of one epoch with ``callback`` (None: no tracker), the seconds its runs took to
    open before it, and the end's wait after it."""
    open_s = opened(callback) if callback is not None else 0.0
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))
    trainer = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.05), loss_fn=nn.CrossEntropyLoss(),
                      accumulation_steps=2, callbacks=[callback] if callback else [])
    loader = make_loader(data, 16, seed=0)
    history: list[Any] = []
    # --clock cpu: this process's CPU time, the sinks' threads included (W&B's service process
    # and the MLflow server are other processes): steady where other work loads the machine.
    seconds = common.timed(lambda: history.append(trainer.fit(loader, epochs=1)))
    steps = len(history[0].steps)
    end_start = time.perf_counter()
    if callback is not None:
        callback.end("succeeded")
    return steps / seconds, open_s, time.perf_counter() - end_start


def main() -> None:
    parser = common.base_parser(__doc__ or "")
    args = parser.parse_args()
    common.configure(args)
    os.environ.update(WANDB_MODE="offline", WANDB_SILENT="true", WANDB_DISABLE_GIT="true",
                      WANDB_DISABLE_CODE="true", WANDB_ERROR_REPORTING="false")
    samples = 1024 if args.quick else 32768
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
            results: dict[str, list[tuple[float, float, float]]] = {name: [] for name in runners}
            for _ in range(common.warmups(args)):
                for run in runners.values():
                    run()
            for index in range(repeats):
                for name in list(runners) if index % 2 == 0 else reversed(list(runners)):
                    results[name].append(runners[name]())
        finally:
            server.stop()
    rates = {name: [rate for rate, _, _ in values] for name, values in results.items()}
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
        "open_s": {name: round(common.median([o for _, o, _ in results[name]]), 3) for name in TRACKERS},
        # The ratio as a cost per step: logging is under 1 % of any step 100x longer than it.
        "cost_per_step_us": {name: round(max(1 / ratio - 1, 0.0) * step_s * 1e6, 1)
                             for name, ratio in ratios.items()},
        "end_s": {name: round(common.median([e for _, _, e in results[name]]), 3) for name in TRACKERS},
        "target": TARGET,
        "measured": worst,
        "verdict": common.verdict(worst, TARGET, higher_is_better=True),
    }, args)


if __name__ == "__main__":
    main()
