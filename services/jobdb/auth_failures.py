"""Failed token checks per client address, shared by every API process.

    ages = record_failure(session, "203.0.113.7", window_s=60, keep=20)

The API's limiter (services/api/auth_failures.py) answers from memory on every request; it
writes here only when a token check fails, and reads back the address's failures from every
process, so N API processes (uvicorn workers, replicas) allow an address about `keep` failures
per window in all, not N x `keep`. Each write deletes every row older than the window (of any
address), so the table holds one window of failures at most.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from services.jobdb.models import AuthFailure
from services.jobdb.types import utcnow


def record_failure(
    session: Session, address: str, window_s: float, keep: int, now: datetime | None = None
) -> list[float]:
    """Log a failed token check by ``address`` and return the ages in seconds of its newest
    ``keep`` failures within the window (this one included, newest first). Does not commit."""
    now = now or utcnow()
    since = now - timedelta(seconds=window_s)
    session.execute(delete(AuthFailure).where(AuthFailure.at <= since))
    session.add(AuthFailure(address=address, at=now))
    session.flush()
    recent = session.scalars(
        select(AuthFailure.at)
        .where(AuthFailure.address == address, AuthFailure.at > since)
        .order_by(AuthFailure.at.desc())
        .limit(keep)
    )
    return [max(0.0, (now - at).total_seconds()) for at in recent]
