"""The jobs whose message the broker holds: ``jobs_in_broker(settings, queue)``.

The reaper re-sends a queued job beside an idle worker (``services.housekeeping.reaper``)
only when the broker holds no message for it, neither waiting on one of the queue's lists (an
idle worker is about to take it) nor taken by a worker and not yet acknowledged (kombu's
``unacked`` hash: the worker is between taking it and claiming the job, which can take
seconds while it imports torch, or runs it; late acks keep it there until the job ends). A
worker that took the message and has not claimed the job is listed idle, so asking the
database alone re-sent messages that were not lost (the duplicate seen in
``tests/reliability/test_redis_restart.py``). The lists and the hash are read in one MULTI:
a message moving from a list to the hash is seen in one of them (kombu writes the hash just
after its BRPOP, in the same process, so only that instant is unseen).

Only Redis can be read so; the embedded SQLite broker keeps its queues on disk (they survive
a restart) and a taken message in its consumer's memory: None, as for a list too long to read.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from services.dispatch.enqueue import publisher_for
from services.dispatch.priority import PRIORITY_STEPS, redis_list
from services.dispatch.redis_publish import is_redis_url
from services.settings import Settings

# kombu.transport.redis's Channel.unacked_key: taken, unacknowledged messages by delivery tag.
UNACKED_KEY = "unacked"
# A queue with more messages waiting than this has work for its idle workers: not read.
MAX_WAITING = 1000


def jobs_in_broker(settings: Settings, queue: str) -> set[str] | None:
    """Ids of the jobs with a message on ``queue``'s lists (every priority step) or taken by
    any worker and unacknowledged; None when that cannot be told (not Redis, or more than
    ``MAX_WAITING`` messages wait on the queue)."""
    if not is_redis_url(settings.broker_url):
        return None
    lists = [redis_list(queue, step) for step in PRIORITY_STEPS]
    with publisher_for(settings).client.pipeline(transaction=True) as pipe:
        for name in lists:
            pipe.lrange(name, 0, MAX_WAITING)  # one more than read: tells a longer list
        pipe.hvals(UNACKED_KEY)
        *waiting, unacked = pipe.execute()
    if sum(len(messages) for messages in waiting) > MAX_WAITING:
        return None
    envelopes = [_loads(message) for messages in waiting for message in messages]
    envelopes += [(_loads(value) or [None])[0] for value in unacked]  # [envelope, exchange, key]
    return {job_id for job_id in map(_job_id, envelopes) if job_id is not None}


def _loads(data: bytes) -> Any:
    try:
        return json.loads(data)
    except ValueError:
        return None


def _job_id(envelope: Any) -> str | None:
    """The job id of an ``accum.run_job`` message in kombu's envelope (None: not one of ours)."""
    try:
        body = envelope["body"]
        if envelope["properties"].get("body_encoding") == "base64":
            body = base64.b64decode(body)
        args = json.loads(body)[0]  # Celery protocol 2: [args, kwargs, embed]
        return str(args[0])
    except (KeyError, IndexError, TypeError, ValueError, AttributeError):
        return None
