"""etcd fault scenarios from docs/reliability.md (C-*, E-*), against real etcd servers from backends/.

Timing bounds carry CI slack and print what was measured. etcd's lessor
checks for expired leases every 500 ms, so "the lease expired" is observable
up to half a second after the TTL passes; bounds that wait for a server-side
expiry include that tick.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import lockkit
from backends.servers import EtcdServer
from lockkit import LockLost
from lockkit.drivers.etcd.keys import name_range
from lockkit.timing import drift

SLACK = 0.25
LESSOR_TICK = 0.5  # etcd revokes expired leases on a 500 ms tick
ROOT = Path(__file__).resolve().parents[1]


def _name() -> str:
    return f"ef-{uuid.uuid4().hex[:10]}"


def etcdctl(server: EtcdServer, *args: str) -> str:
    done = subprocess.run(["etcdctl", *args], env=server.etcdctl_env(), capture_output=True, text=True,
                          timeout=15, check=True)
    return done.stdout


def lock_keys(server: EtcdServer, name: str, prefix: str = "/lockkit/") -> list[str]:
    """The keys of lock ``name`` on the server, in create_revision order."""
    start, end = name_range(prefix, name)
    out = etcdctl(server, "get", start.decode(), end.decode(), "--keys-only", "--sort-by=CREATE", "--order=ASCEND")
    return [line for line in out.splitlines() if line.strip()]


def lease_of(key: str) -> str:
    """The session lease id (hex) in a lock key (see lockkit.drivers.etcd.keys)."""
    return key.rsplit("/", 1)[1].split("-")[0]


def lease_count(server: EtcdServer) -> int:
    out = etcdctl(server, "lease", "list")
    return sum(1 for line in out.splitlines() if line.strip() and not line.startswith("found"))


HOLDER = textwrap.dedent("""
    import sys, time, lockkit
    url, name, ttl = sys.argv[1], sys.argv[2], float(sys.argv[3])
    locks = lockkit.connect(url)
    lease = locks.lock(name, ttl=ttl).acquire(timeout=30)
    print("held", lease.fencing_token, lease.ttl, flush=True)
    for line in sys.stdin:  # commands from the test
        print("valid" if lease.valid else "invalid", flush=True)
