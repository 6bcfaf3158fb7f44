"""A short job's own cost through the service, against the bare training script.

    .venv/bin/python -m bench.service.job_start [--quick] [--repeats 5] [--out] [--no-postgres] [--no-trackers]

The same 46-step digits job (the demo's ``small_cnn``, m=16 x N=4, AdamW, cosine, 2 epochs:
23 steps each, an evaluation after each, a checkpoint at the end), run four ways, interleaved
(a round runs each once, the order alternating round by round) after a warm-up round:

(a) ``bare``: a hand loop in this process, as a user's script would train it (the digits read
    from the shipped CSV, the model, a DataLoader, ``loss / N``, evaluation, ``torch.save``);
(b) ``trainer``: ``accumcore.Trainer`` on the same objects (its default checks on);
(c) ``embedded``: a job through the embedded default (SQLite database + SQLite broker), to a
    warm worker process (``python -m services.worker``, its warm-up job done), with
    ``trackers: [mlflow, tensorboard]`` (``embedded_trackers``, an MLflow server started here)
    and without;
(d) ``postgres_redis``: the same through PostgreSQL + Redis (a scratch database on
    localhost:5432, Redis db 11 on localhost:6379), trackers on and off.

A job is submitted as the API stores one (the row, then the broker's message; the API's own
cost per submit is bench/service/api.py's). Per run: ``first_step_s`` (submit -> the first
step's metric timestamp), ``total_s`` (submit -> ``finished_at``) and, from the worker's
record (``job_attempts.phases``), the phases of the attempt: claim, admit (the spec checked
again), build, checks (the first-window exactness check), train, final writes, tracker end.
For (a) and (b) the same two figures from their own clock. ``overhead_s`` = a service run's
total - the bare run's total of the same round. Figures: medians over the rounds; the load
average is recorded with every run.

Targets (issue 45, on a quiet machine): first step <= 0.5 s and total <= 1.5 x bare on the warm
embedded worker; trackers on <= 0.5 s more than off; PostgreSQL + Redis within 0.3 s of embedded.

``--quick`` (the smoke test): 2 steps, (a) and (b), and (c) by calling the worker's
``run_job`` in this process on a scratch SQLite store (no broker, no worker process).
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from bench.harness.common import base_parser, configure, emit, machine, verdict

BENCH = "job_start"
SPEC: dict[str, Any] = {
    "name": "digits-small-cnn", "model": "small_cnn", "dataset": "digits",
    "micro_batch_size": 16, "accumulation_steps": 4, "epochs": 2,
    "optimizer": {"name": "adamw", "lr": 0.003, "weight_decay": 0.0001},
    "scheduler": {"name": "cosine", "warmup_steps": 5}, "seed": 0,
    "checkpoint_every": 50, "keep_checkpoints": 3, "gpus": 0,
}
TRACKERS = ["mlflow", "tensorboard"]
FIRST_STEP_TARGET_S = 0.5
TOTAL_RATIO_TARGET = 1.5
TRACKERS_EXTRA_TARGET_S = 0.5
POSTGRES_EXTRA_TARGET_S = 0.3
PHASES = ("claim", "admit", "build", "checks", "train", "final_writes", "tracker_end")


def load() -> float:
    return round(os.getloadavg()[0], 2)


# ---------------------------------------------------------------- (a) and (b): one process
def digits_tensors() -> tuple[Any, Any, Any, Any]:
    """The digits as a script reads them: the shipped CSV, the catalog's split, standardised."""
    from importlib import resources

    import numpy as np
    import torch

    from services.catalog.builders.datasets import DIGITS_FILE, DIGITS_SPLIT_SEED
    from services.catalog.families.builtin_datasets import DIGITS_VAL_SIZE

    with resources.as_file(resources.files("services.catalog").joinpath("data", DIGITS_FILE)) as path:
        table = np.loadtxt(path, delimiter=",")
    order = np.random.RandomState(DIGITS_SPLIT_SEED).permutation(len(table))
    val_idx, train_idx = order[:DIGITS_VAL_SIZE], order[DIGITS_VAL_SIZE:]
    x = torch.tensor(table[:, :-1], dtype=torch.float32).view(-1, 1, 8, 8) / 16.0
    x = (x - x[train_idx].mean()) / x[train_idx].std()
    y = torch.tensor(table[:, -1].astype(np.int64))
    return x[train_idx], y[train_idx], x[val_idx], y[val_idx]


