"""Driver discovery: built-in schemes, entry points, lazy imports, missing extras."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys

import pytest

import lockkit
from lockkit import ConfigError, registry


def test_import_lockkit_loads_no_backend_client() -> None:
    code = "import sys, lockkit; bad = {'redis', 'kazoo', 'pyetcd', 'grpc'} & set(sys.modules); print(sorted(bad))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_unknown_scheme_lists_known_ones() -> None:
    with pytest.raises(ConfigError, match=r"unknown lock backend scheme 'mongo'; known schemes: .*etcd.*redis"):
        lockkit.connect("mongo://h")


@pytest.mark.parametrize(
    ("url", "client", "extra"),
    [
        ("redis://127.0.0.1:1/0", "redis", "redis"),
        ("zookeeper://127.0.0.1:1", "kazoo", "zookeeper"),
        ("etcd://127.0.0.1:1", "pyetcd", "etcd"),
    ],
)
def test_missing_client_names_the_extra(url: str, client: str, extra: str) -> None:
    code = (
        f"import sys; sys.modules[{client!r}] = None\n"
        "import lockkit\n"
        f"try:\n    lockkit.connect({url!r})\nexcept lockkit.ConfigError as exc:\n    print(exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60).stdout
    assert "pip install" in out and f"'lockkit[{extra}]'" in out


def test_entry_point_drivers_are_found(monkeypatch: pytest.MonkeyPatch) -> None:
    plugin = importlib.metadata.EntryPoint(
        name="custom", value="lockkit.drivers.memory:MemoryDriver", group="lockkit.drivers"
    )
    monkeypatch.setattr(registry, "_entry_points", lambda: {"custom": plugin})
    with lockkit.connect("custom://plugin") as locks, locks.lock("x") as lease:
        assert lease.valid


def test_every_builtin_declares_guarantees() -> None:
    for scheme in ("memory", "file"):
        factory = registry.load_factory(scheme)
        assert factory.guarantees.scope in ("process", "host")
        assert factory.guarantees.fencing == "strict"


@pytest.mark.parametrize(
    ("module", "names"),
    [
        ("lockkit.drivers.redis", ["RedisDriver", "AsyncRedisDriver"]),
        ("lockkit.drivers.redlock", ["RedlockDriver", "AsyncRedlockDriver"]),
        ("lockkit.drivers.etcd", ["EtcdDriver", "EtcdOptions"]),
        ("lockkit.drivers.zookeeper", ["ZooKeeperDriver", "ZooKeeperOptions"]),
        ("lockkit.drivers.file", ["FileDriver", "FileOptions"]),
        ("lockkit.drivers.memory", ["MemoryDriver"]),
        ("lockkit.drivers.migrate", ["MigrateDriver"]),
        ("lockkit.cli", ["main"]),
    ],
)
def test_the_import_paths_of_the_flat_layout_still_work(module: str, names: list[str]) -> None:
    """Issue 13 moved the drivers into one package per backend: user code importing the old paths needs no edit."""
    mod = importlib.import_module(module)
    for name in names:
        assert getattr(mod, name) is not None, f"{module}.{name}"
    assert set(names) <= set(getattr(mod, "__all__", names))


def test_the_registry_and_the_old_paths_name_the_same_classes() -> None:
    from lockkit.drivers.file import FileDriver
    from lockkit.drivers.memory import MemoryDriver
    from lockkit.drivers.redis import RedisDriver
    from lockkit.drivers.redlock import RedlockDriver

    assert registry.load_factory("memory") is MemoryDriver
    assert registry.load_factory("file") is FileDriver
    assert registry.load_factory("redis") is RedisDriver
    assert registry.load_factory("redlock") is RedlockDriver
