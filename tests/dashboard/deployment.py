"""What the browser tests talk to: the server's URL, an admin token, and the worker stack."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx
from worker_stack import Stack


@dataclass(frozen=True)
class Deployment:
    url: str
    token: str
    stack: Stack

    def api(self) -> httpx.Client:
        return httpx.Client(
            base_url=self.url, headers={"Authorization": f"Bearer {self.token}"}, timeout=10
        )

    def submit(self, **spec: Any) -> str:
        """Submit over HTTP, on the queue this deployment's worker consumes."""
        with self.api() as client:
            response = client.post("/v1/jobs", json={**spec, "queue": self.stack.queue})
        assert response.status_code == 201, response.text
        return str(response.json()["id"])
