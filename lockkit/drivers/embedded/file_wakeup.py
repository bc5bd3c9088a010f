"""How a ``file://`` release wakes a waiter: one Unix datagram socket per waiting acquire, no server, no polling.

A waiter binds a socket and puts its address in the lock's record (``waiters``); a release sends one datagram
to the first address that still answers. Two kinds of address, chosen by the URL option ``wakeup``:

- ``abstract`` (the default on Linux): a name in Linux's abstract socket namespace, ``lockkit-<pid>-<hex>``.
  No file: the name vanishes with its socket, so a crashed waiter leaves nothing behind.
- ``files`` (the default elsewhere, e.g. macOS and the BSDs, which have no abstract namespace): a socket *file*
  ``<16 hex digits>`` in ``<lock dir>/.wakeup/``, recorded relative to the lock directory as
  ``.wakeup/<name>`` (so that every process that found the lock file finds the socket, whatever path it took to
  the directory). A socket path must fit ``sun_path`` (104 bytes on macOS, 108 on Linux), so when the lock
  directory's path is too long the socket goes to a private ``lockkit-wakeup-<uid>`` directory in the temp
  directory instead, recorded by its absolute path. The directories are ``0700`` and the sockets ``0600``:
  only the user who owns them can wake them, as only that user can open the ``0600`` lock files.

Every process sends to either kind, whatever its own setting, so processes with different settings share a
directory. A crashed waiter's socket file stays behind; the waker that finds it dead (``ECONNREFUSED``)
removes it and its entry, and each driver sweeps its socket directory of dead files once, when it first waits.
"""

from __future__ import annotations

import contextlib
import enum
import errno
import os
import re
import secrets
import socket
import stat
import sys
import tempfile
import time
from pathlib import Path

from ...errors import BackendUnavailable, ConfigError

MODES = ("auto", "abstract", "files")
"""The values of the ``wakeup`` URL option."""

SOCKET_DIR = ".wakeup"
"""The socket directory inside the lock directory."""

SUN_PATH_MAX = 103
"""The longest socket path used, in bytes: macOS's ``sun_path`` holds 104 with the terminating NUL (Linux 108).
One limit everywhere, so that the fallback is exercised on Linux exactly as it happens on macOS."""

SWEEP_MIN_AGE = 60.0
"""A socket file is swept only when older than this: on the BSDs ``bind`` creates the file a moment before the
socket is attached to it, and a sweep must never take that moment for a dead waiter."""

_NAME = re.compile(r"[0-9a-f]{16}\Z")


class Sent(enum.Enum):
    DELIVERED = "delivered"
    BUSY = "busy"
    """Its queue is full: it has wake-ups pending already."""
    GONE = "gone"
    """Nobody listens there any more (the waiter ended or crashed): drop the entry."""
    UNREACHABLE = "unreachable"
    """This process cannot address it (its path would be too long here): leave it for a process that can."""


def resolve_mode(requested: str, platform: str | None = None) -> str:
    """``abstract`` or ``files`` for the ``wakeup`` option on ``platform`` (this one: ``sys.platform``, read at
    the call); ``ConfigError`` where file:// cannot run."""
    platform = sys.platform if platform is None else platform
    if platform == "win32":
        raise ConfigError(
            "file:// does not run on Windows: it needs flock(2) and Unix datagram sockets. Use memory:// "
            "within one process, a server backend (redis://, etcd://, zookeeper://) across processes, or run "
            "under WSL, where file:// works as on Linux"
        )
    linux = platform.startswith("linux") or platform == "android"
    if requested == "auto":
        return "abstract" if linux else "files"
    if requested == "abstract" and not linux:
        raise ConfigError(
            f"wakeup=abstract needs Linux's abstract socket namespace, which {platform} does not have; "
            "leave the option out (or use wakeup=files) for socket files in the lock directory"
        )
    return requested


class Waiter:
    """One waiting acquire's socket and the address the record holds for it."""

    def __init__(self, sock: socket.socket, address: str, path: str | None) -> None:
        self.sock = sock
        self.address = address
        self._path = path

    def sleep(self, timeout: float | None) -> None:
        """Until a datagram arrives (a release, a cancel) or ``timeout`` seconds pass."""
        self.sock.settimeout(timeout)
        with contextlib.suppress(TimeoutError):
            self.sock.recv(16)

    def close(self) -> None:
        self.sock.close()
        if self._path is not None:
            # Gone already if a waker found it dead first; any other failure leaves it to the next sweep.
            with contextlib.suppress(OSError):
                os.unlink(self._path)


