"""Bad arguments get a clear error from the one tree rooted at LockError (docs/semantics.md, Errors)."""

from __future__ import annotations

import pytest

import lockkit


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"auto_renew": 1}, "auto_renew must be True or False"),
        ({"auto_renew": "yes"}, "auto_renew must be True or False"),
        ({"on_lost": 5}, "on_lost must be a callable"),
        ({"ttl": True}, "ttl must be a number"),
        ({"timeout": -1}, "timeout must be"),
        ({"max_hold": 0}, "max_hold must be between"),
    ],
)
def test_bad_lock_arguments_raise_config_error(kwargs: dict[str, object], match: str) -> None:
    with lockkit.connect("memory://bad-input") as locks, pytest.raises(lockkit.ConfigError, match=match) as info:
        locks.lock("x", **kwargs)  # type: ignore[arg-type]
    assert isinstance(info.value, lockkit.LockError) and isinstance(info.value, ValueError)
