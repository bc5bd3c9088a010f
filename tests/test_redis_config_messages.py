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


@pytest.mark.parametrize("option", ["tls_insecure=true", "tls_check_hostname=false", "tls_check_hostname=true"])
@pytest.mark.parametrize(
    ("url", "advice"),
    [
        ("redis://h:1", "(use rediss://)"),
        ("redis+sentinel://s1:1/m", "(use rediss+sentinel://)"),
        ("redis+cluster://h1:7000", "(use rediss+cluster://)"),
        ("redlock://a:1,b:2,c:3", "(add tls=true)"),
        ("redlock://a:1,b:2,c:3?tls=false", "(add tls=true)"),
        ("unix:///tmp/r.sock", "carries no TLS"),
    ],
)
def test_tls_verification_options_on_a_plaintext_url_are_refused(url: str, advice: str, option: str) -> None:
    """Docs audit F7: ``redis://…?tls_insecure=true`` (meant: TLS without verification) connected in plaintext
    without a word, while tls_ca on the same URL was refused. Any TLS option on a URL without TLS says the user
    believes it has TLS: refused alike, naming the option and how to turn TLS on."""
    full = f"{url}{'&' if '?' in url else '?'}{option}"
    with pytest.raises(lockkit.ConfigError) as caught:
        lockkit.connect(full)
    message = str(caught.value)
    assert advice in message and option.split("=")[0] in message and "does not use TLS" in message, message


@pytest.mark.parametrize(
    "url",
    [
        "rediss://h:1?tls_insecure=true&tls_check_hostname=false",
        "redlock://a:1,b:2,c:3?tls=true&tls_check_hostname=false",
        "rediss+sentinel://s1:1/m?tls_check_hostname=false",
        "rediss+cluster://h1:7000?tls_insecure=false",
    ],
)
def test_tls_verification_options_with_tls_are_accepted(url: str) -> None:
    from lockkit.drivers.redis.cluster_config import cluster_target
    from lockkit.drivers.redis.config import redis_nodes, redlock_nodes
    from lockkit.drivers.redis.sentinel_config import sentinel_target
    from lockkit.urls import parse_url

    parsed = parse_url(url)
    parse = {"rediss": redis_nodes, "redlock": redlock_nodes, "rediss+sentinel": sentinel_target}
    parse.get(parsed.scheme, cluster_target)(parsed)  # type: ignore[operator]
