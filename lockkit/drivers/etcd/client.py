"""The etcd v3 gRPC connection under the etcd driver: import guard, endpoints, auth, TLS, errors.

Client choice: the generated etcd v3 gRPC stubs and messages of PyPI
``etcd-sdk-python`` (import ``pyetcd``, a maintained fork of python-etcd3 whose
generated code loads with protobuf 5.27 and later, 7 included), called through
``grpcio`` directly. python-etcd3 (PyPI ``etcd3`` 0.12) cannot be imported with
protobuf >= 4, and pinning an old protobuf would break applications; the
fork's high-level client is bypassed because it never refreshes an expired
auth token, parks a failed endpoint for five minutes, and its ``Lock`` is not
safe to build on. What is used of it is only ``pyetcd.etcdrpc``.

The import guard turns any failure to load grpc or the generated code (a
protobuf too old for it raises ``VersionError``, python-etcd3-era code raises
``TypeError: Descriptors cannot be created directly``) into a
:class:`~lockkit.errors.ConfigError` naming the fix.

Errors: a refused login (wrong password, auth on and no user in the URL, credentials for a server without
auth) is a ``ConfigError`` naming the user; every other failed RPC becomes a ``BackendUnavailable`` in words
(:meth:`EtcdClient.translate`), never gRPC's raw ``UNAVAILABLE: failed to connect to all addresses``.
"""

from __future__ import annotations

import contextlib
import importlib
import re
import shlex
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from ...errors import BackendUnavailable, ConfigError

__all__ = ["INSTALL_HINT", "EtcdClient", "cmp_created", "delete_op", "grpc", "load_client", "range_op", "rpc"]

T = TypeVar("T")

INSTALL_HINT = (
    "pip install -U 'lockkit[etcd]' (it needs etcd-sdk-python>=0.0.7, grpcio and protobuf>=5.27.2; "
    "python-etcd3 / the 'etcd3' package is not used and may stay installed)"
)


def load_client() -> tuple[Any, Any]:
    """Import grpc and the generated etcd stubs, or raise a ConfigError that says how to fix it."""
    try:
        grpc_module = importlib.import_module("grpc")
        rpc_module = importlib.import_module("pyetcd.etcdrpc")
    except Exception as exc:  # generated protobuf code fails with TypeError, VersionError, ImportError…
        raise ConfigError(
            f"the etcd:// driver cannot load its gRPC client ({type(exc).__name__}: {exc}); {INSTALL_HINT}"
        ) from exc
    return grpc_module, rpc_module


grpc, rpc = load_client()

# Keepalive pings find a dead connection under a long watch; etcd refuses pings more often than every 5 s.
_CHANNEL_OPTIONS = [
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
]
_RETRY_CODES = ("UNAVAILABLE",)
_AUTH_RETRY = ("invalid auth token", "auth token is not provided", "user name is empty")
_NO_USER = "user name is empty"
"""etcd's answer (INVALID_ARGUMENT) to a request without a token when auth is on: the URL has no user."""
_AUTH_DISABLED = "authentication is not enabled"
"""etcd's answer (FAILED_PRECONDITION) to a login when auth is off."""
MIN_ACQUIRE_BOUND = 1.0
"""Seconds an acquire gives a silent cluster at least, however short its timeout (``try_acquire`` too): the
budget it passes to :meth:`EtcdClient.within` is max(what is left of its deadline, this)."""
MIN_REQUEST_SECONDS = 0.25
"""The least a request waits inside a :meth:`EtcdClient.within` budget, however little of it is left: a healthy
cluster answers in milliseconds, and the clean-up of an acquire that timed out (its dequeue) comes just after
its deadline."""
_CODE_PREFIX = re.compile(r"^(?:[A-Z_]+: )+")
_ADDRESS_PREFIX = re.compile(r"^(?:ipv4|ipv6|unix|dns):\S+?: ")


# -- request builders ------------------------------------------------------------------------------


def cmp_created(key: bytes, revision: int) -> Any:
    return rpc.Compare(result=rpc.Compare.EQUAL, target=rpc.Compare.CREATE, key=key, create_revision=revision)


