"""Asking the sentinels where the master of a service is: :class:`AsyncSentinels`.

This file is the source of the blocking ``SyncSentinels`` too (``scripts/unasync.py`` generates
``../_sync/sentinels.py``). Each question is a short-lived connection of lockkit's own (:mod:`.connection`) to
one sentinel: questions are rare (the first call, and after the master failed or moved), so no pool is kept.
The sentinels are tried in the URL's order, and the first that answers is moved to the front, so that a dead
sentinel costs a connect timeout once rather than on every question.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from redis.exceptions import AuthenticationError, NoPermissionError, RedisError, ResponseError

from ....errors import BackendUnavailable, ConfigError
from ..calls import pack
from ..config import NodeSpec
from ..errors import translate
from ..sentinel_config import Master, SentinelTarget, parse_master_reply, resolve_commands
from .connection import AsyncConnection

__all__ = ["AsyncSentinels"]


class AsyncSentinels:
    def __init__(self, target: SentinelTarget) -> None:
        self.target = target
        self._order = list(target.sentinels)

    @property
    def first(self) -> NodeSpec:
        """The sentinel asked first: the one that answered last."""
        return self._order[0]

    async def locate(self) -> Master:
        """The master the first answering sentinel names.

        :class:`ConfigError` if every sentinel that answered does not know the service (or refused the login);
        :class:`BackendUnavailable` listing the sentinels tried if none answered."""
        commands = resolve_commands(self.target.service)
        unknown: list[str] = []
        failures: list[str] = []
        for spec in list(self._order):
            conn = AsyncConnection(spec)
            try:
                await conn.connect()
                await conn.send(pack(commands))
                replies = await conn.read(len(commands), time.monotonic() + spec.options.timeout)
            except AuthenticationError as exc:
                raise ConfigError(
                    f"sentinel {spec.label} refused the login of user {spec.username or 'default'!r} ({exc}); "
                    "set the options sentinel_username and sentinel_password (the URL's user and password are "
                    "the master's)"
                ) from exc
            except RedisError as exc:
                failures.append(str(translate(spec, exc)))
                continue
            finally:
                await conn.close()
            if isinstance(replies[0], ResponseError) and "unknown command" in str(replies[0]):
                raise ConfigError(
                    f"{spec.label} is not a sentinel (it does not know SENTINEL): a redis+sentinel:// URL names the "
                    "sentinels; for one Redis server use redis://, for a node of a Redis Cluster redis+cluster://"
                )
            if isinstance(replies[0], NoPermissionError):
                # Not "no such service": that would send the user to check a name that is right
                raise ConfigError(
                    f"sentinel {spec.label} refused user {spec.username or 'default'!r} the command SENTINEL "
                    "GET-MASTER-ADDR-BY-NAME, which lockkit needs to find the master: give that sentinel user "
                    "+sentinel|get-master-addr-by-name (ACL SETUSER <user> +sentinel|get-master-addr-by-name, with "
                    "the rest of docs/backends/redis.md's ACL rule for sentinels)"
                ) from replies[0]
            master = parse_master_reply(replies, f"sentinel {spec.label}")
            if master is None:
                unknown.append(spec.label)
                continue
            self._order.remove(spec)
            self._order.insert(0, spec)
            return master
        if unknown:
            raise ConfigError(
                f"sentinel{'s' if len(unknown) > 1 else ''} {', '.join(unknown)} know{'' if len(unknown) > 1 else 's'} "
                f"no master named {self.target.service!r}: check the service name in the URL's path "
                "(SENTINEL MASTERS lists them)"
            )
        raise BackendUnavailable(
            f"no sentinel answered for {self.target.service!r} (tried {self.target.tried}): "
            + "; ".join(failures)
            + ". Check that the sentinels are up and reachable from this host, and that the URL lists them"
        )

    async def refused(self, spec: NodeSpec, channels: Sequence[bytes]) -> list[bytes]:
        """The channels of ``channels`` that sentinel ``spec`` refuses this user to subscribe to (an ACL's
        ``NOPERM``), asked on a connection of its own, one ``SUBSCRIBE`` each: one SUBSCRIBE of several channels is
        refused whole, so a hub subscribing them together would hear none. Unreachable, or any other trouble:
        none refused (the hub then finds out, and warns, itself)."""
        conn = AsyncConnection(spec)
        try:
            await conn.connect()
            await conn.send(pack([("SUBSCRIBE", channel) for channel in channels]))
            replies = await conn.read(len(channels), time.monotonic() + spec.options.timeout)
        except RedisError:
            return []
        finally:
            await conn.close()
        return [c for c, reply in zip(channels, replies, strict=True) if isinstance(reply, ResponseError)]
