"""Backend URLs: parsing, driver options, and redaction.

``scheme://[user[:password]@]host[:port][,host[:port]…][/path][?option=value&…]``

Several hosts are separated by commas (Redlock masters, ZooKeeper and etcd
members); IPv6 hosts go in brackets (``[::1]:2379``); user and password are
percent-decoded, so a password containing ``@:/`` is written ``%40%3A%2F``.
A :class:`BackendURL` never shows its password: ``str`` and ``repr`` print
``***`` in its place, and so does every error message built from it. The same holds for every option whose
name ends in ``password`` (``sentinel_password=``). A URL that could hold a password left unencoded where a
host, port, path or option seems to be (an ``@`` after a ``host:port``, any ``#``) is refused, not guessed.
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import parse_qsl, unquote, urlsplit

from .errors import ConfigError

__all__ = ["BackendURL", "parse_options", "parse_url", "redact"]

T = TypeVar("T")


@dataclass(frozen=True)
class BackendURL:
    scheme: str
    hosts: tuple[tuple[str, int | None], ...] = ()
    path: str = ""
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    options: Mapping[str, str] = field(default_factory=dict)

    def __str__(self) -> str:
        auth = ""
        if self.username or self.password:
            auth = (self.username or "") + (":***" if self.password else "") + "@"
        hosts = ",".join(_format_host(h, p) for h, p in self.hosts)
        query = "&".join(f"{k}={'***' if _secret(k) else v}" for k, v in self.options.items())
        return f"{self.scheme}://{auth}{hosts}{self.path}" + (f"?{query}" if query else "")

    def __repr__(self) -> str:
        return f"BackendURL({str(self)!r})"

    def host_port(self, default_port: int) -> list[tuple[str, int]]:
        return [(h, p if p is not None else default_port) for h, p in self.hosts]


def _secret(option: str) -> bool:
    """An option whose value is a secret (``sentinel_password``), masked wherever a URL is shown."""
    return option.lower().endswith("password")


_SECRET_OPTION = re.compile(r"([?&][^=&#]*password=)[^&#]*", re.IGNORECASE)


def _format_host(host: str, port: int | None) -> str:
    shown = f"[{host}]" if ":" in host else host
    return shown if port is None else f"{shown}:{port}"


def redact(url: str) -> str:
    """Mask the password of a URL string, even one that does not parse.

    The userinfo ends at the *last* ``@`` of the URL, not at the first ``/``, ``?`` or ``#``: a password with
    one of those characters left unencoded (``app:pa/ss@host``) would otherwise read as a host followed by a
    path, and be shown in full. Masking too much (an ``@`` in a query value) hides a host name, never a secret.
    """
    url = _SECRET_OPTION.sub(r"\1***", url)
    scheme, sep, rest = url.partition("://")
    if not sep or "@" not in rest or rest.startswith("/"):
        return url  # no authority ("file:///dir@x"): no userinfo either
    userinfo, _, hosts = rest.rpartition("@")
    user, colon, _ = userinfo.partition(":")
    if any(stop in user for stop in "/?#"):
        return f"{scheme}://***@{hosts}"  # not a plain user name: do not guess where a secret starts
    return f"{scheme}://{user}{':***' if colon else ''}@{hosts}"


def _parse_host(part: str, shown: str) -> tuple[str, int | None]:
    if part.startswith("["):
        end = part.find("]")
        if end == -1:
            raise ConfigError(f"unclosed '[' in IPv6 host of {shown}; write it as [::1]:6379")
        host, rest = part[1:end], part[end + 1 :]
        if rest and not rest.startswith(":"):
            raise ConfigError(f"unexpected {rest!r} after IPv6 host in {shown}; write it as [::1]:6379")
        port_text = rest[1:] if rest else None
    else:
        host, colon, port_text_raw = part.partition(":")
        port_text = port_text_raw if colon else None
    if not host:
        raise ConfigError(f"empty host in {shown}; write scheme://host:port, e.g. redis://localhost:6379/0")
    if port_text is None:
        return host, None
    if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise ConfigError(f"port must be a number from 1 to 65535, got {port_text!r} in {shown}")
    return host, int(port_text)


def parse_url(url: object) -> BackendURL:
    """Split a backend URL into its parts; raise :class:`ConfigError` naming the (masked) URL."""
    if not isinstance(url, str):
        raise ConfigError(
            f"a backend URL must be a str, got {type(url).__name__}; pass it as text, e.g. 'redis://localhost:6379/0'"
        )
    if not url:
        raise ConfigError("the backend URL is empty; e.g. redis://localhost:6379/0")
    shown = redact(url)
    if "://" not in url:
        raise ConfigError(f"{shown!r} is not a URL: expected scheme://…, e.g. redis://localhost:6379/0")
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        raise ConfigError(
            f"malformed URL {shown!r}: {exc}; expected scheme://[user:password@]host:port/path?option=value"
        ) from None
    scheme = parts.scheme.lower()
    if "#" in url:
        raise ConfigError(
            f"{shown!r} has a '#': lockkit reads no URL fragment, and would drop it unread. Write a '#' in a "
            "password or an option value as %23 (urllib.parse.quote(password, safe=''))"
        )
    after_scheme = url.split("://", 1)[1]
    netloc = after_scheme
    for stop in "/?":
        netloc = netloc.split(stop, 1)[0]
    username = password = None
    had_userinfo = "@" in netloc
    if (had_userinfo or ":" in netloc) and "@" in after_scheme[len(netloc) :]:
        # "app:1234/s3cret@db" is a host and port followed by a path, and also a user whose password starts with
        # digits and holds an unencoded '/' (or '?'); "u:p@h/x@db" may be a password holding an '@'. Guessing
        # either way can show the password or connect to another server: only an encoded '@' says which is meant.
        raise ConfigError(
            f"{shown!r} has an '@' after its host part, so lockkit cannot tell its host:port and credentials from "
            "a password holding an unencoded '/', '?' or '@'. Percent-encode the password "
            "(urllib.parse.quote(password, safe='')), and write an '@' in a path or option value as %40"
        )
    if had_userinfo:
        userinfo, _, netloc = netloc.rpartition("@")
        user, colon, secret = userinfo.partition(":")
        username = unquote(user) or None
        password = unquote(secret) if colon else None
    try:
        hosts = tuple(_parse_host(part, shown) for part in netloc.split(",")) if netloc else ()
    except ConfigError as exc:
        if had_userinfo or "@" not in after_scheme:
            raise
        # The host part does not parse and an '@' comes later: most likely a password with an unencoded '/',
        # '?' or '#' (which ends the host part early). ``shown`` masks up to the last '@' either way.
        raise ConfigError(
            f"{exc}. If the URL has a password with '/', '?', '#' or '@' in it: Percent-encode them "
            "(urllib.parse.quote(password, safe=''))"
        ) from None
    options: dict[str, str] = {}
    try:
        pairs = parse_qsl(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query))
    except ValueError:
        raise ConfigError(f"malformed query string in {shown!r}: expected option=value&…") from None
    for key, value in pairs:
        if key in options:
            raise ConfigError(f"option {key!r} is given twice in {shown!r}; keep one")
        options[key] = value
    return BackendURL(scheme, hosts, unquote(parts.path), username, password, types.MappingProxyType(options))


def _convert(raw: str, target: Any, key: str, shown: str) -> Any:
    origin = typing.get_origin(target)
    if origin in (typing.Union, types.UnionType):
        members = [m for m in typing.get_args(target) if m is not type(None)]
        if raw.lower() in ("", "none", "null") and len(members) < len(typing.get_args(target)):
            return None
        return _convert(raw, members[0], key, shown)
    try:
        if target is bool:
            lowered = raw.lower()
            if lowered in ("1", "true", "yes", "on"):
                return True
            if lowered in ("0", "false", "no", "off"):
                return False
            raise ValueError(raw)
        if target is int:
            return int(raw)
        if target is float:
            value = float(raw)
            if value != value or value in (float("inf"), float("-inf")):
                raise ValueError(raw)
            return value
    except ValueError:
        name = getattr(target, "__name__", str(target))
        raise ConfigError(f"option {key}={raw!r} in {shown!r} must be a {name}; fix its value") from None
    return raw


def parse_options(cls: type[T], options: Mapping[str, str], url: BackendURL | str) -> T:
    """Build a driver's frozen options dataclass from URL query options, strictly.

    An unknown option is an error naming it and listing the known ones (tooz
    silently ignores them, and a typo like ``tll=5`` then goes unnoticed).
    """
    shown = str(url) if isinstance(url, BackendURL) else redact(url)
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    hints = typing.get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for key, raw in options.items():
        if key not in fields:
            known = ", ".join(sorted(fields)) or "none"
            raise ConfigError(f"unknown option {key!r} in {shown!r}; known options: {known}")
        kwargs[key] = _convert(raw, hints[key], key, shown)
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"invalid options in {shown!r}: {exc}") from None
