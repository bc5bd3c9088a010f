"""etcd:// permit waiters: a release costs one re-check, not one per waiter (no thundering herd).

A permit waiter with ``b`` keys before it can hold only after ``b - limit + 1`` of them are deleted; it
counts the deletes it watches and asks the server again only then. Before, every waiter re-checked in a
transaction on every delete, so each release cost a transaction per waiter (16 contenders, limit 1: handoffs
at half the mutex's rate). Counted on the server (``etcd_mvcc_txn_total``), not timed.
"""

from __future__ import annotations

import threading
import time
import urllib.request
from collections.abc import Callable

import pytest

import lockkit
from backends.servers import EtcdServer

WAITERS = 6


def _txns(url: str) -> int:
    host = url.split("://", 1)[1].split("/", 1)[0]
    text = urllib.request.urlopen(f"http://{host}/metrics", timeout=10).read().decode()
    return int(next(line.split()[1] for line in text.splitlines() if line.startswith("etcd_mvcc_txn_total ")))


def _until(predicate: Callable[[], bool], timeout: float = 20.0) -> None:
    end = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.05)


@pytest.mark.parametrize("limit", [1, 2])
def test_a_release_wakes_only_the_waiter_it_lets_hold(limit: int, fresh_etcd: Callable[[], EtcdServer]) -> None:
    url = fresh_etcd().url
    name = f"herd-{limit}"
    owner = lockkit.connect(url)
    lockers = [lockkit.connect(url) for _ in range(WAITERS)]
    granted: list[threading.Event] = [threading.Event() for _ in lockers]
    handles = [locks.semaphore(name, limit=limit, ttl=30) for locks in lockers]
    holders = [owner.semaphore(name, limit=limit, ttl=30) for _ in range(limit)]
    for holder in holders:
        holder.acquire()
    first = holders[0]

    done = threading.Event()

    def wait(i: int) -> None:
        handles[i].acquire(timeout=60)
        granted[i].set()
        done.wait(60)
        handles[i].release()  # the next waiter's turn, until all went through

    threads = [threading.Thread(target=wait, args=(i,), daemon=True) for i in range(WAITERS)]
    try:
        for thread in threads:
            thread.start()
        _until(lambda: owner.permit_holders(name).waiters == WAITERS)
        time.sleep(0.5)  # every waiter subscribed and asleep
        before = _txns(url)
        first.release()
        _until(lambda: any(event.is_set() for event in granted))
        time.sleep(0.5)  # a herd would re-check now
        spent = _txns(url) - before
        # the release, the next holder's re-check; a herd adds one per other waiter (WAITERS - 1 more)
        assert spent <= 3, f"{spent} transactions for one hand-off among {WAITERS} waiters"
    finally:
        done.set()
        for thread in threads:
            thread.join(60)
        for holder in holders[1:]:
            holder.release()
        owner.close()
        for locks in lockers:
            locks.close()
