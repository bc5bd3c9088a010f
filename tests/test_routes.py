"""Routes you can see and trust (issue 15): requirements, shadowed and never-matching routes, `lockkit routes`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import lockkit
from lockkit.config import parse_settings
from lockkit.routes import REQUIREMENTS


def _config(routes: dict[str, Any], tmp_path: Path) -> dict[str, Any]:
    return {
        "default": "fast",
        "backends": {
            "fast": {"url": "memory://routes"},
            "strong": {"url": (tmp_path / "locks").as_uri()},
            "redlock": {"url": "redlock://127.0.0.1:1,127.0.0.1:2,127.0.0.1:3/0"},
        },
        "routes": routes,
    }


def test_first_match_wins_and_the_default_catches_the_rest(tmp_path: Path) -> None:
    settings = parse_settings(_config({"payment:*": "strong", "inventory:*": "fast"}, tmp_path), "t.toml")
    assert settings.route("payment:9") == "strong"
    assert settings.route("inventory:1") == "fast"
    assert settings.route("report:1") == "fast"
    route = settings.route_for("payment:9")
    assert route is not None and route.pattern == "payment:*"
    assert settings.route_for("report:1") is None


def test_a_catch_all_above_a_route_is_refused(tmp_path: Path) -> None:
    with pytest.raises(lockkit.ConfigError, match=r"'payment:\*' can never match: the earlier route '\*'"):
        parse_settings(_config({"*": "fast", "payment:*": "strong"}, tmp_path), "t.toml")


@pytest.mark.parametrize(
    ("earlier", "later"),
    [("payment:*", "payment:refund:*"), ("payment:*", "payment:9"), ("pay*", "payment:?"), ("a?c", "abc")],
)
def test_shadowed_routes_are_refused(tmp_path: Path, earlier: str, later: str) -> None:
    with pytest.raises(lockkit.ConfigError, match="can never match"):
        parse_settings(_config({earlier: "fast", later: "strong"}, tmp_path), "t.toml")


def test_a_narrow_route_above_a_wide_one_is_fine(tmp_path: Path) -> None:
    settings = parse_settings(_config({"payment:refund:*": "fast", "payment:*": "strong"}, tmp_path), "t.toml")
    assert settings.route("payment:refund:1") == "fast"
    assert settings.route("payment:1") == "strong"


def test_a_prefix_without_wildcard_is_refused_and_exact_opts_out(tmp_path: Path) -> None:
    with pytest.raises(lockkit.ConfigError, match=r"has no wildcard.*Write \"inventory:\*\"") as caught:
        parse_settings(_config({"inventory:": "strong"}, tmp_path), "t.toml")
    assert "t.toml: [routes] 'inventory:'" in str(caught.value)
    settings = parse_settings(_config({"inventory:": {"backend": "strong", "exact": True}}, tmp_path), "t.toml")
    assert settings.route("inventory:") == "strong"
    assert settings.route("inventory:1") == "fast"
    # an exact name that does not look like a prefix needs no opt-out
    assert parse_settings(_config({"nightly": "strong"}, tmp_path), "t.toml").route("nightly") == "strong"


@pytest.mark.parametrize("pattern", ["", "x" * 600, "bad\ud800name"])
def test_a_pattern_no_name_can_match_is_refused(tmp_path: Path, pattern: str) -> None:
    with pytest.raises(lockkit.ConfigError, match="no lock name can match"):
        parse_settings(_config({pattern: "strong"}, tmp_path), "t.toml")


def test_route_tables_are_checked(tmp_path: Path) -> None:
    cases: list[tuple[Any, str]] = [
        ({"backend": "nope"}, "names no backend"),
        ({"require": ["fencing"]}, "missing 'backend'"),
        ({"backend": "strong", "require": "fencing"}, "must be a list"),
        ({"backend": "strong", "require": ["fast"]}, "unknown requirement 'fast'; known: consensus"),
        ({"backend": "strong", "colour": "red"}, "unknown key 'colour'"),
        ({"backend": "strong", "exact": "yes"}, "exact must be true or false"),
        (3, "expected a backend name or a table"),
    ]
    for value, message in cases:
        with pytest.raises(lockkit.ConfigError, match=message):
            parse_settings(_config({"payment:*": value}, tmp_path), "t.toml")


def test_a_requirement_the_backend_lacks_is_refused_before_anything_connects(tmp_path: Path) -> None:
    # redlock:// points at closed ports: the refusal must come from its declared guarantees, not a connection
    config = _config({"payment:*": {"backend": "redlock", "require": ["consensus", "fencing"]}}, tmp_path)
    with pytest.raises(lockkit.ConfigError) as caught:
        lockkit.from_config(config)
    message = str(caught.value)
    assert "'payment:*' requires consensus, fencing" in message
    assert "backend 'redlock'" in message and "fencing=none" in message


def test_a_met_requirement_opens(tmp_path: Path) -> None:
    config = _config({"payment:*": {"backend": "strong", "require": ["fencing", "server-wakeup"]}}, tmp_path)
    del config["backends"]["redlock"]
    with lockkit.from_config(config) as locks, locks.lock("payment:1", ttl=5) as lease:
        assert lease.fencing_token >= 1
        assert locks.backend_for("payment:1").name == "strong"


def test_a_migrate_backend_offers_the_weaker_side_in_every_phase(tmp_path: Path) -> None:
    for phase in ("old", "both", "new"):
        config = {
            "default": "mig",
            "backends": {
                "a": {"url": (tmp_path / "a").as_uri()},
                "b": {"url": "redlock://127.0.0.1:1,127.0.0.1:2,127.0.0.1:3/0"},
                "mig": {"migrate": {"from": "a", "to": "b", "phase": phase}},
            },
            "routes": {"payment:*": {"backend": "mig", "require": ["fencing"]}},
        }
        with pytest.raises(lockkit.ConfigError, match="requires fencing, but backend 'mig'"):
            lockkit.from_config(config)


def test_every_requirement_is_documented() -> None:
    text = (Path(__file__).parent.parent / "docs" / "configuration.md").read_text()
    for requirement in REQUIREMENTS:
        assert f"`{requirement}`" in text


def _lockkit(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "lockkit.cli", *args], capture_output=True, text=True, cwd=cwd, timeout=60
    )


def test_lockkit_routes_shows_the_table_and_where_names_go(tmp_path: Path) -> None:
    toml = tmp_path / "lockkit.toml"
    toml.write_text(
        'default = "fast"\n[backends.fast]\nurl = "memory://x"\n'
        f'[backends.strong]\nurl = "{(tmp_path / "locks").as_uri()}"\n'
        '[routes]\n"payment:*" = { backend = "strong", require = ["fencing"] }\n'
    )
    table = _lockkit("--config", str(toml), "routes", cwd=tmp_path)
    assert table.returncode == 0, table.stderr
    assert "payment:*" in table.stdout and "requires fencing" in table.stdout
    assert "(anything else)" in table.stdout and "scope host, fencing strict" in table.stdout
    names = _lockkit("routes", "--config", str(toml), "payment:1", "report:1", cwd=tmp_path)
    assert "payment:1 -> strong  (route 'payment:*'" in names.stdout
    assert "report:1 -> fast  (the default backend: no route matches" in names.stdout
    data = json.loads(_lockkit("routes", "--json", "payment:1", cwd=tmp_path).stdout)  # ./lockkit.toml
    assert data["names"]["payment:1"] == {"backend": "strong", "route": "payment:*"}
    assert data["backends"]["strong"]["fencing"] == "strict"


def test_lockkit_check_refuses_a_shadowed_route(tmp_path: Path) -> None:
    toml = tmp_path / "bad.toml"
    toml.write_text(
        'default = "fast"\n[backends.fast]\nurl = "memory://x"\n[backends.other]\nurl = "memory://y"\n'
        '[routes]\n"*" = "fast"\n"payment:*" = "other"\n'
    )
    done = _lockkit("check", "--config", str(toml), cwd=tmp_path)
    assert done.returncode == 2
    assert "'payment:*' can never match" in done.stderr


def test_lockkit_routes_refuses_a_requirement_the_backend_lacks(tmp_path: Path) -> None:
    """docs/cli.md: a requirement the backend lacks makes `routes`, like every subcommand, exit 2 (it printed the
    table and exited 0)."""
    toml = tmp_path / "unmet.toml"
    toml.write_text(
        'default = "fast"\n[backends.fast]\nurl = "memory://x"\n'
        '[routes]\n"export:*" = { backend = "fast", require = ["fifo"] }\n'
    )
    for args in (["routes"], ["routes", "export:1"], ["routes", "--json"], ["check"]):
        done = _lockkit(*args, "--config", str(toml), cwd=tmp_path)
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        assert "'export:*' requires fifo, but backend 'fast' does not offer it" in done.stderr
