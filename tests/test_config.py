"""lockkit.toml: backends, routes, defaults, ${ENV} secrets, strict validation."""

from __future__ import annotations

from pathlib import Path

import pytest

import lockkit
from lockkit import ConfigError
from lockkit.config import load_file, parse_settings, resolve_settings

SECRET = "s3cr3t-XYZ"


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "lockkit.toml"
    path.write_text(text)
    return path


def test_routes_default_and_override(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        f"""
default = "fast"
[backends.fast]
url = "memory://cfg-fast"
[backends.strong]
url = "{(tmp_path / "locks").as_uri()}"
[routes]
"payment:*" = "strong"
"inventory:*" = "strong"
""",
    )
    with lockkit.from_config(path) as locks:
        assert locks.lock("report:1").acquire().backend == "fast"
        assert locks.lock("payment:9").acquire().backend == "strong"
        assert locks.lock("report:2", backend="strong").acquire().backend == "strong"
        with pytest.raises(ConfigError, match="no backend named 'nope'"):
            locks.lock("x", backend="nope")
        assert set(locks.stats()) == {"fast", "strong"}


def test_env_expansion_and_secret_masking(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        """
[backends.main]
url = "memory://${SPACE}"
""",
    )
    settings = load_file(path, {"SPACE": "envspace"})
    assert settings.backends["main"].url == "memory://envspace"
    with pytest.raises(ConfigError, match=r"\$\{SPACE\}.*not set"):
        load_file(path, {})
    settings = parse_settings({"backends": {"r": {"url": "redis://u:${PW}@h/0"}}}, "x.toml", {"PW": SECRET})
    assert SECRET not in repr(settings)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ('defualt = "a"\n[backends.a]\nurl = "memory://"', "unknown top-level key 'defualt'"),
        ('[backends.a]\nurl = "memory://"\n[routes]\n"x*" = "b"', "names no backend"),
        ('default = "b"\n[backends.a]\nurl = "memory://"', "names no backend"),
        ("[backends.a]\nurll = 'memory://'", "missing 'url'"),
        ("[backends]", "no backends configured"),
        ('[backends.a]\nurl = "memory://"\n[backends.b]\nurl = "memory://"', "no 'default'"),
        ('[backends.a]\nurl = "memory://"\ntiemout = 3', "unknown option 'tiemout'"),
        ('[backends.a]\nurl = "nosuch://x"', "unknown lock backend scheme 'nosuch'"),
        ("[backends.a\nurl=", "not valid TOML"),
    ],
)
def test_config_errors_name_file_and_key(tmp_path: Path, text: str, fragment: str) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(ConfigError, match=fragment) as info:
        lockkit.from_config(path)
    assert str(path) in str(info.value) or "scheme" in str(info.value)


def test_missing_file() -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        lockkit.from_config("/nonexistent/lockkit.toml")


def test_resolution_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    assert resolve_settings(env={}).backends["default"].url.startswith("file://")
    assert str(tmp_path / "state") in resolve_settings(env={}).backends["default"].url
    _write(tmp_path, '[backends.a]\nurl = "memory://local"')
    assert resolve_settings(env={}).backends["a"].url == "memory://local"
    other = tmp_path / "other.toml"
    other.write_text('[backends.b]\nurl = "memory://other"')
    assert "b" in resolve_settings(env={"LOCKKIT_CONFIG": str(other)}).backends
    assert (
        resolve_settings(env={"LOCKKIT_URL": "memory://env", "LOCKKIT_CONFIG": str(other)}).backends["default"].url
        == "memory://env"
    )
    assert (
        resolve_settings("memory://explicit", env={"LOCKKIT_URL": "memory://env"}).backends["default"].url
        == "memory://explicit"
    )


def test_embedded_default_needs_no_configuration(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("LOCKKIT_URL", raising=False)
    monkeypatch.delenv("LOCKKIT_CONFIG", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    with lockkit.connect() as locks:
        with locks.lock("embedded") as lease:
            assert lease.valid
        assert (tmp_path / "state" / "lockkit" / "locks").is_dir()
        assert locks.guarantees()["default"].scope == "host"
