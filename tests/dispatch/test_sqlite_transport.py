"""The embedded SQLite broker: messages survive the process, go to one consumer each, in order."""

from __future__ import annotations

from pathlib import Path

import pytest
from kombu import Connection, Exchange, Queue

from services.dispatch import sqlite_transport
from services.settings import Settings

sqlite_transport.register()


def _queue(name: str) -> Queue:
    return Queue(name, Exchange(name, type="direct"), routing_key=name)


def test_messages_are_delivered_once_in_order_across_connections(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'broker.sqlite'}"
    queue = _queue("gpu")
    with Connection(url) as producer_conn:
        producer = producer_conn.Producer()
        for i in range(3):
            producer.publish({"n": i}, exchange=queue.exchange, routing_key="gpu", declare=[queue])
    # Two independent consumers (as two worker processes would be) share the queue.
    got: list[int] = []
    with Connection(url) as a, Connection(url) as b:
        qa, qb = queue(a.default_channel), queue(b.default_channel)
        for q in (qa, qb, qa, qb):
            message = q.get(no_ack=False)
            if message is not None:
                got.append(message.payload["n"])
                message.ack()
    assert got == [0, 1, 2]


def test_unacked_message_is_restored_when_the_consumer_closes(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'broker.sqlite'}"
    queue = _queue("default")
    with Connection(url) as conn:
        conn.Producer().publish({"job": "x"}, exchange=queue.exchange, routing_key="default", declare=[queue])
    with Connection(url) as conn:
        assert queue(conn.default_channel).get(no_ack=False) is not None  # taken, never acked
    with Connection(url) as conn:
        message = queue(conn.default_channel).get(no_ack=False)
        assert message is not None and message.payload == {"job": "x"}


def test_settings_default_broker_is_the_sqlite_file_under_home(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path)
    url = settings.broker_url
    assert url.startswith("sqlite:///") and url.endswith(str(tmp_path.resolve() / "broker.sqlite"))
    with Connection(url) as conn:
        conn.Producer().publish({}, exchange="", routing_key="q")
    assert (tmp_path / "broker.sqlite").exists()


def test_a_url_without_a_path_says_how_to_write_one() -> None:
    with pytest.raises(ValueError, match="ACCUM_BROKER_URL=sqlite:////"):
        sqlite_transport.database_path("/")
