"""C-8: a cancelled offloaded acquire whose grant already came back releases it off the event loop's thread.

``lockkit.offload.ThreadOffloadDriver`` releases the grant of an acquire that was cancelled after its worker
thread had started. When the grant had already arrived by the time the cancellation was seen, that release ran
inline in the event loop's thread (``concurrent.futures.Future.add_done_callback`` calls a callback at once
on a finished future): a blocking network call on the loop, for as long as the server takes to answer (or its
whole timeout when the server is gone). It must run in a worker thread, and still run.
"""

from __future__ import annotations

import asyncio
import threading
import time

from lockkit.driver import Cancel, DriverContext, Grant
from lockkit.drivers.embedded.memory import MemoryDriver
from lockkit.offload import ThreadOffloadDriver


class _Recording(MemoryDriver):
    """A memory driver that says when a grant is about to return, and in which thread each release ran."""

    def __init__(self) -> None:
        super().__init__(f"grant-race-{time.monotonic_ns()}", DriverContext())
        self.granting = threading.Event()
        self.released_in: list[int] = []
        self.released = threading.Event()

    def acquire(
        self, name: str, token: str, ttl: float, deadline: float | None, cancel: Cancel | None = None
    ) -> Grant | None:
        grant = super().acquire(name, token, ttl, deadline, cancel)
        self.granting.set()
        return grant

    def release(self, name: str, token: str) -> bool:
        self.released_in.append(threading.get_ident())
        try:
            return super().release(name, token)
        finally:
            self.released.set()


def test_C8_grant_that_raced_the_cancel_is_released_in_a_worker_thread() -> None:
    blocking = _Recording()
    driver = ThreadOffloadDriver(blocking, max_threads=2)

    async def main() -> int:
        task = asyncio.create_task(driver.acquire("orders", "t" * 32, 10.0, None))
        await asyncio.sleep(0)  # the task submits its call to a worker
        assert blocking.granting.wait(10)  # the worker has the grant; the loop has not run its callback yet
        time.sleep(0.05)  # (blocking the loop on purpose) the worker has finished the future
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
        else:
            raise AssertionError("the acquire was cancelled yet returned a grant")
        assert await asyncio.to_thread(blocking.released.wait, 10), "the raced grant was never released"
        await driver.close()
        return threading.get_ident()

    loop_thread = asyncio.run(main())
    assert blocking.released_in and loop_thread not in blocking.released_in
    assert blocking.holder("orders").held is False