def range_op(key: bytes, end: bytes = b"", *, newest_first: bool = False, limit: int = 0, below: int = 0) -> Any:
    """A range read sorted by create_revision (``below``: max_create_revision, 0 = none)."""
    order = rpc.RangeRequest.DESCEND if newest_first else rpc.RangeRequest.ASCEND
    request = rpc.RangeRequest(
        key=key,
        range_end=end,
        limit=limit,
        sort_order=order,
        sort_target=rpc.RangeRequest.CREATE,
        max_create_revision=below,
    )
    return rpc.RequestOp(request_range=request)


def delete_op(key: bytes) -> Any:
    return rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(key=key))


class _RawKV:
    """``KV.Txn`` for a ``TxnRequest`` already serialised (:mod:`.wire`): grpc sends the bytes as they are."""

    def __init__(self, channel: Any) -> None:
        self.Txn = channel.unary_unary(
            "/etcdserverpb.KV/Txn", request_serializer=None, response_deserializer=rpc.TxnResponse.FromString
        )


class EtcdClient:
    """Channels to the members, one auth token, per-call timeouts and error translation."""

    def __init__(
        self,
        endpoints: list[tuple[str, int]],
        *,
        credentials: Any = None,
        user: str | None = None,
        password: str | None = None,
        timeout: float = 5.0,
        shown: str = "etcd",
        prefix: str = "/lockkit/",
    ) -> None:
        self.timeout = timeout
        self.shown = shown  # the URL with its password masked, for messages
        self.prefix = prefix  # lockkit's key prefix, for the permission hint
        self._targets = [f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in endpoints]
        self._credentials = credentials
        self._user, self._password = user, password
        self._mutex = threading.Lock()
        self._channels: dict[int, Any] = {}
        self._stubs: dict[tuple[int, str], Any] = {}
        self._current = 0
        self._token: str | None = None
        self._closed = False
        self._budget = threading.local()
        """``until`` (``time.monotonic()``): this thread's requests end by then (:meth:`within`)."""

    # -- plumbing --------------------------------------------------------------------------

    def _channel(self, index: int) -> Any:
        with self._mutex:
            if self._closed:
                raise BackendUnavailable(
                    f"the etcd client for {self.shown} is closed; open a new locker with lockkit.connect()"
                )
            channel = self._channels.get(index)
            if channel is None:
                target = self._targets[index]
                if self._credentials is not None:
                    channel = grpc.secure_channel(target, self._credentials, options=_CHANNEL_OPTIONS)
                else:
                    channel = grpc.insecure_channel(target, options=_CHANNEL_OPTIONS)
                self._channels[index] = channel
            return channel

    def stub(self, index: int, service: str) -> Any:
        """The cached ``<service>Stub`` over member ``index``'s channel (``RawKV``: :class:`_RawKV`)."""
        found = self._stubs.get((index, service))
        if found is None:
            make = _RawKV if service == "RawKV" else getattr(rpc, service + "Stub")
            found = self._stubs[(index, service)] = make(self._channel(index))
        return found

    def metadata(self, index: int | None = None) -> tuple[tuple[str, str], ...] | None:
        if self._user is None:
            return None
        with self._mutex:
            token = self._token
        if token is None:
            token = self._authenticate(self._current if index is None else index)
        return (("token", token),)

    def _authenticate(self, index: int) -> str:
        stub = self.stub(index, "Auth")
        request = rpc.AuthenticateRequest(name=self._user, password=self._password)
        try:
            token = str(stub.Authenticate(request, timeout=self.seconds()).token)
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.INVALID_ARGUMENT:
                raise ConfigError(
                    f"etcd at {self.shown} rejected user {self._user!r}: wrong user name or password "
                    "(fix the credentials in the URL)"
                ) from None
            if exc.code() == grpc.StatusCode.FAILED_PRECONDITION and _AUTH_DISABLED in (exc.details() or ""):
                raise ConfigError(
                    f"etcd at {self.shown} refused the login of user {self._user!r}: {_AUTH_DISABLED} on that "
                    "server. Remove user:password@ from the URL, or enable authentication there (etcdctl auth "
                    "enable)"
                ) from None
            raise  # the caller fails over (UNAVAILABLE) or translates it
        with self._mutex:
            self._token = token
        return token

    def translate(self, exc: Any, what: str) -> BackendUnavailable:
        """The lockkit error for a failed RPC: what happened in words, and what to do; no raw gRPC status."""
        code = exc.code()
        detail = exc.details() or ""
        name = getattr(code, "name", str(code))
        if code == grpc.StatusCode.PERMISSION_DENIED:
            user = "the user" if self._user is None else f"user {self._user!r}"
            prefix = shlex.quote(self.prefix)
            return BackendUnavailable(
                f"etcd at {self.shown} denied {user} {what} ({detail}): lockkit needs readwrite on its key prefix "
                f"{self.prefix!r}. Grant it to a role of {user}: etcdctl role grant-permission --prefix=true "
                f"<role> readwrite {prefix}, then etcdctl user grant-role {self._user or '<user>'} <role>"
            )
        if code == grpc.StatusCode.UNAVAILABLE and not detail.startswith("etcdserver:"):
            return self.unreachable(detail)  # the connection, not etcd, failed: refused, reset, DNS, TLS
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return BackendUnavailable(
                f"etcd at {self.shown} did not answer {what} in time (the timeout URL option, {self.timeout:g} s "
                "by default per request): is the cluster overloaded, or a majority of its members down?"
            )
        return BackendUnavailable(
            f"etcd at {self.shown}: {what} failed ({detail or name}; gRPC status {name}); retry, and if it "
            "persists check the cluster's health (etcdctl endpoint health) and its log"
        )

    def unreachable(self, detail: str) -> BackendUnavailable:
        """The error for an endpoint that could not be connected to, with gRPC's reason made readable."""
        reason = detail.rpartition("last error: ")[2] if "last error: " in detail else detail
        reason = _ADDRESS_PREFIX.sub("", _CODE_PREFIX.sub("", reason.strip())) or "no connection"
        if "connection refused" in reason.lower():
            reason = "connection refused"
        elif "handshake" in reason.lower():
            reason += " (check the ca, cert and key options of the etcds:// URL)"
        where = ", ".join(self._targets)
        return BackendUnavailable(
            f"could not connect to etcd at {where}: {reason}. Is an etcd server running at {where}, and is the "
            f"URL right ({self.shown})?"
        )

    def failover(self, service: str, invoke: Callable[[Any, Any], T]) -> T:
        """``invoke(stub, metadata)`` on the current member; on UNAVAILABLE try the next (each once).

        The member that answered becomes the current one for every later call. A stale auth token is
        renewed once. Raises the last ``grpc.RpcError``.
        """
        attempts = len(self._targets)
        reauthed = False
        index = self._current
        while True:
            try:
                return invoke(self.stub(index, service), self.metadata(index))
            except grpc.RpcError as exc:
                code, detail = exc.code(), (exc.details() or "")
                if self._user is None and code == grpc.StatusCode.INVALID_ARGUMENT and _NO_USER in detail:
                    raise ConfigError(
                        f"etcd at {self.shown} requires a login (authentication is enabled there) and the URL "
                        f"gives no user: put user:password@ in the URL ({self._scheme()}://USER:PASSWORD@"
                        f"{','.join(self._targets)})"
                    ) from None
                if self._user is not None and not reauthed and any(s in detail for s in _AUTH_RETRY):
                    reauthed = True
                    self._authenticate(index)
                    continue
                attempts -= 1
                if getattr(code, "name", "") not in _RETRY_CODES or attempts == 0:
                    raise
                index = (index + 1) % len(self._targets)
                with self._mutex:
                    self._current = index

    @contextlib.contextmanager
    def within(self, seconds: float | None) -> Iterator[None]:
        """This thread's requests in the block share one budget of ``seconds`` (``None``: no budget): each waits
        at most the timeout option and what is left of the budget (at least :data:`MIN_REQUEST_SECONDS`), so
        that an operation of several requests against an unresponsive cluster fails by about its deadline
        rather than after one timeout per request. Other threads (keepalives, watches) are not affected."""
        previous = getattr(self._budget, "until", None)
        self._budget.until = None if seconds is None else time.monotonic() + seconds
        try:
            yield
        finally:
            self._budget.until = previous

    def seconds(self, timeout: float | None = None) -> float:
        """How long the next request of this thread may wait: ``timeout`` (default: the timeout option), cut to
        what is left of a :meth:`within` budget."""
        seconds = timeout or self.timeout
        until = getattr(self._budget, "until", None)
        if until is not None:
            seconds = min(seconds, max(MIN_REQUEST_SECONDS, until - time.monotonic()))
        return seconds

    def _scheme(self) -> str:
        return "etcd" if self._credentials is None else "etcds"

    def call(self, service: str, method: str, request: Any, timeout: float | None = None) -> Any:
        """One unary RPC, failing over to the next member on UNAVAILABLE (each try within :meth:`seconds`)."""
        return self.failover(
            service,
            lambda stub, metadata: getattr(stub, method)(request, timeout=self.seconds(timeout), metadata=metadata),
        )

    def guarded(self, what: str, fn: Callable[[], T]) -> T:
        """Run ``fn``; translate a gRPC failure into BackendUnavailable."""
        try:
            return fn()
        except grpc.RpcError as exc:
            raise self.translate(exc, what) from exc

    # -- the RPCs the driver uses ---------------------------------------------------------------

    def txn(self, request: Any, what: str = "transaction") -> Any:
        return self.guarded(what, lambda: self.call("KV", "Txn", request))

    def txn_bytes(self, request: bytes, what: str = "transaction") -> Any:
        """:meth:`txn` of a request already encoded by :mod:`.wire`."""
        return self.guarded(what, lambda: self.call("RawKV", "Txn", request))

    def range(self, request: Any, what: str = "read") -> Any:
        return self.guarded(what, lambda: self.call("KV", "Range", request))

    def grant(self, ttl: int) -> Any:
        return self.guarded("lease grant", lambda: self.call("Lease", "LeaseGrant", rpc.LeaseGrantRequest(TTL=ttl)))

    def revoke(self, lease_id: int, timeout: float | None = None) -> None:
        request = rpc.LeaseRevokeRequest(ID=lease_id)
        try:
            self.call("Lease", "LeaseRevoke", request, timeout)
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.NOT_FOUND:
                raise self.translate(exc, "lease revoke") from exc

    def time_to_live(self, lease_id: int) -> int:
        request = rpc.LeaseTimeToLiveRequest(ID=lease_id)
        return int(self.guarded("lease lookup", lambda: self.call("Lease", "LeaseTimeToLive", request)).TTL)

    def lease_keys(self, lease_id: int) -> set[bytes] | None:
        """The keys attached to a lease now, in one read; ``None`` if the lease is gone."""
        request = rpc.LeaseTimeToLiveRequest(ID=lease_id, keys=True)
        reply = self.guarded("lease keys read", lambda: self.call("Lease", "LeaseTimeToLive", request))
        return None if int(reply.TTL) <= 0 else set(reply.keys)

    def keepalive(self, lease_id: int, timeout: float | None = None) -> int:
        """One keepalive round trip (on the next member if this one is unavailable); the TTL after it.

        A TTL <= 0 means the lease is gone.
        """
        request = rpc.LeaseKeepAliveRequest(ID=lease_id)

        def once(stub: Any, metadata: Any) -> int:
            call = stub.LeaseKeepAlive(iter([request]), timeout=self.seconds(timeout), metadata=metadata)
            try:
                for response in call:
                    return int(response.TTL)
                return 0
            finally:
                call.cancel()

        return self.guarded("lease keepalive", lambda: self.failover("Lease", once))

    def watch_stream(self, requests: Iterator[Any]) -> Any:
        """Open a Watch stream on the current member (no deadline: it lives until cancelled or broken).

        A broken stream wakes every waiter, whose re-check fails over; the next stream opens on the member
        that answered.
        """
        index = self._current
        return self.guarded("watch", lambda: self.stub(index, "Watch").Watch(requests, metadata=self.metadata(index)))

    def close(self) -> None:
        with self._mutex:
            self._closed = True
            channels, self._channels = list(self._channels.values()), {}
            self._stubs.clear()
        for channel in channels:
            channel.close()
