"""Each error says what to do next (lockkit/errors.py, docs/semantics.md): a sample of the messages the
sweep of 2026-12-02 extended with a next step, triggered without any server (memory://, file://, bad URLs,
configs and arguments). Each case asserts the error's class, the wording it had before (other tests match on
it) and the advice it now ends with."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import pytest

import lockkit
from lockkit.config import backend_url, load_file, parse_settings
from lockkit.timing import validate_ttl
from lockkit.urls import parse_url


def _raises(call: Callable[[], object], kind: type[lockkit.LockError], before: str, advice: str) -> str:
    with pytest.raises(kind) as caught:
        call()
    text = str(caught.value)
    assert before in text, text
    assert advice in text, text
    return text


def test_a_bad_locked_call_says_which_argument_to_pass() -> None:
    with lockkit.connect("memory://sweep") as locks:
        _raises(lambda: locks.locked("a", limit=2, side="read"), lockkit.ConfigError, "not both", "drop one of them")
        _raises(lambda: locks.locked("a", side="up"), lockkit.ConfigError, "side must be", 'pass side="read"')


def test_a_bad_semaphore_limit_says_to_pass_an_int() -> None:
    with lockkit.connect("memory://sweep") as locks:
        _raises(lambda: locks.semaphore("s", 0), lockkit.ConfigError, "whole number", "pass an int, e.g. limit=3")


@pytest.mark.parametrize(
    ("ttl", "before", "advice"),
    [("30", "must be a number of seconds", "pass an int or float"), (math.nan, "got NaN", "pass a finite number")],
)
def test_a_bad_ttl_says_what_to_pass(ttl: object, before: str, advice: str) -> None:
    _raises(lambda: validate_ttl(ttl), lockkit.ConfigError, before, advice)  # type: ignore[arg-type]
    with lockkit.connect("memory://sweep") as locks:
        _raises(lambda: locks.lock("t", ttl=ttl), lockkit.ConfigError, before, advice)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("url", "before", "advice"),
    [
        ("redis://:6379/0", "empty host", "write scheme://host:port"),
        ("redis://[::1:6379/0", "malformed URL", "expected scheme://[user:password@]host:port/path"),
        ("redis://[::1]x/0", "after IPv6 host", "write it as [::1]:6379"),
        ("redis://h/0?timeout=1&timeout=2", "is given twice", "keep one"),
    ],
)
def test_a_malformed_url_says_how_to_write_it(url: str, before: str, advice: str) -> None:
    _raises(lambda: parse_url(url), lockkit.ConfigError, before, advice)


def test_a_url_that_is_not_text_says_to_pass_text() -> None:
    _raises(lambda: parse_url(6379), lockkit.ConfigError, "must be a str", "pass it as text")


def test_an_unknown_scheme_says_to_fix_it() -> None:
    _raises(lambda: lockkit.connect("mongo://h/0"), lockkit.ConfigError, "unknown lock backend scheme", "Fix the URL")


@pytest.mark.parametrize(
    ("url", "before", "advice"),
    [
        ("redis://h/0?pool_size=0", "pool_size must be ≥ 1", "pool_size=64 (the default)"),
        ("redis://h/0?health_check_interval=-1", "health_check_interval must be ≥ 0", "(the default)"),
        ("redis://h/0?timeout=0", "must be > 0 seconds", "e.g. timeout=1"),
        ("redis://h/1?db=2", "database given twice", "keep one of them"),
        ("rediss://h/0?tls_cert=/c.pem", "go together", "give both or neither"),
        ("redlock://a,b,c?retry_delay=-1", "retry_delay must be ≥ 0", "retry_delay=0.05"),
        ("redlock://a,b,a", "fakes a quorum", "list each master once"),
        ("redis+sentinel://s1/mymaster/0?failover_wait=0", "failover_wait must be > 0", "failover_wait=5"),
        ("etcd://a:2379,a:2379", "duplicate etcd endpoint", "list each endpoint once"),
        ("etcd://a:2379?prefix=", "prefix must not be empty", "?prefix=/myapp/locks/"),
        ("etcd://a:2379?ca=/ca.pem", "need the etcds:// scheme", "Write etcds://"),
        ("postgresql://h/app?max_sessions=1", "max_sessions must be", "set one in that range"),
        ("postgresql://h/app/extra", "one segment", "e.g. postgresql://host:5432/app"),
        ("zookeeper://h:2181/zookeeper/app", "which the server reserves", "choose another"),
        ("zookeeper://h:2181/app?layout=curatorr", "layout must be one of", "?layout=curator"),
    ],
)
def test_a_bad_backend_option_says_what_to_set(url: str, before: str, advice: str) -> None:
    # These are refused while the locker is built, before any server is contacted: no server runs here.
    _raises(lambda: lockkit.connect(url).close(), lockkit.ConfigError, before, advice)


def test_a_config_file_that_cannot_be_used_says_what_to_check(tmp_path: Path) -> None:
    _raises(lambda: load_file(tmp_path / "absent.toml"), lockkit.ConfigError, "does not exist", "check the path")
    broken = tmp_path / "broken.toml"
    broken.write_text("default = \n")
    _raises(lambda: load_file(broken), lockkit.ConfigError, "is not valid TOML", "fix the syntax")


def test_a_config_naming_what_is_not_there_says_what_to_name() -> None:
    unset = {"backends": {"main": {"url": "redis://${LOCKKIT_SWEEP_UNSET}/0"}}}
    _raises(lambda: parse_settings(unset, "t.toml", {}), lockkit.ConfigError, "is not set", "set it in the environment")
    two = {"default": "nope", "backends": {"a": {"url": "memory://a"}, "b": {"url": "memory://b"}}}
    _raises(lambda: parse_settings(two, "t.toml", {}), lockkit.ConfigError, "names no backend", "Set default to one")
    both = {"backends": {"a": {"url": "redis://h/0?timeout=1", "timeout": 2}}}
    spec = parse_settings(both, "t.toml", {}).backends["a"]
    _raises(lambda: backend_url(spec, "t.toml"), lockkit.ConfigError, "in both url and table", "keep it in one")


def test_current_lease_outside_a_decorated_function_says_what_to_use() -> None:
    _raises(lockkit.current_lease, lockkit.LockError, "only available inside", "use the Lease that acquire() returns")


def test_a_template_field_without_its_parameter_says_to_rename_one() -> None:
    with lockkit.connect("memory://sweep") as locks:

        def report(day: str) -> None: ...

        _raises(lambda: locks.locked("report:{dya}")(report), lockkit.ConfigError, "has no", "rename the field")


def test_a_lock_directory_gone_says_to_fix_it(tmp_path: Path) -> None:
    directory = tmp_path / "locks"
    directory.mkdir()
    with lockkit.connect(f"file://{directory}") as locks:
        directory.rmdir()  # os.access is False for a missing directory, even for root (who may write anywhere)
        [error] = locks.check().values()
        assert isinstance(error, lockkit.BackendUnavailable), error
        assert "is not writable" in str(error) and "fix its permissions or point file:// elsewhere" in str(error)


def test_a_bad_redis_presence_ttl_is_a_config_error_with_advice() -> None:
    # It was a bare ValueError, outside the LockError tree that etcd's and ZooKeeper's presence records use.
    from lockkit.drivers.redis.presence import announce_call

    for ttl in (0, -1.0, math.nan, math.inf):
        with pytest.raises(lockkit.ConfigError, match=r"presence ttl must be .*; pass e\.g\. 30"):
            announce_call("lk:", "g", "m", "v", ttl)
