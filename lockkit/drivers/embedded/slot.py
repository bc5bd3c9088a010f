"""The lock record the embedded drivers keep (memory:// in a dict, file:// in a file).

Pure logic on plain values and an explicit ``now``: whether a lock is free,
taking it (with the per-name fencing counter), owner-checked renew and release.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Slot:
    token: str | None = None
    expires: float = 0.0
    fence: int = 0
    """The last fencing token handed out for this name; it survives release so tokens never repeat."""

    def holder(self, now: float) -> str | None:
        return self.token if self.token is not None and now < self.expires else None

    def take(self, token: str, ttl: float, now: float) -> int | None:
        """Take the lock if free (or expired); the new fencing token, or ``None`` if held."""
        if self.holder(now) is not None:
            return None
        self.token = token
        self.expires = now + ttl
        self.fence += 1
        return self.fence

    def renew(self, token: str, ttl: float, now: float) -> bool:
        if self.holder(now) != token:
            return False
        self.expires = now + ttl
        return True

    def release(self, token: str | None, now: float) -> bool:
        """Free the lock if ``token`` holds it (``None``: whoever holds it, for force-release)."""
        current = self.holder(now)
        if current is None or (token is not None and current != token):
            return False
        self.token = None
        self.expires = 0.0
        return True

    def wait_hint(self, now: float) -> float | None:
        """Seconds until the holder's TTL passes (the one re-check a waiter makes), ``None`` if free."""
        return None if self.holder(now) is None else self.expires - now
