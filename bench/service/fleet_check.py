"""What the submit checks against the fleet cost the API: CPU per check with the API's kept
view of the registry (`services.fleet.FleetView`, read again every 2 s) against a fresh read
of every worker's row, with 64 workers registered.

    python -m bench.service.fleet_check [--postgres postgresql+psycopg://postgres@localhost/test]

Prints one JSON row: CPU ms per check for each, at 0, 8 and 64 registered workers, and the
ratio kept / fresh at 64 (interleaved rounds on the process CPU clock; target <= 0.1).
With --postgres it runs in a database of its own made on that server (dropped afterwards);
without, on a temporary SQLite file.
"""

from __future__ import annotations

import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, delete, make_url, text

from bench.harness.common import (
    base_parser,
    emit,
    interleaved,
    machine,
    median,
    paired_ratio,
    set_clock,
    verdict,
)
from services.catalog import DATASETS, MODELS
from services.fleet import FleetView, fleet_refusals
from services.jobdb import workers as store_workers
from services.jobdb.db import make_engine, make_session_factory
from services.jobdb.migrate import upgrade
from services.jobdb.models import Worker
from services.settings import Settings
from services.spec import parse_spec

TARGET = 0.1
SPEC = {"model": "mlp", "dataset": "digits", "micro_batch_size": 16, "accumulation_steps": 4,
        "epochs": 1, "optimizer": {"name": "sgd", "lr": 0.1}}


def worker(i: int) -> dict[str, Any]:
    return {"name": f"w{i}@node{i // 8}", "host": f"node{i // 8}", "pid": i, "queues": ["default"],
            "devices": [{"kind": "gpu", "index": g, "name": "NVIDIA H100", "memory_bytes": 80 * 2**30}
                        for g in range(8)],
            "gpus": 8, "models": sorted(MODELS), "datasets": sorted(DATASETS), "plugins": [],
            "versions": {"torch": "2.14.1"}, "accum_version": "0.1.0"}


def main() -> None:
    parser = base_parser(__doc__ or "")
    parser.add_argument("--postgres", default=None, help="a PostgreSQL server URL (any database)")
    args = parser.parse_args()
    with scratch_database(args.postgres) as url:
        run(args, url)


@contextmanager
def scratch_database(server: str | None) -> Iterator[str | None]:
    """A fresh database on ``server`` for this run, dropped afterwards (None: SQLite)."""
    if server is None:
        yield None
        return
    url = make_url(server)
    name = f"accum_bench_fleet_{uuid.uuid4().hex[:8]}"
    admin = create_engine(url, isolation_level="AUTOCOMMIT")

    def sql(statement: str) -> None:
        with admin.connect() as conn:
            conn.execute(text(statement))

    sql(f'CREATE DATABASE "{name}"')
    try:
        yield url.set(database=name).render_as_string(hide_password=False)
    finally:
        sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()


def run(args: Any, database_url: str | None) -> None:
    set_clock("cpu")  # every figure here is this process's CPU time (time.process_time)
    calls = 20 if args.quick else 300
    repeats = args.repeats or (1 if args.quick else 5)
    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(home=Path(tmp), **({"database_url": database_url} if database_url else {}))
        upgrade(settings.database_url)
        engine = make_engine(settings)
        sessions = make_session_factory(engine)
        spec = parse_spec(SPEC)

        def per_check(view: FleetView | None) -> float:
            start = time.process_time()
            for _ in range(calls):
                with sessions() as session:
                    fleet_refusals(session, spec, settings, view=view)
            return (time.process_time() - start) / calls * 1e3

        results: dict[str, Any] = {}
        try:
            for count in (0, 8, 64):
                with sessions.begin() as session:
                    session.execute(delete(Worker))
                    for i in range(count):
                        store_workers.register(session, worker(i))
                kept = FleetView()  # read afresh at this fleet size, then kept
                samples = interleaved({"kept": lambda view=kept: per_check(view), "fresh": lambda: per_check(None)},
                                      repeats, warmup=0 if args.quick else 1)
                results[str(count)] = {"kept_cpu_ms": round(median(samples["kept"]), 4),
                                       "fresh_cpu_ms": round(median(samples["fresh"]), 4),
                                       "ratio": round(paired_ratio(samples["kept"], samples["fresh"]), 4)}
        finally:
            with sessions.begin() as session:
                session.execute(delete(Worker))
            engine.dispose()
    measured = results["64"]["ratio"]
    emit("fleet_check", {
        "figure": "submit's fleet check, CPU per submit: kept view / fresh registry read (64 workers)",
        "target": f"<= {TARGET}", "measured": measured, "verdict": verdict(measured, TARGET, False),
        "workers": results, "database": settings.database_url.split("://", 1)[0],
        "calls_per_round": calls, "repeats": repeats, "machine": machine(),
    }, args)


if __name__ == "__main__":
    main()
