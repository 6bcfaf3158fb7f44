"""Typed HTTP client for the accum API, the one the `accum` CLI is built on.

Use it from your own scripts:

    from accum import AccumClient
    with AccumClient("http://127.0.0.1:8000", token) as client:
        job = client.submit({"model": "mlp", "dataset": "digits", "micro_batch_size": 16,
                             "accumulation_steps": 4, "epochs": 1,
                             "optimizer": {"name": "sgd", "lr": 0.1}})
        for event, data in client.stream_events(job["id"]):
            print(event, data)
        client.download(job["id"], path="model.pt")  # latest checkpoint, sha256 verified

Every non-2xx answer raises `AccumAPIError`, whose `str()` is one readable line built from the
problem+json body (status, title, detail and each field error with its path).
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
import re
import time
from collections.abc import Callable, Iterator
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx

from accum.config import ClientConfig, resolve_client_config
from accum.spec_file import read_spec

JSON = dict[str, Any]
# What `wait` waits for: a job in one of these will not change again until resumed.
FINAL_STATUSES = frozenset({"succeeded", "failed", "cancelled"})

try:
    __version__ = version("accum")
except PackageNotFoundError:  # a source tree on sys.path without an install
    __version__ = "0+unknown"

# Training jobs run for hours: the SSE stream must not time out between two events, but
# connecting to a dead server should fail fast.
_STREAM_TIMEOUT = httpx.Timeout(10.0, read=None)
_DOWNLOAD_CHUNK = 1 << 20


class AccumAPIError(Exception):
    """An error answer from the API (or no answer at all: status 0)."""

    def __init__(
        self,
        status: int,
        title: str,
        detail: str | None = None,
        errors: list[Any] | None = None,
        method: str = "",
        url: str = "",
    ) -> None:
        self.status = status
        self.title = title
        self.detail = detail
        self.errors = list(errors or [])
        self.method = method
        self.url = url
        super().__init__(self.one_line())

    def one_line(self) -> str:
        """`422 Invalid request: micro_batch_size: must be an integer from 1 ...; got 0`.

        Each field error once, by the path the spec uses (no `body.`); the `detail` of a 422
        only summarises those errors, so it is left out when they are there.
        """
        return "; ".join(self.lines())

    def lines(self) -> list[str]:
        """The error as a person reads it: one line, or with several field errors a head line
        (`422 Invalid request (2 fields):`) and one line per field."""
        head = f"{self.status} {self.title}" if self.status else self.title
        fields = [_format_field_error(e) for e in self.errors]
        if self.detail and self.detail != self.title and not fields:
            head = f"{head}: {self.detail}"
        if len(fields) > 1:
            return [f"{head} ({len(fields)} fields):", *fields]
        return [f"{head}: {fields[0]}" if fields else head]

    @classmethod
    def from_response(cls, response: httpx.Response) -> AccumAPIError:
        title, detail, errors = response.reason_phrase or "error", None, None
        try:
            body = response.json()
        except ValueError:
            text = response.text.strip()
            detail = text[:300] if text else None
        else:
            if isinstance(body, dict):
                title = str(body.get("title") or title)
                raw_detail = body.get("detail")
                # FastAPI's own errors put a list of field errors under "detail".
                if isinstance(raw_detail, list):
                    errors = raw_detail
                elif raw_detail is not None:
                    detail = str(raw_detail)
                if isinstance(body.get("errors"), list):
                    errors = body["errors"]
        request = response.request
        return cls(
            response.status_code, title, detail, errors, request.method, str(request.url)
        )


# Where a value came from, in front of pydantic's field paths: a user knows the spec's paths.
_SOURCES = ("body", "query", "path", "header")
# A closed set longer than this is shown as the closest names and a count, not 80 names.
_CHOICES_SHOWN = 6
_CHOICES = re.compile(r"(?P<head>.*?)(?P<intro>choose one of|allowed values?|one of):\s*(?P<names>[^;]+)$")


def _format_field_error(error: Any) -> str:
    if not isinstance(error, dict):
        return str(error)
    loc = error.get("loc") or error.get("path") or error.get("field") or ""
    parts = loc if isinstance(loc, list | tuple) else str(loc).split(".")
    while parts and parts[0] in _SOURCES:
        parts = parts[1:]
    path = ".".join(str(p) for p in parts)
    message = _shorten_choices(str(error.get("msg") or error.get("message") or error.get("detail") or ""))
    # "micro_batch_size: micro_batch_size must be ..." says the name twice.
    for name in (path, str(parts[-1]) if parts else ""):
        if name and message.startswith(f"{name} "):
            message = message[len(name) + 1 :]
            break
    return f"{path}: {message}" if path else message


def _shorten_choices(message: str) -> str:
    """`unknown model 'resnt18'; choose one of: alexnet, ..., wide_resnet50_2` (83 names) ->
    `unknown model 'resnt18'; did you mean resnet18? (83 choices: alexnet, convnext_base, ...)`."""
    match = _CHOICES.match(message)
    names = [n.strip() for n in match["names"].split(",")] if match else []
    if len(names) <= _CHOICES_SHOWN:
        return message
    assert match is not None
    given = re.findall(r"'([^']*)'", match["head"])
    close = difflib.get_close_matches(given[0], names, n=3, cutoff=0.6) if given else []
    alternatives = f"{', '.join(close[:-1])} or {close[-1]}" if len(close) > 1 else "".join(close)
    guess = f"did you mean {alternatives}? " if close else ""
    shown = ", ".join(names[:_CHOICES_SHOWN])
    return f"{match['head']}{guess}({len(names)} choices: {shown}, ...)"


def parse_sse(lines: Iterator[str]) -> Iterator[tuple[str, JSON]]:
    """Turn text/event-stream lines into (event, data) pairs; data is decoded JSON.

    Follows the SSE framing: `event:` and `data:` fields, a blank line ends a message,
    lines starting with ':' are comments (keep-alives), several data lines join with '\\n'.
    """
    event = "message"
    data_lines: list[str] = []
    for raw in lines:
        line = raw.rstrip("\r")
        if not line:
            if data_lines:
                payload = "\n".join(data_lines)
                try:
                    data = json.loads(payload)
                except ValueError:
                    data = {"raw": payload}
                yield event, data if isinstance(data, dict) else {"value": data}
            event, data_lines = "message", []
            continue
        if line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if field == "event":
            event = value
        elif field == "data":
            data_lines.append(value)


class AccumClient:
    """A thin, typed wrapper over the accum REST API (one method per endpoint)."""

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        timeout: float = 30.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        """`url` and `token` left out are found as the CLI finds them (accum.config): ACCUM_URL
        and ACCUM_TOKEN, else the local.json of ACCUM_HOME, of ./.accum or a parent folder's,
        else the per-user one that `accum up` wrote; a token found goes only to its own URL."""
        # Kept to say, when nothing answers or the token is refused, where the values came from.
        self._found: ClientConfig | None = None
        if url is None or token is None:
            self._found = resolve_client_config(url)
            url = self._found.url if url is None else url
            token = self._found.token if token is None else token
        self.url = url.rstrip("/")
        headers = {"Accept": "application/json", "User-Agent": f"accum-client/{__version__}"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self._http = httpx.Client(
            base_url=self.url, headers=headers, timeout=timeout, transport=transport
        )

    # -- plumbing ---------------------------------------------------------------------
    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> AccumClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise self._unreachable(method, path, exc) from exc
        if response.is_error:
            raise self._error(response)
        return response

    def _error(self, response: httpx.Response) -> AccumAPIError:
        """The answer's error; a 401 also says where the token came from and what to do."""
        error = AccumAPIError.from_response(response)
        if error.status != 401 or self._found is None:
            return error
        detail = "; ".join(filter(None, (error.detail, self._found.refused_hint())))
        return AccumAPIError(401, error.title, detail, error.errors, error.method, error.url)

    def _unreachable(self, method: str, path: str, exc: Exception) -> AccumAPIError:
        found = self._found
        return AccumAPIError(
            0,
            f"cannot reach the accum API at {self.url} ({type(exc).__name__}: {exc})",
            found.unreachable_hint() if found and found.source != "the URL given"
            else "start it with `accum up`, or set ACCUM_URL to a running server",
            method=method,
            url=f"{self.url}{path}",
        )

    def _json(self, method: str, path: str, **kwargs: Any) -> JSON:
        data = self._request(method, path, **kwargs).json()
        return data if isinstance(data, dict) else {"items": data}

    def _all_pages(self, path: str, params: dict[str, Any]) -> list[JSON]:
        """Follow `next_cursor` until the last page."""
        items: list[JSON] = []
        query = {k: v for k, v in params.items() if v is not None}
        while True:
            page = self._json("GET", path, params=query)
            items.extend(page.get("items", []))
            cursor = page.get("next_cursor")
            if not cursor:
                return items
            query["cursor"] = cursor

    # -- health -----------------------------------------------------------------------
    def healthz(self) -> JSON:
        return self._json("GET", "/healthz")

    def readyz(self) -> JSON:
        return self._json("GET", "/readyz")

    def me(self) -> JSON:
        """Who the token belongs to: `{"name", "is_admin"}`."""
        return self._json("GET", "/v1/me")

    # -- jobs -------------------------------------------------------------------------
    def submit(self, spec: JSON | str | Path, idempotency_key: str | None = None) -> JSON:
        """POST /v1/jobs; the same idempotency key and body return the same job.

        `spec` is a mapping, or the path of a .yaml/.yml/.json file, read as `accum submit`
        reads it (`lr: 3e-4` is a number); a file that cannot be read raises `SpecFileError`.
        """
        body = spec if isinstance(spec, dict) else read_spec(spec)
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        return self._json("POST", "/v1/jobs", json=body, headers=headers)

    def jobs(
        self, status: str | None = None, limit: int | None = None, cursor: str | None = None,
        tags: list[str] | None = None, q: str | None = None,
    ) -> JSON:
        """One page of jobs, newest first: {"items": [...], "next_cursor": ...}; `tags`: only
        jobs with all of them, `q`: only jobs whose name, notes or a tag contain it."""
        params = {"status": status, "limit": limit, "cursor": cursor, "tag": tags, "q": q}
        return self._json("GET", "/v1/jobs", params={k: v for k, v in params.items() if v})

    def all_jobs(
        self, status: str | None = None, tags: list[str] | None = None, q: str | None = None
    ) -> list[JSON]:
        return self._all_pages("/v1/jobs", {"status": status, "tag": tags or None, "q": q})

    def edit(
        self, job_id: str, name: str | None = None, tags: list[str] | None = None,
        notes: str | None = None,
    ) -> JSON:
        """PATCH /v1/jobs/{id}: a new name, tags (replacing the old; [] clears) or notes
        ("" clears); what is left None is kept."""
        body = {k: v for k, v in {"name": name, "tags": tags, "notes": notes}.items() if v is not None}
        return self._json("PATCH", f"/v1/jobs/{job_id}", json=body)

    def job(self, job_id: str, timeout: float | None = None) -> JSON:
        """The job object; ``timeout`` (seconds) in place of the client's for this one read."""
        return self._json("GET", f"/v1/jobs/{job_id}",
                          timeout=httpx.USE_CLIENT_DEFAULT if timeout is None else timeout)

    def wait(self, job_id: str, timeout: float | None = None, poll_s: float = 2.0) -> JSON:
        """Block until the job has finished (succeeded, failed or cancelled); returns it.

        Raises `TimeoutError` after `timeout` seconds (None: no limit), saying where it was.
        Polls `GET /v1/jobs/{id}` every `poll_s` seconds: one cheap read, and no stream held
        open for hours.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            job = self.job(job_id)
            if job.get("status") in FINAL_STATUSES:
                return job
            if deadline is not None and time.monotonic() >= deadline:
                step = (job.get("progress") or {}).get("optimizer_step") or 0
                raise TimeoutError(
                    f"job {job_id} is still {job.get('status')} (step {step}) after {timeout} s; "
                    "wait again, or cancel it with AccumClient.cancel"
                )
            time.sleep(poll_s if deadline is None else max(0.0, min(poll_s, deadline - time.monotonic())))

    def cancel(self, job_id: str) -> JSON:
        return self._json("POST", f"/v1/jobs/{job_id}/cancel")

    def resume(self, job_id: str, from_step: int | None = None, from_scratch: bool = False,
               timeout: int | str | None = None) -> JSON:
        """Queue a failed or cancelled job again: from its latest checkpoint, from the
        checkpoint at ``from_step``, or ``from_scratch``; ``timeout`` (seconds, or "90m",
        "12h", "7d") replaces the spec's. Its run time counts from 0 again either way."""
        body: JSON = {}
        if from_step is not None:
            body["from_step"] = from_step
        if from_scratch:
            body["from_scratch"] = True
        if timeout is not None:
            body["timeout"] = timeout
        return self._json("POST", f"/v1/jobs/{job_id}/resume", json=body or None)

    def delete(self, job_id: str) -> None:
        """Delete a finished job: its checkpoints (rows and objects), metrics and events."""
        self._request("DELETE", f"/v1/jobs/{job_id}")

    # -- results ----------------------------------------------------------------------
    def metrics(
        self,
        job_id: str,
        name: str | None = None,
        since_step: int | None = None,
        max_points: int | None = None,
        page_size: int | None = None,
    ) -> list[JSON]:
        """Every metric point (all pages), in the API's order (name, then step)."""
        params = {
            "name": name, "since_step": since_step, "max_points": max_points, "limit": page_size
        }
        return self._all_pages(f"/v1/jobs/{job_id}/metrics", params)

    def checkpoints(self, job_id: str) -> list[JSON]:
        return list(self._json("GET", f"/v1/jobs/{job_id}/checkpoints").get("items", []))

    def download(self, job_id: str, step: int | None = None, path: str | Path = ".") -> Path:
        """Stream a checkpoint file to `path` and verify its sha256; returns the file's path.

        `step=None` takes the latest checkpoint. When `path` is a directory the file is
        saved there as `<job>-<step>.pt`. A mismatch deletes the partial file and raises.
        """
        listing = self.checkpoints(job_id)
        if step is None:
            if not listing:
                raise AccumAPIError(404, "Not Found", f"job {job_id} has no checkpoints yet")
            step = max(int(c["step"]) for c in listing)
        expected = next((c.get("sha256") for c in listing if int(c["step"]) == step), None)
        target = Path(path)
        if target.is_dir():
            target = target / f"{job_id}-{step}.pt"
        return self._fetch_verified(f"/v1/jobs/{job_id}/checkpoints/{step}", target, f"checkpoint {job_id}/{step}",
                                    expected)

    def download_merged(self, job_id: str, path: str | Path = ".") -> Path:
        """Stream a LoRA job's merged model (spec `peft.merge`: a tar of its `save_pretrained`
        folder; `tar xf` it, then `from_pretrained("merged")`) to `path`, verifying the sha256
        its ETag names; a directory gets `<job>-merged.tar`. Returns the file's path."""
        target = Path(path)
        if target.is_dir():
            target = target / f"{job_id}-merged.tar"
        return self._fetch_verified(f"/v1/jobs/{job_id}/merged", target, f"the merged model of job {job_id}", None)

    def _fetch_verified(self, url: str, target: Path, what: str, expected: str | None) -> Path:
        """``url`` streamed to ``target`` through a ``.part`` file (a 307 followed without the
        token), its sha256 checked against ``expected``, else the ETag; a mismatch deletes it."""
        partial = target.with_name(target.name + ".part")
        digest = hashlib.sha256()
        try:
            with self._http.stream("GET", url, timeout=_STREAM_TIMEOUT) as response:
                if response.is_error:
                    response.read()
                    raise self._error(response)
                etag = response.headers.get("ETag", "").strip('"').removeprefix("W/").strip('"')
                expected = expected or etag or None
                if response.status_code == 307:  # a presigned URL: no token goes there
                    with httpx.stream("GET", response.headers["Location"],
                                      timeout=_STREAM_TIMEOUT) as presigned:
                        if presigned.is_error:
                            presigned.read()
                            raise AccumAPIError.from_response(presigned)
                        self._save(presigned, partial, digest)
                else:
                    self._save(response, partial, digest)
        except httpx.HTTPError as exc:
            partial.unlink(missing_ok=True)
            raise self._unreachable("GET", url, exc) from exc
        except BaseException:
            partial.unlink(missing_ok=True)
            raise
        actual = digest.hexdigest()
        if expected is None or actual != expected:
            partial.unlink(missing_ok=True)
            raise AccumAPIError(0, f"{what} failed sha256 verification",
                                f"expected {expected}, got {actual}; download it again")
        os.replace(partial, target)
        return target

    @staticmethod
    def _save(response: httpx.Response, partial: Path, digest: Any) -> None:
        with partial.open("wb") as out:
            for chunk in response.iter_bytes(_DOWNLOAD_CHUNK):
                digest.update(chunk)
                out.write(chunk)

    # -- events -----------------------------------------------------------------------
    def events(
        self, job_id: str, after_id: int | None = None, limit: int | None = None
    ) -> list[JSON]:
        """One page of the job's lifecycle events, oldest first (`after_id`: newer ones)."""
        params = {k: v for k, v in {"after_id": after_id, "limit": limit}.items() if v is not None}
        return list(self._json("GET", f"/v1/jobs/{job_id}/events", params=params).get("items", []))

    def all_events(self, job_id: str, page_size: int = 1000) -> list[JSON]:
        """Every lifecycle event of the job, oldest first (all pages)."""
        return _every_page(lambda after: self.events(job_id, after_id=after, limit=page_size), page_size)

    def stream_events(self, job_id: str) -> Iterator[tuple[str, JSON]]:
        """Live (event, data) pairs from the SSE stream until `end` or the server closes it.

        Event types: `job_event`, `metric`, `status`, `end` (see docs/architecture.md).
        """
        return self._stream(f"/v1/jobs/{job_id}/events", {})

    # -- logs -------------------------------------------------------------------------
    def logs(
        self, job_id: str, attempt: int | None = None, after: int | None = None,
        limit: int | None = None,
    ) -> list[JSON]:
        """One page of what the job's training process printed (stdout, stderr, warnings,
        library log messages), oldest first: each line's `id`, `attempt`, `stream` and `line`.
        `attempt` (1 is the first) keeps one attempt's lines; `after` (a line id) newer ones.

            for line in client.logs("01jd3k5x", attempt=2):
                print(line["line"])
        """
        params = {k: v for k, v in {"attempt": attempt, "after": after, "limit": limit}.items()
                  if v is not None}
        return list(self._json("GET", f"/v1/jobs/{job_id}/logs", params=params).get("items", []))

    def all_logs(self, job_id: str, attempt: int | None = None, page_size: int = 1000) -> list[JSON]:
        """Every captured line of the job (or of one attempt), oldest first (all pages)."""
        return _every_page(
            lambda after: self.logs(job_id, attempt=attempt, after=after, limit=page_size), page_size)

    def follow_logs(self, job_id: str, attempt: int | None = None,
                    after: int | None = None) -> Iterator[JSON]:
        """The job's lines as it prints them (after line id `after`), until it finishes."""
        params = {k: v for k, v in {"attempt": attempt, "after": after}.items() if v is not None}
        for event, data in self._stream(f"/v1/jobs/{job_id}/logs", params):
            if event == "log":
                yield data

    def _stream(self, path: str, params: dict[str, Any]) -> Iterator[tuple[str, JSON]]:
        headers = {"Accept": "text/event-stream"}
        try:
            with self._http.stream("GET", path, params=params, headers=headers,
                                   timeout=_STREAM_TIMEOUT) as resp:
                if resp.is_error:
                    resp.read()
                    raise self._error(resp)
                for event, data in parse_sse(resp.iter_lines()):
                    yield event, data
                    if event == "end":
                        return
        except httpx.HTTPError as exc:
            raise self._unreachable("GET", path, exc) from exc

    # -- catalog ----------------------------------------------------------------------
    def catalog(self, kind: str = "models") -> list[JSON]:
        """`kind` is "models" or "datasets"."""
        if kind not in ("models", "datasets"):
            raise ValueError(f"catalog kind must be 'models' or 'datasets', not {kind!r}")
        return list(self._json("GET", f"/v1/catalog/{kind}").get("items", []))

    # -- fleet ------------------------------------------------------------------------
    def workers(self) -> list[JSON]:
        """The registered workers (GET /v1/workers): name, queues, devices, state; an admin
        gets every field (host, versions, current job, heartbeat age, ...)."""
        return list(self._json("GET", "/v1/workers").get("items", []))


def _every_page(page: Callable[[int | None], list[JSON]], page_size: int) -> list[JSON]:
    """Every item of a list paged by id: ``page(after)`` until a short page."""
    items: list[JSON] = []
    while True:
        batch = page(items[-1]["id"] if items else None)
        items.extend(batch)
        if len(batch) < page_size:
            return items
