"""Each error says what to do next (lockkit/errors.py, docs/semantics.md): the messages the docs audit of
2026-12-02 found saying only what went wrong."""

from __future__ import annotations

import pytest

import lockkit


def test_releasing_or_renewing_an_unheld_handle_says_to_acquire_first() -> None:
    with lockkit.connect("memory://advice") as locks:
        lock = locks.lock("advice:unheld")
        for action in (lock.release, lock.renew):
            with pytest.raises(lockkit.LockNotOwned, match="acquire it first"):
                action()


def test_a_released_lease_says_to_acquire_again() -> None:
    with lockkit.connect("memory://advice") as locks:
        lock = locks.lock("advice:released")
        lease = lock.acquire()
        lock.release()
        with pytest.raises(lockkit.LockLost, match="acquire it again"):
            lease.ensure_valid()


def test_a_lost_lease_says_to_stop_and_acquire_again() -> None:
    with lockkit.connect("memory://advice") as locks:
        lock = locks.lock("advice:lost")
        lease = lock.acquire()
        assert locks.force_release("advice:lost")
        with pytest.raises(lockkit.LockLost, match="stop the work that relied on it and acquire it again"):
            lock.renew()
        with pytest.raises(lockkit.LockLost, match="acquire it again"):
            lease.ensure_valid()


@pytest.mark.parametrize(
    ("name", "advice"),
    [("", "pass a name such as"), (42, "pass a str, e.g."), (b"orders:1", "decode bytes before passing them")],
)
def test_a_bad_name_says_what_to_pass(name: object, advice: str) -> None:
    with lockkit.connect("memory://advice") as locks, pytest.raises(lockkit.InvalidLockName) as caught:
        locks.lock(name)  # type: ignore[arg-type]
    assert advice in str(caught.value)
    if not isinstance(name, bytes):
        assert "decode bytes" not in str(caught.value)
