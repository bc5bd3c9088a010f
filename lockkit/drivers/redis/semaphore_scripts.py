"""Semaphores and reader-writer locks on one Redis server: the key layout and the Lua scripts (no I/O).

**Keys** of permit name ``N`` (``E`` = ``N`` percent-escaped as for locks, so all of them share the Redis
Cluster hash tag ``{E}``), under the driver's prefix ``P`` (default ``lockkit:``)::

    P sem{E}:holders   ZSET   member = holder's token, score = its expiry (server ms, from TIME)
    P sem{E}:writers   ZSET   member = waiting writer's token, score = its arrival number (oldest first)
    P sem{E}:wexp      HASH   waiting writer's token -> when its place lapses (server ms)
    P sem{E}:meta      HASH   limit (0: a reader-writer lock), fence (the last fencing token), writer (the
                              token of the writer holding, if one does), seq (the queues' arrival counter)
    P sem{E}:queue     ZSET   member = queued permit waiter's id (<client id>.<ttl ms>.<token>), score = arrival
    P sem{E}:qexp      HASH   queued permit waiter's id -> when its place lapses (server ms)
    P sem{E}:fences    HASH   holder's token -> its fence (until it is released or lapses)
    P sem{E}:wake      pub/sub channel: an empty message after every release and every writer leaving

Expired holders and lapsed writers are pruned by every script before it decides, on the server's clock
(``TIME``), so a dead holder's permit lapses at its ttl with nobody's help. ``meta`` carries no expiry: the
fencing counter lives as long as the server keeps its data, as a lock's does. The rules are those of every
backend (docs/semaphores.md): a permit while fewer than ``limit`` are held and no older permit waiter is
queued; a read while no writer holds or waits; a write when nobody holds and it is the oldest waiting writer.
Every grant is ``HINCRBY fence``. A release hands a freed permit to the oldest queued permit waiter whose
client still listens, on that client's own channel (``P client:<client id>``, as a lock's release does; on a
Redis Cluster ``P sem{E}:client:<client id>``, in the name's slot, and the scripts use SPUBLISH: :func:`sharded`).

Names travel only as ``KEYS`` and tokens, TTLs and modes only as ``ARGV``, as in :mod:`.scripts`.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

from ...driver import Offer
from .keys import _ESCAPES
from .scripts import Script

__all__ = [
    "CLUSTER_PERMITS",
    "PLAIN_SCRIPTS",
    "REDLOCK_PERMITS",
    "SEM_ACQUIRE",
    "SEM_CLEAR",
    "SEM_INFO",
    "SEM_LEAVE",
    "SEM_RELEASE",
    "SEM_RENEW",
    "SENTINEL_PERMITS",
    "SHARDED_SCRIPTS",
    "PermitKeys",
    "PermitScripts",
    "cluster_permit_keys",
    "permit_keys",
    "sharded",
]


@dataclass(frozen=True)
class PermitKeys:
    holders: bytes
    writers: bytes
    wexp: bytes
    meta: bytes
    queue: bytes
    qexp: bytes
    fences: bytes
    channel: bytes
    clients: bytes
    """The prefix of the clients' own channels, where a release's direct grant is published (as for locks)."""

    def script_keys(self) -> tuple[bytes, ...]:
        """The ``KEYS`` every permit script takes, in this order."""
        return (self.holders, self.writers, self.wexp, self.meta, self.queue, self.qexp, self.fences)

    def renew_keys(self) -> tuple[bytes, bytes]:
        """The ``KEYS`` of :data:`SEM_RENEW`, which needs only these two."""
        return (self.holders, self.fences)


@functools.lru_cache(maxsize=1 << 14)
def permit_keys(prefix: str, name: str) -> PermitKeys:
    base = f"{prefix}sem{{{name.translate(_ESCAPES)}}}".encode()
    return PermitKeys(
        base + b":holders", base + b":writers", base + b":wexp", base + b":meta", base + b":queue",
        base + b":qexp", base + b":fences", base + b":wake", f"{prefix}client:".encode(),
    )  # fmt: skip


# Shared head of every script: the server's now in ms; expired holders, lapsed writers and lapsed queued
# permit waiters dropped; a writer field that names no live holder cleared.
_PRUNE = """
local t = redis.call('time')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- (each structure is looked at only when it is not empty: the uncontended path stays a few calls long)
local holders = redis.call('zcard', KEYS[1])
if holders > 0 then
  for _, gone in ipairs(redis.call('zrangebyscore', KEYS[1], '-inf', now)) do
    redis.call('zrem', KEYS[1], gone)
    redis.call('hdel', KEYS[7], gone)
    holders = holders - 1
  end
