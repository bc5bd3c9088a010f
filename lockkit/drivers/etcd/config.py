"""``etcd://`` / ``etcds://`` URL options of the etcd driver, and the client they open (no I/O until used)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ...errors import ConfigError
from ...urls import BackendURL, parse_options
from .client import EtcdClient, grpc
from .keys import DEFAULT_PREFIX

__all__ = ["DEFAULT_PORT", "EtcdOptions", "open_client"]

DEFAULT_PORT = 2379


@dataclass(frozen=True)
class EtcdOptions:
    prefix: str = DEFAULT_PREFIX
    """Every key lockkit creates starts with this (grant the role readwrite on it)."""
    timeout: float = 5.0
    """Seconds each request may take before the call fails with BackendUnavailable."""
    ca: str | None = None
    """etcds://: PEM file of the CA that signed the members' certificates (default: system roots)."""
    cert: str | None = None
    """etcds://: PEM client certificate, for --client-cert-auth."""
    key: str | None = None
    """etcds://: PEM private key of ``cert``."""

    def __post_init__(self) -> None:
        if not self.prefix:
            raise ConfigError(
                "prefix must not be empty (it separates lockkit's keys from the rest); set ?prefix=/myapp/locks/, or "
                "leave the option out for the default"
            )
        if not 0 < self.timeout <= 300:
            raise ConfigError(
                f"timeout must be between 0 and 300 seconds, got {self.timeout!r}; e.g. ?timeout=5 (the default)"
            )
        if (self.cert is None) != (self.key is None):
            raise ConfigError(
                "give both cert and key (client certificate authentication) or neither: add the missing one "
                "(?cert=client.pem&key=client.key) or remove the other"
            )


def _read_pem(path: str | None, what: str) -> bytes | None:
    if path is None:
        return None
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(
            f"cannot read the {what} file {path!r} ({exc.strerror}); check the path and that this user may read it"
        ) from None


def open_client(url: BackendURL) -> tuple[EtcdClient, EtcdOptions]:
    """Check ``url`` strictly and build its client (channels open lazily, on the first request)."""
    options = parse_options(EtcdOptions, url.options, url)
    if not url.hosts:
        raise ConfigError(f"{url.scheme}:// needs at least one host, e.g. {url.scheme}://127.0.0.1:2379; got {url}")
    if url.path not in ("", "/"):
        raise ConfigError(f"etcd URLs take no path; set the key prefix with ?prefix=/myapp/locks/ (got {url})")
    endpoints = url.host_port(DEFAULT_PORT)
    if len(set(endpoints)) != len(endpoints):
        raise ConfigError(f"duplicate etcd endpoint in {url}; list each endpoint once")
    if url.password is not None and not url.username:
        raise ConfigError(f"a password needs a user name: {url.scheme}://USER:PASSWORD@host (got {url})")
    credentials = None
    if url.scheme == "etcds":
        credentials = grpc.ssl_channel_credentials(
            root_certificates=_read_pem(options.ca, "CA"),
            private_key=_read_pem(options.key, "client key"),
            certificate_chain=_read_pem(options.cert, "client certificate"),
        )
    elif options.ca or options.cert:
        raise ConfigError(
            f"TLS options (ca, cert, key) need the etcds:// scheme; got {url}. Write etcds://, or remove them"
        )
    client = EtcdClient(
        endpoints,
        credentials=credentials,
        user=url.username,
        password=url.password,
        timeout=options.timeout,
        shown=str(url),
        prefix=options.prefix,
    )
    return client, options
