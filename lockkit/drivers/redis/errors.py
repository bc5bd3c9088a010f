"""Redis client errors as lockkit errors that say what to do (both drivers, both faces).

* A refused login (``WRONGPASS``, ``NOAUTH``, a password for a server without one) is a
  :class:`~lockkit.ConfigError` naming the user, never the password: retrying cannot help, the URL or the
  server's ACL must change.
* A refused connection (nothing listens at host:port, no socket file at the path) says so and asks whether a
  server runs there and whether the URL is right.
* Anything else is a :class:`~lockkit.BackendUnavailable` naming the server.
"""

from __future__ import annotations

from collections.abc import Sequence

from redis.exceptions import AuthenticationError

from ...errors import BackendUnavailable, ConfigError, LockError
from .config import NodeSpec

__all__ = ["login_refused", "refused_logins", "translate"]


def _user(spec: NodeSpec) -> str:
    return spec.username or "default"


def _refused(exc: BaseException) -> bool:
    cause = exc.__cause__
    return isinstance(cause, (ConnectionRefusedError, FileNotFoundError))


def login_refused(spec: NodeSpec, exc: BaseException) -> ConfigError:
    # No scheme in the advice: the same NodeSpec serves redis://, rediss://, redlock://, redis+sentinel:// (the
    # master's login) and redis+cluster://, and a redis:// example misled the users of the others.
    return ConfigError(
        f"redis {spec.label} refused the login of user {_user(spec)!r} ({exc}). Fix the user and password in the "
        "URL (USER:PASSWORD@ before the host, as in the URL's own scheme; no user means 'default'), or the "
        "server's ACL for that user"
    )


def translate(spec: NodeSpec, exc: BaseException) -> LockError:
    """The lockkit error for a redis-py or socket error talking to ``spec``'s server."""
    if isinstance(exc, AuthenticationError):
        return login_refused(spec, exc)
    if _refused(exc):
        what = "no socket file there" if spec.path else "connection refused"
        return BackendUnavailable(
            f"could not connect to redis at {spec.label}: {what}. Is a Redis server running at {spec.label}, "
            "and is the URL right?"
        )
    return BackendUnavailable(
        f"redis {spec.label} is unreachable: {exc}; check that the server is up and reachable from this host, "
        "then retry"
    )


def refused_logins(specs: Sequence[NodeSpec], errors: Sequence[BaseException | None], need: int) -> ConfigError | None:
    """For Redlock: a ConfigError if refused logins alone leave fewer than ``need`` masters able to answer."""
    refused = [(spec, e) for spec, e in zip(specs, errors, strict=True) if isinstance(e, AuthenticationError)]
    if refused and len(specs) - len(refused) < need:
        spec, exc = refused[0]
        named = ", ".join(s.label for s, _ in refused)
        base = login_refused(spec, exc)
        return ConfigError(f"redlock: {len(refused)} of {len(specs)} masters ({named}) refused the login; {base}")
    return None
