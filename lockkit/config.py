"""Configuration: one URL, or a ``lockkit.toml`` with named backends, routes and a default.

::

    default = "fast"
    [backends.fast]
    url = "redis://cache:6379/0"
    [backends.strong]
    url = "etcd://etcd-1:2379,etcd-2:2379"
    prefix = "orders/"              # any other key is a driver option, as in the URL's query
    [routes]                        # first match wins; glob on the lock name
    "payment:*" = "strong"

Where the settings come from, in order: an explicit URL; ``LOCKKIT_URL``;
the file named by ``LOCKKIT_CONFIG``; ``./lockkit.toml``; otherwise the
embedded ``file://`` backend in a per-user state directory.

Strings may use ``${VAR}`` (and ``$$`` for a literal ``$``): secrets come from
the environment and never need to be written in the file. Everything is
checked at load time; errors name the file, the key and what was expected,
and never show a secret.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

from .drivers.epoch import OPTION as FENCING_EPOCH
from .drivers.epoch import parse_epoch
from .errors import ConfigError
from .routes import Route, check_shadowing, parse_route
from .urls import BackendURL, parse_url, redact

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib  # type: ignore[import-not-found,unused-ignore]

__all__ = ["BackendSpec", "Settings", "default_state_dir", "load_file", "resolve_settings", "settings_for_url"]

DEFAULT_BACKEND = "default"
_VAR = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|\$)")
_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


@dataclass(frozen=True)
class BackendSpec:
    name: str
    url: str = field(repr=False)
    options: Mapping[str, str] = field(default_factory=dict)
    migrate: Mapping[str, str] | None = None

    def __repr__(self) -> str:
        return f"BackendSpec({self.name!r}, {redact(self.url)!r})"


@dataclass(frozen=True)
class Settings:
    backends: Mapping[str, BackendSpec]
    routes: tuple[Route, ...] = ()
    default: str = DEFAULT_BACKEND
    source: str = "<url>"  # URL_SOURCE

    def route(self, name: str, backend: str | None = None) -> str:
        """The backend name a lock name goes to: explicit override, first matching route, else the default."""
        if backend is not None:
            if backend not in self.backends:
                known = ", ".join(sorted(self.backends))
                raise ConfigError(
                    f"no backend named {backend!r} in {self.source}; configured: {known}. "
                    "Use one of them, or add a [backends.NAME] table"
                )
            return backend
        route = self.route_for(name)
        return self.default if route is None else route.backend

    def route_for(self, name: str) -> Route | None:
        """The first route that matches ``name``; ``None`` when it goes to the default backend."""
        for route in self.routes:
            if route.matches(name):
                return route
        return None


def default_state_dir() -> Path:
    """Where the embedded ``file://`` default keeps its lock files (per user)."""
    base = os.environ.get("XDG_STATE_HOME")
    if not base:
        try:
            base = str(Path.home() / ".local" / "state")
        except RuntimeError:  # no HOME and no passwd entry: a container run under an arbitrary uid
            raise ConfigError(
                "the embedded default backend keeps its locks under $XDG_STATE_HOME or ~/.local/state, and this "
                "process has neither (no HOME, and its user has no home directory in the passwd database): set "
                "XDG_STATE_HOME or HOME, or pass a URL such as file:///var/lib/app/locks (or set LOCKKIT_URL)"
            ) from None
    return Path(base) / "lockkit" / "locks"


URL_SOURCE = "<url>"
"""The source of settings made from a URL passed in code."""


def settings_for_url(url: str, source: str = URL_SOURCE) -> Settings:
    return Settings({DEFAULT_BACKEND: BackendSpec(DEFAULT_BACKEND, url)}, (), DEFAULT_BACKEND, source)


_USERINFO_SAFE = "%!$&'()*+,;=-._~"
"""Left as they are in a variable expanded into a URL's user name or password: everything else (``@ : / ? #
[ ]``, spaces, non-ASCII) is percent-encoded. ``%`` is kept so that a value already percent-encoded, as the
docs once asked, still means what it meant."""


