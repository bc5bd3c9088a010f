"""Semaphores and reader-writer locks on one Redis server: the key layout and the Lua scripts (no I/O).

**Keys** of permit name ``N`` (``E`` = ``N`` percent-escaped as for locks, so all of them share the Redis
Cluster hash tag ``{E}``), under the driver's prefix ``P`` (default ``lockkit:``)::

    P sem{E}:holders   ZSET   member = holder's token, score = its expiry (server ms, from TIME)
    P sem{E}:writers   ZSET   member = waiting writer's token, score = its arrival number (oldest first)
    P sem{E}:wexp      HASH   waiting writer's token -> when its place lapses (server ms)
    P sem{E}:meta      HASH   limit (0: a reader-writer lock), fence (the last fencing token), writer (the
                              token of the writer holding, if one does), seq (the writers' arrival counter)
    P sem{E}:wake      pub/sub channel: an empty message after every release and every writer leaving

Expired holders and lapsed writers are pruned by every script before it decides, on the server's clock
(``TIME``), so a dead holder's permit lapses at its ttl with nobody's help. ``meta`` carries no expiry: the
fencing counter lives as long as the server keeps its data, as a lock's does. The rules are those of every
backend (docs/semaphores.md): a permit while fewer than ``limit`` are held; a read while no writer holds or
waits; a write when nobody holds and it is the oldest waiting writer. Every grant is ``HINCRBY fence``.

Names travel only as ``KEYS`` and tokens, TTLs and modes only as ``ARGV``, as in :mod:`.scripts`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from ...driver import Offer
from .keys import _ESCAPES
from .scripts import Script

__all__ = [
    "REDLOCK_PERMITS",
    "SEM_ACQUIRE",
    "SEM_CLEAR",
    "SEM_INFO",
    "SEM_LEAVE",
    "SEM_RELEASE",
    "SEM_RENEW",
    "SENTINEL_PERMITS",
    "PermitKeys",
    "permit_keys",
]


@dataclass(frozen=True)
class PermitKeys:
    holders: bytes
    writers: bytes
    wexp: bytes
    meta: bytes
    channel: bytes

    def script_keys(self) -> tuple[bytes, ...]:
        """The ``KEYS`` every permit script takes, in this order."""
        return (self.holders, self.writers, self.wexp, self.meta)


@functools.lru_cache(maxsize=1 << 14)
def permit_keys(prefix: str, name: str) -> PermitKeys:
    base = f"{prefix}sem{{{name.translate(_ESCAPES)}}}".encode()
    return PermitKeys(base + b":holders", base + b":writers", base + b":wexp", base + b":meta", base + b":wake")


# Shared head of every script: the server's now in ms, expired holders and lapsed writers dropped, a writer
# field that names no live holder cleared.
_PRUNE = """
local t = redis.call('time')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('zremrangebyscore', KEYS[1], '-inf', now)
local wexp = redis.call('hgetall', KEYS[3])
local next_lapse = false
for i = 1, #wexp, 2 do
  local at = tonumber(wexp[i + 1])
  if at <= now then
    redis.call('hdel', KEYS[3], wexp[i])
    redis.call('zrem', KEYS[2], wexp[i])
  elseif not next_lapse or at < next_lapse then
    next_lapse = at
  end
end
local writer = redis.call('hget', KEYS[4], 'writer')
if writer and not redis.call('zscore', KEYS[1], writer) then
  redis.call('hdel', KEYS[4], 'writer')
  writer = false
end
local holders = redis.call('zcard', KEYS[1])
local waiting = redis.call('zcard', KEYS[2])
if holders == 0 and waiting == 0 then redis.call('hdel', KEYS[4], 'limit') end
"""

# ARGV[1] token; ARGV[2] ttl ms; ARGV[3] limit (0: reader-writer lock); ARGV[4] mode: permit | read | write
# -> {1, fence}: granted; {0, ms until the next holder or writer lapses, -1 if none}: not now (a writer is
#    queued, or its place refreshed); {-2, limit}: the live holders use another limit (nothing changed)
SEM_ACQUIRE = Script(
    "sem_acquire",
    _PRUNE
    + """
local limit = tonumber(ARGV[3])
local held = redis.call('hget', KEYS[4], 'limit')
if held and tonumber(held) ~= limit then return {-2, tonumber(held)} end
local function hint()
  local first = redis.call('zrange', KEYS[1], 0, 0, 'withscores')
  local at = first[2] and tonumber(first[2]) or false
  if next_lapse and (not at or next_lapse < at) then at = next_lapse end
  if not at then return -1 end
  return at - now
