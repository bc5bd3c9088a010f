"""Wake-ups on a Redis Cluster: :class:`ClusterHub`, one sharded :class:`~.hub.Hub` per master, behind one face.

A waiter's channels (its lock's ``…:wake`` and its client's ``<prefix>{E}:client:<id>``) carry the lock's hash
tag, so both live on the master of the lock's slot, which a release's script ``SPUBLISH``\\es on. Each channel is
placed on the hub of the master the slot map names when its first waiter comes, and stays there until that hub
hands it back: the slot moved (a ``MOVED`` reply to ``SSUBSCRIBE``, or the ``sunsubscribe`` a node sends when a
slot it served is given to another), or the connection failed (a master killed; its replica takes over). Then
the channel is placed again, where ``MOVED`` said or where the map names by then, a little later (the map is
refreshed by the driver's own calls), and once the new subscription is confirmed its waiters are woken to look
again: a release may have come while nobody listened.

The hub runs on an event loop like :class:`~.hub.Hub` (the caller's, or a blocking driver's loop thread); it
reads the driver's slot map but never asks the cluster itself.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable

from .cluster_config import key_slot
from .config import NodeSpec
from .hub import Hub, Snapshot, Wake

__all__ = ["ClusterHub"]

REPLACE_AFTER = 0.1
"""Seconds before a handed-back channel is placed again: time for a failover or a refresh of the map. Doubled
(up to :data:`REPLACE_MAX`) while it keeps coming back within a second or two: a dead master, or an ACL that
refuses SSUBSCRIBE, is not retried in a tight loop."""
REPLACE_MAX = 1.0


class ClusterHub(Hub):
    def __init__(self, seed: NodeSpec, route: Callable[[int], NodeSpec | None]) -> None:
        """``route(slot)``: the spec of the master the driver's slot map names for a slot (None: not known)."""
        self._route = route
        super().__init__(seed)

    def _fresh(self) -> None:
        super()._fresh()
        self._hubs: dict[tuple[str | None, int | None], Hub] = {}
        self._index: dict[int, int] = {}
        self._placed: dict[bytes, Hub] = {}
        self._homeless: dict[bytes, set[Wake]] = {}
        self._told: dict[bytes, tuple[str, int]] = {}
        self._backoff: dict[bytes, tuple[float, float]] = {}
        """Per channel handed back: when it last was, and the delay it was given."""
        self._version = 0
        """Bumped whenever a channel is handed back: a snapshot across it is void."""

    def _hub_at(self, spec: NodeSpec) -> Hub:
        key = (spec.host, spec.port)
        hub = self._hubs.get(key)
        if hub is None:
            hub = self._hubs[key] = Hub(spec, self._lost)
            self._index[id(hub)] = len(self._index)
        return hub

    def _spec_for(self, channel: bytes) -> NodeSpec:
        told = self._told.pop(channel, None)
        if told is not None:
            return self._route_to(*told)
        return self._route(key_slot(channel)) or self._spec

    def _route_to(self, host: str, port: int) -> NodeSpec:
        import dataclasses

        label = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        return dataclasses.replace(self._spec, label=label, host=host, port=port)

    def _hub_for(self, channel: bytes, place: bool) -> Hub:
        placed = self._placed.get(channel)
        if placed is not None and placed.serves(channel):
            return placed
        hub = self._hub_at(self._spec_for(channel))
        if place:
            self._placed[channel] = hub
        return hub

    def _tag(self, hub: Hub) -> int:
        return (self._version << 40) | (self._index[id(hub)] << 32)

    def snapshot(self, channel: bytes) -> Snapshot:
        placed = self._placed.get(channel)
        if placed is None or not placed.serves(channel):
            return None  # not subscribed anywhere right now
        inner = placed.snapshot(channel)
        return None if inner is None else (self._tag(placed) | inner[0], inner[1])

    def _inner(self, hub: Hub, before: Snapshot) -> Snapshot:
        """``before`` as ``hub`` took it, or None (look again) if it was taken on another hub or before a hand-back."""
        if before is None or before[0] & ~0xFFFFFFFF != self._tag(hub):
            return None
        return before[0] & 0xFFFFFFFF, before[1]

    async def watch(self, channel: bytes, wake: Wake, before: Snapshot = None) -> bool:
        hub = self._hub_for(channel, place=True)
        return await hub.watch(channel, wake, self._inner(hub, before))

    def watch_soon(self, channel: bytes, wake: Wake, before: Snapshot) -> None:
        hub = self._hub_for(channel, place=True)
        hub.watch_soon(channel, wake, self._inner(hub, before))

    def unwatch(self, channel: bytes, wake: Wake) -> None:
        homeless = self._homeless.get(channel)
        if homeless is not None:
            homeless.discard(wake)
        placed = self._placed.get(channel)
        if placed is not None:
            placed.unwatch(channel, wake)

    def _lost(self, channel: bytes, waiters: set[Wake], where: tuple[str, int] | None) -> None:
        """A hub handed ``channel`` back: place its waiters again soon (see the module docstring)."""
        self._version += 1
        if self._placed.get(channel) is not None and not self._placed[channel].serves(channel):
            del self._placed[channel]
        if where is not None:
            self._told[channel] = where
        self._homeless.setdefault(channel, set()).update(waiters)
        loop = asyncio.get_running_loop()
        last, delay = self._backoff.get(channel, (-math.inf, 0.0))
        delay = min(REPLACE_MAX, delay * 2) if loop.time() - last < 2 * REPLACE_MAX + delay else REPLACE_AFTER
        if len(self._backoff) > 1024:  # forget channels long settled
            self._backoff = {c: v for c, v in self._backoff.items() if loop.time() - v[0] < 4 * REPLACE_MAX}
        self._backoff[channel] = (loop.time(), delay)
        loop.call_later(delay, self._place_again, channel)

    def _place_again(self, channel: bytes) -> None:
        waiters = self._homeless.pop(channel, set())
        if self._closed or not waiters:
            return
        hub = self._hub_for(channel, place=True)
        for wake in waiters:
            hub.watch_soon(channel, wake, None)  # wakes it once the new subscription is confirmed

    async def close(self) -> None:
        self._closed = True
        self._homeless.clear()
        for hub in list(self._hubs.values()):
            await hub.close()
