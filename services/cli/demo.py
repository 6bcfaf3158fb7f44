"""`accum demo` (what `make demo` runs): the service doing its main job, start to finish.

Migrates the SQLite database under ACCUM_HOME (default ./.accum), starts the API and one worker
(embedded SQLite broker: no Redis, no PostgreSQL), submits examples/digits_small_cnn.yaml over
HTTP, shows live progress, prints the final validation accuracy and where the metrics and
checkpoints are, then stops both processes. Exits non-zero unless the job succeeded.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from services.cli.common import load_spec, require_worker_extra
from services.cli.server import DEFAULT_PORT
from services.packaged import packaged_dir
from services.ports import free_port

if TYPE_CHECKING:
    from services.settings import Settings

DEFAULT_SPEC = packaged_dir("examples") / "digits_small_cnn.yaml"


def register(commands: Any) -> None:
    demo = commands.add_parser("demo", help="run the example job on a local service, end to end")
    demo.add_argument("--spec", default=str(DEFAULT_SPEC), help="job spec (default: %(default)s)")
    demo.add_argument("--port", type=int, default=0, help="API port (default: a free one)")
    demo.set_defaults(func=cmd_demo)


def cmd_demo(args: argparse.Namespace) -> int:
    from accum import AccumClient
    from services.cli.local import LocalService, LocalServiceError, Terminated, sigterm_as_exception
    from services.cli.watch import watch_job
    from services.settings import get_settings

    require_worker_extra()
    spec = load_spec(args.spec)
    settings = get_settings()
    started = time.monotonic()
    service = LocalService(
        settings, port=args.port or free_port(), log_dir=Path(settings.home) / "logs"
    )
    with sigterm_as_exception():
        try:
            print(f"starting the API and a worker (state in {settings.home})...", flush=True)
            token = service.start()
            print(
                f"API up at {service.url} after {time.monotonic() - started:.1f} s; "
                f"logs in {service.log_dir}",
                flush=True,
            )
            with AccumClient(service.url, token) as client:
                job = client.submit(spec)
                job_id = str(job["id"])
                print(
                    f"submitted job {job_id} ({job.get('name')}): {spec.get('model')} on "
                    f"{spec.get('dataset')}, micro-batch {job['spec'].get('micro_batch_size')} x "
                    f"{job['spec'].get('accumulation_steps')} accumulation steps = effective batch "
                    f"{job.get('effective_batch_size')}",
                    flush=True,
                )
                final = watch_job(client, job_id, interrupt_hint=False)  # the service stops too
                accuracy = _final_accuracy(client, final)
                checkpoints = client.checkpoints(job_id)
        except LocalServiceError as exc:
            print(f"accum demo: {exc}", file=sys.stderr)
            return 1
        except (KeyboardInterrupt, Terminated):
            print("\ninterrupted; stopping the API and the worker", file=sys.stderr)
            return 130
        finally:
            service.stop()
    _report(settings, final, accuracy, checkpoints, time.monotonic() - started)
    if final["status"] != "succeeded":
        worker_log = Path(settings.home) / "logs" / "worker.log"
        print(f"accum demo: the job {final['status']}; see {worker_log}", file=sys.stderr)
        return 1
    return 0


def _final_accuracy(client: Any, job: dict[str, Any]) -> float | None:
    """The last evaluation's accuracy: kept on the job, else read from its metric history."""
    value = (job.get("latest_metrics") or {}).get("val_accuracy")
    if isinstance(value, int | float):
        return float(value)
    points = client.metrics(str(job["id"]), name="val_accuracy")
    if not points:
        return None
    return float(max(points, key=lambda p: p["step"])["value"])


def _report(
    settings: Settings,
    job: dict[str, Any],
    accuracy: float | None,
    checkpoints: list[dict[str, Any]],
    elapsed_s: float,
) -> None:
    """Where the results are and how to read them again: through `accum up`'s URL (the demo's
    own service, on a free port, is stopped by now), with no secret printed (the demo's token
    would sit in a terminal's scrollback and in CI logs; `accum token create` makes one)."""
    job_id = job["id"]
    shown = f"{accuracy:.2%}" if accuracy is not None else "not recorded"
    latest = max((int(c["step"]) for c in checkpoints), default=None)
    artefacts = f"{settings.artifacts_url}/{job_id}"
    url = f"http://127.0.0.1:{DEFAULT_PORT}"  # where `accum up` serves by default
    print(
        f"\njob {job_id} {job['status']} in {elapsed_s:.0f} s (including start-up)\n"
        f"final validation accuracy: {shown}\n"
        f"\nwhere the results are:\n"
        f"  database (metrics, events, checkpoint rows): {settings.database_url}\n"
        f"  checkpoint files: {artefacts}/ "
        f"({len(checkpoints)} kept, latest step {latest})\n"
        f"\nread them again (the service is stopped now): `accum up` (or `make up`) serves them\n"
        f"at {url}, the dashboard too; then, from any folder:\n"
        f"  accum status {job_id}\n"
        f"  accum metrics {job_id} --name val_accuracy\n"
        f"  accum metrics {job_id} --csv > metrics.csv\n"
        f"  accum download {job_id} -o model.pt\n"
        f"  curl -H \"Authorization: Bearer $TOKEN\" '{url}/v1/jobs/{job_id}/metrics?name=val_accuracy'\n"
        f"    (a token for curl: TOKEN=$(accum token create my-curl); it is printed once)"
    )
