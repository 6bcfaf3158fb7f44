"""A real S3 endpoint on localhost for tests: moto in server mode (what s3fs's own suite uses).

``S3Server`` runs ``moto.server.ThreadedMotoServer`` on a free port in the test process; workers
started as subprocesses reach it over HTTP like any S3 service. ``stop()``/``start()`` keep the
port and moto's in-memory objects, so a test can take the store away and bring it back.
"""

from __future__ import annotations

import logging
import os
import time
import uuid

from moto.server import ThreadedMotoServer

from services.ports import free_port

BUCKET = "accum-test"
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
               "AWS_REGION": "eu-west-3"}  # not us-east-1: nothing may hard-code the region


class S3Server:
    def __init__(self) -> None:
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._server: ThreadedMotoServer | None = None
        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise

    @property
    def env(self) -> dict[str, str]:
        """The standard AWS environment pointing at this server."""
        return dict(CREDENTIALS, AWS_ENDPOINT_URL=self.endpoint)

    def start(self) -> None:
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        self._server.start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None

    def ensure_running(self) -> None:
        if self._server is None:
            self.start()

    def create_bucket(self, name: str = BUCKET) -> None:
        import boto3

        client = boto3.client("s3", endpoint_url=self.endpoint, region_name=CREDENTIALS["AWS_REGION"],
                              aws_access_key_id="testing", aws_secret_access_key="testing")
        deadline = time.monotonic() + 10
        while True:
            try:
                client.create_bucket(
                    Bucket=name,
                    CreateBucketConfiguration={"LocationConstraint": CREDENTIALS["AWS_REGION"]},
                )
                return
            except client.exceptions.BucketAlreadyOwnedByYou:
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def url(self) -> str:
        """A fresh prefix in the bucket: each test sees an empty store."""
        return f"s3://{BUCKET}/t-{uuid.uuid4().hex[:10]}"


def apply_env(server: S3Server) -> dict[str, str]:
    """Point this process's AWS environment at ``server``; returns the previous values."""
    previous = {k: os.environ.get(k, "") for k in server.env}
    os.environ.update(server.env)
    return previous
