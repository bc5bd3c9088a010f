"""Presence records of the etcd driver (``migrate`` fleet safety): one key per member, on its own lease.

Key layout, beside the lock keys but never inside a lock's range::

    <prefix>.presence/<encode_name(group)>/<encode_name(member)>   = value

``encode_name`` never produces a ``.``, so no lock name's range (``<prefix><encoded
name>/…``) can contain a presence key, and groups ``a`` and ``a/b`` never share a
range (``/`` is encoded).

* **announce** with a ttl puts the key under an etcd lease of ``ceil(ttl)``
  seconds owned by that one record: the first announce grants it, each later
  one keeps it alive (so the record lives a TTL after its last announce,
  counted by the server) and puts the value again, which also re-creates a key
  withdrawn meanwhile. If the lease is gone (expired while we were paused,
  revoked) or the ttl changed, a new lease is granted and the old one revoked.
  A record per lease, not a shared one: announcing one record must not extend
  another. The TTL is etcd's granted one (whole seconds, at least its minimum,
  about 2 s), and a record may outlive it by up to 500 ms (the lessor's expiry
  tick) or an election timeout after a leader change: longer, never shorter,
  which errs on the safe side for a fleet guard.
* **announce** with ``ttl=None`` puts the key with no lease: it stays until
  withdrawn.
* **withdraw** deletes the key (whoever wrote it) and revokes our lease for it.
* **members** is one linearizable range read of the group, so a client that
  announced and then reads sees every record announced before its own.

Closing the driver does not withdraw records: they expire with their leases.
"""

from __future__ import annotations

import logging
import math
import threading

from ...errors import BackendUnavailable, ConfigError
from ...names import decode_name, encode_name
from .client import EtcdClient, grpc, rpc
from .keys import prefix_end

__all__ = ["PRESENCE_SPACE", "PresenceRecords"]

log = logging.getLogger("lockkit")

PRESENCE_SPACE = ".presence/"
REVOKE_TIMEOUT = 1.0


class PresenceRecords:
    """announce / withdraw / members over one etcd client, for :class:`~lockkit.driver.Presence`."""

    def __init__(self, client: EtcdClient, prefix: str) -> None:
        self._client = client
        self._root = prefix + PRESENCE_SPACE
        self._mutex = threading.Lock()
        self._leases: dict[tuple[str, str], tuple[int, int]] = {}
        """(group, member) -> (lease id, requested whole-second TTL) of the records this client announced."""

    def group_range(self, group: str) -> tuple[bytes, bytes]:
        if not group:
            raise ConfigError("a presence group must not be empty; pass a group name such as 'orders'")
        start = (self._root + encode_name(group) + "/").encode("utf-8")
        return start, prefix_end(start)

    def key(self, group: str, member: str) -> bytes:
        if not member:
            raise ConfigError("a presence member must not be empty; pass a member id such as 'host-1:4242'")
        return self.group_range(group)[0] + encode_name(member).encode("utf-8")

    def announce(self, group: str, member: str, value: str, ttl: float | None) -> None:
        key = self.key(group, member)
        if ttl is not None and not ttl > 0:
            raise ConfigError(f"a presence ttl must be positive or None, got {ttl!r}; pass seconds, e.g. 30")
        with self._mutex:
            old = self._leases.get((group, member))
            requested = 0 if ttl is None else max(1, math.ceil(ttl))
            lease = 0
            if requested:
                if old is not None and old[1] == requested and self._keepalive(old[0]):
                    lease = old[0]
                else:
                    lease = int(self._client.grant(requested).ID)
                    self._leases[(group, member)] = (lease, requested)  # reused next time even if the put fails
            if not self._put(key, value, lease):  # the lease vanished between keepalive and put
                lease = int(self._client.grant(requested).ID)
                self._leases[(group, member)] = (lease, requested)
                if not self._put(key, value, lease):
                    raise BackendUnavailable(
                        f"etcd at {self._client.shown}: presence lease vanished at once; retry, and check "
                        "that nothing revokes leases there"
                    )
            if not requested:
                self._leases.pop((group, member), None)
            if old is not None and old[0] != lease:
                self._revoke(old[0])  # it holds no key any more: the put moved ours to the new lease

    def withdraw(self, group: str, member: str) -> None:
        key = self.key(group, member)
        self._client.guarded(
            "presence withdraw", lambda: self._client.call("KV", "DeleteRange", rpc.DeleteRangeRequest(key=key))
        )
        with self._mutex:
            old = self._leases.pop((group, member), None)
        if old is not None:
            self._revoke(old[0])

    def members(self, group: str) -> dict[str, str]:
        start, end = self.group_range(group)
        reply = self._client.range(rpc.RangeRequest(key=start, range_end=end), "presence read")
        return {
            decode_name(kv.key[len(start) :].decode("utf-8")): kv.value.decode("utf-8", "replace") for kv in reply.kvs
        }

    # -- plumbing ----------------------------------------------------------------------------------

    def _keepalive(self, lease: int) -> bool:
        return self._client.keepalive(lease) > 0

    def _put(self, key: bytes, value: str, lease: int) -> bool:
        """Put the record; ``False`` if etcd says the lease is gone."""
        request = rpc.PutRequest(key=key, value=value.encode("utf-8"), lease=lease)
        try:
            self._client.call("KV", "Put", request)
        except grpc.RpcError as exc:
            if lease and exc.code() == grpc.StatusCode.NOT_FOUND:
                return False
            raise self._client.translate(exc, "presence announce") from exc
        return True

    def _revoke(self, lease: int) -> None:
        try:
            self._client.revoke(lease, timeout=min(self._client.timeout, REVOKE_TIMEOUT))
        except BackendUnavailable as exc:  # it then expires on its own
            log.debug("lockkit: could not revoke etcd presence lease %x: %s", lease, exc)
