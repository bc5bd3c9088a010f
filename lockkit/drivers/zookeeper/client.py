"""kazoo plumbing for :mod:`lockkit.drivers.zookeeper`: building the client, and what kazoo does not offer.

* the negotiated session timeout, which kazoo keeps as a local of its handshake
  (python-zk/kazoo#769): read from the server's connect reply by wrapping the
  connection's ``_invoke``, the one call that performs the handshake;
* container nodes (``createContainer``, opcode 19), which kazoo's ``create()``
  cannot make: sent through kazoo's request queue;
* a lock name's parent and first contender made in one ``multi`` (:func:`found_async`), whose reply kazoo's
  ``Transaction`` cannot read (it knows no ``create2`` result);
* a barrier behind kazoo's watch callbacks (see :func:`barrier`);
* a node's deletion told on kazoo's connection thread, as it reads the event (see :func:`_tell_deletions`);
* what each connect attempt met (refused, or a host name that does not resolve), which kazoo only logs;
* kazoo's log, routed under lockkit's and quieted (see :class:`KazooLog`).
"""

from __future__ import annotations

import errno
import logging
import struct
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from kazoo.client import KazooClient
from kazoo.exceptions import EXCEPTIONS, RolledBackError, RuntimeInconsistency
from kazoo.protocol.serialization import (
    Auth,
    Connect,
    Create2,
    MultiHeader,
    Watch,
    ZnodeStat,
    int_struct,
    multiheader_struct,
    read_string,
    stat_struct,
)
from kazoo.protocol.states import Callback

from ...errors import BackendUnavailable, ConfigError
from .nodes import Transient, ZooKeeperOptions
from .poll import use_poll

CONTAINER_FLAG = 4
"""``CreateMode.CONTAINER``: the server deletes the node once its last child is gone (ZooKeeper ≥ 3.5.3)."""
EPHEMERAL_SEQUENTIAL_FLAG = 3
"""``CreateMode.EPHEMERAL_SEQUENTIAL``."""
CREATE, CREATE2, CREATE_CONTAINER, MULTI_ERROR = 1, 15, 19, -1
"""Opcodes of a ``multi``'s operations and of its results (an error result's type is -1)."""
DELETE, SET_DATA, CHECK = 2, 5, 13
"""More opcodes a ``multi`` may carry (the permits' version checks, :mod:`.permits`)."""


KAZOO_LOGGER = "lockkit.kazoo"
"""The logger kazoo's records go to (see :class:`KazooLog`)."""

NOTHING_THERE = (errno.ECONNREFUSED, errno.EHOSTUNREACH, errno.ENETUNREACH)
"""Connect errors that mean no server is there at all (as opposed to one that is slow or silent)."""

DELETED_EVENT = 2
"""The type of a ZooKeeper watch event for a deleted node."""

Attempt = Callable[[str | None], None]
"""Told what one connect attempt met: ``None`` (a TCP connection, or a failure that proves nothing: a
timeout), or why nothing was there (``"connection refused"``, ``"cannot resolve zk1"``…)."""

if TYPE_CHECKING:
    _Adapter = logging.LoggerAdapter[logging.Logger]
else:  # LoggerAdapter is subscriptable at run time only from Python 3.11 on
    _Adapter = logging.LoggerAdapter


class KazooLog(_Adapter):
    """kazoo's logger for one client: its records go to ``lockkit.kazoo``, quieted and without secrets.

    * Below ERROR, records are logged at DEBUG. During an outage kazoo logs a WARNING for every connect
      attempt ("Connection dropped: … Connection refused", about one a second), and lockkit already reports
      the outage once, as the ``BackendUnavailable`` of the call that waited for it; the detail is one step
      away: ``lockkit -v``, or ``logging.getLogger("lockkit").setLevel(logging.DEBUG)``.
    * ERROR and above (kazoo's own failures, with their tracebacks) keep their level.
    * Below DEBUG (kazoo's BLATHER: raw request and session dumps) nothing is logged, and the digest
      credential is masked wherever it appears: kazoo logs every request it sends at DEBUG, its ``Auth``
      request (``user:password``) included.
    * A WARNING about a connect attempt ("Cannot resolve zk1: …") is also told to ``attempt``: kazoo
      reports a host name that does not resolve only in its log.
    """

    def __init__(self, credential: str | None, attempt: Attempt | None = None) -> None:
        super().__init__(logging.getLogger(KAZOO_LOGGER), {})
        self._secret = credential.partition(":")[2] if credential else None
        self._attempt = attempt

    def log(self, level: int, msg: object, *args: object, **kwargs: Any) -> None:
        if level == logging.WARNING and self._attempt is not None and str(msg).startswith("Cannot resolve"):
            self._attempt(f"cannot resolve {args[0]}" if args else "a host name does not resolve")
        if level < logging.DEBUG:
            return
        if level < logging.ERROR:
            level = logging.DEBUG
        if self.isEnabledFor(level):
            self.logger.log(level, f"kazoo: {msg}", *(self._scrub(arg) for arg in args), **kwargs)

    def warn(self, msg: object, *args: object, **kwargs: Any) -> None:
        self.log(logging.WARNING, msg, *args, **kwargs)  # kazoo still calls the deprecated name

    def _scrub(self, arg: object) -> object:
        if isinstance(arg, Auth):
            user = str(arg.auth).partition(":")[0]
            return f"Auth(auth_type={arg.auth_type}, scheme={arg.scheme!r}, auth='{user}:***')"
        if self._secret:
            text = str(arg)
            if self._secret in text:
                return text.replace(self._secret, "***")
        return arg


