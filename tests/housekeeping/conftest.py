"""In-process fixtures for housekeeping unit tests: a migrated SQLite store under a fresh ACCUM_HOME."""

from __future__ import annotations

from job_store import make_job, settings  # noqa: F401  (the fixtures)