end
local next_lapse = false
local function lapse(queue, expiries)
  local entries = redis.call('hgetall', expiries)
  for i = 1, #entries, 2 do
    local at = tonumber(entries[i + 1])
    if at <= now then
      redis.call('hdel', expiries, entries[i])
      redis.call('zrem', queue, entries[i])
    elseif not next_lapse or at < next_lapse then
      next_lapse = at
    end
  end
  return redis.call('zcard', queue)
end
local waiting = redis.call('zcard', KEYS[2])
if waiting > 0 then waiting = lapse(KEYS[2], KEYS[3]) end
local queued = redis.call('zcard', KEYS[5])
if queued > 0 then queued = lapse(KEYS[5], KEYS[6]) end
local meta = redis.call('hmget', KEYS[4], 'writer', 'limit')
local writer = meta[1]
if writer and not redis.call('zscore', KEYS[1], writer) then
  redis.call('hdel', KEYS[4], 'writer')
  writer = false
end
-- the limit the live holders and waiters use; a stored one with nobody left binds nobody
local held_limit = (holders > 0 or waiting > 0 or queued > 0) and meta[2]
local function grant(token, ttl)
  local fence = redis.call('hincrby', KEYS[4], 'fence', 1)
  redis.call('zadd', KEYS[1], now + ttl, token)
  -- Every holder's fence is kept: a grant told by a release's message (which may be lost), or an attempt sent
  -- again after its reply was lost (Sentinel, Cluster), reads it back from here, never a 0.
  redis.call('hset', KEYS[7], token, fence)
  return fence
end
"""

# A freed permit goes to the oldest queued permit waiter whose client still listens (PUBLISH counts the
# receivers), told on its client's own channel as "<waiter id> <fence>", as a lock's release does
# (scripts._HANDOFF); else everyone is woken to look again. Waiter id: <client id>.<ttl ms>.<token>.
_HANDOFF = """
local function hand_off(channel, clients)
  local silent, tries = {}, 0
  while queued > 0 and tries < 8 do
    local head = redis.call('zrange', KEYS[5], 0, 0)[1]
    if not head then break end
    local client, ttl, token = string.match(head, '^([A-Za-z0-9_%-]+)%.([1-9]%d*)%.([!-~]+)$')
    if not token or #ttl > 15 then break end
    redis.call('zrem', KEYS[5], head)
    redis.call('hdel', KEYS[6], head)
    if not silent[client] then
      tries = tries + 1
      local fence = tonumber(redis.call('hget', KEYS[4], 'fence') or '0') + 1
      if redis.call('publish', clients .. client, head .. ' ' .. fence) > 0 then
        grant(token, tonumber(ttl))
        return
      end
      silent[client] = true
    end
  end
  redis.call('publish', channel, '')
end
"""

# ARGV[1] token; ARGV[2] ttl ms; ARGV[3] limit (0: reader-writer lock); ARGV[4] mode: permit | read | write;
# ARGV[5] the permit waiter's id ('' = do not queue: one attempt, or not listening yet); ARGV[6] wake channel
# -> {1, fence}: granted (or already ours by a release's direct grant); {0, ms until the next holder or waiter
#    lapses, -1 if none}: not now (a writer or a permit waiter is queued, or its place refreshed);
#    {-2, limit}: the live holders use another limit (nothing changed)
SEM_ACQUIRE = Script(
    "sem_acquire",
    _PRUNE
    + """