""")


@pytest.fixture
def holder_process() -> Iterator[list[subprocess.Popen[str]]]:
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
            proc.kill()
        proc.wait(10)
        for pipe in (proc.stdin, proc.stdout):
            if pipe is not None:
                pipe.close()


def start_holder(procs: list[subprocess.Popen[str]], url: str, name: str, ttl: float) -> tuple[int, float]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, url, name, str(ttl)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=env)
    procs.append(proc)
    assert proc.stdout is not None
    line = proc.stdout.readline().split()
    assert line and line[0] == "held", line
    return int(line[1]), float(line[2])


def test_c2_holder_sigkill(etcd_server: EtcdServer, holder_process: list[subprocess.Popen[str]]) -> None:
    name = _name()
    _, ttl = start_holder(holder_process, etcd_server.url, name, 1.0)
    with lockkit.connect(etcd_server.url) as locks:
        lock = locks.lock(name, ttl=ttl)
        assert lock.try_acquire() is None
        got: list[float] = []
        waiter = threading.Thread(target=lambda: got.append((lock.acquire(timeout=20), time.monotonic())[1]))
        waiter.start()
        time.sleep(0.2)
        killed = time.monotonic()
        holder_process[0].kill()
        waiter.join(20)
        assert got, "the waiter never acquired"
        waited = got[0] - killed
        print(f"C-2: waiter acquired {waited:.3f} s after SIGKILL (granted ttl {ttl:g} s)")
        assert waited <= ttl + LESSOR_TICK + SLACK
        lock.release()


def test_e1_operator_revokes_lease(etcd_server: EtcdServer) -> None:
    name = _name()
    lost = threading.Event()
    with lockkit.connect(etcd_server.url) as locks, lockkit.connect(etcd_server.url) as other:
        lease = locks.lock(name, ttl=3, on_lost=lambda _: lost.set()).acquire(timeout=5)
        (key,) = lock_keys(etcd_server, name)
        got: list[float] = []
        waiter = threading.Thread(
            target=lambda: got.append((other.lock(name, ttl=3).acquire(timeout=20), time.monotonic())[1]))
        waiter.start()
        while len(lock_keys(etcd_server, name)) < 2:
            time.sleep(0.02)
        revoked = time.monotonic()
        etcdctl(etcd_server, "lease", "revoke", lease_of(key))
        assert lost.wait(lease.ttl / 3 + SLACK + 1), "the revoked lease was not reported lost"
        detected = time.monotonic() - revoked
        waiter.join(10)
        print(f"E-1: loss seen after {detected:.3f} s (ttl/3 = {lease.ttl / 3:.3f}); waiter after "
              f"{got[0] - revoked:.3f} s")
        assert detected <= lease.ttl / 3 + SLACK
        assert got and got[0] - revoked <= 0.5
        assert key not in lock_keys(etcd_server, name)
        assert not lease.valid
        with pytest.raises(LockLost):
            lease.ensure_valid()


def test_e2_waiter_lease_revoked_while_waiting(etcd_server: EtcdServer) -> None:
    name = _name()
    with lockkit.connect(etcd_server.url) as locks, lockkit.connect(etcd_server.url) as other:
        holder = locks.lock(name, ttl=2)
        holder.acquire(timeout=5)
        result: list[lockkit.Lease] = []
        waiter = threading.Thread(target=lambda: result.append(other.lock(name, ttl=2).acquire(timeout=20)))
        waiter.start()
        while len(lock_keys(etcd_server, name)) < 2:
            time.sleep(0.02)
        waiting_key = lock_keys(etcd_server, name)[1]
        etcdctl(etcd_server, "lease", "revoke", lease_of(waiting_key))
        time.sleep(0.1)
        holder.release()
        waiter.join(20)
        assert result, "the waiter never acquired after re-queueing"
        keys = lock_keys(etcd_server, name)
        assert len(keys) == 1 and lease_of(keys[0]) != lease_of(waiting_key), (
            "the waiter reported 'acquired' on its revoked lease (#11456)")
        assert result[0].valid


def test_e3_stale_release_is_guarded_by_create_revision(etcd_server: EtcdServer) -> None:
    name = _name()
    with lockkit.connect(etcd_server.url) as locks:
        driver = locks._backends["default"].driver  # type: ignore[attr-defined]
        token = uuid.uuid4().hex
        first = driver.acquire(name, token, 5.0, None)
        (key,) = lock_keys(etcd_server, name)
        assert driver.release(name, token)
        # the same session re-creates the very same key name: only its create_revision differs
        second = driver.acquire(name, token, 5.0, None)
        assert lock_keys(etcd_server, name) == [key] and second.fencing_token > first.fencing_token
        assert not driver._delete_if(key.encode(), first.fencing_token), "a stale release deleted the new key"
        assert lock_keys(etcd_server, name) == [key]
        # and through the public API: the old handle's release is refused, the new holder survives
        old = locks.lock(name + "-api", ttl=5)
        old.acquire()
        old.release()
        new = locks.lock(name + "-api", ttl=5)
        new.acquire()
        with pytest.raises(lockkit.LockNotOwned):
            old.release()
        assert locks.holder(name + "-api").held
        new.release()
        assert driver.release(name, token)


def test_e4_prefix_names_and_fifo(etcd_server: EtcdServer) -> None:
    base = _name()
    lockers = [lockkit.connect(etcd_server.url) for _ in range(4)]
    try:
        a, ab = lockers[0].lock(base + "a", ttl=5), lockers[1].lock(base + "a/b", ttl=5)
        a.acquire(timeout=0)
        ab.acquire(timeout=0)  # both held at once: no prefix collision
        order: list[int] = []
        threads = []
        for i in range(20):
            lock = lockers[i % 4].lock(base + "a", ttl=5)

            def wait(lock: lockkit.Lock = lock, i: int = i) -> None:
                with lock:
                    order.append(i)

            threads.append(threading.Thread(target=wait))
            threads[-1].start()
            while lockers[0].holder(base + "a").waiters != i + 1:  # queue them in a known order
                time.sleep(0.005)
        a.release()
        for t in threads:
            t.join(30)
        assert order == list(range(20)), f"grants did not follow create-revision order: {order}"
        assert ab.owned()
        ab.release()
    finally:
        for locker in lockers:
            locker.close()


def test_e5_effective_ttl_is_the_granted_lease(etcd_server: EtcdServer) -> None:
    with lockkit.connect(etcd_server.url) as locks:
        for asked in (1.0, 0.3):
            lock = locks.lock(_name(), ttl=asked)
            lease = lock.acquire(timeout=5)
            assert lease.ttl == 2.0, lease.ttl  # etcd's default minimum lease TTL
            assert lease.expires_at == pytest.approx(lease.acquired_at + 2.0 - (2.0 * 0.01 + 0.002))
            lock.release()
        lease = locks.lock(_name(), ttl=2.4).acquire(timeout=5)
        assert lease.ttl == 3.0  # whole seconds, rounded up


def test_e5_fast_server_grants_smaller_minimum(fresh_etcd) -> None:  # type: ignore[no-untyped-def]
    server = fresh_etcd(heartbeat_interval_ms=10, election_timeout_ms=100)
    with lockkit.connect(server.url) as locks:
        lease = locks.lock(_name(), ttl=0.3).acquire(timeout=5)
        assert lease.ttl == 1.0


def test_one_session_lease_shared_by_all_locks(etcd_server: EtcdServer) -> None:
    base = _name()
    with lockkit.connect(etcd_server.url) as locks:
        held = [locks.lock(f"{base}-{i}", ttl=5) for i in range(30)]
        for lock in held:
            lock.acquire(timeout=5)
        leases = {lease_of(lock_keys(etcd_server, f"{base}-{i}")[0]) for i in range(30)}
        assert len(leases) == 1, "every lock of one client and ttl must share one session lease"
        for lock in held:
            lock.release()


def test_key_names_are_reused_and_simultaneous_handles_contend(etcd_server: EtcdServer) -> None:
    name = _name()
    with lockkit.connect(etcd_server.url) as locks:
        first, second = locks.lock(name, ttl=5), locks.lock(name, ttl=5)
        first.acquire(timeout=5)
        assert second.try_acquire() is None  # two handles of one client are strangers
        with pytest.raises(lockkit.LockTimeout):
            second.acquire(timeout=0.05)  # queued in slot 1, then gave up
        got: list[lockkit.Lease] = []
        waiter = threading.Thread(target=lambda: got.append(second.acquire(timeout=10)))
        waiter.start()
        while len(lock_keys(etcd_server, name)) < 2:
            time.sleep(0.01)
        keys = lock_keys(etcd_server, name)
        assert [k.rsplit("-", 1)[1] for k in keys] == ["0", "1"], keys
        first.release()
        waiter.join(10)
        assert got and got[0].valid
        second.release()
        for _ in range(5):  # one after another: the same key name every time (etcd's index stays small)
            with first:
                assert lock_keys(etcd_server, name) == [keys[0]]
    assert lock_keys(etcd_server, name) == []


async def test_c8_cancellation_storm(etcd_server: EtcdServer) -> None:
    name = _name()
    leases_before = lease_count(etcd_server)
    async with lockkit.connect_async(etcd_server.url) as locks, lockkit.connect_async(etcd_server.url) as other:
        holder = locks.lock(name, ttl=5)
        await holder.acquire()
        rng = random.Random(8)
        for i in range(200):
            task = asyncio.ensure_future(other.lock(name, ttl=5).acquire())
            await asyncio.sleep(rng.random() * 0.01)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            deadline = time.monotonic() + 2
            while True:  # the worker thread finishes its clean-up just after the task is cancelled
                keys = await asyncio.to_thread(lock_keys, etcd_server, name)
                if len(keys) == 1 or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.01)
            assert len(keys) == 1, f"iteration {i}: leaked waiter keys {keys}"
        assert lease_count(etcd_server) <= leases_before + 2, "leases leaked (one session lease per client)"
        await holder.release()
    assert await asyncio.to_thread(lock_keys, etcd_server, name) == []


def test_c8_sync_timeouts_leave_nothing(etcd_server: EtcdServer) -> None:
    name = _name()
    with lockkit.connect(etcd_server.url) as locks, lockkit.connect(etcd_server.url) as other:
        holder = locks.lock(name, ttl=5)
        holder.acquire()
        for i in range(20):
            with pytest.raises(lockkit.LockTimeout):
                other.lock(name, ttl=5).acquire(timeout=0.001 * i)
            assert len(lock_keys(etcd_server, name)) == 1
        holder.release()


def test_c10_server_sigstop(fresh_etcd) -> None:  # type: ignore[no-untyped-def]
    server = fresh_etcd()
    lost_at: list[float] = []
    with lockkit.connect(server.url) as locks, lockkit.connect(server.url) as other:
        lease = locks.lock(_name(), ttl=2, on_lost=lambda _: lost_at.append(time.monotonic())).acquire(timeout=5)
        name = lease.name
        server.pause()
        try:
            time.sleep(2 * lease.ttl)
        finally:
            server.resume()
        assert lost_at, "the loss was not reported while the server was stopped"
        print(f"C-10: lost {lost_at[0] - lease.expires_at:+.3f} s after the local deadline")
        assert lost_at[0] <= lease.expires_at + 0.1 + SLACK
        assert not lease.valid
        # after resume the old lease is revoked by the server; exactly one of two contenders wins
        time.sleep(LESSOR_TICK + SLACK)
        first = locks.lock(name, ttl=2).try_acquire()
        second = other.lock(name, ttl=2).try_acquire()
        assert (first is None) != (second is None), (first, second)


def test_c5_holder_cut_off_by_proxy(etcd_server: EtcdServer, fault_proxy) -> None:  # type: ignore[no-untyped-def]
    proxy = fault_proxy(etcd_server)
    lost_at: list[float] = []
    name = _name()
    with lockkit.connect(f"etcd://127.0.0.1:{proxy.port}?timeout=2") as locks:
        lease = locks.lock(name, ttl=2, on_lost=lambda _: lost_at.append(time.monotonic())).acquire(timeout=5)
        proxy.set_mode("blackhole")
        cut = time.monotonic()
        # Nothing reaches etcd after the cut, so no renewal sent after it can count: the lease may promise at
        # most what a request sent at the cut would have bought.
        latest = cut + lease.ttl - drift(lease.ttl)
        while not lost_at and time.monotonic() < cut + 2 * lease.ttl:
            assert lease.expires_at <= latest, "the lease was extended while etcd was unreachable"
            time.sleep(0.01)
        assert lost_at, "the loss was not reported during the partition"
        print(f"C-5: lost {lost_at[0] - lease.expires_at:+.3f} s after the local deadline")
        assert lost_at[0] <= lease.expires_at + 0.1 + SLACK
        with pytest.raises(LockLost):
            lease.ensure_valid()
        time.sleep(max(0.0, cut + 2 * lease.ttl - time.monotonic()))
        proxy.heal()
        time.sleep(lease.ttl / 2)  # a ghost renewal would land here
        assert not lease.valid
        again = locks.lock(name, ttl=2).acquire(timeout=10)  # a fresh session after healing
        assert again.valid and again.fencing_token > lease.fencing_token


def test_c7_acquire_reply_lost(etcd_server: EtcdServer, fault_proxy) -> None:  # type: ignore[no-untyped-def]
    proxy = fault_proxy(etcd_server)
    name = _name()
    with lockkit.connect(f"etcd://127.0.0.1:{proxy.port}?timeout=1") as locks:
        locks.lock(_name(), ttl=2).acquire(timeout=5)  # the session exists and is kept alive by a held lock
        proxy.set_mode("drop_downstream")
        with pytest.raises(lockkit.BackendUnavailable):
            locks.lock(name, ttl=2).acquire(timeout=5)
        assert len(lock_keys(etcd_server, name)) == 1, "the create should have been applied (reply lost)"
        proxy.heal()
        proxy.reset_all()  # the stream the client saw is broken: make it reconnect
        started = time.monotonic()
        with lockkit.connect(etcd_server.url) as other:
            lease = other.lock(name, ttl=2).acquire(timeout=10)
            waited = time.monotonic() - started
            print(f"C-7: a later acquirer got the lock after {waited:.3f} s")
            assert lease.valid and waited <= 2 + LESSOR_TICK + SLACK
        assert lock_keys(etcd_server, name) == []


C4_HOLDER = textwrap.dedent("""
    import sys, lockkit
    from lockkit.drivers.etcd.client import rpc, cmp_created
    url, name = sys.argv[1], sys.argv[2]
    locks = lockkit.connect(url)
    lock = locks.lock(name, ttl=1)
    lease = lock.acquire(timeout=30)
    driver = locks._backends["default"].driver
    key = driver._held[lease.token].key
    print("held", lease.fencing_token, flush=True)
    sys.stdin.readline()
    valid = lease.valid
    # Jepsen's lock-etcd-set: write guarded on our key's create_revision (IsOwner)
    txn = rpc.TxnRequest(compare=[cmp_created(key, lease.fencing_token)],
                         success=[rpc.RequestOp(request_put=rpc.PutRequest(key=b"/c4/data", value=b"old"))])
    ok = driver._client.txn(txn).succeeded
    print("valid" if valid else "invalid", "written" if ok else "rejected", flush=True)