def _expand(value: str, where: str, env: Mapping[str, str], url: bool = False) -> str:
    # In a URL, the user name and password end at the last "@" after "://": a secret expanded there is
    # percent-encoded, or a "/" or "@" in it would move the host (and print the secret in the error).
    scheme_end = value.find("://") + 3 if url and "://" in value else -1
    userinfo_end = value.rfind("@") if scheme_end >= 3 else -1
    # "redis://${CREDS}@host" with CREDS=user:pass: when the template writes no ':' of its own in the userinfo,
    # the variable's first ':' is the user/password separator, as it was before values were encoded.
    written = _VAR.sub("", value[scheme_end:userinfo_end]) if userinfo_end > scheme_end else ""
    safe = _USERINFO_SAFE if ":" in written else _USERINFO_SAFE + ":"

    def substitute(match: re.Match[str]) -> str:
        var = match.group(1)
        if var is None:
            return "$"
        if var not in env:
            raise ConfigError(
                f"{where} uses ${{{var}}}, but the environment variable {var} is not set; "
                "set it in the environment of this process, or write the value into the file"
            )
        if scheme_end <= match.start() < userinfo_end:
            if safe.endswith(":"):
                user, colon, password = env[var].partition(":")
                return quote(user, safe=_USERINFO_SAFE) + colon + quote(password, safe=_USERINFO_SAFE)
            return quote(env[var], safe=_USERINFO_SAFE)
        return env[var]

    return _VAR.sub(substitute, value)


def _scalar(value: Any, where: str, env: Mapping[str, str]) -> str:
    if isinstance(value, str):
        return _expand(value, where, env)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    raise ConfigError(
        f"{where} must be a string, number or boolean, got {type(value).__name__}; write the value as one "
        "(quote it as a string if unsure)"
    )


def _table(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ConfigError(
            f"{where} must be a table, got {type(value).__name__}; write it as a [section] or an inline "
            "{ key = value }"
        )
    return value


def parse_settings(data: Mapping[str, Any], source: str, env: Mapping[str, str] | None = None) -> Settings:
    env = os.environ if env is None else env
    unknown = set(data) - {"default", "backends", "routes"}
    if unknown:
        raise ConfigError(f"{source}: unknown top-level key {sorted(unknown)[0]!r}; expected default, backends, routes")
    backends: dict[str, BackendSpec] = {}
    for name, raw in _table(data.get("backends", {}), f"{source}: [backends]").items():
        where = f"{source}: [backends.{name}]"
        if not _NAME.match(name):
            raise ConfigError(f"{where}: backend names use letters, digits, '_', '-' and '.'; rename the table")
        table = _table(raw, where)
        if "migrate" in table:
            migrate = _table(table["migrate"], f"{where} migrate")
            extra = set(table) - {"migrate"}
            if extra:
                raise ConfigError(
                    f"{where}: a migrate backend takes only 'migrate', not {sorted(extra)[0]!r}; "
                    "remove it (options go on the from and to backends)"
                )
            spec = {k: _scalar(v, f"{where} migrate.{k}", env) for k, v in migrate.items()}
            unknown_keys = set(spec) - {"from", "to", "phase", "group", "presence_ttl"}
            if unknown_keys or "phase" not in spec:
                wrong = f"unknown key {sorted(unknown_keys)[0]!r}" if unknown_keys else "missing 'phase'"
                raise ConfigError(
                    f"{where} migrate: {wrong}; expected from, to, phase (old|both|new), "
                    "and optionally group, presence_ttl"
                )
            if spec["phase"] not in ("old", "both", "new"):
                raise ConfigError(f"{where} migrate.phase = {spec['phase']!r}; expected old, both or new")
            backends[name] = BackendSpec(name, "migrate://", {}, spec)
            continue
        if "url" not in table:
            raise ConfigError(f"{where}: missing 'url' (e.g. url = \"redis://localhost:6379/0\")")
        raw_url = table["url"]
        url = (
            _expand(raw_url, f"{where} url", env, url=True)
            if isinstance(raw_url, str)
            else _scalar(raw_url, f"{where} url", env)
        )
        options = {k: _scalar(v, f"{where} {k}", env) for k, v in table.items() if k != "url"}
        if FENCING_EPOCH in options:
            parse_epoch(options[FENCING_EPOCH], where)  # checked here too, so the error names the file and key
        backends[name] = BackendSpec(name, url, options)
    if not backends:
        raise ConfigError(f"{source}: no backends configured; add a [backends.NAME] table with a url")
    default = data.get("default")
    if default is None:
        if len(backends) != 1:
            raise ConfigError(f"{source}: several backends but no 'default'; set default = \"NAME\"")
        default = next(iter(backends))
    if not isinstance(default, str) or default not in backends:
        raise ConfigError(
            f"{source}: default = {default!r} names no backend; configured: {', '.join(sorted(backends))}. "
            "Set default to one of them"
        )
    where_routes = f"{source}: [routes]"
    routes = [
        parse_route(pattern, value, backends, where_routes)
        for pattern, value in _table(data.get("routes", {}), where_routes).items()
    ]
    check_shadowing(routes, where_routes)
    for name, backend_spec in backends.items():
        if backend_spec.migrate is not None:
            for role in ("from", "to"):
                ref = backend_spec.migrate.get(role)
                if ref not in backends or ref == name or backends[ref].migrate is not None:
                    raise ConfigError(
                        f"{source}: [backends.{name}] migrate.{role} = {ref!r} must name another, non-migrate backend; "
                        "point it at a plain [backends.NAME] with a url"
                    )
                if _sets_epoch(backends[ref]):
                    raise ConfigError(
                        f"{source}: [backends.{name}] migrate.{role} = {ref!r}, which sets {FENCING_EPOCH}: the "
                        f"migration adds its own epoch. Put {FENCING_EPOCH} on the plain backend that replaces the "
                        "migration at its end (a separate [backends.NAME] with the same url while another migration "
                        "still uses this one); see docs/migration.md"
                    )
    return Settings(backends, tuple(routes), default, source)


def _sets_epoch(spec: BackendSpec) -> bool:
    if FENCING_EPOCH in spec.options:
        return True
    try:
        return FENCING_EPOCH in parse_url(spec.url).options
    except ConfigError:
        return False  # a bad URL is reported, with its backend's name, when the locker opens it


def load_file(path: str | os.PathLike[str], env: Mapping[str, str] | None = None) -> Settings:
    # Checked before open(), which answers these with a bare TypeError or ValueError ("embedded null byte").
    if not isinstance(path, (str, bytes, os.PathLike)):
        raise ConfigError(
            f"a config must be the path of a lockkit.toml or a mapping of its settings, got {type(path).__name__}; "
            "pass e.g. 'lockkit.toml' or {'backends': {'default': {'url': 'redis://localhost:6379/0'}}}"
        )
    source = str(path)
    if "\0" in os.fsdecode(path):
        raise ConfigError(f"config file path {source!r} contains a NUL character; remove it")
    try:
        with open(path, "rb") as handle:
            data = tomllib.load(handle)
    except FileNotFoundError:
        raise ConfigError(f"config file {source} does not exist; check the path, or create the file") from None
    except OSError as exc:
        raise ConfigError(
            f"cannot read config file {source}: {exc.strerror}; check that this user may read it"
        ) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source} is not valid TOML: {exc}; fix the syntax at that line") from None
    return parse_settings(data, source, env)


