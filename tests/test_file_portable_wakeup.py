"""file:// with the portable wake-up (socket files, ``wakeup=files``), forced on Linux.

On macOS and the BSDs ``wakeup=auto`` means socket files; here the URL option forces them, and the whole
conformance suite runs on them as it runs on the abstract namespace in ``tests/test_conformance_embedded.py``.
The focused tests below wake real waiters through real socket files: nothing is mocked but ``sys.platform``
(to show what ``auto`` chooses elsewhere) and the temp directory (to keep fallback paths short).
"""

from __future__ import annotations

import os
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import lockkit
from lockkit import ConfigError
from lockkit.driver import DriverContext
from lockkit.drivers.embedded import file_wakeup
from lockkit.drivers.embedded.file import MAX_WAITER_BYTES, FileDriver
from lockkit.testing import AsyncConformanceSuite, ConformanceSuite
from lockkit.urls import parse_url

LIVENESS = 20.0
"""A generous bound for a wake-up that must come: far below the 60 s TTL whose expiry is the only re-check."""


@pytest.fixture
def lock_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # Short on purpose: pytest's per-test paths carry the test name, and a long one would put the sockets in the
    # fallback directory, which has tests of its own.
    return tmp_path_factory.mktemp("pw") / "locks"


def _files_url(directory: Path) -> str:
    return directory.as_uri() + "?wakeup=files"


class TestFilePortable(ConformanceSuite):
    @pytest.fixture
    def url(self, lock_dir: Path) -> str:
        return _files_url(lock_dir)


class TestFilePortableAsync(AsyncConformanceSuite):
    @pytest.fixture
    def url(self, lock_dir: Path) -> str:
        return _files_url(lock_dir)


# -- helpers -------------------------------------------------------------------------------------------


def _driver(url: str) -> FileDriver:
    return FileDriver.from_url(parse_url(url), DriverContext())


def _waiters(driver: FileDriver, name: str) -> list[str]:
    with driver._locked(name) as (record, _now):
        return list(record.waiters)


def _until(condition: Callable[[], bool], what: str, limit: float = LIVENESS) -> None:
    deadline = time.monotonic() + limit
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


class _Waiting:
    """A thread waiting for ``name`` on ``url``, acquiring and releasing it once it is woken."""

    def __init__(self, url: str, name: str) -> None:
        self.locker = lockkit.connect(url)
        self.got = threading.Event()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(name,), daemon=True)
        self._thread.start()

    def _run(self, name: str) -> None:
        try:
            lock = self.locker.lock(name, ttl=5)
            lock.acquire(timeout=2 * LIVENESS)
            self.got.set()
            lock.release()
        except BaseException as exc:  # reported by the test's assertion
            self.error = exc

    def woken(self) -> bool:
        woke = self.got.wait(LIVENESS)
        self._thread.join(LIVENESS)
        self.locker.close()
        assert self.error is None, self.error
        return woke


@pytest.fixture
def holder(lock_dir: Path) -> Iterator[lockkit.Lock]:
    """``x`` held for 60 s by this process: a waiter that gets it sooner was woken by the release."""
    with lockkit.connect(_files_url(lock_dir)) as locker:
        lock = locker.lock("x", ttl=60)
        lock.acquire()
        yield lock
        if lock.owned():
            lock.release()


# -- choosing the path -----------------------------------------------------------------------------------


def test_auto_is_the_abstract_namespace_on_linux_and_socket_files_elsewhere() -> None:
    assert file_wakeup.resolve_mode("auto", "linux") == "abstract"
    for platform in ("darwin", "freebsd14", "openbsd7", "netbsd10"):
        assert file_wakeup.resolve_mode("auto", platform) == "files"
    assert file_wakeup.resolve_mode("files", "linux") == "files"
    assert file_wakeup.resolve_mode("abstract", "linux") == "abstract"


def test_auto_on_macos_binds_socket_files(lock_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "platform", "darwin")
    waiter = _driver(lock_dir.as_uri())._wakeup.waiter()
    try:
        assert waiter.address.startswith(".wakeup/")
        assert stat.S_ISSOCK(os.lstat(lock_dir / waiter.address).st_mode)
    finally:
        waiter.close()
    assert not (lock_dir / waiter.address).exists(), "a waiter's socket file outlived it"


def test_windows_is_refused_with_a_config_error(lock_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "platform", "win32")
    with pytest.raises(ConfigError, match=r"Windows.*memory://.*WSL"):
        lockkit.connect(lock_dir.as_uri())
    assert not lock_dir.exists(), "the refusal came after creating the directory"


