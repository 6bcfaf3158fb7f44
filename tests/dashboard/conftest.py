"""A real deployment for the browser tests, and headless Chromium driven by Playwright.

`deployment` (module): the embedded SQLite stack of tests/worker_stack.py with one real worker
subprocess, `accum api` (uvicorn, tests/api_process.py) on a free port over the same store, and an admin token.
`browser` (module): Debian's /usr/bin/chromium launched by Playwright (never `playwright
install`). `page` (function): a fresh browser context that refuses every request leaving the
server (the dashboard must work offline) and fails the test on any page error.
`shot(page, name)` saves a PNG under test-artifacts/dashboard/ (or $ACCUM_TEST_ARTIFACTS).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from api_process import running_api
from skips import skip_or_fail
from worker_stack import make_stack

from services.jobdb import tokens

from .deployment import Deployment

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
VIEWPORT = {"width": 1360, "height": 1000}
# Chromium logs every 4xx answer as a console error; these are answers the page shows the
# user (a refused token, a 422 at its field, a job that is not yours), not page errors.
ANSWERED = re.compile(r"status of (401|404|409|422) ")


@pytest.fixture(scope="module")
def deployment(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Deployment]:
    stack = make_stack("sqlite", tmp_path_factory.mktemp("dashboard"), request)
    with stack.sessions.begin() as session:
        _, token = tokens.create_owner_with_token(session, "dana", admin=True)
    stack.start_worker()
    try:
        # Jobs the pages keep queued go to a queue no worker serves: allowed here, else the
        # submit would be refused or not depending on whether the worker had registered yet.
        env = {**stack.env(), "ACCUM_ALLOW_EMPTY_QUEUES": "1"}
        with running_api(env, stack.logs / "api.log") as api:
            yield Deployment(api.url, token, stack)
    finally:
        stack.stop_workers()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not CHROMIUM.exists():
        skip_or_fail(f"{CHROMIUM} is missing; install it with: apt-get install -y chromium")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture
def page(browser: Any, deployment: Deployment) -> Iterator[Any]:
    context = browser.new_context(viewport=VIEWPORT, base_url=deployment.url, accept_downloads=True)
    context.set_default_timeout(15_000)
    outside: list[str] = []
    errors: list[str] = []

    def only_our_server(route: Any) -> None:
        if route.request.url.startswith(deployment.url) or route.request.url.startswith(("data:", "blob:")):
            route.continue_()
        else:
            outside.append(route.request.url)
            route.abort()

    context.route("**/*", only_our_server)
    page = context.new_page()
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" and not ANSWERED.search(m.text) else None)
    try:
        yield page
    finally:
        context.close()
    assert outside == [], f"the page tried to leave the server: {outside}"
    assert errors == [], f"errors in the page: {errors}"


@pytest.fixture
def logged_in(page: Any, deployment: Deployment) -> Any:
    """The page with the token already in local storage (the login test types it)."""
    page.add_init_script(f"localStorage.setItem('accum.token', {deployment.token!r})")
    return page


@pytest.fixture(scope="session")
def shot() -> Callable[[Any, str], Path]:
    folder = Path(os.environ.get("ACCUM_TEST_ARTIFACTS") or ROOT / "test-artifacts") / "dashboard"
    folder.mkdir(parents=True, exist_ok=True)

    def save(page: Any, name: str) -> Path:
        path = folder / f"{name}.png"
        page.screenshot(path=str(path), full_page=True)
        return path

    return save
