"""SIGTERM to the API drains in-flight requests (issue 7).

The API runs as production starts it (`accum api`, uvicorn) with two live event streams
open: one of a job that finishes after the signal, one of a job that never does. Promised:
from the signal on, new connections are refused; the first stream is served to its end
(every metric written after the signal, then `end`); the second is cut once the graceful
timeout has passed; and the process exits 0 within that timeout plus a little.
"""

from __future__ import annotations

import signal
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
from api_process import running_api
from worker_stack import Stack

from accum import AccumClient
from services.jobdb import leases, metrics, tokens
from services.jobdb.migrate import upgrade
from services.settings import Settings

GRACEFUL_S = 5.0
EXIT_SLACK_S = 3.0
STEPS = 5


def watch(url: str, token: str, job_id: str, seen: list[tuple[str, Any]],
          failure: list[BaseException]) -> None:
    try:
        with AccumClient(url, token) as client:
            seen.extend(client.stream_events(job_id))
    except Exception as exc:  # the stream that is cut ends this way
        failure.append(exc)


def refused(url: str) -> bool:
    """True when a new connection is not served: refused outright, or accepted into the
    listen backlog just before the socket closed and then reset without an answer."""
    try:
        httpx.get(f"{url}/healthz", timeout=1)
    except (httpx.ConnectError, httpx.ReadError, httpx.RemoteProtocolError):
        return True
    return False


def test_sigterm_drains_in_flight_streams_and_exits_0(tmp_path: Path, record_figure: Any) -> None:
    settings = Settings(home=tmp_path / "home")
    upgrade(settings.database_url)
    (tmp_path / "logs").mkdir()
    stack = Stack("sigterm", settings, f"st-{uuid.uuid4().hex[:8]}", tmp_path / "logs")
    with stack.sessions.begin() as session:
        stack.owner, token = tokens.create_owner_with_token(session, "sigterm")
    finishing, endless = stack.create(enqueue=False), stack.create(enqueue=False)

    with running_api(stack.env(), stack.logs / "api.log",
                     "--timeout-graceful-shutdown", str(GRACEFUL_S)) as api:
        streams: dict[str, tuple[list[tuple[str, Any]], list[BaseException]]] = {}
        watchers = []
        for job_id in (finishing, endless):
            seen, failure = streams[job_id] = ([], [])
            watchers.append(threading.Thread(target=watch, args=(api.url, token, job_id, seen, failure)))
            watchers[-1].start()
        while not all(seen for seen, _ in streams.values()):  # both streams are open
            time.sleep(0.02)

        signalled = time.monotonic()
        api.process.send_signal(signal.SIGTERM)
        while not refused(api.url):
            assert time.monotonic() - signalled < 2, "new connections still accepted after SIGTERM"
        refused_s = time.monotonic() - signalled

        # Play the worker of the first job, after the signal: start, log steps, succeed.
        with stack.sessions.begin() as session:
            leases.claim_job(session, finishing, worker_id="w1", host="node", gpu=None,
                             lease_timeout_s=60)
            for step in range(1, STEPS + 1):
                metrics.write_metrics(session, finishing, 1, metrics.metric_rows(step, 0, {"loss": 1.0 / step}))
        with stack.sessions.begin() as session:
            assert leases.finish_job(session, finishing, "w1", "succeeded")

        try:
            code = api.process.wait(timeout=GRACEFUL_S + EXIT_SLACK_S)
        except Exception:
            code = None
        exited_s = time.monotonic() - signalled
        for watcher in watchers:
            watcher.join(timeout=5)
        api_log = api.log_tail()

    served, served_error = streams[finishing]
    cut, _ = streams[endless]
    steps = [d["step"] for e, d in served if e == "metric" and d["name"] == "loss"]
    drained = steps == list(range(1, STEPS + 1)) and served[-1:] == [("end", {"status": "succeeded"})]
    record_figure(
        "api_sigterm",
        area="fault",
        check=f"SIGTERM to the API (accum api, graceful timeout {GRACEFUL_S:g} s) with 2 live "
        "streams open: one job finishing after the signal, one never",
        figure=f"new connections refused {refused_s:.2f} s after the signal; in-flight stream "
        f"got {len(steps)}/{STEPS} steps + end: {drained}; endless stream cut; exit code {code} "
        f"{exited_s:.1f} s after the signal",
        passed=drained and not served_error and code == 0 and exited_s <= GRACEFUL_S + EXIT_SLACK_S,
    )

    assert not served_error, f"the in-flight stream broke: {served_error}\n{api_log}"
    assert drained, f"the in-flight stream was not served to its end: {served}\n{api_log}"
    assert code == 0, f"the API exited with {code} after {exited_s:.1f} s\n{api_log}"
    assert not any(e == "end" for e, _ in cut), "the endless job's stream cannot have ended"
    assert not any(w.is_alive() for w in watchers), "a stream outlived the server"
