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
        "redis://127.0.0.1:6379/0?client_name=a@b",
    ],
)
def test_an_at_sign_outside_the_authority_is_not_a_password(url: str) -> None:
    """Review finding: the percent-encode check refused URLs whose '@' sits in a path or a query."""
    parsed = lockkit.urls.parse_url(url)
    assert parsed.password is None and parsed.username is None
    if url.startswith("file:"):
        assert lockkit.urls.redact(url) == url


def test_a_variable_holding_user_and_password_still_splits_at_its_colon() -> None:
    """Review finding: "redis://${CREDS}@host" with CREDS=user:pass must stay user 'app', password 'p/w:x'."""
    from lockkit.config import parse_settings

    settings = parse_settings(
        {"backends": {"main": {"url": "redis://${CREDS}@127.0.0.1:6379/0"}}}, "<test>", {"CREDS": f"app:p/w:x{SECRET}"}
    )
    parsed = lockkit.urls.parse_url(settings.backends["main"].url)
    assert (parsed.username, parsed.password) == ("app", f"p/w:x{SECRET}")
