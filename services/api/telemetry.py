"""Prometheus instruments of one app: request latency by route template, jobs by status, queue
depth, workers by queue and state, worker heartbeat age, lifecycle counters read from the event
log, failed token checks, open event streams.

Each app gets its own registry so that several apps in one process (tests) do not collide.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, Metric
from starlette.types import ASGIApp, Message, Receive, Scope, Send

# Buckets sized for an API whose target p99 is 25 ms, with a tail for slow pages and streams.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0)


class Telemetry:
    """The registry and the instruments that `/metrics` exposes."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.request_latency = Histogram(
            "accum_http_request_duration_seconds",
            "Time to answer an HTTP request, by method, route template and status code.",
            ("method", "route", "status"),
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.jobs = Gauge(
            "accum_jobs", "Jobs in the store, by status.", ("status",), registry=self.registry
        )
        self.queue_depth = Gauge(
            "accum_queue_depth",
            "Jobs waiting to start (status queued), by queue.",
            ("queue",),
            registry=self.registry,
        )

        self.workers = Gauge(
            "accum_workers",
            "Registered workers by queue and state (idle, busy, lost, stopped); alive = idle + busy.",
            ("queue", "state"),
            registry=self.registry,
        )
        self.worker_heartbeat_age = Gauge(
            "accum_worker_heartbeat_age_seconds",
            "Seconds since each worker that is not stopped last renewed its registration.",
            ("worker",),
            registry=self.registry,
        )
        self.auth_failures = Counter(
            "accum_auth_failures",
            "Requests with a bad token, by answer: 401, or 429 once the address or the token "
            "prefix had too many (this API process).",
            ("answer",),
            registry=self.registry,
        )
        self.event_streams = Gauge(
            "accum_event_streams",
            "Live event streams open in this API process.",
            registry=self.registry,
        )
        self.lifecycle = LifecycleCounters()
        self.registry.register(self.lifecycle)
        self.store_errors = Gauge(
            "accum_artifact_store_errors",
            "Artifact store failures: store_fault events written by workers (source=workers), "
            "failed /readyz probes of this API process (source=api).",
            ("source",),
            registry=self.registry,
        )
        self.stored_bytes = Gauge(
            "accum_artifact_stored_bytes", "Bytes of every retained checkpoint in the store.",
            registry=self.registry,
        )

    def observe_request(self, method: str, route: str, status: int, seconds: float) -> None:
        self.request_latency.labels(method, route, str(status)).observe(seconds)


class LatencyMiddleware:
    """Pure ASGI middleware (no BaseHTTPMiddleware: it costs a task per request) timing each request.

    The label is the route template (`/v1/jobs/{job_id}`), never the raw path, so ids do not
    explode the label set; unmatched paths share one label.
    """

    def __init__(self, app: ASGIApp, observe: Callable[[str, str, int, float], None]) -> None:
        self.app = app
        self.observe = observe

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500

        async def send_wrapper(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            route = scope.get("route")
            template = getattr(route, "path", None) or "<unmatched>"
            self.observe(scope["method"], template, status, time.perf_counter() - start)


# name suffix (after accum_), help, label, key of services.jobdb.events.lifecycle_counts
LIFECYCLE = (
    ("job_transitions", "Job state transitions (event kinds), over every process.", "kind",
     "transitions"),
    ("job_restarts", "Automatic restarts, by cause: lease_expired (worker lost), "
     "worker_shutdown (SIGTERM hand-back), node_lost (a node of a multi-node job), hung (a rank "
     "made no progress past its deadline), store_fault.",
     "cause", "restarts"),
    ("lease_expiries", "Leases that expired (a worker stopped renewing), by whether the lost "
     "attempt had written a new checkpoint (no_progress feeds the poison rule).", "cause",
     "lease_expiries"),
    ("job_failures", "Jobs that failed, by reason: timeout, poison, lease_expired (past "
     "max_restarts), nonfinite, error.", "reason", "failures"),
    ("process_deaths", "Attempts whose process died under a prefork worker, by cause: "
     "oom_killer, the signal's name (SIGKILL, SIGSEGV, ...), exit_code, other.", "cause",
     "process_deaths"),
)


class LifecycleCounters:
    """Counters whose totals live in the database (every worker and reaper writes the event
    log), set at each scrape from ``lifecycle_counts`` and exposed as counters."""

    def __init__(self) -> None:
        self.counts: dict[str, dict[str, int]] = {}

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> list[Metric]:
        families: list[Metric] = []
        for name, help_text, label, key in LIFECYCLE:
            family = CounterMetricFamily(f"accum_{name}", help_text, labels=[label])
            for value, count in sorted(self.counts.get(key, {}).items()):
                family.add_metric([value], count)
            families.append(family)
        return families
