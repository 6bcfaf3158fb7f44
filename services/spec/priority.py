"""Job priorities, named in this one place: a spec's ``priority`` is one of ``PRIORITIES``, the
job row stores its index there (``priority_number``: higher goes first in its queue,
``services.jobdb.queue_order``), and the broker maps that number onto its own delivery steps
(``services.dispatch.priority``). Owners may lower theirs; only admins raise one above the
default (``ADMIN_ONLY``, the admission check ``priority``).
"""

from __future__ import annotations

from typing import Literal

Priority = Literal["low", "normal", "high"]
PRIORITIES: tuple[Priority, ...] = ("low", "normal", "high")  # rising: the stored number is the index
DEFAULT_PRIORITY: Priority = "normal"
ADMIN_ONLY: tuple[Priority, ...] = PRIORITIES[PRIORITIES.index(DEFAULT_PRIORITY) + 1:]
OWNERS_MAY_CHOOSE: tuple[Priority, ...] = PRIORITIES[: PRIORITIES.index(DEFAULT_PRIORITY) + 1]


def priority_number(name: str | None) -> int:
    """The number a job of priority ``name`` is stored (and sent) with; the default's for None
    or a name this version does not know (a stored spec from elsewhere)."""
    return PRIORITIES.index(name if name in PRIORITIES else DEFAULT_PRIORITY)
