"""Prometheus instruments of one app: request latency by route template, jobs by status, queue
depth, workers by queue and state, worker heartbeat age.

Each app gets its own registry so that several apps in one process (tests) do not collide.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Gauge, Histogram
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