def test_abstract_off_linux_and_unknown_values_are_config_errors(
    lock_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ConfigError, match=r"wakeup must be one of auto, abstract, files, not 'poll'"):
        lockkit.connect(lock_dir.as_uri() + "?wakeup=poll")
    monkeypatch.setattr(sys, "platform", "darwin")
    with pytest.raises(ConfigError, match=r"wakeup=abstract needs Linux.*wakeup=files"):
        lockkit.connect(lock_dir.as_uri() + "?wakeup=abstract")


# -- waking through socket files ---------------------------------------------------------------------


def test_a_release_wakes_a_waiter_through_its_socket_file(lock_dir: Path, holder: lockkit.Lock) -> None:
    driver = _driver(_files_url(lock_dir))
    waiting = _Waiting(_files_url(lock_dir), "x")
    _until(lambda: len(_waiters(driver, "x")) == 1, "the waiter to register")
    (address,) = _waiters(driver, "x")
    assert address.startswith(".wakeup/"), "recorded relative to the lock directory"
    assert stat.S_ISSOCK(os.lstat(lock_dir / address).st_mode)
    holder.release()
    assert waiting.woken(), "the release did not wake the waiter"
    assert _waiters(driver, "x") == []
    assert os.listdir(lock_dir / ".wakeup") == [], "socket files outlived their waiters"


@pytest.mark.parametrize(("waiter_mode", "releaser_mode"), [("abstract", "files"), ("files", "abstract")])
def test_processes_with_either_setting_wake_each_other(lock_dir: Path, waiter_mode: str, releaser_mode: str) -> None:
    url = lock_dir.as_uri() + "?wakeup="
    with lockkit.connect(url + releaser_mode) as locker:
        lock = locker.lock("x", ttl=60)
        lock.acquire()
        waiting = _Waiting(url + waiter_mode, "x")
        driver = _driver(url + "files")
        _until(lambda: len(_waiters(driver, "x")) == 1, "the waiter to register")
        lock.release()
        assert waiting.woken(), f"a {releaser_mode} releaser did not wake a {waiter_mode} waiter"


