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
