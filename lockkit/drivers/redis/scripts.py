"""The Lua scripts shared by the Redis and Redlock drivers, one per operation.

Every mutating operation is one script that checks our token first, so it is
atomic on the server. Names travel only as ``KEYS`` and tokens, TTLs and channel
names only as ``ARGV``: nothing a user passes is ever spliced into Lua text.
Scripts are loaded once per server (``SCRIPT LOAD`` on the first connection) and
called by SHA1 (``EVALSHA``); a ``NOSCRIPT`` reply (after ``SCRIPT FLUSH`` or a
restart) reloads the script and runs the same call again, which is safe because
``NOSCRIPT`` means the script did not run. There is no non-atomic fallback.

Every script of a lock takes its ``KEYS`` in one order, lock, fence, queue, alive
(:meth:`.keys.LockKeys.script_keys`), or the first of them if it needs fewer. The fencing counter
(``KEYS[2]``) is optional in the scripts Redlock shares: the single-node driver passes it, Redlock does not
(it offers no fencing token, see :mod:`lockkit.drivers.redis.redlock`).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

__all__ = [
    "ALL",
    "ANNOUNCE",
    "FORCE_RELEASE",
    "HOLDER",
    "MEMBERS",
    "RELEASE",
    "RENEW",
    "WITHDRAW",
    "Script",
]


@dataclass(frozen=True)
class Script:
    name: str
    source: str
    sha: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "sha", hashlib.sha1(self.source.encode()).hexdigest())


# KEYS[1] lock key; KEYS[2] (optional) fencing counter
# ARGV[1] token; ARGV[2] TTL in milliseconds
# -> the fence (0 without KEYS[2]) if the key still held our token (its TTL is now ARGV[2]); -1 otherwise.
#    One integer, not an array: a renewal round parses thousands of these replies.
RENEW = Script(
    "renew",
    """
if redis.call('get', KEYS[1]) == ARGV[1] then
  redis.call('pexpire', KEYS[1], ARGV[2])
  if KEYS[2] then return tonumber(redis.call('get', KEYS[2]) or '0') end
  return 0
end
return -1
""",
)

# KEYS[1] lock key
# ARGV[1] token; ARGV[2] wake-up channel of the same name
# -> 1 + the number of subscribers woken if the key held our token (deleted, waiters woken); 0 otherwise
#    (nothing touched). Redlock's releaser reads who else was waiting from it (see flow.YIELD_ROUNDS).
RELEASE = Script(
    "release",
    """
if redis.call('get', KEYS[1]) == ARGV[1] then
  redis.call('del', KEYS[1])
  return 1 + redis.call('publish', ARGV[2], '')
end
return 0
""",
)

# KEYS[1] lock key
# ARGV[1] wake-up channel
# -> 1 if a lock was deleted (waiters woken), 0 if it was free
FORCE_RELEASE = Script(
    "force_release",
    """
if redis.call('del', KEYS[1]) == 1 then
  redis.call('publish', ARGV[1], '')
  return 1
end
return 0
""",
)

# KEYS[1] lock key; KEYS[2] (optional) fencing counter
# -> {token or false, pttl, fence or false}  (read-only)
HOLDER = Script(
    "holder",
    """
local fence = false
if KEYS[2] then fence = redis.call('get', KEYS[2]) end
return {redis.call('get', KEYS[1]), redis.call('pttl', KEYS[1]), fence}
""",
)

# -- presence records (lockkit.driver.Presence): expiry counted on the server's own clock (TIME) -----------
# Scripts calling TIME are safe to replicate: Redis ≥ 5 replicates a script's effects, not the script.

_NOW_AND_PRUNE = """
local t = redis.call('time')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local dead = redis.call('zrangebyscore', KEYS[2], '-inf', now)
for i = 1, #dead do redis.call('hdel', KEYS[1], dead[i]) end
if #dead > 0 then redis.call('zremrangebyscore', KEYS[2], '-inf', now) end
"""

# KEYS[1] records (hash member -> value); KEYS[2] expiries (zset member -> expiry ms on the server clock)
# ARGV[1] member; ARGV[2] value; ARGV[3] TTL in milliseconds, or '' for a permanent record
# -> 1. Both keys expire with their longest-lived record, so an abandoned group leaves nothing behind.
ANNOUNCE = Script(
    "announce",
    _NOW_AND_PRUNE
    + """
