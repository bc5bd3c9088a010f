"""One acquisition's key (lockkit/drivers/etcd/waiter.py) against a real etcd: placed, waited on, abandoned.

The driver-level behaviour (FIFO, fencing, faults) is covered by the other test_etcd_* files; these pin the
Waiter's own contract: what each step leaves on the server and in the session's slots, and that giving up
is idempotent whatever happened before.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator

import pytest

from backends.servers import EtcdServer
from lockkit.driver import Cancel, DriverContext
from lockkit.drivers.etcd.client import EtcdClient, range_op
from lockkit.drivers.etcd.session import Session, Sessions
from lockkit.drivers.etcd.waiter import Queue, State, Waiter
from lockkit.drivers.etcd.watch import Watcher

PREFIX = "/waiter-test/"


@pytest.fixture
def queue(etcd_server: EtcdServer) -> Iterator[Queue]:
    client = EtcdClient([(etcd_server.host, etcd_server.port)])
    ctx = DriverContext()
    sessions, watcher = Sessions(client, ctx.clock, ctx.events), Watcher(client)
    yield Queue(client, sessions, watcher, ctx.clock, PREFIX)
    watcher.close()
    sessions.close()
    client.close()


def _name() -> str:
    return f"w-{uuid.uuid4().hex[:8]}"


def _token() -> str:
    return uuid.uuid4().hex


def _exists(queue: Queue, waiter: Waiter) -> bool:
    kvs = queue.client.range(range_op(waiter.key).request_range).kvs
    return bool(kvs) and int(kvs[0].create_revision) == waiter.revision


def _waiting(queue: Queue, session: Session, name: str) -> tuple[Waiter, Waiter]:
    """A holder and a waiter queued behind it, on one session (two slots of one name)."""
    first, second = Waiter(queue, session, name, _token()), Waiter(queue, session, name, _token())
    assert first.place(one_shot=False) is State.GRANTED
    assert second.place(one_shot=False) is State.QUEUED
    return first, second


def test_place_grants_an_empty_name_and_queues_behind_a_holder(queue: Queue) -> None:
    session, name = queue.sessions.get(3), _name()
    first, second = _waiting(queue, session, name)
    assert first.granted and 0 < first.revision < second.revision  # the fencing token: the create revision
    assert first.valid_from <= queue.clock()
    assert first.key != second.key and {first.key, second.key} <= session.keys  # one slot each
    assert _exists(queue, first) and _exists(queue, second)


def test_one_shot_on_a_taken_name_leaves_nothing(queue: Queue) -> None:
    session, name = queue.sessions.get(3), _name()
    holder = Waiter(queue, session, name, _token())
    holder.place(one_shot=True)
    attempt = Waiter(queue, session, name, _token())
    assert attempt.place(one_shot=True) is State.TAKEN
    assert attempt.key not in session.keys and not _exists(queue, attempt)
    attempt.abandon()  # nothing to do: no request, no error
    assert attempt.state is State.TAKEN


def test_wait_is_granted_when_the_holder_goes(queue: Queue) -> None:
    session, name = queue.sessions.get(3), _name()
    first, second = _waiting(queue, session, name)
    outcome: list[State] = []
    thread = threading.Thread(target=lambda: outcome.append(second.wait(time.monotonic() + 10, None)))
    thread.start()
    time.sleep(0.2)
    assert not outcome  # still waiting for the holder
    first.abandon()
    thread.join(10)
    assert outcome == [State.GRANTED] and second.granted
    assert not _exists(queue, first) and first.key not in session.keys


def test_deadline_abandons_the_key_once(queue: Queue) -> None:
    session, name = queue.sessions.get(3), _name()
    _, second = _waiting(queue, session, name)
    assert second.wait(time.monotonic() + 0.3, None) is State.ABANDONED
    assert not _exists(queue, second) and second.key not in session.keys
    second.abandon()  # idempotent
    second.orphan()  # and nothing left for the sweep
    assert second.state is State.ABANDONED and not queue.sessions.has_orphans


def test_cancel_abandons_the_key(queue: Queue) -> None:
    session, name = queue.sessions.get(3), _name()
    _, second = _waiting(queue, session, name)
    cancel = Cancel()
    threading.Timer(0.2, cancel.cancel).start()
    started = time.monotonic()
    assert second.wait(None, cancel) is State.ABANDONED
    assert time.monotonic() - started < 5
    assert not _exists(queue, second) and second.key not in session.keys


def test_abandon_after_the_session_was_lost(queue: Queue) -> None:
    session, name = queue.sessions.get(3), _name()
    _, second = _waiting(queue, session, name)
    queue.client.revoke(session.lease_id)  # our keys go with the lease
    queue.sessions.lose(session, "test")
    second.abandon()  # the guarded delete finds nothing: no error, slot freed
    second.abandon()
    assert second.state is State.ABANDONED and second.key not in session.keys and not queue.sessions.has_orphans


def test_wait_reports_a_vanished_key(queue: Queue) -> None:
    session, name = queue.sessions.get(3), _name()
    _, second = _waiting(queue, session, name)
    outcome: list[State] = []
    thread = threading.Thread(target=lambda: outcome.append(second.wait(time.monotonic() + 10, None)))
    thread.start()
    time.sleep(0.2)
    queue.client.revoke(session.lease_id)  # both keys go: the waiter is woken by first's delete, finds its own gone
    thread.join(10)
    assert outcome == [State.VANISHED] and second.vanished and second.key not in session.keys


def test_orphan_hands_the_key_to_the_sweep_once(queue: Queue) -> None:
    session, name = queue.sessions.get(3), _name()
    first, _ = _waiting(queue, session, name)
    first.orphan()
    first.orphan()
    first.abandon()  # already the sweep's: no request
    assert first.state is State.ORPHANED and _exists(queue, first)
    queue.sessions.sweep()
    assert not queue.sessions.has_orphans and not _exists(queue, first) and first.key not in session.keys
