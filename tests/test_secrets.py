"""No secret (password, lease token) ever appears in a repr, a log line or an error message."""

from __future__ import annotations

import logging
import traceback

import pytest

import lockkit
from lockkit import BackendUnavailable

SECRET = "s3cr3t-XYZ"


def _chain(exc: BaseException) -> str:
    return "".join(traceback.format_exception(exc))


@pytest.mark.parametrize(
    "url",
    [
        f"redis://app:{SECRET}@127.0.0.1:1/0?timeout=0.3&connect_timeout=0.3",
        f"redlock://app:{SECRET}@127.0.0.1:1,127.0.0.1:2,127.0.0.1:3/0",
        f"zookeeper://app:{SECRET}@127.0.0.1:1?connect_timeout=0.5",
        f"etcd://app:{SECRET}@127.0.0.1:1?timeout=0.5",
    ],
)
def test_unreachable_backend_with_password(url: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    locks = lockkit.connect(url)  # drivers connect lazily: no I/O, so no error yet
    try:
        assert SECRET not in repr(locks) and SECRET not in str(locks.describe())
        lock = locks.lock("secret-test", ttl=2)
        assert SECRET not in repr(lock)
        with pytest.raises(BackendUnavailable) as info:
            lock.acquire(timeout=1)
        assert SECRET not in _chain(info.value)
        result = locks.check()
        assert SECRET not in repr(result)
    finally:
        locks.close()
    assert SECRET not in caplog.text


def test_lease_token_is_never_logged(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    with lockkit.connect("memory://secrets") as locks:
        lease = locks.lock("x", ttl=0.2, auto_renew=False).acquire()
        assert lease.token not in repr(lease)
        locks.force_release("x")
    assert lease.token not in caplog.text


def test_config_secret_from_environment_is_masked(
    tmp_path: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REDIS_PASSWORD", SECRET)
    path = tmp_path / "lockkit.toml"  # type: ignore[operator]
    path.write_text('[backends.main]\nurl = "redis://app:${REDIS_PASSWORD}@127.0.0.1:1/0"\nbogus = 1\n')
    with pytest.raises(lockkit.ConfigError) as info:
        lockkit.from_config(path)
    assert "bogus" in str(info.value) and SECRET not in _chain(info.value)


RESERVED = ":/?#[]@!$&'()*+,;=% "


@pytest.mark.parametrize("char", list(RESERVED))
@pytest.mark.parametrize("scheme", ["redis", "redlock", "zookeeper", "etcd"])
def test_password_with_a_reserved_character_is_never_shown(scheme: str, char: str) -> None:
    """A password with a reserved character left unencoded must not leak through the error that follows."""
    hosts = "127.0.0.1:1,127.0.0.1:2,127.0.0.1:3" if scheme == "redlock" else "127.0.0.1:1"
    secret = f"pa{char}ss-{SECRET}"
    url = f"{scheme}://app:{secret}@{hosts}/0"
    assert SECRET not in lockkit.urls.redact(url)
    try:
        locks = lockkit.connect(url)
    except lockkit.ConfigError as exc:
        assert SECRET not in _chain(exc), f"{char!r}: {exc}"
        return
    try:
        assert SECRET not in repr(locks) and SECRET not in str(locks.describe())
    finally:
        locks.close()


@pytest.mark.parametrize("char", list(RESERVED))
def test_percent_encoded_reserved_password_round_trips(char: str) -> None:
    from urllib.parse import quote

    password = f"pa{char}ss-{SECRET}"
    parsed = lockkit.urls.parse_url(f"redis://app:{quote(password, safe='')}@127.0.0.1:6379/0")
    assert parsed.password == password and parsed.hosts == (("127.0.0.1", 6379),)
    assert SECRET not in str(parsed) and SECRET not in repr(parsed)


def test_unencoded_slash_in_password_says_to_percent_encode() -> None:
    with pytest.raises(lockkit.ConfigError, match="Percent-encode") as info:
        lockkit.connect(f"redis://app:pa/ss-{SECRET}@127.0.0.1:1/0")
    assert SECRET not in _chain(info.value)


@pytest.mark.parametrize("char", list(RESERVED))
def test_password_from_the_environment_may_hold_any_character(char: str) -> None:
    """${VAR} in a lockkit.toml URL's password is percent-encoded, so a '/' or '@' in the secret works."""
    password = f"pa{char}ss-{SECRET}" if char != "%" else f"pa%25ss-{SECRET}"
    from lockkit.config import parse_settings

    settings = parse_settings(
        {"backends": {"main": {"url": "redis://app:${LK_TEST_PASSWORD}@127.0.0.1:6379/0"}}},
        "<test>",
        {"LK_TEST_PASSWORD": password},
    )
    parsed = lockkit.urls.parse_url(settings.backends["main"].url)
    expected = password if char != "%" else f"pa%ss-{SECRET}"
    assert parsed.password == expected and parsed.hosts == (("127.0.0.1", 6379),)


@pytest.mark.parametrize(
    "url",
    [
        "file:///tmp/lockkit-user@corp.example",
        "memory://x?group=a@b",
        "redis://127.0.0.1/0?client_name=a@b",
    ],
)
def test_an_at_sign_outside_the_authority_is_not_a_password(url: str) -> None:
    """Review finding: the percent-encode check refused URLs whose '@' sits in a path or a query.

    Only where the text before it cannot be a ``user:password``: no authority, or a host part with no ':'.
    """
    parsed = lockkit.urls.parse_url(url)
    assert parsed.password is None and parsed.username is None
    if url.startswith("file:"):
        assert lockkit.urls.redact(url) == url


# A password that starts with digits and holds an unencoded '/', '?' or '#' reads as a host:port followed by a
# path, a query or a fragment (the host part ends at the first of them). Before, each of these was taken so:
# the locker pointed at host "app" with the password's first digits shown as its port, the rest of the password
# in a ZooKeeper chroot, a PostgreSQL database name or an option, or dropped with a fragment; the errors of the
# etcd and PostgreSQL path checks printed the password in full.
PREFIX = "48213"
AMBIGUOUS = [
    f"etcd://app:{PREFIX}#zz{SECRET}@127.0.0.1:2379",
    f"zookeeper://app:{PREFIX}/{SECRET}@127.0.0.1:2181/app",
    f"postgresql://app:{PREFIX}#{SECRET}@127.0.0.1/orders",
    f"postgresql://app:{PREFIX}/{SECRET}@127.0.0.1/orders",
    f"etcd://app:{PREFIX}/{SECRET}@127.0.0.1",
    f"redis://app:{PREFIX}?x={SECRET}@127.0.0.1:6379/0",
    f"redis://app:pa#ss{SECRET}@127.0.0.1:6379/0",
    f"redis://app:{PREFIX}@{SECRET}/0?client_name=a@127.0.0.1",
]


@pytest.mark.parametrize("url", AMBIGUOUS)
def test_a_password_that_reads_as_a_port_is_refused_not_guessed(url: str) -> None:
    with pytest.raises(lockkit.ConfigError, match=r"Percent-encode|%23") as info:
        lockkit.connect(url)
    assert SECRET not in _chain(info.value) and PREFIX not in _chain(info.value)


@pytest.mark.parametrize("url", AMBIGUOUS)
def test_the_same_password_percent_encoded_is_taken_whole(url: str) -> None:
    from urllib.parse import quote

    scheme, _, rest = url.partition("://")
    userinfo, _, hosts = rest.rpartition("@")
    user, _, password = userinfo.partition(":")
    parsed = lockkit.urls.parse_url(f"{scheme}://{user}:{quote(password, safe='')}@{hosts}")
    assert parsed.password == password and parsed.hosts[0][0] == "127.0.0.1"
    assert SECRET not in repr(parsed) and PREFIX not in repr(parsed)


def test_a_fragment_is_refused_not_dropped() -> None:
    """Options are strict: the text after a '#' was dropped without a word."""
    with pytest.raises(lockkit.ConfigError, match="fragment") as info:
        lockkit.connect(f"etcd://app:{SECRET}@127.0.0.1:2379?prefix=/a#b")
    assert SECRET not in _chain(info.value)
    assert dict(lockkit.urls.parse_url("etcd://127.0.0.1:2379?prefix=/a%23b").options) == {"prefix": "/a#b"}


def test_an_at_sign_after_a_host_and_port_is_written_percent_encoded() -> None:
    """After a host:port, an '@' in an option value could end a password; %40 says it is the value's."""
    with pytest.raises(lockkit.ConfigError, match="%40"):
        lockkit.urls.parse_url("redis://127.0.0.1:6379/0?client_name=a@b")
    parsed = lockkit.urls.parse_url("redis://127.0.0.1:6379/0?client_name=a%40b")
    assert parsed.hosts == (("127.0.0.1", 6379),) and dict(parsed.options) == {"client_name": "a@b"}


def test_a_variable_holding_user_and_password_still_splits_at_its_colon() -> None:
    """Review finding: "redis://${CREDS}@host" with CREDS=user:pass must stay user 'app', password 'p/w:x'."""
    from lockkit.config import parse_settings

    settings = parse_settings(
        {"backends": {"main": {"url": "redis://${CREDS}@127.0.0.1:6379/0"}}}, "<test>", {"CREDS": f"app:p/w:x{SECRET}"}
    )
    parsed = lockkit.urls.parse_url(settings.backends["main"].url)
    assert (parsed.username, parsed.password) == ("app", f"p/w:x{SECRET}")