local ttl = tonumber(ARGV[2])
if redis.call('zscore', KEYS[1], ARGV[1]) then
  redis.call('zadd', KEYS[1], now + ttl, ARGV[1])
  redis.call('zrem', KEYS[5], ARGV[5])
  redis.call('hdel', KEYS[6], ARGV[5])
  return {1, tonumber(redis.call('hget', KEYS[7], ARGV[1]) or '0')}
end
local limit = tonumber(ARGV[3])
if held_limit and tonumber(held_limit) ~= limit then return {-2, tonumber(held_limit)} end
local function keep_limit()
  if meta[2] ~= ARGV[3] then redis.call('hset', KEYS[4], 'limit', ARGV[3]) end
end
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
    redis.call('hset', KEYS[3], ARGV[1], now + ttl)
    keep_limit()
    return {0, hint()}
  end
  redis.call('zrem', KEYS[2], ARGV[1])
  redis.call('hdel', KEYS[3], ARGV[1])
  redis.call('hset', KEYS[4], 'writer', ARGV[1])
elseif mode == 'read' then
  ok = waiting == 0 and not writer
  if not ok then return {0, hint()} end
else
  -- first come, first served: a free permit goes to the oldest queued waiter, not to a newcomer
  local first = queued > 0 and redis.call('zrange', KEYS[5], 0, 0)[1]
  ok = holders < limit and (not first or first == ARGV[5])
  if not ok then
    if ARGV[5] ~= '' then
      if not redis.call('zscore', KEYS[5], ARGV[5]) then
        redis.call('zadd', KEYS[5], redis.call('hincrby', KEYS[4], 'seq', 1), ARGV[5])
      end
      -- Its place lapses soon after the next expiry it re-checks at (or after its ttl) unless that re-check
      -- refreshes it: a crashed waiter must not hold back a permit that lapsed, as a release would skip it.
      local h, keep = hint(), ttl
      if h >= 0 and h + 500 < keep then keep = h + 500 end
      redis.call('hset', KEYS[6], ARGV[5], now + keep)
      keep_limit()
    end
    return {0, hint()}
  end
  if first then
    redis.call('zrem', KEYS[5], ARGV[5])
    redis.call('hdel', KEYS[6], ARGV[5])
    -- more permits free and more queued: the next in line may take one too
    if holders + 1 < limit and queued > 1 then redis.call('publish', ARGV[6], '') end
  end
end
keep_limit()
return {1, grant(ARGV[1], ttl)}
""",
)

# KEYS: holders, fences only (:meth:`PermitKeys.renew_keys`): both exist while anyone holds, so a renewal is
# served while the name's slot migrates (a cluster answers TRYAGAIN to a script some of whose keys are missing).
# ARGV[1] token; ARGV[2] ttl ms -> the permit's fence if it was still ours (its expiry moved), -1 otherwise
SEM_RENEW = Script(
    "sem_renew",
    """
local t = redis.call('time')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local at = redis.call('zscore', KEYS[1], ARGV[1])
if not at or tonumber(at) <= now then return -1 end
redis.call('zadd', KEYS[1], 'XX', now + tonumber(ARGV[2]), ARGV[1])
return tonumber(redis.call('hget', KEYS[2], ARGV[1]) or '0')
""",
)

# ARGV[1] token; ARGV[2] the wake channel; ARGV[3] the clients' channel prefix
# -> 1 if the permit was ours (removed, and granted on or waiters woken), 0 otherwise (nothing touched)
SEM_RELEASE = Script(
    "sem_release",
    _PRUNE
    + _HANDOFF
    + """
if redis.call('zrem', KEYS[1], ARGV[1]) == 0 then return 0 end
redis.call('hdel', KEYS[7], ARGV[1])
if writer == ARGV[1] then redis.call('hdel', KEYS[4], 'writer') end
if tonumber(meta[2] or '0') > 0 then
  hand_off(ARGV[2], ARGV[3])
else
  redis.call('publish', ARGV[2], '')
end
return 1
""",
)

# A waiter that gives up (deadline, cancel, an error): its queued place and any permit a lost reply or a release
# granted it are removed, the permit passed on, and the others told.
# ARGV[1] token; ARGV[2] the wake channel; ARGV[3] its waiter id ('' if none); ARGV[4] the clients' prefix
# -> 1 if anything was removed
SEM_LEAVE = Script(
    "sem_leave",
    _PRUNE
    + _HANDOFF
    + """