def script_objects(steps: int) -> tuple[Any, ...]:
    import math

    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from services.catalog.build import build_model

    xt, yt, xv, yv = digits_tensors()
    torch.manual_seed(SPEC["seed"])
    model = build_model(SPEC["model"], SPEC["dataset"])
    opt = torch.optim.AdamW(model.parameters(), lr=SPEC["optimizer"]["lr"],
                            weight_decay=SPEC["optimizer"]["weight_decay"])
    warmup = SPEC["scheduler"]["warmup_steps"]

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / (warmup + 1)
        span = max(steps - warmup, 1)
        return 0.5 * (1.0 + math.cos(math.pi * min(step - warmup, span) / span))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, factor)
    m = SPEC["micro_batch_size"]
    generator = torch.Generator().manual_seed(SPEC["seed"])
    train = DataLoader(TensorDataset(xt, yt), batch_size=m, shuffle=True, generator=generator)
    val = DataLoader(TensorDataset(xv, yv), batch_size=m)
    return model, opt, sched, train, val


def run_bare(steps: int, epochs: int, folder: Path) -> dict[str, float]:
    """(a): the tutorial hand loop, ``loss / N``, an evaluation per epoch, a final save."""
    import torch
    import torch.nn.functional as F

    start = time.perf_counter()
    model, opt, sched, train, val = script_objects(steps)
    n, step, first = SPEC["accumulation_steps"], 0, None
    for _ in range(epochs):
        model.train()
        for i, (x, y) in enumerate(train):
            (F.cross_entropy(model(x), y) / n).backward()
            if (i + 1) % n == 0 or i + 1 == len(train):
                opt.step()
                sched.step()
                opt.zero_grad(set_to_none=True)
                step += 1
                first = first or time.perf_counter() - start
                if step >= steps:
                    break
        model.eval()
        with torch.no_grad():
            sum(F.cross_entropy(model(x), y, reduction="sum").item() for x, y in val)
        if step >= steps:
            break
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, folder / "bare.pt")
    return {"first_step_s": float(first or 0.0), "total_s": time.perf_counter() - start, "load": load()}


def run_trainer(steps: int, epochs: int, folder: Path) -> dict[str, float]:
    """(b): ``accumcore.Trainer`` on the same objects, its checkpoint at the end."""
    from accumcore import Callback, Trainer

    start = time.perf_counter()
    first: list[float] = []

    class First(Callback):
        def on_step(self, trainer: Any, metrics: dict[str, float]) -> None:
            if not first:
                first.append(time.perf_counter() - start)

    model, opt, sched, train, val = script_objects(steps)
    trainer = Trainer(model, opt, accumulation_steps=SPEC["accumulation_steps"], scheduler=sched,
                      callbacks=[First()], checkpoint_dir=folder / "trainer", seed=SPEC["seed"],
                      verify_window=True)
    trainer.fit(train, epochs=epochs, val_loader=val, max_steps=steps)
    return {"first_step_s": first[0], "total_s": time.perf_counter() - start, "load": load()}


# ---------------------------------------------------------------- (c) and (d): a job
def seconds(later: datetime | None, earlier: datetime | None) -> float | None:
    if later is None or earlier is None:
        return None
    return (later - earlier).total_seconds()


def job_figures(settings: Any, job_id: str) -> dict[str, Any]:
    """Submit -> first step and -> finished, and the worker's phases, from the store."""
    from services.jobdb import metrics
    from services.jobdb.models import Job, JobAttempt
    from services.jobdb.sessions import session_factory

    with session_factory(settings)() as session:
        job = session.get(Job, job_id)
        assert job is not None
        if job.status != "succeeded":
            raise RuntimeError(f"bench job {job_id} {job.status}: {job.error}")
        rows, _ = metrics.read_metrics(session, job_id, name="loss", limit=1)
        first = rows[0].ts if rows else None
        attempt = session.get(JobAttempt, (job_id, job.attempts))
        phases = dict(getattr(attempt, "phases", None) or {})
        return {"first_step_s": seconds(first, job.created_at),
                "total_s": seconds(job.finished_at, job.created_at),
                "queued_s": seconds(job.started_at, job.created_at),
                "phases": phases, "load": load()}


