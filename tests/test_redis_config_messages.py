"""The advice of Redis URL errors fits the scheme it is given for (docs audit, 2026-12-02)."""

from __future__ import annotations

import pytest

import lockkit


@pytest.mark.parametrize(
    ("url", "advice"),
    [
        ("redis://h:1?tls_ca=/x", "(use rediss://)"),
        ("redis+sentinel://s1:1/m?tls_ca=/x", "(use rediss+sentinel://)"),
        ("redis+cluster://h1:7000?tls_ca=/x", "(use rediss+cluster://)"),
        ("redlock://a:1,b:2,c:3?tls_ca=/x", "(add tls=true)"),
        ("unix:///tmp/r.sock?tls_ca=/x", "carries no TLS"),
    ],
)
def test_tls_options_without_tls_say_how_to_turn_it_on_for_that_scheme(url: str, advice: str) -> None:
    with pytest.raises(lockkit.ConfigError) as caught:
        lockkit.connect(url)
    assert advice in str(caught.value)
    assert "tls=true" not in str(caught.value) or url.startswith("redlock")  # redis:// has no tls option
