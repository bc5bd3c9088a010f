"""file:// specifics: crash-safe records, corrupt and unwritable state, reboots, the wake-up channel."""

from __future__ import annotations

import dataclasses
import os
import shutil
import socket
import threading
from pathlib import Path

import pytest

import lockkit
from lockkit import BackendUnavailable, ConfigError
from lockkit.driver import DriverContext
from lockkit.drivers.embedded import file_record
from lockkit.drivers.file import FileDriver
from lockkit.urls import parse_url


@pytest.fixture
def driver(tmp_path: Path) -> FileDriver:
    return FileDriver.from_url(parse_url((tmp_path / "locks").as_uri()), DriverContext())


def _record_path(driver: FileDriver, name: str) -> Path:
    return driver._path(name)


def test_corrupt_record_is_a_clear_error_and_changes_nothing(driver: FileDriver) -> None:
    assert driver.acquire("x", "a" * 32, 5, 0) is not None
    path = _record_path(driver, "x")
    path.write_bytes(b"garbage" * 100)
    with pytest.raises(BackendUnavailable, match=r"corrupt.*delete it"):
        driver.acquire("x", "b" * 32, 5, 0)
    assert path.read_bytes() == b"garbage" * 100


def test_a_torn_write_keeps_the_previous_record(driver: FileDriver) -> None:
    grant = driver.acquire("x", "a" * 32, 5, 0)
    assert grant is not None and driver.release("x", "a" * 32)
    path = _record_path(driver, "x")
    fd = os.open(path, os.O_RDWR)
    try:
        seq, record = file_record.read(fd)
        assert record is not None
        # a crash in the middle of the next write: the slot it was writing holds half a record
        os.pwrite(fd, b"LKR1" + b"\x00" * 7 + b"\x09" + b"\x00\x00\x10\x00" + b"\xff" * 40, ((seq + 1) % 2) * 65536)
    finally:
        os.close(fd)
    again = driver.acquire("x", "b" * 32, 5, 0)
    assert again is not None and again.fencing_token == grant.fencing_token + 1


def test_after_a_reboot_locks_are_free_but_fencing_carries_on(driver: FileDriver) -> None:
    first = driver.acquire("x", "a" * 32, 60, 0)
    assert first is not None
    # what a reboot looks like to the records on disk: this host's identity, another boot
    driver._id = dataclasses.replace(driver._id, boot="another-boot")
    second = driver.acquire("x", "b" * 32, 60, 0)
    assert second is not None and second.fencing_token == first.fencing_token + 1


def test_unwritable_directory_is_a_config_error(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(ConfigError, match="not writable"):
        lockkit.connect((blocker / "locks").as_uri())


@pytest.mark.parametrize("url", ["file://", "file:///", "file://host/x", "file://u:p@/x", "file:///x?fsink=1"])
def test_bad_file_urls(url: str) -> None:
    with pytest.raises(ConfigError):
        lockkit.connect(url)


def test_release_never_blocks_on_a_waiter_that_stopped_reading(driver: FileDriver) -> None:
    # A waiter's datagram queue holds ~10 wake-ups; a releaser holding the flock must not block on it.
    sleeper = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sleeper.bind("\0lockkit-test-sleeper")
    try:
        with driver._locked("x") as (record, _now):
            record.waiters.append("lockkit-test-sleeper")
        done = threading.Event()

        def churn() -> None:
            for i in range(100):
                token = f"{i:032d}"
                assert driver.acquire("x", token, 5, 0) is not None
                assert driver.release("x", token)
            done.set()

        threading.Thread(target=churn, daemon=True).start()
        assert done.wait(30), "a release blocked on a full wake-up queue"
    finally:
        sleeper.close()


def test_presence_on_a_missing_directory_raises_backend_unavailable(tmp_path: Path) -> None:
    """migrate:// reads presence through the driver: a vanished directory is a LockError, not a raw OSError."""
    directory = tmp_path / "gone"
    driver = FileDriver.from_url(parse_url(directory.as_uri()), DriverContext())
    shutil.rmtree(directory)
    with pytest.raises(BackendUnavailable, match="presence file"):
        driver.members("g")
    with pytest.raises(BackendUnavailable, match="presence file"):
        driver.announce("g", "m", "v", 5)


def test_a_presence_group_too_big_for_its_record_is_a_lock_error(tmp_path: Path) -> None:
    """Review finding: the record's size limit escaped as a raw ValueError from announce."""
    driver = FileDriver.from_url(parse_url((tmp_path / "p").as_uri()), DriverContext())
    with pytest.raises(BackendUnavailable, match="cannot hold this group"):
        for i in range(1000):
            driver.announce("big", f"member-{i}", "x" * 200, 30)