class Service:
    """A deployment of bench/service/worker.py (database, broker, a warm worker process)."""

    def __init__(self, kind: str, threads: int, env: dict[str, str]) -> None:
        from bench.service.worker import Deployment

        self.deployment = Deployment(kind, threads, env=env)

    def run(self, trackers: bool) -> dict[str, Any]:
        spec = {**SPEC, "trackers": TRACKERS} if trackers else SPEC
        job_id = self.deployment.submit(spec)
        self.deployment.wait(job_id, timeout=900, poll_s=0.05)
        return job_figures(self.deployment.settings, job_id)

    def close(self) -> None:
        self.deployment.close()


class InProcess:
    """--quick: the worker's ``run_job`` called here, on a scratch SQLite store."""

    def __init__(self, steps: int) -> None:
        from services.jobdb import tokens
        from services.jobdb.migrate import upgrade
        from services.jobdb.sessions import session_factory
        from services.settings import Settings

        self.tmp = Path(tempfile.mkdtemp(prefix="accum-bench-job-start-"))
        self.settings = Settings(home=self.tmp)
        upgrade(self.settings.database_url)
        self.steps = steps
        with session_factory(self.settings).begin() as session:
            self.owner, _ = tokens.create_owner_with_token(session, "bench")

    def run(self, trackers: bool) -> dict[str, Any]:
        from services.jobdb import jobs
        from services.jobdb.sessions import session_factory
        from services.spec import parse_spec, total_optimizer_steps
        from services.worker.runner import run_job

        spec = parse_spec({**{k: v for k, v in SPEC.items() if k != "epochs"}, "max_steps": self.steps})
        with session_factory(self.settings).begin() as session:
            job, _ = jobs.create_job(session, owner=self.owner, spec=spec.normalised(), queue="default",
                                     total_optimizer_steps=total_optimizer_steps(spec))
            job_id = str(job.id)
        outcome = run_job(self.settings, job_id, worker_name="bench@quick")
        if outcome != "succeeded":
            raise RuntimeError(f"quick job {job_id}: {outcome}")
        return job_figures(self.settings, job_id)

    def close(self) -> None:
        import shutil

        shutil.rmtree(self.tmp, ignore_errors=True)


def reachable(host: str, port: int) -> bool:
    from bench.service.worker import reachable as open_port

    return open_port(host, port)


# ---------------------------------------------------------------- figures
def med(runs: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in runs if r.get(key) is not None]
    return float(statistics.median(values)) if values else None


def phase_medians(runs: list[dict[str, Any]]) -> dict[str, float]:
    names = [n for n in PHASES if any(n in r.get("phases", {}) for r in runs)]
    names += sorted({n for r in runs for n in r.get("phases", {})} - set(names))
    return {n: round(statistics.median(float(r["phases"].get(n, 0.0)) for r in runs), 4) for n in names}