def test_the_socket_directory_and_sockets_are_private(lock_dir: Path) -> None:
    lock_dir.mkdir(parents=True)
    (lock_dir / ".wakeup").mkdir(mode=0o755)
    os.chmod(lock_dir / ".wakeup", 0o777)  # loosened by someone: tightened again before a socket goes in
    waiter = _driver(_files_url(lock_dir))._wakeup.waiter()
    try:
        assert stat.S_IMODE(os.lstat(lock_dir / ".wakeup").st_mode) == 0o700
        info = os.lstat(lock_dir / waiter.address)
        assert stat.S_ISSOCK(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o600
        assert info.st_uid == os.geteuid()
    finally:
        waiter.close()


def test_a_symlinked_socket_directory_is_not_used(lock_dir: Path, tmp_path: Path, short_tmp: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    lock_dir.mkdir(parents=True)
    (lock_dir / ".wakeup").symlink_to(elsewhere)
    waiter = _driver(_files_url(lock_dir))._wakeup.waiter()
    try:
        assert Path(waiter.address).parent == short_tmp / f"lockkit-wakeup-{os.geteuid()}"
        assert os.listdir(elsewhere) == []
    finally:
        waiter.close()


@pytest.fixture
def short_tmp(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The one temp directory the fallback may use: short, and never the machine's own /tmp."""
    with tempfile.TemporaryDirectory(prefix="lkw", dir="/tmp") as short:
        monkeypatch.setattr(file_wakeup, "_temp_bases", lambda: [short])
        yield Path(short)


def test_a_lock_directory_too_long_for_socket_paths_uses_a_private_temp_directory(
    tmp_path: Path, short_tmp: Path
) -> None:
    deep = tmp_path / ("d" * 60) / ("e" * 60) / "locks"
    assert len(os.fsencode(deep / ".wakeup" / ("0" * 16))) > file_wakeup.SUN_PATH_MAX
    url = _files_url(deep)
    driver = _driver(url)
    with lockkit.connect(url) as locker:
        lock = locker.lock("x", ttl=60)
        lock.acquire()
        waiting = _Waiting(url, "x")
        _until(lambda: len(_waiters(driver, "x")) == 1, "the waiter to register")
        (address,) = _waiters(driver, "x")
        fallback = short_tmp / f"lockkit-wakeup-{os.geteuid()}"
        assert Path(address).parent == fallback
        assert stat.S_IMODE(os.lstat(fallback).st_mode) == 0o700
        assert len(os.fsencode(address)) <= file_wakeup.SUN_PATH_MAX
        lock.release()
        assert waiting.woken(), "a waiter in the fallback directory was not woken"
    assert not (deep / ".wakeup").exists()
    assert os.listdir(fallback) == []


@pytest.mark.parametrize("planted", ["symlink", "another user's"])
def test_a_fallback_directory_someone_else_planted_is_never_used(tmp_path: Path, short_tmp: Path, planted: str) -> None:
    deep = tmp_path / ("d" * 60) / ("e" * 60) / "locks"
    squat = short_tmp / f"lockkit-wakeup-{os.geteuid()}"  # what another user could create in a shared /tmp
    if planted == "symlink":
        squat.symlink_to(tmp_path)
    else:
        if os.geteuid() != 0:
            pytest.skip("giving a directory to another user needs root")
        squat.mkdir(mode=0o700)
        os.chown(squat, 65534, 65534)
    with pytest.raises(lockkit.BackendUnavailable, match=r"shorter lock directory path or set TMPDIR"):
        _driver(_files_url(deep))._wakeup.waiter()
    assert not any(p.name.startswith(("0", "1")) for p in tmp_path.iterdir())


# -- crashed waiters -----------------------------------------------------------------------------------

WAITER_CHILD = r"""
import sys, lockkit
lockkit.connect(sys.argv[1]).lock("x", ttl=5).acquire(timeout=120)
"""


def test_a_killed_waiters_socket_file_is_removed_and_does_not_block_a_release(
    lock_dir: Path, holder: lockkit.Lock
) -> None:
    url = _files_url(lock_dir)
    driver = _driver(url)
    source = str(Path(lockkit.__file__).parents[1])  # the lockkit under test, not whatever the venv installed
    path = os.pathsep.join(p for p in (source, os.environ.get("PYTHONPATH")) if p)
    child = subprocess.Popen([sys.executable, "-c", WAITER_CHILD, url], env={**os.environ, "PYTHONPATH": path})
    try:
        _until(lambda: len(_waiters(driver, "x")) == 1, "the child to register as a waiter")
        (dead,) = _waiters(driver, "x")
        waiting = _Waiting(url, "x")  # second in line, behind the child
        _until(lambda: len(_waiters(driver, "x")) == 2, "the thread to register as a waiter")
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    assert stat.S_ISSOCK(os.lstat(lock_dir / dead).st_mode), "SIGKILL leaves the socket file behind"
    released = threading.Event()
    threading.Thread(target=lambda: (holder.release(), released.set()), daemon=True).start()
    assert released.wait(LIVENESS), "a release blocked on a dead waiter's socket file"
    assert waiting.woken(), "the live waiter behind the dead one was not woken"
    assert not os.path.lexists(lock_dir / dead), "the waker left the dead waiter's socket file"
    assert dead not in _waiters(driver, "x")


def _dead_socket_file(path: Path) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(path))  # closed without unlinking: what a crashed waiter leaves


def test_the_first_wait_sweeps_old_dead_socket_files_only(lock_dir: Path) -> None:
    sockets = lock_dir / ".wakeup"
    sockets.mkdir(parents=True, mode=0o700)
    old = time.time() - 2 * file_wakeup.SWEEP_MIN_AGE
    dead, young, other = sockets / ("a" * 16), sockets / ("b" * 16), sockets / "not-ours"
    for path in (dead, young, other):
        _dead_socket_file(path)
    live = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    live.bind(str(sockets / ("c" * 16)))
    try:
        for path in (dead, other, sockets / ("c" * 16)):
            os.utime(path, (old, old), follow_symlinks=False)
        waiter = _driver(_files_url(lock_dir))._wakeup.waiter()
        waiter.close()
        left = set(os.listdir(sockets))
        assert dead.name not in left, "an old dead socket file survived the sweep"
        assert {young.name, other.name, "c" * 16} <= left, "the sweep removed a young, foreign or live file"
    finally:
        live.close()


def test_a_waiter_this_process_cannot_address_is_kept_for_one_that_can(lock_dir: Path) -> None:
    """An address longer than ``sun_path`` from here stays in the record; the next waiter is woken meanwhile."""
    far = file_wakeup.Wakeup(Path("/" + "x" * 120), "files")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as reachable:
        lock_dir.mkdir(parents=True)
        path = lock_dir / "r"
        reachable.bind(str(path))
        waiters = [".wakeup/" + "d" * 16, str(path)]
        far.wake_first(waiters)
        assert waiters == [".wakeup/" + "d" * 16, str(path)]
        reachable.settimeout(LIVENESS)
        assert reachable.recv(16) == b"w"


def test_the_waiters_list_keeps_the_record_within_its_slot() -> None:
    longest = "/" + "p" * (file_wakeup.SUN_PATH_MAX - 1)
    waiters: list[str] = []
    while FileDriver._room_for(waiters, longest):
        waiters.append(longest)
    assert sum(len(w) + 3 for w in waiters) <= MAX_WAITER_BYTES
    abstract = "lockkit-4194304-0123456789abcdef"
    assert FileDriver._room_for([abstract] * 1023, abstract), "abstract names keep their 1024 waiters"