def resolve_settings(url: str | None = None, env: Mapping[str, str] | None = None) -> Settings:
    """Find the settings a bare ``lockkit.connect()`` uses (see the module docstring for the order)."""
    env = os.environ if env is None else env
    if url is not None:
        return settings_for_url(url)
    if env.get("LOCKKIT_URL"):
        return settings_for_url(env["LOCKKIT_URL"], "LOCKKIT_URL")
    if env.get("LOCKKIT_CONFIG"):
        return load_file(env["LOCKKIT_CONFIG"], env)
    local = Path("lockkit.toml")
    if local.is_file():
        return load_file(local, env)
    return settings_for_url(default_state_dir().as_uri(), "embedded default")


def backend_url(spec: BackendSpec, source: str) -> BackendURL:
    """The parsed URL of a configured backend, with its table's options merged in (a clash is an error)."""
    try:
        url = parse_url(spec.url)
    except ConfigError as exc:
        raise ConfigError(f"{where_backend(source, spec.name)}{exc}") from None
    if spec.options:
        merged = dict(url.options)
        for key, value in spec.options.items():
            if key in merged:
                raise ConfigError(
                    f"{source}: backend {spec.name!r}: option {key!r} is set in both url and table; "
                    "keep it in one of them"
                )
            merged[key] = value
        url = BackendURL(url.scheme, url.hosts, url.path, url.username, url.password, merged)
    return url


def where_backend(source: str, backend: str) -> str:
    """How an error about one backend says where it was configured: nothing more for a URL given in code
    (``connect(url)`` has one backend, named by nobody), else the file (or variable) and the backend's name."""
    return "" if source == URL_SOURCE else f"{source}: backend {backend!r}: "