def summarise(samples: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    bare = samples["bare"]
    out: dict[str, Any] = {}
    for name, runs in samples.items():
        row: dict[str, Any] = {"first_step_s": med(runs, "first_step_s"), "total_s": med(runs, "total_s")}
        if name != "bare":
            overheads = [r["total_s"] - b["total_s"] for r, b in zip(runs, bare, strict=True)]
            ratios = [r["total_s"] / b["total_s"] for r, b in zip(runs, bare, strict=True)]
            row["overhead_s"] = round(statistics.median(overheads), 4)
            row["total_over_bare"] = round(statistics.median(ratios), 4)
        if any("phases" in r for r in runs):
            row["queued_s"] = med(runs, "queued_s")
            row["phases"] = phase_medians(runs)
        out[name] = row
    return out


def paired_extra(samples: dict[str, list[dict[str, Any]]], a: str, b: str) -> float | None:
    """Median over rounds of total(a) - total(b)."""
    if a not in samples or b not in samples:
        return None
    return round(statistics.median(x["total_s"] - y["total_s"] for x, y in zip(samples[a], samples[b], strict=True)), 4)


def main() -> None:
    parser = base_parser(__doc__ or "")
    parser.add_argument("--no-postgres", action="store_true", help="skip (d)")
    parser.add_argument("--no-trackers", action="store_true", help="skip the runs with trackers")
    args = parser.parse_args()
    configure(args)
    import torch

    threads = args.threads or torch.get_num_threads()
    torch.set_num_threads(threads)
    steps = 2 if args.quick else 46
    epochs = SPEC["epochs"]
    repeats = 1 if args.quick else (args.repeats or 5)
    folder = Path(tempfile.mkdtemp(prefix="accum-bench-bare-"))
    result: dict[str, Any] = {"machine": machine(), "spec": SPEC, "steps": steps, "load_start": load()}
    runners: dict[str, Callable[[], dict[str, Any]]] = {
        "bare": lambda: run_bare(steps, epochs, folder),
        "trainer": lambda: run_trainer(steps, epochs, folder),
    }
    services: list[Any] = []
    server: Any = None
    skipped: dict[str, str] = {}
    try:
        if args.quick:
            quick = InProcess(steps)
            services.append(quick)
            runners["embedded"] = lambda: quick.run(False)
        else:
            env: dict[str, str] = {}
            trackers = not args.no_trackers
            if trackers:
                from bench.harness.mlflow_server import MlflowServer
                from services.ports import free_port

                server = MlflowServer(folder / "mlflow", free_port())
                server.start()
                env = {"ACCUM_TRACKERS": '["mlflow","tensorboard"]', "ACCUM_MLFLOW_TRACKING_URI": server.uri,
                       "ACCUM_MLFLOW_EXPERIMENT": f"bench-{uuid.uuid4().hex[:6]}"}
            kinds = [("embedded", "sqlite")]
            if args.no_postgres:
                skipped["postgres_redis"] = "--no-postgres"
            elif not (reachable("127.0.0.1", 6379) and reachable("127.0.0.1", 5432)):
                skipped["postgres_redis"] = "Redis or PostgreSQL not reachable on localhost"
            else:
                kinds.append(("postgres_redis", "redis"))
            for name, kind in kinds:
                service = Service(kind, threads, env)
                services.append(service)
                runners[name] = (lambda s=service: s.run(False))
                if trackers:
                    runners[f"{name}_trackers"] = (lambda s=service: s.run(True))
        for _ in range(0 if args.quick else 1):  # warm-up: the workers import torch, pools open
            for run in runners.values():
                run()
        samples: dict[str, list[dict[str, Any]]] = {name: [] for name in runners}
        names = list(runners)
        for round_index in range(repeats):
            for name in names if round_index % 2 == 0 else reversed(names):
                samples[name].append(runners[name]())
    finally:
        for service in services:
            service.close()
        if server is not None:
            server.stop()
    figures = summarise(samples)
    emb = figures["embedded"]
    first_ok = verdict(emb["first_step_s"], FIRST_STEP_TARGET_S, higher_is_better=False)
    ratio_ok = verdict(emb["total_over_bare"], TOTAL_RATIO_TARGET, higher_is_better=False)
    trackers_extra = paired_extra(samples, "embedded_trackers", "embedded")
    postgres_extra = paired_extra(samples, "postgres_redis", "embedded")
    targets = {
        f"embedded submit -> first step <= {FIRST_STEP_TARGET_S} s": first_ok,
        f"embedded total / bare <= {TOTAL_RATIO_TARGET}": ratio_ok,
        f"trackers on - off <= {TRACKERS_EXTRA_TARGET_S} s": verdict(trackers_extra, TRACKERS_EXTRA_TARGET_S, False),
        f"postgres_redis - embedded <= {POSTGRES_EXTRA_TARGET_S} s": verdict(postgres_extra, POSTGRES_EXTRA_TARGET_S, False),
    }
    verdicts = [v for v in targets.values() if v != "not measured"]
    result.update(
        figure="46-step digits job: submit -> succeeded through the warm embedded worker / the bare script",
        target=TOTAL_RATIO_TARGET,
        measured=emb["total_over_bare"],
        verdict="pass" if verdicts and all(v == "pass" for v in verdicts) else "miss",
        targets=targets,
        figures=figures,
        trackers_extra_s=trackers_extra,
        postgres_extra_s=postgres_extra,
        skipped=skipped,
        runs=samples,
        load_end=load(),
        repeats=repeats,
    )
    emit(BENCH, result, args)


if __name__ == "__main__":
    main()