""")


def test_c4c_paused_holder_guarded_txn_fails(
    etcd_server: EtcdServer, holder_process: list[subprocess.Popen[str]]
) -> None:
    name = _name()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-c", C4_HOLDER, etcd_server.url, name], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=env)
    holder_process.append(proc)
    assert proc.stdout is not None and proc.stdin is not None
    held, old_token = proc.stdout.readline().split()
    assert held == "held"
    os.kill(proc.pid, signal.SIGSTOP)  # a "GC pause": the renewal thread stops too
    try:
        with lockkit.connect(etcd_server.url) as other:
            lease = other.lock(name, ttl=2).acquire(timeout=10)
            assert lease.fencing_token > int(old_token)
            os.kill(proc.pid, signal.SIGCONT)
            proc.stdin.write("go\n")
            proc.stdin.flush()
            verdict = proc.stdout.readline().split()
            assert verdict == ["invalid", "rejected"], verdict
    finally:
        os.kill(proc.pid, signal.SIGCONT)


def test_c11_server_restart(fresh_etcd, holder_process: list[subprocess.Popen[str]]) -> None:  # type: ignore[no-untyped-def]
    server = fresh_etcd()
    name = _name()
    token, ttl = start_holder(holder_process, server.url, name, 2.0)
    holder_process[0].kill()  # the holder dies, then the server restarts before its lease expired
    server.kill()
    restarted = time.monotonic()
    server.restart(keep_data=True)
    restart_took = time.monotonic() - restarted
    with lockkit.connect(server.url) as other:
        # a restart gives every lease its full TTL again (#9395): the dead holder's lock outlives the restart
        second = other.lock(name, ttl=2).acquire(timeout=15)
        waited = time.monotonic() - restarted
        print(f"C-11: restart took {restart_took:.3f} s; the lock was free {waited:.3f} s after it began")
        assert second.fencing_token > token
        # a new leader also extends every lease by its election timeout (1 s by default) when it takes office
        assert waited <= ttl + restart_took + 1.0 + LESSOR_TICK + SLACK


def test_keepalive_fails_over_to_the_next_member(etcd_server: EtcdServer, fault_proxy) -> None:  # type: ignore[no-untyped-def]
    # two "members": a proxy (current at first) and the server itself; the proxy then refuses every connection
    proxy = fault_proxy(etcd_server)
    lost = threading.Event()
    with lockkit.connect(f"etcd://127.0.0.1:{proxy.port},127.0.0.1:{etcd_server.port}?timeout=1") as locks:
        lock = locks.lock(_name(), ttl=2, on_lost=lambda _: lost.set())
        lease = lock.acquire(timeout=5)
        proxy.set_mode("reset")  # the member in use is gone: every RPC to it fails with UNAVAILABLE
        assert not lost.wait(2 * lease.ttl + LESSOR_TICK), "renewal did not fail over to the next member"
        assert lease.valid
        lock.release()


C4_FENCED_HOLDER = textwrap.dedent("""
    import sys, threading, time, lockkit
    from pathlib import Path
    from lockkit.cli.fencing_store import FencedStore
    url, name, store_path, plain = sys.argv[1:5]
    store = FencedStore(store_path)
    locks = lockkit.connect(url)
    lost_at = []
    lease = locks.lock(name, ttl=1, on_lost=lambda _: lost_at.append(time.monotonic())).acquire(timeout=30)
    client = locks._backends["default"].driver._client
    main, rpcs = threading.get_ident(), [0]
    failover = client.failover
    def counted(*args, **kwargs):
        if threading.get_ident() == main:
            rpcs[0] += 1
        return failover(*args, **kwargs)
    client.failover = counted
    fenced = store.read(lease.fencing_token, lease.token)  # registers our token: older ones may not write
    unfenced = int(Path(plain).read_text())
    print("held", lease.fencing_token, lease.ttl, time.monotonic(), flush=True)
    sys.stdin.readline()  # SIGSTOPped here ("GC pause"); the test writes a line after SIGCONT
    before = rpcs[0]
    valid = lease.valid
    try:
        lease.ensure_valid()
        raised = False
    except lockkit.LockLost:
        raised = True
    checked_rpcs = rpcs[0] - before
    written = store.write(fenced + 1, lease.fencing_token, lease.token)  # C-4a: what we computed before
    Path(plain).write_text(str(unfenced + 1))  # C-4b: the same update on a resource that checks nothing
    stale_at = time.monotonic()
    time.sleep(lease.ttl / 3 + 0.5)  # give on_lost its renewal period
    print(valid, raised, checked_rpcs, written, stale_at, lost_at[0] if lost_at else -1, flush=True)
