"""file:// host and boot identity off Linux: where the boot id comes from without /proc, and what an unknown one means.

The absence of ``/proc`` is simulated by pointing the driver's reader at a missing file and by standing in for
``sysctlbyname(3)`` (which Linux's libc does not have); the locks themselves are real drivers on a real
directory.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from lockkit.driver import DriverContext
from lockkit.drivers.embedded import file_host, file_record
from lockkit.drivers.embedded.file import UNCERTAIN_SLACK, FileDriver
from lockkit.urls import parse_url

MAC_UUID = "3C0A7E2B-9F7D-4B8E-A3C1-5D2E6F7A8B9C"
FREEBSD_ID = bytes(range(16))


@pytest.fixture(autouse=True)
def _no_test_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(file_host.TEST_IDENTITY_ENV, raising=False)


def _no_proc(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, sysctls: dict[str, bytes] | None = None) -> list[str]:
    """No ``/proc``; ``sysctls`` what ``sysctlbyname`` answers. Returns the names the driver asked for."""
    asked: list[str] = []

    def sysctl(name: str) -> bytes | None:
        asked.append(name)
        return (sysctls or {}).get(name)

    monkeypatch.setattr(file_host, "_BOOT_ID_FILE", tmp_path / "no-proc" / "boot_id")
    monkeypatch.setattr(file_host, "_sysctl", sysctl)
    return asked


def test_linux_reads_the_boot_id_from_proc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    boot_id = tmp_path / "boot_id"
    boot_id.write_text("0f9c2c35-6c27-4c38-9f4e-1e6c1e2f3a4b\n")
    monkeypatch.setattr(file_host, "_BOOT_ID_FILE", boot_id)
    monkeypatch.setattr(file_host, "_sysctl", lambda name: pytest.fail(f"asked sysctl {name} although /proc has it"))
    assert file_host.current().boot == "0f9c2c35-6c27-4c38-9f4e-1e6c1e2f3a4b"


def test_macos_reads_kern_bootsessionuuid(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    asked = _no_proc(monkeypatch, tmp_path, {"kern.bootsessionuuid": MAC_UUID.encode() + b"\0"})
    assert file_host.current().boot == MAC_UUID
    assert asked == ["kern.bootsessionuuid"]


def test_freebsd_reads_kern_boot_id_as_hex(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    asked = _no_proc(monkeypatch, tmp_path, {"kern.boot_id": FREEBSD_ID})
    assert file_host.current().boot == FREEBSD_ID.hex()
    assert asked == ["kern.bootsessionuuid", "kern.boot_id"]


def test_without_any_boot_id_it_is_unknown_and_the_boot_time_is_never_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # kern.boottime is recomputed when the wall clock is stepped: two processes of one boot could disagree.
    asked = _no_proc(monkeypatch, tmp_path, {"kern.boottime": b"\x00" * 16, "kern.boot_id": b"\0" * 16})
    assert file_host.current().boot == file_host.UNKNOWN_BOOT
    assert "kern.boottime" not in asked


def test_sysctl_is_simply_absent_on_linux() -> None:
    assert file_host._sysctl("kern.bootsessionuuid") is None


def test_relation_of_a_record_to_this_process() -> None:
    me = file_host.HostIdentity("h1", "b1", "one")
    assert me.relation("h1", "b1") == "same"
    assert me.relation("h2", "b1") == "same", "containers of one host share its boot and clock"
    assert me.relation("h1", "b0") == "rebooted"
    assert me.relation("h2", "b2") == "foreign"
    assert me.relation("h1", "unknown") == "uncertain"
    assert me.relation("h2", "unknown") == "foreign"
    lost = file_host.HostIdentity("h1", "unknown", "one")
    assert lost.relation("h1", "b1") == "uncertain", "a boot id we cannot read is no evidence of a reboot"
    assert lost.relation("h1", "unknown") == "uncertain"
    assert lost.relation("h2", "unknown") == "foreign", "two hosts without boot ids are two clocks"


# -- the driver with an unknown boot id ------------------------------------------------------------------


def _driver(directory: Path) -> FileDriver:
    return FileDriver.from_url(parse_url(directory.as_uri()), DriverContext())


def _edit(driver: FileDriver, name: str, change: Callable[[dict[str, object]], None]) -> None:
    """Rewrite the record on disk as another process could have written it."""
    fd = os.open(driver._path(name), os.O_RDWR)
    try:
        seq, record = file_record.read(fd)
        assert record is not None
        change(record)
        file_record.write(fd, seq, record, False)
    finally:
        os.close(fd)


@pytest.mark.parametrize("unknown", ["holder", "reader"])
def test_a_live_lock_is_respected_when_one_side_has_no_boot_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, unknown: str
) -> None:
    """Before: an unreadable boot id differed from the holder's, which read as a reboot, and the lock as free."""
    directory = tmp_path / "locks"
    known = _driver(directory)
    _no_proc(monkeypatch, tmp_path)
    lost = _driver(directory)
    assert lost._id.boot == file_host.UNKNOWN_BOOT and known._id.boot != file_host.UNKNOWN_BOOT
    holder, reader = (lost, known) if unknown == "holder" else (known, lost)
    grant = holder.acquire("x", "a" * 32, 60, 0)
    assert grant is not None
    assert reader.acquire("x", "b" * 32, 60, 0) is None
    assert reader.holder("x").held


def test_an_expiry_beyond_its_ttl_gives_a_previous_boot_away(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _no_proc(monkeypatch, tmp_path)
    driver = _driver(tmp_path / "locks")
    first = driver.acquire("x", "a" * 32, 60, 0)
    assert first is not None
    # Written late in an earlier, longer boot: its monotonic expiry is far ahead of this boot's clock.
    _edit(driver, "x", lambda record: record.update(expires=time.monotonic() + 86400.0))
    second = driver.acquire("x", "b" * 32, 60, 0)
    assert second is not None and second.fencing_token == first.fencing_token + 1


def test_an_expiry_within_its_ttl_is_respected_although_the_boot_is_unknown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _no_proc(monkeypatch, tmp_path)
    driver = _driver(tmp_path / "locks")
    assert driver.acquire("x", "a" * 32, 60, 0) is not None
    _edit(driver, "x", lambda record: record.update(expires=time.monotonic() + 60.0 + UNCERTAIN_SLACK / 2))
    assert driver.acquire("x", "b" * 32, 60, 0) is None


def test_two_hosts_without_boot_ids_do_not_share_a_clock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: both boots were 'unknown', so another machine's monotonic expiry was compared with ours."""
    _no_proc(monkeypatch, tmp_path)
    here = _driver(tmp_path / "locks")
    there = _driver(tmp_path / "locks")
    there._id = dataclasses.replace(there._id, host="another-machine/other")
    assert there.acquire("x", "a" * 32, 5, 0) is not None
    _edit(here, "x", lambda record: record.update(expires=time.monotonic() - 100.0))  # "expired" on our clock
    assert here.acquire("x", "b" * 32, 5, 0) is None, "another machine's expiry was read on this host's clock"


def test_presence_of_an_unknown_boot_follows_the_same_rule(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    directory = tmp_path / "locks"
    known = _driver(directory)
    _no_proc(monkeypatch, tmp_path)
    lost = _driver(directory)
    lost.announce("g", "member", "v", 60)
    assert known.members("g") == {"member": "v"}, "a live member of an unknown boot was dropped"
    with known._presence("g") as live:
        live["member"]["expires"] = time.monotonic() + 86400.0  # an earlier boot's
    assert known.members("g") == {}
