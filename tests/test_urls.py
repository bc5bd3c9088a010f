"""URL parsing, strict driver options and password redaction."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from lockkit import ConfigError
from lockkit.urls import parse_options, parse_url, redact

SECRET = "s3cr3t-XYZ"


def test_multi_host_ipv6_and_percent_encoded_password() -> None:
    url = parse_url("redis://user:p%40ss%3Aw%2Frd@[::1]:6379,host2:6380,host3/0?socket_timeout=2")
    assert url.scheme == "redis"
    assert url.hosts == (("::1", 6379), ("host2", 6380), ("host3", None))
    assert url.username == "user" and url.password == "p@ss:w/rd"
    assert url.path == "/0" and dict(url.options) == {"socket_timeout": "2"}
    assert "p@ss" not in str(url) and "p@ss" not in repr(url)
    assert str(url) == "redis://user:***@[::1]:6379,host2:6380,host3/0?socket_timeout=2"


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "localhost:6379",
        "redis://h:0",
        "redis://h:70000",
        "redis://h:abc",
        "redis://[::1",
        "redis://h?a=1&a=2",
        "redis://,h",
    ],
)
def test_malformed_urls(bad: str) -> None:
    with pytest.raises(ConfigError):
        parse_url(bad)


def test_non_str_url() -> None:
    with pytest.raises(ConfigError):
        parse_url(None)


@pytest.mark.parametrize(
    "url",
    [f"redis://u:{SECRET}@h:1/0", f"redis://:{SECRET}@h", f"redis://u:{SECRET}@h:99999", f"etcd://u:{SECRET}@a,b?x"],
)
def test_password_never_in_errors_or_redaction(url: str) -> None:
    assert SECRET not in redact(url)
    try:
        parsed = parse_url(url)
        assert SECRET not in str(parsed) and SECRET not in repr(parsed)
    except ConfigError as exc:
        assert SECRET not in str(exc)


@dataclass(frozen=True)
class _Opts:
    timeout: float = 1.0
    strict: bool = False
    pool: int = 10
    prefix: str = "lk:"
    maybe: int | None = None


def test_options_are_converted() -> None:
    opts = parse_options(
        _Opts, {"timeout": "2.5", "strict": "yes", "pool": "3", "prefix": "x", "maybe": "none"}, "u://"
    )
    assert opts == _Opts(2.5, True, 3, "x", None)


@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        ({"tiemout": "1"}, "unknown option 'tiemout'"),
        ({"pool": "many"}, "must be a int"),
        ({"strict": "maybe"}, "must be a bool"),
        ({"timeout": "nan"}, "must be a float"),
    ],
)
def test_bad_options_name_the_key(options: dict[str, str], fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment) as info:
        parse_options(_Opts, options, f"redis://u:{SECRET}@h")
    assert SECRET not in str(info.value)
