"""The Lua scripts shared by the Redis and Redlock drivers, one per operation.

Every mutating operation is one script that checks our token first, so it is
atomic on the server. Names travel only as ``KEYS`` and tokens, TTLs and channel
names only as ``ARGV``: nothing a user passes is ever spliced into Lua text.
Scripts are loaded once per server (``SCRIPT LOAD`` on the first connection) and
called by SHA1 (``EVALSHA``); a ``NOSCRIPT`` reply (after ``SCRIPT FLUSH`` or a
restart) reloads the script and runs the same call again, which is safe because
``NOSCRIPT`` means the script did not run. There is no non-atomic fallback.

The fencing counter (``KEYS[2]``) is optional: the single-node driver passes it,
Redlock does not (it offers no fencing token, see :mod:`lockkit.drivers.redlock`).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

__all__ = ["ACQUIRE", "ALL", "FORCE_RELEASE", "HOLDER", "RELEASE", "RENEW", "Script"]


@dataclass(frozen=True)
class Script:
    name: str
    source: str
    sha: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "sha", hashlib.sha1(self.source.encode()).hexdigest())


# KEYS[1] lock key; KEYS[2] (optional) fencing counter of the same name
# ARGV[1] token; ARGV[2] TTL in milliseconds
# -> {1, fence} if taken (fence is 0 without KEYS[2]); {0, pttl} if someone else holds it
ACQUIRE = Script(
    "acquire",
    """
if redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  if KEYS[2] then return {1, redis.call('incr', KEYS[2])} end
  return {1, 0}
end
return {0, redis.call('pttl', KEYS[1])}
""",
)

# KEYS[1] lock key; KEYS[2] (optional) fencing counter
# ARGV[1] token; ARGV[2] TTL in milliseconds
# -> {1, fence} if the key still held our token (its TTL is now ARGV[2]); {0, 0} otherwise
RENEW = Script(
    "renew",
    """
if redis.call('get', KEYS[1]) == ARGV[1] then
  redis.call('pexpire', KEYS[1], ARGV[2])
  if KEYS[2] then return {1, tonumber(redis.call('get', KEYS[2]) or '0')} end
  return {1, 0}
end
return {0, 0}
""",
)

# KEYS[1] lock key
# ARGV[1] token; ARGV[2] wake-up channel of the same name
# -> 1 if the key held our token (deleted, waiters woken); 0 otherwise (nothing touched)
RELEASE = Script(
    "release",
    """
if redis.call('get', KEYS[1]) == ARGV[1] then
  redis.call('del', KEYS[1])
  redis.call('publish', ARGV[2], '')
  return 1
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

ALL = (ACQUIRE, RENEW, RELEASE, FORCE_RELEASE, HOLDER)