class CreateContainer(Create2):  # type: ignore[misc]  # kazoo is untyped
    """ZooKeeper's ``createContainer`` request: the body and reply of ``create2``, another opcode."""

    type = 19


def new_client(
    hosts: str,
    options: ZooKeeperOptions,
    credential: str | None,
    on_negotiated: Callable[[float], None],
    on_attempt: Attempt | None = None,
    on_deleted: Callable[[str], None] | None = None,
) -> KazooClient:
    kz = KazooClient(
        hosts=hosts,
        timeout=options.session_timeout,
        auth_data=[("digest", credential)] if credential else None,
        randomize_hosts=options.randomize_hosts,
        # reconnect fast (a lock's session is at stake), never give up; lockkit retries commands itself
        connection_retry={"max_tries": -1, "delay": 0.05, "backoff": 2, "max_jitter": 0.2, "max_delay": 1.0},
        command_retry={"max_tries": 0},
        logger=KazooLog(credential, on_attempt),
    )
    use_poll(kz)  # one poll per socket wait instead of an epoll set (see .poll): most of kazoo's thread's CPU
    if on_attempt is not None:
        _watch_connects(kz, on_attempt)
    connection: Any = getattr(kz, "_connection", None)
    original = getattr(connection, "_invoke", None)
    if connection is None or original is None:
        raise ConfigError(
            "this kazoo version hides its handshake; lockkit needs kazoo 2.10 or 2.11: pip install 'kazoo>=2.10,<2.12'"
        )

    def invoke(timeout: float, request: Any, xid: int | None = None) -> Any:
        result = original(timeout, request, xid)
        if isinstance(request, Connect) and result and getattr(result[0], "time_out", 0) > 0:
            on_negotiated(result[0].time_out / 1000.0)
        return result

    connection._invoke = invoke
    if on_deleted is not None:
        _tell_deletions(connection, on_deleted)
    return kz


def _tell_deletions(connection: Any, on_deleted: Callable[[str], None]) -> None:
    """Call ``on_deleted(path)`` on kazoo's connection thread for each node-deleted event, as it is read.

    kazoo hands every watch event to its callback thread, which then waits for the GIL, and a request made
    there waits for the connection thread to wake up again before it is written: two thread hand-offs,
    150-700 µs on a busy machine, between the server's event and the request it calls for. Told here, the
    request is queued before the connection thread looks for more work, so it goes out next, with no hand-off
    at all. ``on_deleted`` runs on the thread that keeps the connection alive: it must not block, and it must
    not raise (anything it raises is logged and dropped here, and kazoo's own dispatch follows as before).
    """
    original = getattr(connection, "_read_watch_event", None)
    if original is None:  # another kazoo: the watch callback sends the list, a hand-off later
        return

    def read_watch_event(buffer: Any, offset: int) -> Any:
        try:
            watch, _ = Watch.deserialize(buffer, offset)
            if watch.type == DELETED_EVENT:
                on_deleted(watch.path)
        except Exception:  # never break kazoo's connection loop: the callbacks below still run
            logging.getLogger("lockkit").debug("lockkit: a ZooKeeper deletion hook failed", exc_info=True)
        return original(buffer, offset)

    connection._read_watch_event = read_watch_event


def _watch_connects(kz: KazooClient, on_attempt: Attempt) -> None:
    """Tell ``on_attempt`` what each TCP connect kazoo makes meets: kazoo only logs a refused one, then retries.

    kazoo opens every connection through its handler's ``create_connection`` (one handler per client), so
    wrapping it there sees the socket error itself rather than a log line.
    """
    handler: Any = kz.handler
    original = handler.create_connection

    def create_connection(*args: Any, **kwargs: Any) -> Any:
        try:
            sock = original(*args, **kwargs)
        except OSError as exc:
            if isinstance(exc, ConnectionRefusedError):
                on_attempt("connection refused")
            elif exc.errno in NOTHING_THERE:
                on_attempt((exc.strerror or str(exc)).lower())
            else:
                on_attempt(None)  # a timeout, say: a server may be there, only slow or cut off
            raise
        on_attempt(None)
        return sock

    handler.create_connection = create_connection


