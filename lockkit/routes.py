"""Routes: which backend a lock name goes to, and what a route may require of it.

A route is a shell-style glob on the lock name (first match wins) and a backend, optionally with the
guarantees its call sites depend on::

    [routes]
    "inventory:*" = "fast"
    "payment:*"   = { backend = "strong", require = ["consensus", "fencing"] }
    "nightly"     = { backend = "zk", exact = true }

Mistakes are refused when the configuration is loaded, never discovered in production:

* a route that can never be used because an earlier one catches every name it matches (``"*"`` above
  ``"payment:*"``) — reorder them;
* a pattern without a wildcard that ends like a prefix (``"inventory:"``) — it matches only the one name
  ``inventory:``; write ``"inventory:*"``, or ``exact = true`` if that one name is meant;
* a pattern that no valid lock name can match (empty, or longer than a name may be);
* a requirement the route's backend does not offer (a ``migrate`` backend offers the weaker of its sides).

Why refuse rather than warn: every one of these leaves a call site on a backend its author did not choose,
and a warning in a log nobody reads is how a fenced payment path ends up on Redlock. Each error names the
route, the backend and what to change.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .driver import Guarantees
from .errors import ConfigError, InvalidLockName
from .names import MAX_NAME_BYTES, validate_name

__all__ = ["REQUIREMENTS", "Route", "check_requirements", "check_shadowing", "missing", "parse_route"]

_WILDCARDS = "*?["
_PREFIX_ENDINGS = ":/.-_|#"

REQUIREMENTS: dict[str, str] = {
    "consensus": "a consensus group decides the holder (scope 'consensus': etcd, ZooKeeper)",
    "majority": "a majority of servers decides (scope 'majority' or 'consensus')",
    "fencing": "fencing tokens strictly increase per name (fencing 'strict')",
    "fifo": "waiters are served in arrival order",
    "failover": "a held lock survives the loss of one server",
    "server-wakeup": "waiters are woken by the backend, not by polling",
}
"""What a route can ``require``, and what each means in terms of :class:`~lockkit.Guarantees`."""


def _offers(guarantees: Guarantees, requirement: str) -> bool:
    if requirement == "consensus":
        return guarantees.scope == "consensus"
    if requirement == "majority":
        return guarantees.scope in ("majority", "consensus")
    if requirement == "fencing":
        return guarantees.fencing == "strict"
    if requirement == "fifo":
        return guarantees.fifo
    if requirement == "failover":
        return guarantees.survives_failover
    assert requirement == "server-wakeup"
    return guarantees.server_wakeup


def missing(guarantees: Guarantees, require: Sequence[str]) -> list[str]:
    """The requirements ``guarantees`` does not meet, in the order given."""
    return [r for r in require if not _offers(guarantees, r)]


@dataclass(frozen=True)
class Route:
    pattern: str
    backend: str
    require: tuple[str, ...] = ()
    exact: bool = False

    def matches(self, name: str) -> bool:
        return fnmatch.fnmatchcase(name, self.pattern)

    def describe(self) -> str:
        extra = f" (requires {', '.join(self.require)})" if self.require else ""
        return f"{self.pattern!r} -> {self.backend!r}{extra}"


def _literal_prefix(pattern: str) -> str:
    cut = min((i for i, c in enumerate(pattern) if c in _WILDCARDS), default=len(pattern))
    return pattern[:cut]


def parse_route(pattern: str, value: Any, backends: Mapping[str, object], where: str) -> Route:
    """One ``[routes]`` entry: ``"glob" = "backend"`` or ``"glob" = { backend = …, require = […], exact = … }``."""
    known = ", ".join(sorted(backends))
    here = f"{where} {pattern!r}"
    if isinstance(value, str):
        route = Route(pattern, value)
    elif isinstance(value, Mapping):
        unknown = set(value) - {"backend", "require", "exact"}
        if unknown or "backend" not in value:
            wrong = f"unknown key {sorted(unknown)[0]!r}" if unknown else "missing 'backend'"
            raise ConfigError(f"{here}: {wrong}; a route table takes backend, and optionally require and exact")
        require = value.get("require", [])
        if not isinstance(require, list) or not all(isinstance(r, str) for r in require):
            raise ConfigError(f"{here}: require must be a list of names, e.g. require = [\"fencing\"]")
        bad = [r for r in require if r not in REQUIREMENTS]
        if bad:
            raise ConfigError(f"{here}: unknown requirement {bad[0]!r}; known: {', '.join(REQUIREMENTS)}")
        exact = value.get("exact", False)
        if not isinstance(exact, bool):
            raise ConfigError(f"{here}: exact must be true or false, got {exact!r}")
        route = Route(pattern, value["backend"], tuple(require), exact)
    else:
        raise ConfigError(f"{here} = {value!r}: expected a backend name or a table; configured backends: {known}")
    if not isinstance(route.backend, str) or route.backend not in backends:
        raise ConfigError(f"{here} = {route.backend!r} names no backend; configured: {known}. Use one of them")
    has_wildcard = any(c in pattern for c in _WILDCARDS)
    if not has_wildcard:
        try:
            validate_name(pattern)
        except InvalidLockName as exc:
            raise ConfigError(f"{here}: no lock name can match this pattern ({exc}); fix the pattern") from None
    elif len(_literal_prefix(pattern).encode()) > MAX_NAME_BYTES:
        raise ConfigError(
            f"{here}: no lock name can match this pattern (names are at most {MAX_NAME_BYTES} bytes); shorten it"
        )
    if route.exact and has_wildcard:
        raise ConfigError(f"{here}: exact = true, but the pattern has a wildcard ({_WILDCARDS!r}); drop one of them")
    if not has_wildcard and not route.exact and pattern[-1] in _PREFIX_ENDINGS:
        raise ConfigError(
            f"{here} has no wildcard, so it matches only the one name {pattern!r}, not names that start with it. "
            f'Write "{pattern}*" to route every such name, or {{ backend = "{route.backend}", exact = true }} '
            "if that one name is meant"
        )
    return route


def _shadows(earlier: Route, later: Route) -> bool:
    """Whether every name ``later`` matches is caught by ``earlier`` first (decided for the common shapes)."""
    if not any(c in later.pattern for c in _WILDCARDS):
        return earlier.matches(later.pattern)  # one name: ask the earlier glob about it directly
    head = earlier.pattern[:-1]
    if earlier.pattern.endswith("*") and not any(c in head for c in _WILDCARDS):
        return _literal_prefix(later.pattern).startswith(head)  # "a:*" catches every "a:b…" pattern
    return earlier.pattern == later.pattern


def check_shadowing(routes: Sequence[Route], where: str) -> None:
    """Refuse a route that an earlier one makes unreachable (first match wins)."""
    for i, later in enumerate(routes):
        for earlier in routes[:i]:
            if _shadows(earlier, later):
                raise ConfigError(
                    f"{where} {later.pattern!r} can never match: the earlier route {earlier.pattern!r} catches "
                    f"every name it would (first match wins). Put {later.pattern!r} above {earlier.pattern!r}, "
                    "or remove it"
                )


def check_requirements(routes: Sequence[Route], guarantees: Mapping[str, Guarantees], where: str) -> None:
    """Refuse a route whose backend lacks a guarantee it requires."""
    for route in routes:
        lacking = missing(guarantees[route.backend], route.require)
        if lacking:
            offered = guarantees[route.backend]
            raise ConfigError(
                f"{where} {route.pattern!r} requires {', '.join(lacking)}, but backend {route.backend!r} does not "
                f"offer it ({_summary(offered)}): {'; '.join(REQUIREMENTS[r] for r in lacking)}. Route it to a "
                "backend that does, or drop the requirement if the call sites do not depend on it"
            )


def _summary(g: Guarantees) -> str:
    return f"scope={g.scope}, fencing={g.fencing}, fifo={g.fifo}, survives_failover={g.survives_failover}"