end
local mode = ARGV[4]
local ok
if mode == 'write' then
  local first = redis.call('zrange', KEYS[2], 0, 0)[1]
  ok = holders == 0 and (not first or first == ARGV[1])
  if not ok then
    if not redis.call('zscore', KEYS[2], ARGV[1]) then
      redis.call('zadd', KEYS[2], redis.call('hincrby', KEYS[4], 'seq', 1), ARGV[1])
    end
    redis.call('hset', KEYS[3], ARGV[1], now + tonumber(ARGV[2]))
    redis.call('hset', KEYS[4], 'limit', limit)
    return {0, hint()}
  end
elseif mode == 'read' then
  ok = waiting == 0 and not writer
else
  ok = holders < limit
end
if not ok then return {0, hint()} end
redis.call('zrem', KEYS[2], ARGV[1])
redis.call('hdel', KEYS[3], ARGV[1])
redis.call('zadd', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
if mode == 'write' then redis.call('hset', KEYS[4], 'writer', ARGV[1]) end
redis.call('hset', KEYS[4], 'limit', limit)
return {1, redis.call('hincrby', KEYS[4], 'fence', 1)}
""",
)

# ARGV[1] token; ARGV[2] ttl ms -> the last fence if the permit was still ours (its expiry moved), -1 otherwise
SEM_RENEW = Script(
    "sem_renew",
    """
local t = redis.call('time')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local at = redis.call('zscore', KEYS[1], ARGV[1])
if not at or tonumber(at) <= now then return -1 end
redis.call('zadd', KEYS[1], 'XX', now + tonumber(ARGV[2]), ARGV[1])
return tonumber(redis.call('hget', KEYS[4], 'fence') or '0')
""",
)

# ARGV[1] token; ARGV[2] the wake channel -> 1 if the permit was ours (removed, waiters woken), 0 otherwise
SEM_RELEASE = Script(
    "sem_release",
    _PRUNE
    + """
if redis.call('zrem', KEYS[1], ARGV[1]) == 0 then return 0 end
if writer == ARGV[1] then redis.call('hdel', KEYS[4], 'writer') end
if holders == 1 and waiting == 0 then redis.call('hdel', KEYS[4], 'limit') end
redis.call('publish', ARGV[2], '')
return 1
""",
)

# A waiter that gives up (deadline, cancel, an error): its queued place and any permit a lost reply granted it
# are removed, and the others told. ARGV[1] token; ARGV[2] the wake channel -> 1 if anything was removed
SEM_LEAVE = Script(
    "sem_leave",
    """
local gone = redis.call('zrem', KEYS[2], ARGV[1]) + redis.call('hdel', KEYS[3], ARGV[1])
  + redis.call('zrem', KEYS[1], ARGV[1])
if redis.call('hget', KEYS[4], 'writer') == ARGV[1] then redis.call('hdel', KEYS[4], 'writer') end
if gone > 0 then redis.call('publish', ARGV[2], '') return 1 end
return 0
""",
)

# -> {limit or -1, holders, 1 if a writer holds else 0, waiting writers, fence or 0}; read-only
SEM_INFO = Script(
    "sem_info",
    """
local t = redis.call('time')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local holders = redis.call('zcount', KEYS[1], '(' .. now, '+inf')
local waiting = 0
local wexp = redis.call('hgetall', KEYS[3])
for i = 1, #wexp, 2 do if tonumber(wexp[i + 1]) > now then waiting = waiting + 1 end end
local writer = redis.call('hget', KEYS[4], 'writer')
local writes = 0
if writer then
  local at = redis.call('zscore', KEYS[1], writer)
  if at and tonumber(at) > now then writes = 1 end
end
local limit = -1
if holders > 0 or waiting > 0 then limit = tonumber(redis.call('hget', KEYS[4], 'limit') or '-1') end
return {limit, holders, writes, waiting, tonumber(redis.call('hget', KEYS[4], 'fence') or '0')}
""",
)

# Administrative: drop every holder and waiter. ARGV[1] the wake channel -> how many held
SEM_CLEAR = Script(
    "sem_clear",
    """
local t = redis.call('time')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local held = redis.call('zcount', KEYS[1], '(' .. now, '+inf')
redis.call('del', KEYS[1], KEYS[2], KEYS[3])
redis.call('hdel', KEYS[4], 'writer', 'limit')
redis.call('publish', ARGV[1], '')
return held
""",
)


# What the other Redis drivers say about permits (their Guarantees.semaphores), with the reason shown to users.
REDLOCK_PERMITS = Offer(
    "never",
    "a majority of masters agreeing on each permit does not bound the holders fleet-wide: with limit 2 on 3 "
    "masters, 3 clients can each hold a permit on a different pair of masters while every master counts only 2, "
    "so the limit is exceeded with no master at fault (limit 1 is a lock: use lock()); and Redlock hands out no "
    "fencing tokens",
)
SENTINEL_PERMITS = Offer(
    "not yet",
    "the permit scripts would run on the master as on redis://, but their fencing tokens are not yet lifted by "
    "the sentinels' config-epoch as lock tokens are, so a failover that lost the counter could hand out lower "
    "tokens",
)
