"""What an admission check reads: the spec, where it is checked, and who asks.

    ctx = Admission(spec, settings, Phase.SUBMIT, owner=owner, session=session, fleet=fleet)
    ctx = Admission(spec, settings, Phase.START, job_id=job_id, owner_name="alice",
                    ranks=lambda: ranks_here(settings))

At submit the API fills the caller, the request's session and its cached view of the fleet; at
a job's start the worker fills the job id and the ranks it offers (read only by a check that
needs them: NVML). A check asks for what it reads with ``needs``, which says which phase
lacks it instead of failing on None.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import TypeVar

from sqlalchemy.orm import Session

from services.fleet import FleetView
from services.jobdb.models import Owner
from services.settings import Settings
from services.spec import JobSpec

T = TypeVar("T")


class Phase(Enum):
    """Where a spec is checked: the API's submit, or the worker's pre-flight before it trains
    a stored job (one stored earlier, under other settings, or inserted without the API)."""

    SUBMIT = "submit"
    START = "start"


@dataclass
class Admission:
    """One spec being admitted. A check may resolve what the spec names in place (the
    ``init_from.job`` prefix becomes the full id the worker loads by)."""

    spec: JobSpec
    settings: Settings
    phase: Phase
    owner: Owner | None = None  # submit: the caller (an admin is told the data roots)
    session: Session | None = None  # submit: the request's session
    fleet: FleetView | None = None  # submit: the API's view of the registered workers
    job_id: str | None = None  # start: the stored job
    owner_name: str | None = None  # start: the job's owner (whose data roots it may read)
    ranks: Callable[[], int] | None = None  # start: the ranks this worker offers

    def reader(self) -> str | None:
        """The name of the owner the job reads data for: the caller at submit, the job's owner
        at start (None, for a job claimed without it: everyone's roots only)."""
        return self.owner.name if self.owner is not None else self.owner_name

    def needs(self, value: T | None, what: str) -> T:
        """``value``, which a check of this phase must be given (a bug in the caller if not)."""
        if value is None:
            raise TypeError(f"an admission check at {self.phase.value} needs {what}; pass it to Admission")
        return value