class Multi:
    """ZooKeeper's ``multi`` (opcode 14): operations applied atomically, as one transaction with one zxid.

    Unlike kazoo's ``Transaction``, its reply reader knows every create result: ``create2`` and
    ``createContainer`` answer with a path and a stat (ZooKeeper 3.8 answers a ``create2`` inside a multi with
    a bare path, typed ``create``). A failed multi is no error reply: each operation's result is an exception
    (the failing one's own, ``RolledBackError`` or ``RuntimeInconsistency`` for the others), as in kazoo.
    """

    type = 14

    def __init__(self, operations: list[tuple[int, Any]]) -> None:
        self.operations = operations

    def serialize(self) -> bytearray:
        out = bytearray()
        for opcode, request in self.operations:
            out.extend(MultiHeader(opcode, False, -1).serialize() + request.serialize())
        out.extend(multiheader_struct.pack(-1, True, -1))
        return out

    @classmethod
    def deserialize(cls, data: bytes, offset: int) -> list[Any]:
        # kazoo hands what this raises to the caller's result unchanged: it must be a lockkit error, or a
        # malformed reply reached acquire() as a bare ValueError, RuntimeError or struct.error.
        try:
            return cls._read(data, offset)
        except (struct.error, UnicodeDecodeError) as exc:
            raise _unreadable(f"it ends early or is garbled ({exc})") from exc

    @classmethod
    def _read(cls, data: bytes, offset: int) -> list[Any]:
        results: list[Any] = []
        header, offset = MultiHeader.deserialize(data, offset)
        while not header.done:
            if header.type in (CREATE2, CREATE_CONTAINER):
                path, offset = read_string(data, offset)
                results.append((path, ZnodeStat._make(stat_struct.unpack_from(data, offset))))
                offset += stat_struct.size
            elif header.type == CREATE:
                path, offset = read_string(data, offset)
                results.append((path, None))
            elif header.type == SET_DATA:
                results.append(ZnodeStat._make(stat_struct.unpack_from(data, offset)))
                offset += stat_struct.size
            elif header.type in (CHECK, DELETE):
                results.append(True)  # no body
            elif header.type == MULTI_ERROR:
                code = int_struct.unpack_from(data, offset)[0]
                offset += int_struct.size
                if code not in EXCEPTIONS:  # kazoo's table answers an unknown code with a bare RuntimeError
                    raise _unreadable(f"it holds error code {code}, which no ZooKeeper version defines")
                results.append(EXCEPTIONS[code]())
            else:  # lockkit sends creates, deletes, sets and checks only: the framing is not what we think
                raise _unreadable(f"it holds a result of type {header.type}, which lockkit never asks for")
            header, offset = MultiHeader.deserialize(data, offset)
        return results


def _unreadable(why: str) -> BackendUnavailable:
    return BackendUnavailable(
        f"ZooKeeper's reply to a multi request could not be read: {why}. Something between lockkit and the "
        "ensemble may rewrite the traffic, or the server speaks another protocol: check the server's version "
        "(echo srvr | nc HOST PORT) and any proxy in the path, then retry"
    )


def found_async(kz: KazooClient, parent: str, stem: str, data: bytes, acl: Any) -> Any:
    """Create ``parent`` (a container) and our first contender ``parent/stem<seq>`` under it in one ``multi``.

    Either both are created or neither: a parent that exists already fails the whole multi with
    ``NodeExistsError`` and creates nothing. When it succeeds, this call made the parent, so our node is its
    only child, which holds the lock: no ``getChildren`` is needed. :func:`founded` reads the reply.
    """
    result = kz.handler.async_result()
    operations = [
        (CREATE_CONTAINER, Create2(parent, b"", acl, CONTAINER_FLAG)),
        (CREATE2, Create2(f"{parent}/{stem}", data, acl, EPHEMERAL_SEQUENTIAL_FLAG)),
    ]
    kz._call(Multi(operations), result)
    return result


def founded(results: list[Any]) -> tuple[str, int]:
    """The name and czxid of the contender :func:`found_async` made; raises the multi's failure.

    A multi is one transaction with one zxid, so our node's czxid is the parent's (the one create result
    that carries a stat on ZooKeeper 3.8).
    """
    failures = [r for r in results if isinstance(r, Exception)]
    if failures:
        real = [r for r in failures if not isinstance(r, (RolledBackError, RuntimeInconsistency))]
        raise (real or failures)[0]
    if len(results) != 2 or not all(isinstance(r, tuple) and len(r) == 2 for r in results):
        raise _unreadable(f"it holds {len(results)} result(s) of other shapes for the 2 creates sent")
    (_parent, parent_stat), (path, child_stat) = results
    stat = child_stat if child_stat is not None else parent_stat
    return str(path).rpartition("/")[2], int(stat.czxid)


def create_parent_async(kz: KazooClient, parent: str, acl: Any, container: bool) -> Any:
    if not container:
        return kz.create_async(parent, b"", acl)
    result = kz.handler.async_result()
    kz._call(CreateContainer(parent, b"", acl, CONTAINER_FLAG), result)
    return result


def barrier(kz: KazooClient, timeout: float) -> None:
    """Wait until kazoo has run every watch callback for the events it has received so far.

    kazoo reads watch events and replies on one thread, in the server's order,
    but runs watch callbacks on another: after a reply, a marker queued behind
    them proves that no earlier deletion of one of our nodes is still unseen.
    """
    done = threading.Event()
    kz.handler.dispatch_callback(Callback("watch", done.set, ()))
    if not done.wait(timeout):
        raise Transient("kazoo's event thread did not answer")