class Wakeup:
    """The wake-up channel of one ``file://`` driver: makes waiters' sockets and sends to any kind of address."""

    def __init__(self, directory: Path, mode: str) -> None:
        self.mode = mode
        self._root = os.path.abspath(directory)
        self._socket_dir: tuple[str, str] | None = None
        """``(directory, how addresses in it are recorded: a prefix)``, found at the first wait."""

    # -- waiting ---------------------------------------------------------------------------------

    def waiter(self) -> Waiter:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            if self.mode == "abstract":
                address = f"lockkit-{os.getpid()}-{secrets.token_hex(8)}"
                sock.bind("\0" + address)
                return Waiter(sock, address, None)
            return self._file_waiter(sock)
        except OSError as exc:
            sock.close()
            raise BackendUnavailable(
                f"cannot create a wake-up socket for file:// ({exc.strerror or exc}); check the lock directory "
                f"{self._root} and the temp directory, or use a server backend"
            ) from None
        except BaseException:
            sock.close()
            raise

    def _file_waiter(self, sock: socket.socket) -> Waiter:
        first = self._socket_dir is None
        directory, prefix = self._socket_dir = self._socket_dir or self._find_socket_dir()
        if first:
            self.sweep(directory)
        for _ in range(3):
            name = secrets.token_hex(8)
            path = os.path.join(directory, name)
            try:
                sock.bind(path)
            except FileNotFoundError:
                _private_dir(directory)  # someone removed the socket directory: make it again
                continue
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    continue  # a left-over file of that very name: draw another
                raise
            # The directory is 0700 already; the mode is for a directory someone loosens later.
            os.chmod(path, 0o600)
            return Waiter(sock, prefix + name, path)
        raise OSError(errno.EADDRNOTAVAIL, f"could not bind a socket in {directory}")

    def _find_socket_dir(self) -> tuple[str, str]:
        """The first private directory whose socket paths fit ``sun_path``, and how its addresses are recorded."""
        candidates = [
            (os.path.join(self._root, SOCKET_DIR), SOCKET_DIR + "/"),
            *((os.path.join(base, f"lockkit-wakeup-{os.geteuid()}"), "") for base in _temp_bases()),
        ]
        for directory, prefix in candidates:
            if _fits(os.path.join(directory, "0" * 16)) and _private_dir(directory):
                return directory, prefix or directory + "/"
        raise BackendUnavailable(
            f"no directory for file:// wake-up sockets: {candidates[0][0]} and the temp directory are too long "
            f"for a socket path ({SUN_PATH_MAX} bytes) or not private to this user; use a shorter lock "
            "directory path or set TMPDIR to a short directory you own"
        )

    def sweep(self, directory: str) -> int:
        """Remove the dead socket files (no socket bound: a crashed waiter's) in ``directory``; how many."""
        removed = 0
        now = time.time()
        with contextlib.suppress(OSError), os.scandir(directory) as entries:
            for entry in entries:
                if not _NAME.match(entry.name):
                    continue
                with contextlib.suppress(OSError):
                    info = entry.stat(follow_symlinks=False)
                    if stat.S_ISSOCK(info.st_mode) and now - info.st_mtime > SWEEP_MIN_AGE and _dead(entry.path):
                        os.unlink(entry.path)
                        removed += 1
        return removed

    # -- waking ----------------------------------------------------------------------------------

    def wake_first(self, waiters: list[str]) -> None:
        """Wake the first waiter still alive; drop the dead ones met on the way (and their socket files).

        Without a socket to send from (out of file descriptors) nobody is woken: the waiters still re-check at
        the holder's expiry, and a release must not fail over a wake-up.
        """
        try:
            sender = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        except OSError:
            return
        with sender:
            # Never block here: the caller holds the name's flock, and a waiter with a full queue may be waiting
            # for it.
            sender.setblocking(False)
            for address in list(waiters):
                outcome = self.send(sender, address, b"w")
                if outcome in (Sent.DELIVERED, Sent.BUSY):
                    return
                if outcome is Sent.GONE:
                    waiters.remove(address)

    def poke(self, address: str) -> None:
        """Wake our own waiter (its acquire was cancelled); it also re-checks at its timeout if this fails."""
        with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sender:
            sender.setblocking(False)
            self.send(sender, address, b"c")

    def send(self, sender: socket.socket, address: str, payload: bytes) -> Sent:
        target = self._target(address)
        if target is None:
            return Sent.UNREACHABLE
        try:
            sender.sendto(payload, target)
        except OSError as exc:
            if exc.errno in (errno.EAGAIN, errno.EWOULDBLOCK, errno.ENOBUFS):
                return Sent.BUSY
            if exc.errno == errno.ECONNREFUSED and not target.startswith("\0"):
                _remove_socket_file(target)  # nothing bound to it: a crashed waiter's left-over
            return Sent.GONE  # ECONNREFUSED, ENOENT, EACCES (another user's), ...: no one we can wake
        return Sent.DELIVERED

    def _target(self, address: str) -> str | None:
        if "/" not in address:
            return "\0" + address  # abstract (Linux; elsewhere the send fails and the entry is dropped)
        path = address if address.startswith("/") else os.path.join(self._root, address)
        return path if _fits(path) else None


def _temp_bases() -> list[str]:
    bases: list[str] = []
    with contextlib.suppress(OSError):  # no usable temp directory at all
        bases.append(tempfile.gettempdir())
    if "/tmp" not in bases:
        bases.append("/tmp")  # short on every Unix, for a TMPDIR too long for socket paths
    return bases


def _fits(path: str) -> bool:
    return len(os.fsencode(path)) <= SUN_PATH_MAX


def _private_dir(path: str) -> bool:
    """Make ``path`` a directory only this user can enter, or say it cannot be one."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError:
        return False
    try:
        info = os.lstat(path)
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
            return False  # a symlink, a file, or another user's (in a shared temp directory: never ours to use)
        if stat.S_IMODE(info.st_mode) != 0o700:
            os.chmod(path, 0o700)
    except OSError:
        return False
    return True


def _dead(path: str) -> bool:
    """Whether no socket is bound to the socket file ``path`` (connecting is harmless to a live one)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(path)
        except ConnectionRefusedError:
            return True
        except OSError:
            return False
    return False


def _remove_socket_file(path: str) -> None:
    # Only one of our socket files: the path comes from a record, and a record is no licence to delete anything.
    with contextlib.suppress(OSError):
        if _NAME.match(os.path.basename(path)) and stat.S_ISSOCK(os.lstat(path).st_mode):
            os.unlink(path)
