"""What ``@locker.locked(...)`` needs besides I/O: the lock-name template and the lease of the running call.

::

    @locks.locked("report:{day}", ttl=30, timeout=5)
    def build_report(day: str) -> None:
        lease = lockkit.current_lease()          # the lease this call holds
        write(..., fencing_token=lease.fencing_token)

The name may name the function's parameters in ``{braces}`` (``str.format`` fields, with format specs and
attribute access as ``str.format`` allows); it is formatted from each call's arguments, defaults applied.
A field that names no parameter is a :class:`~lockkit.ConfigError` when the function is decorated, not when
it is first called.
"""

from __future__ import annotations

import contextvars
import inspect
import string
from collections.abc import Callable, Mapping
from typing import Any

from .errors import ConfigError, InvalidLockName, LockError
from .lease import Lease

__all__ = ["NameTemplate", "current_lease", "enter_call", "leave_call"]

_current: contextvars.ContextVar[Lease | None] = contextvars.ContextVar("lockkit_current_lease", default=None)


def current_lease() -> Lease:
    """The lease held by the innermost ``@locked`` call running in this thread or task.

    Raises :class:`~lockkit.LockError` outside such a call.
    """
    lease = _current.get()
    if lease is None:
        raise LockError(
            "lockkit.current_lease() is only available inside a function decorated with locked(); "
            "elsewhere use the Lease that acquire() returns"
        )
    return lease


def enter_call(lease: Lease) -> contextvars.Token[Lease | None]:
    """Make ``lease`` the :func:`current_lease` while a decorated call runs; give the result to :func:`leave_call`."""
    return _current.set(lease)


def leave_call(entry: contextvars.Token[Lease | None]) -> None:
    """Restore the :func:`current_lease` of before :func:`enter_call` (the caller's, for nested calls)."""
    _current.reset(entry)


class NameTemplate:
    """A lock name with ``{parameter}`` fields, checked against the decorated function's signature."""

    def __init__(self, template: object) -> None:
        if not isinstance(template, str):
            raise ConfigError(
                f"locked() takes a lock name (a str, may have {{parameter}} fields), got {template!r}; "
                "e.g. locked('report:{{day}}')"
            )
        try:
            parsed = list(string.Formatter().parse(template))
        except ValueError as exc:
            hint = "write a literal brace as {{ or }}"
            raise ConfigError(f"bad lock name template {template!r}: {exc} ({hint})") from None
        self.template = template
        self.fields = sorted({_root(field) for _, field, _, _ in parsed if field is not None})
        if "" in self.fields:
            raise ConfigError(
                f"lock name template {template!r} has an empty field {{}}: name the parameter, e.g. 'report:{{day}}'"
            )

    def check(self, fn: Callable[..., Any]) -> inspect.Signature:
        """The signature of ``fn``; :class:`ConfigError` if a field names none of its parameters."""
        signature = inspect.signature(fn)
        unknown = [f for f in self.fields if f not in signature.parameters]
        if unknown:
            raise ConfigError(
                f"lock name template {self.template!r} uses {{{unknown[0]}}}, but {fn.__name__}() has no "
                f"parameter of that name (it has: {', '.join(signature.parameters) or 'none'}); rename the field or "
                "the parameter"
            )
        return signature

    def format(self, signature: inspect.Signature, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> str:
        """The lock name for one call (defaults applied)."""
        if not self.fields:
            return self.template
        bound = signature.bind(*args, **kwargs)  # a call that does not fit: the TypeError calling fn would raise
        bound.apply_defaults()
        try:
            return self.template.format(**{f: bound.arguments[f] for f in self.fields})
        except (AttributeError, LookupError, TypeError, ValueError) as exc:  # {order.id} of None, {day:%Y} of a str
            raise InvalidLockName(
                f"lock name template {self.template!r} does not fit this call's arguments ({type(exc).__name__}: "
                f"{exc}); pass arguments its fields can be read from, or change the template"
            ) from exc


def _root(field: str) -> str:
    """``day`` of ``day``, ``day.year`` or ``day[0]``."""
    for i, char in enumerate(field):
        if char in ".[":
            return field[:i]
    return field