local gone = redis.call('zrem', KEYS[2], ARGV[1]) + redis.call('hdel', KEYS[3], ARGV[1])
  + redis.call('zrem', KEYS[5], ARGV[3]) + redis.call('hdel', KEYS[6], ARGV[3])
local held = redis.call('zrem', KEYS[1], ARGV[1]) > 0
redis.call('hdel', KEYS[7], ARGV[1])
if writer == ARGV[1] then redis.call('hdel', KEYS[4], 'writer') end
if held and tonumber(meta[2] or '0') > 0 then
  hand_off(ARGV[2], ARGV[4])
  return 1
end
if held or gone > 0 then redis.call('publish', ARGV[2], '') return 1 end
return 0
""",
)

# -> {limit or -1, holders, 1 if a writer holds else 0, waiting writers, last fence or 0, queued permit waiters};
#    read-only
SEM_INFO = Script(
    "sem_info",
    """
local t = redis.call('time')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local holders = redis.call('zcount', KEYS[1], '(' .. now, '+inf')
local function live(expiries)
  local n = 0
  local entries = redis.call('hgetall', expiries)
  for i = 1, #entries, 2 do if tonumber(entries[i + 1]) > now then n = n + 1 end end
  return n
end
local waiting, queued = live(KEYS[3]), live(KEYS[6])
local writer = redis.call('hget', KEYS[4], 'writer')
local writes = 0
if writer then
  local at = redis.call('zscore', KEYS[1], writer)
  if at and tonumber(at) > now then writes = 1 end
end
local limit = -1
if holders > 0 or waiting > 0 or queued > 0 then limit = tonumber(redis.call('hget', KEYS[4], 'limit') or '-1') end
return {limit, holders, writes, waiting, tonumber(redis.call('hget', KEYS[4], 'fence') or '0'), queued}
""",
)

# Administrative: drop every holder and waiter. ARGV[1] the wake channel -> how many held
SEM_CLEAR = Script(
    "sem_clear",
    """
local t = redis.call('time')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local held = redis.call('zcount', KEYS[1], '(' .. now, '+inf')
redis.call('del', KEYS[1], KEYS[2], KEYS[3], KEYS[5], KEYS[6], KEYS[7])
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
# Sentinel and Cluster run the same scripts on the master (Cluster: of the name's slot), their fences lifted by
# the master's config epoch as lock tokens are (their drivers' permit classes).
SENTINEL_PERMITS = Offer("yes")
CLUSTER_PERMITS = Offer("yes")


# -- redis+cluster:// -----------------------------------------------------------------------------------------
# In a cluster a script may publish only on a shard channel of its own slot: the same scripts with SPUBLISH, and
# the clients' channels moved into the name's slot (``P sem{E}:client:<client id>``), as the lock's are.


def sharded(script: Script) -> Script:
    source = script.source.replace("redis.call('publish',", "redis.call('spublish',")
    assert source != script.source, script.name
    return Script(script.name + "_sharded", source)


@dataclass(frozen=True)
class PermitScripts:
    """The scripts a permit driver runs: those that publish differ on a cluster (:func:`sharded`)."""

    acquire: Script
    release: Script
    leave: Script
    clear: Script
    renew: Script = SEM_RENEW
    info: Script = SEM_INFO


PLAIN_SCRIPTS = PermitScripts(SEM_ACQUIRE, SEM_RELEASE, SEM_LEAVE, SEM_CLEAR)
SHARDED_SCRIPTS = PermitScripts(sharded(SEM_ACQUIRE), sharded(SEM_RELEASE), sharded(SEM_LEAVE), sharded(SEM_CLEAR))


@functools.lru_cache(maxsize=1 << 14)
def cluster_permit_keys(prefix: str, name: str) -> PermitKeys:
    """:func:`permit_keys` with the clients' channels in the name's slot (a script may SPUBLISH only there)."""
    keys = permit_keys(prefix, name)
    return dataclasses.replace(keys, clients=keys.holders[: -len(b":holders")] + b":client:")