redis.call('hset', KEYS[1], ARGV[1], ARGV[2])
if ARGV[3] == '' then
  redis.call('zadd', KEYS[2], '+inf', ARGV[1])
else
  redis.call('zadd', KEYS[2], now + tonumber(ARGV[3]), ARGV[1])
end
local last = redis.call('zrange', KEYS[2], -1, -1, 'WITHSCORES')
local left = tonumber(last[2])
if left == math.huge then
  redis.call('persist', KEYS[1])
  redis.call('persist', KEYS[2])
else
  redis.call('pexpire', KEYS[1], left - now)
  redis.call('pexpire', KEYS[2], left - now)
end
return 1
""",
)

# KEYS[1] records; KEYS[2] expiries.  ARGV[1] member.  -> 1 (whether or not the record existed)
WITHDRAW = Script(
    "withdraw",
    """
redis.call('zrem', KEYS[2], ARGV[1])
redis.call('hdel', KEYS[1], ARGV[1])
return 1
""",
)

# KEYS[1] records; KEYS[2] expiries
# -> {member, value, ms left (-1: permanent), member, value, ms left, ...} for live records (dead ones pruned)
MEMBERS = Script(
    "members",
    _NOW_AND_PRUNE
    + """
local live = redis.call('zrange', KEYS[2], 0, -1, 'WITHSCORES')
local out = {}
for i = 1, #live, 2 do
  local value = redis.call('hget', KEYS[1], live[i])
  if value then
    local expiry = tonumber(live[i + 1])
    out[#out + 1] = live[i]
    out[#out + 1] = value
    out[#out + 1] = expiry == math.huge and -1 or math.floor(expiry - now)
  end
end
return out
""",
)

# -- fair (FIFO) waiting, single-node driver ----------------------------------------------------------------
# A lock's waiters queue in a list (arrival order) with a sorted set of waiter id -> "alive until" (server ms).
# A waiter's entry lives until the holder's expiry plus a margin and is refreshed by the waiter's one re-check
# at that expiry, so an entry whose waiter died lapses on its own. While the lock is free and an older live
# waiter is queued, newcomers are refused.
#
# A release *grants* the lock to the first live waiter in the same script: a waiter id is
# "<client id>.<ttl ms>.<token>" (the grammar, docs/interop.md and flow.WAITER_ID: client id one or more of
# A-Z a-z 0-9 - _; ttl a positive decimal without leading zeros, at most 15 digits; token one or more printable
# ASCII characters other than space), so the release can set the key to that waiter's token with its TTL, take the
# next fencing token and publish "<waiter id> <fence>" on the waiter's client channel; the waiter returns on
# the message with no round trip of its own. Only a waiter whose client still listens is granted: PUBLISH
# returns how many subscribers received the message, and the client of a crashed process has none (the
# server closed its connection), so the release skips it and tries the next. A waiter that missed the message
# finds its own token in the key at its next attempt, which extends the TTL and returns the grant.

_NOW = """
local function now_ms()
  local t = redis.call('time')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function first_live(queue, alive, skip, now)
  local head = redis.call('lindex', queue, 0)
  while head and head ~= skip do
    if tonumber(redis.call('zscore', alive, head) or '0') > now then return head end
    redis.call('lpop', queue)
    redis.call('zrem', alive, head)
    head = redis.call('lindex', queue, 0)
  end
  return head
end
"""

# KEYS[1] lock; KEYS[2] fencing counter; KEYS[3] queue (list); KEYS[4] alive-until (zset).  ARGV[2] the lock's
# channel; ARGV[3] the prefix of the clients' own channels. The grant is published on the channel of the
# client whose waiter it names, not on the lock's channel, so a release wakes one client's pub/sub reader
# rather than every contender's. Waiters whose clients are gone are skipped: every waiter of a client found
# silent (a crashed process's many threads), and up to eight silent clients per release; after that (or with
# nobody left in the queue) the key is deleted and everyone waiting is woken to look again.
_HANDOFF = (
    _NOW
    + """
local function hand_off()
  if redis.call('lindex', KEYS[3], 0) then
    local now = now_ms()
    local silent, tries = {}, 0
    while tries < 8 do
      local head = first_live(KEYS[3], KEYS[4], false, now)
      if not head then break end
      local client, ttl, token = string.match(head, '^([A-Za-z0-9_%-]+)%.([1-9]%d*)%.([!-~]+)$')
      -- An id outside the grammar cannot be granted, but it is another client's live waiter, so it is not
      -- dropped either: it stays the head, and the lock is freed and everyone woken below. Its owner takes
      -- the lock at its next attempt (FAIR_ACQUIRE lets the head take a free lock); the rest stay behind it.
      if not token or #ttl > 15 then break end
      redis.call('lpop', KEYS[3])
      redis.call('zrem', KEYS[4], head)
      -- a client found silent once in this release is not asked again: its other waiters go without a try
      if not silent[client] then
        tries = tries + 1
        local fence = (tonumber(redis.call('get', KEYS[2])) or 0) + 1
        if redis.call('publish', ARGV[3] .. client, head .. ' ' .. fence) > 0 then
          redis.call('set', KEYS[1], token, 'PX', ttl)
          redis.call('incr', KEYS[2])
          return
        end
        silent[client] = true
      end
    end
  end
  redis.call('del', KEYS[1])
  redis.call('publish', ARGV[2], '')
end
"""
)

# KEYS[1] lock; KEYS[2] fencing counter; KEYS[3] queue; KEYS[4] alive-until
# ARGV[1] token; ARGV[2] TTL ms; ARGV[3] waiter id ('' = one attempt, do not queue); ARGV[4] entry margin ms;
# ARGV[5] queue bound
# -> {1, fence} if taken (or already ours by a release's grant: then its TTL is set to ARGV[2] again);
#    {0, ms until the blocker lapses (-1: a key without expiry)} otherwise, and then the waiter is queued (or
#    its entry refreshed)
FAIR_ACQUIRE = Script(
    "fair_acquire",
    # The uncontended path comes first, before any helper is defined: Lua makes a closure for every
    # `local function` it passes, which doubled the server time of the script.
    """
local head = redis.call('lindex', KEYS[3], 0)
if not head and redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return {1, redis.call('incr', KEYS[2])}
end
"""
    + _NOW
    + """
local wid = ARGV[3]
local cur = redis.call('get', KEYS[1])
if cur == ARGV[1] then  -- a release granted it to us and we looked before its message came
  redis.call('pexpire', KEYS[1], ARGV[2])
  return {1, tonumber(redis.call('get', KEYS[2]) or '0')}
end
local now
if head and head ~= wid and not cur then
  now = now_ms()
  head = first_live(KEYS[3], KEYS[4], wid, now)
end
if not cur and (not head or head == wid) then
  redis.call('set', KEYS[1], ARGV[1], 'PX', ARGV[2])
  if head and redis.call('zrem', KEYS[4], wid) == 1 then redis.call('lrem', KEYS[3], 1, wid) end
  return {1, redis.call('incr', KEYS[2])}
end
local wait
if cur then
  wait = redis.call('pttl', KEYS[1])
else
  wait = tonumber(redis.call('zscore', KEYS[4], head)) - now
end
if wid ~= '' then
  now = now or now_ms()
  local life = (wait >= 0 and wait or tonumber(ARGV[2])) + tonumber(ARGV[4])
  local queued = redis.call('zscore', KEYS[4], wid)
  if queued or redis.call('llen', KEYS[3]) < tonumber(ARGV[5]) then
    if not queued then redis.call('rpush', KEYS[3], wid) end
    redis.call('zadd', KEYS[4], now + life, wid)
    -- The queue keys must outlive every entry. Extend them to twice what is needed, so that the waiters
    -- queueing behind this one usually find them long-lived enough: writes cost a script several times
    -- what reads do. (Redis deletes them anyway once the last entry leaves.)
    if redis.call('pttl', KEYS[3]) < life then
      redis.call('pexpire', KEYS[3], 2 * life)
      redis.call('pexpire', KEYS[4], 2 * life)
    end
  end
end
return {0, wait}
""",
)

# KEYS[1] lock; KEYS[2] fencing counter; KEYS[3] queue; KEYS[4] alive-until (as FAIR_ACQUIRE).  ARGV[1] token;
# ARGV[2] channel; ARGV[3] clients' channel prefix
# -> 1 if the key held our token (granted to the first live waiter, or deleted and everyone woken); 0 otherwise
FAIR_RELEASE = Script(
    "fair_release",
    # As in FAIR_ACQUIRE, the common cases (not ours; nobody queued) end before any helper is defined.
    """
if redis.call('get', KEYS[1]) ~= ARGV[1] then return 0 end
if not redis.call('lindex', KEYS[3], 0) then
  redis.call('del', KEYS[1])
  redis.call('publish', ARGV[2], '')
  return 1
end
"""
    + _HANDOFF
    + """
hand_off()
return 1
""",
)

# KEYS/ARGV as FAIR_RELEASE, without a token.  -> 1 if a holder's lock was removed (and granted on), 0 if free
FAIR_FORCE_RELEASE = Script(
    "fair_force_release",
    _HANDOFF
    + """
if not redis.call('get', KEYS[1]) then return 0 end
hand_off()
return 1
""",
)

# KEYS as FAIR_RELEASE.  ARGV[1] token; ARGV[2] channel; ARGV[3] clients' channel prefix; ARGV[4] waiter id
# -> 1. A waiter giving up leaves the queue, and passes on a grant that reached it too late.
LEAVE = Script(
    "leave",
    _HANDOFF
    + """
if redis.call('zrem', KEYS[4], ARGV[4]) == 1 then redis.call('lrem', KEYS[3], 1, ARGV[4]) end
if redis.call('get', KEYS[1]) == ARGV[1] then hand_off() end
return 1
""",
)

# KEYS as FAIR_ACQUIRE (the queue unused)
# -> {token or false, pttl, fence or false, live waiters}  (read-only)
FAIR_HOLDER = Script(
    "fair_holder",
    _NOW
    + """
return {redis.call('get', KEYS[1]), redis.call('pttl', KEYS[1]), redis.call('get', KEYS[2]),
        redis.call('zcount', KEYS[4], '(' .. now_ms(), '+inf')}
""",
)

ALL = (
    RENEW, RELEASE, FORCE_RELEASE, HOLDER, FAIR_ACQUIRE, FAIR_RELEASE, FAIR_FORCE_RELEASE, LEAVE,
    FAIR_HOLDER, ANNOUNCE, WITHDRAW, MEMBERS,
)  # fmt: skip


# -- redis+cluster:// (sharded pub/sub) ------------------------------------------------------------------------
# The same scripts with SPUBLISH for PUBLISH: in a cluster a script may only publish on a shard channel of its
# own slot, and the cluster driver's channels (the lock's, and the clients' per-lock channels
# ``<prefix>{E}:client:<id>``) all carry the lock's hash tag. Not in ALL: a node loads them on first use
# (NOSCRIPT), so redis:// servers never see them.


def _sharded(script: Script) -> Script:
    source = script.source.replace("redis.call('publish',", "redis.call('spublish',")
    assert source != script.source, script.name
    return Script(script.name + "_sharded", source)


SHARDED_FAIR_RELEASE = _sharded(FAIR_RELEASE)
SHARDED_FAIR_FORCE_RELEASE = _sharded(FAIR_FORCE_RELEASE)
SHARDED_LEAVE = _sharded(LEAVE)