""")


def test_c4a_c4b_paused_holder_fencing_store(
    etcd_server: EtcdServer, holder_process: list[subprocess.Popen[str]], tmp_path: Path
) -> None:
    from lockkit.cli.fencing_store import FencedStore

    name, store_path, plain = _name(), tmp_path / "store.db", tmp_path / "counter"
    plain.write_text("0")
    store = FencedStore(store_path)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-c", C4_FENCED_HOLDER, etcd_server.url, name, str(store_path),
                             str(plain)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    holder_process.append(proc)
    assert proc.stdout is not None and proc.stdin is not None
    held, old_token, ttl, old_entered = proc.stdout.readline().split()
    assert held == "held"
    os.kill(proc.pid, signal.SIGSTOP)  # the holder and its renewal thread freeze past the lease's TTL
    try:
        with lockkit.connect(etcd_server.url) as other:
            lease = other.lock(name, ttl=5).acquire(timeout=15)
            new_entered = time.monotonic()
            assert lease.fencing_token > int(old_token)
            value = store.read(lease.fencing_token, lease.token)
            assert value is not None and store.write(value + 1, lease.fencing_token, lease.token)
            plain.write_text(str(int(plain.read_text()) + 1))
            resumed = time.monotonic()
            os.kill(proc.pid, signal.SIGCONT)
            proc.stdin.write("go\n")
            proc.stdin.flush()
            valid, raised, rpcs, written, stale_at, lost_at = proc.stdout.readline().split()
            new_left = time.monotonic()
            assert lease.valid  # the new holder held throughout
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    print(f"C-4: on_lost {float(lost_at) - resumed:.3f} s after SIGCONT (ttl/3 = {float(ttl) / 3:.3f})")
    # C-4a: the resumed holder knows at once, without I/O, and the fencing store rejects its write
    assert (valid, raised, rpcs) == ("False", "True", "0")
    assert written == "False", "C-4a: the fencing store accepted the paused holder's write"
    report = store.report()
    assert report.value == 1 and report.backwards == 0 and report.shared_tokens == 0, report
    assert 0 <= float(lost_at) - resumed <= float(ttl) / 3 + SLACK
    # C-4b (canary): without fencing the stale write lands inside the new holder's critical section, and
    # the checker sees both the overlap and the lost update
    assert float(old_entered) < new_left and new_entered < float(stale_at) < new_left, "the overlap went unseen"
    assert plain.read_text() == "1", "canary: the unfenced resource should have lost an update"


def _assert_counted_from_the_send(lease: lockkit.Lease, since: float, delay: float, seen: set[float]) -> None:
    """A deadline first seen now comes from a renewal whose reply arrived by now. If that reply was held back
    ``delay`` by the proxy (set at ``since``), its request was sent at least ``delay`` ago, and the deadline
    can be at most that send + ttl - drift; a reply read before ``since`` came from a request sent before it."""
    now, deadline = time.monotonic(), lease.expires_at
    if deadline in seen:
        return
    seen.add(deadline)
    sent_by = max(since, now - delay)
    assert deadline <= sent_by + lease.ttl - drift(lease.ttl), (
        f"a renewal counted from its reply: the deadline is {deadline - (sent_by + lease.ttl - drift(lease.ttl)):+.3f} "
        "s past its send + ttl - drift"
    )


def test_c6_slow_renew_replies(fresh_etcd, fault_proxy) -> None:  # type: ignore[no-untyped-def]
    server = fresh_etcd(heartbeat_interval_ms=10, election_timeout_ms=100)  # 1 s leases: renewals every 1/3 s
    proxy = fault_proxy(server)
    lost_at: list[float] = []
    with lockkit.connect(f"etcd://127.0.0.1:{proxy.port}?timeout=2") as locks:
        lease = locks.lock(_name(), ttl=1, on_lost=lambda _: lost_at.append(time.monotonic())).acquire(timeout=5)
        assert lease.ttl == 1.0
        # replies 0.1 x TTL late: renewals still land in time, no spurious loss
        proxy.delay(0.1 * lease.ttl, direction="down")
        late = time.monotonic()
        seen, until = {lease.expires_at}, late + 12 * lease.ttl / 3
        while time.monotonic() < until:
            assert lease.valid, "spurious loss with replies 0.1 x TTL late"
            _assert_counted_from_the_send(lease, late, 0.1 * lease.ttl, seen)
            time.sleep(0.01)
        print(f"C-6: {len(seen) - 1} renewals with replies 0.1 x TTL late")
        assert len(seen) - 1 >= 6 and not lost_at
        # replies 0.6 x TTL late: a keepalive waits at most TTL/2, so no renewal can land after the deadline
        proxy.delay(0.6 * lease.ttl, direction="down")
        slow = time.monotonic()
        while not lost_at and time.monotonic() < slow + 3 * lease.ttl:
            _assert_counted_from_the_send(lease, slow, 0.6 * lease.ttl, seen)
            time.sleep(0.005)
        assert lost_at, "no loss reported with replies 0.6 x TTL late"
        print(f"C-6: lost {lost_at[0] - lease.expires_at:+.3f} s after the local deadline")
        assert lost_at[0] <= lease.expires_at + 0.1 + SLACK
        assert not lease.valid
        time.sleep(lease.ttl)  # late replies still arriving must not revive it
        assert not lease.valid
        with pytest.raises(LockLost):
            lease.ensure_valid()
