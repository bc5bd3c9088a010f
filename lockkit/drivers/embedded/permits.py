"""The permit record the embedded drivers keep for semaphores and reader-writer locks (memory://, file://).

Pure logic on plain values and an explicit ``now``, like :mod:`.slot` for locks. One record per name holds
the limit its holders use, the fencing counter, the holders (token → expiry, and whether it is a writer) and
the queue of waiting writers (token → when its registration lapses, in arrival order). The rules, the same on
every backend (docs/semaphores.md):

* a ``permit`` is granted while fewer than ``limit`` permits are held;
* a ``read`` is granted while no writer holds *or waits* (writer preference: a stream of readers cannot
  starve a writer);
* a ``write`` is granted when nobody holds and it is the oldest waiting writer; until then it stays queued,
  refreshing its place at every attempt, and a writer that dies lapses after its ttl;
* every grant takes the next fencing token of the name, so a writer's is above every earlier reader's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...driver import PermitMode
from ...errors import ConfigError

__all__ = ["PermitTable", "describe_limit", "limit_mismatch"]


def describe_limit(limit: int) -> str:
    return "a reader-writer lock" if limit == 0 else f"a semaphore of limit {limit}"


def limit_mismatch(name: str, held: int, wanted: int) -> ConfigError:
    """The error for a request whose limit disagrees with the live holders' (the same text on every backend)."""
    return ConfigError(
        f"{name!r} is in use as {describe_limit(held)}, but this handle asks for {describe_limit(wanted)}: "
        "every holder of a name must use the same limit (and a semaphore is not a reader-writer lock). "
        "Fix the limit= of this call site, or roll the change out only once every old holder has released"
    )


@dataclass
class PermitTable:
    limit: int | None = None
    """The limit the live holders and waiting writers use; ``None`` once none is left."""
    fence: int = 0
    """The last fencing token handed out; it survives every release so tokens never repeat."""
    holders: dict[str, tuple[float, bool]] = field(default_factory=dict)
    """token → (expiry, is a writer)."""
    writers: dict[str, float] = field(default_factory=dict)
    """Waiting writers, oldest first: token → when the registration lapses unless refreshed."""

    def prune(self, now: float) -> None:
        """Drop the holders and waiting writers whose time passed (dead processes lapse here)."""
        self.holders = {t: h for t, h in self.holders.items() if h[0] > now}
        self.writers = {t: e for t, e in self.writers.items() if e > now}
        if not self.holders and not self.writers:
            self.limit = None

    def check_limit(self, name: str, limit: int) -> None:
        if self.limit is not None and self.limit != limit:
            raise limit_mismatch(name, self.limit, limit)

    def take(self, name: str, token: str, ttl: float, now: float, limit: int, mode: PermitMode) -> int | None:
        """Grant a permit if the rules allow; the new fencing token, or ``None`` (a writer then stays queued)."""
        self.prune(now)
        self.check_limit(name, limit)
        if mode == "write":
            first = next(iter(self.writers), token)
            if self.holders or first != token:
                self.writers[token] = now + ttl  # keeps its place if already queued
                self.limit = limit
                return None
            self.writers.pop(token, None)
        elif mode == "read":
            if self.writers or any(writer for _, writer in self.holders.values()):
                return None
        elif len(self.holders) >= limit:
            return None
        self.limit = limit
        self.fence += 1
        self.holders[token] = (now + ttl, mode == "write")
        return self.fence

    def leave(self, token: str, now: float) -> None:
        """A waiting writer gives up (deadline, cancel): readers behind it may go."""
        self.writers.pop(token, None)
        self.prune(now)

    def renew(self, token: str, ttl: float, now: float) -> bool:
        self.prune(now)
        held = self.holders.get(token)
        if held is None:
            return False
        self.holders[token] = (now + ttl, held[1])
        return True

    def release(self, token: str, now: float) -> bool:
        self.prune(now)
        if self.holders.pop(token, None) is None:
            return False
        self.prune(now)
        return True

    def clear(self, now: float) -> int:
        """Administrative: drop every holder and waiter; how many holders there were."""
        self.prune(now)
        count = len(self.holders)
        self.holders.clear()
        self.writers.clear()
        self.limit = None
        return count

    def wait_hint(self, now: float) -> float | None:
        """Seconds until the next holder or waiting writer lapses (a waiter's one re-check), ``None`` if none."""
        times = [h[0] for h in self.holders.values()] + list(self.writers.values())
        return None if not times else max(0.0, min(times) - now)

    def writer_holds(self) -> bool:
        return any(writer for _, writer in self.holders.values())

    # -- the file:// encoding ------------------------------------------------------------------

    def encode(self) -> dict[str, Any]:
        return {
            "limit": self.limit,
            "fence": self.fence,
            "holders": {t: [e, w] for t, (e, w) in self.holders.items()},
            "writers": [[t, e] for t, e in self.writers.items()],
        }

    @classmethod
    def decode(cls, raw: dict[str, Any]) -> PermitTable:
        limit = raw.get("limit")
        return cls(
            None if limit is None else int(limit),
            int(raw.get("fence", 0)),
            {str(t): (float(h[0]), bool(h[1])) for t, h in (raw.get("holders") or {}).items()},
            {str(t): float(e) for t, e in (raw.get("writers") or [])},
        )
