"""Job priorities on the broker: Redis delivers a queue's higher priorities first.

kombu's Redis transport keeps one list per priority step of a queue (``PRIORITY_STEPS``
0, 3, 6, 9; 0 is the plain list named after the queue) and a consumer's BRPOP names them
lowest number first, so a message at 0 is taken before any at 3. The stored priorities
(``services.spec.priority``: 0 low, 1 normal, 2 high) map onto those steps, the highest on 0.
The embedded SQLite broker delivers in order of sending: there only the place in line and the
running cap apply.
"""

from __future__ import annotations

from services.spec.priority import DEFAULT_PRIORITY, PRIORITIES, priority_number

# kombu.transport.redis: the separator between a queue's name and its priority step.
SEPARATOR = "\x06\x16"
NORMAL = priority_number(DEFAULT_PRIORITY)
# kombu.transport.redis's PRIORITY_STEPS, restated: importing that module pulls in
# `packaging`, which the API image does not install (tests/dispatch/test_redis_publish.py
# checks the two agree).
PRIORITY_STEPS = (0, 3, 6, 9)
STEP = 3
REDIS_STEPS = {number: STEP * (len(PRIORITIES) - 1 - number) for number in range(len(PRIORITIES))}


def redis_step(priority: int | None) -> int:
    """The kombu priority step a stored priority is sent at (normal when unknown)."""
    return REDIS_STEPS.get(NORMAL if priority is None else priority, REDIS_STEPS[NORMAL])


def redis_list(queue: str, step: int) -> str:
    """The Redis list a message of this step is pushed onto (as kombu names it)."""
    return f"{queue}{SEPARATOR}{step}" if step else queue
