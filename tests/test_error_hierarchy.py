"""No error outside the LockError tree reaches a user (lockkit/errors.py): one test per site the audit of
2026-12-02 found raising a bare ValueError / RuntimeError / OSError, or letting one through, from a public call,
an option, the CLI, a file on disk or a server's reply. Each also checks that the message says what to do next.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import lockkit
from backends.servers import free_port
from lockkit.cli import growth
from lockkit.cli.contention import contention
from lockkit.drivers.embedded import FileOptions
from lockkit.drivers.zookeeper.client import CHECK, CREATE, Multi, founded
from lockkit.metrics import Totals
from lockkit.testing import FakeClock

ROOT = Path(__file__).resolve().parent.parent
LOCKKIT = [sys.executable, "-m", "lockkit.cli"]


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([*LOCKKIT, *args], capture_output=True, text=True, timeout=120, cwd=cwd, env=env)


def dead_redis(password: str = "") -> str:
    """A redis:// URL of a loopback port nothing listens on: every connection is refused at once."""
    auth = f":{password}@" if password else ""
    return f"redis://{auth}127.0.0.1:{free_port()}/0"


# -- lockkit/cli/contention.py, lockkit/cli/growth.py: the benchmark harness ------------------------------------


def test_a_failed_contention_run_is_a_lock_error_that_hides_the_password() -> None:
    """Was a RuntimeError naming the URL as given, password and all."""
    with pytest.raises(lockkit.LockError, match="lockkit check") as caught:
        contention(dead_redis("s3cret-pw"), 0.2, procs=1)
    assert "s3cret-pw" not in str(caught.value)
    assert "BackendUnavailable" in str(caught.value), "each process's reason is kept"


def test_a_failed_renewal_point_is_a_lock_error() -> None:
    """``lockkit bench --growth`` measures each lock count in a child process; its failure was a RuntimeError."""
    config = {"backends": {"default": {"url": dead_redis()}}}
    with pytest.raises(lockkit.LockError, match="Check the backend") as caught:
        growth.point_in_child(config, "default", 10, hold=0.1)
    assert "exited" in str(caught.value)


def test_a_growth_hold_of_nan_is_refused_before_the_run(tmp_path: Path) -> None:
    """Was a RuntimeError traceback (the child's time.sleep(nan)) after the uncontended measurement."""
    done = cli("bench", "--growth", "--url", "memory://", "--growth-locks", "10", "--growth-hold", "nan", cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert "--growth-hold: must be a finite number of seconds" in done.stderr


@pytest.mark.parametrize("option", ["--seconds", "--renew-seconds"])
def test_a_bench_length_of_nan_is_refused_with_its_option_named(tmp_path: Path, option: str) -> None:
    """Was ``lockkit bench: cannot convert float NaN to integer`` (or NaN's sleep error), naming no option."""
    done = cli("bench", "--url", "memory://", "--rounds", "2", option, "nan", cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert f"{option}: must be a finite number of seconds above 0" in done.stderr


def test_a_plot_path_in_a_missing_directory_is_refused_before_the_run(tmp_path: Path) -> None:
    """Was a FileNotFoundError traceback from matplotlib once the whole run was over."""
    target = tmp_path / "no-such-dir" / "bench.png"
    args = ("--rounds", "2", "--renew-locks", "1", "--renew-seconds", "0.1", "--plot", str(target))
    done = cli("bench", "--url", "memory://", *args, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert "is not a writable directory; create it, or give another path" in done.stderr
    assert "uncontended" not in done.stdout, "refused before measuring"


def test_a_plot_that_cannot_be_written_is_a_config_error(tmp_path: Path) -> None:
    """The same failure at the write itself (the directory went away during the run), from the public call."""
    pytest.importorskip("matplotlib")
    run = growth.Growth(
        "default",
        "memory://",
        0.1,
        [growth.ContentionPoint(p, 100.0 * p, 200.0, 1.0, 2.0, 1.0, 1) for p in (1, 2)],
        [growth.RenewalPoint(10, 4.5, 0.1, 10, 20.0, 500.0, True)],
    )
    with pytest.raises(lockkit.ConfigError, match="give a path in a writable directory"):
        growth.plot_growth([run], str(tmp_path / "gone" / "growth.png"))


def test_verify_against_an_unreachable_backend_fails_with_the_workers_error(tmp_path: Path) -> None:
    """Each worker died with a BackendUnavailable traceback, and the run still printed RESULT: ok, exit 0:
    a self-test that passed without testing anything. Now the controller's own first acquire (the pre-start
    check of lockkit/cli/preflight.py) finds it, in one line, before any worker starts."""
    for args in (["--json"], []):
        done = cli("verify", *args, "--url", dead_redis(), "--processes", "2", "--duration", "1", cwd=tmp_path)
        assert done.returncode == 1, done
        assert "could not connect" in done.stderr and "RESULT: ok" not in done.stdout, done
        assert "Traceback" not in done.stderr, done.stderr


def test_demo_on_a_process_local_backend_is_refused(tmp_path: Path) -> None:
    """Its workers are processes: the locked run lost updates too and the demo said 'updates were LOST: a bug'."""
    done = cli("demo", "--url", "memory://", "--workers", "2", "--deductions", "20", cwd=tmp_path)
    assert done.returncode == 2, done
    assert "locks only the threads of one process" in done.stderr and "a bug" not in done.stdout


def test_demo_against_an_unreachable_backend_says_why_once_and_hides_the_password(tmp_path: Path) -> None:
    """It printed the URL as given (password and all) and then a BackendUnavailable traceback per worker."""
    done = cli("demo", "--url", dead_redis("hunter2-pw"), "--workers", "2", "--deductions", "4", cwd=tmp_path)
    assert done.returncode == 1, done
    assert "hunter2-pw" not in done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert "could not connect" in done.stderr, done.stderr


# -- lockkit/drivers/embedded/file.py ----------------------------------------------------------------------------


def test_file_options_with_an_unknown_wakeup_are_a_config_error() -> None:
    """``FileOptions`` is exported (lockkit.drivers.embedded); built directly it raised a bare ValueError."""
    with pytest.raises(lockkit.ConfigError, match="leave it out for auto"):
        FileOptions(wakeup="carrier-pigeon")


def test_a_file_url_with_a_nul_in_its_path_is_a_config_error() -> None:
    """``%00`` decodes to a NUL, which pathlib refused with a bare ``ValueError: embedded null byte``."""
    with pytest.raises(lockkit.ConfigError, match="contains a NUL character"):
        lockkit.connect("file:///tmp/locks%00here")


# -- lockkit/config.py: from_config ------------------------------------------------------------------------------


@pytest.mark.parametrize("given", [None, ["lockkit.toml"], "lockkit\0.toml"])
def test_from_config_of_neither_a_path_nor_a_mapping_is_a_config_error(given: object) -> None:
    """open() answered these with a bare TypeError, or ValueError for the NUL."""
    with pytest.raises(lockkit.ConfigError, match=r"lockkit\.toml|NUL"):
        lockkit.from_config(given)  # type: ignore[arg-type]


# -- lockkit/guarded.py: @locker.locked ------------------------------------------------------------------------


@pytest.mark.parametrize("template", ["order:{order[5]}", "order:{order.id}", "order:{order:%Y}"])
def test_a_locked_template_that_does_not_fit_the_call_is_invalid_lock_name(template: str) -> None:
    """The template names a real parameter, but this call's value cannot fill it: the TypeError, AttributeError or
    ValueError of str.format escaped from the decorated call."""
    with lockkit.connect("memory://templates") as locks:

        @locks.locked(template)
        def ship(order: object) -> None:
            raise AssertionError("not reached: no lock, no call")

        with pytest.raises(lockkit.InvalidLockName, match="does not fit this call's arguments"):
            ship(3)


def test_the_embedded_default_without_a_home_directory_is_a_config_error(tmp_path: Path) -> None:
    """A container under an arbitrary uid: no HOME, no passwd entry. Path.home() raised a bare RuntimeError from
    a bare lockkit.connect(). The missing passwd entry is made by hiding the pwd module in the child (the test
    runs as root, whose entry exists): os.path.expanduser then finds no home, as it does for such a uid."""
    script = (
        "import sys; sys.modules['pwd'] = None\n"
        "import lockkit\n"
        "try:\n"
        "    lockkit.connect()\n"
        "except lockkit.ConfigError as exc:\n"
        "    print('ConfigError:', exc)\n"
    )
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=tmp_path, env=env
    )
    assert done.returncode == 0, done.stderr
    assert "ConfigError:" in done.stdout and "set XDG_STATE_HOME or HOME, or pass a URL" in done.stdout, done


# -- lockkit/metrics.py, lockkit/metrics_multiprocess.py ------------------------------------------------------


def test_totals_from_json_refuses_other_figures_with_a_config_error() -> None:
    good = Totals().to_json()
    for bad in ({}, [], {**good, "counts": {"nope": 1}}, {**good, "counts": dict.fromkeys(good["counts"], "x")}):
        with pytest.raises(lockkit.ConfigError, match="read it with the lockkit version that wrote it"):
            Totals.from_json(bad)


def _bounds_doc() -> dict[str, object]:
    from lockkit.metrics_multiprocess import FORMAT, _bounds

    return {"format": FORMAT, "bounds": _bounds()}


def test_a_scrape_skips_a_metrics_file_without_its_backends_table(tmp_path: Path) -> None:
    """A damaged file with the right format and bounds but no 'backends': collect() raised a bare KeyError."""
    pytest.importorskip("prometheus_client")
    from lockkit import metrics_multiprocess

    (tmp_path / "lockkit_1_abcd.json").write_text(json.dumps(_bounds_doc()))
    (tmp_path / "lockkit_2_abcd.json").write_text(json.dumps({**_bounds_doc(), "backends": []}))
    collector = metrics_multiprocess.MultiProcessCollector(None, path=tmp_path)
    assert list(collector.collect()), "the families are still exported, without the unreadable files"


def test_folding_into_an_unreadable_dead_total_is_a_lock_error(tmp_path: Path) -> None:
    """mark_process_dead raised a bare JSONDecodeError (a ValueError) from a damaged lockkit_dead.json."""
    from lockkit import metrics_multiprocess

    (tmp_path / "lockkit_4242_abcd.json").write_text(json.dumps({**_bounds_doc(), "backends": {}}))
    (tmp_path / metrics_multiprocess.DEAD).write_text("{ torn")
    with pytest.raises(lockkit.LockError, match="move it aside") as caught:
        metrics_multiprocess.mark_process_dead(4242, tmp_path)
    assert not isinstance(caught.value, ValueError), "not bad input: the file on disk is damaged"
    assert (tmp_path / "lockkit_4242_abcd.json").exists(), "the worker's file is kept for a later fold"


def test_a_metrics_lock_file_that_cannot_be_opened_is_backend_unavailable(tmp_path: Path) -> None:
    """The lock file's name taken by a directory (a root-proof stand-in for a read-only directory): a scrape
    raised a bare IsADirectoryError."""
    pytest.importorskip("prometheus_client")
    from lockkit import metrics_multiprocess

    (tmp_path / metrics_multiprocess.LOCK).mkdir()
    collector = metrics_multiprocess.MultiProcessCollector(None, path=tmp_path)
    with pytest.raises(lockkit.BackendUnavailable, match="check its owner and mode"):
        list(collector.collect())


# -- lockkit/testing/clock.py: shipped test support --------------------------------------------------------------


def test_fake_clock_refusals_are_config_errors() -> None:
    clock = FakeClock(1000.0)
    with pytest.raises(lockkit.ConfigError, match="pass a step of 0 or more"):
        clock.advance(-1)
    with pytest.raises(lockkit.ConfigError, match="set an instant at or after now"):
        clock.set(999.0)
    with pytest.raises(lockkit.ConfigError, match=r"pass a float such as 1\.5"):
        clock.advance(float("inf"))
    with pytest.raises(lockkit.ConfigError, match=r"pass a float such as 1\.5"):
        FakeClock("soon")  # type: ignore[arg-type]
    assert clock() == 1000.0, "a refused move moves nothing"


# -- lockkit/drivers/zookeeper/client.py: a multi reply lockkit cannot read ----------------------------------


def _multi_reply(*results: bytes) -> bytes:
    from kazoo.protocol.serialization import multiheader_struct

    return b"".join(results) + multiheader_struct.pack(-1, True, -1)


def test_an_unreadable_zookeeper_multi_reply_is_backend_unavailable() -> None:
    """kazoo hands what a reply's parser raises to the caller's result unchanged, so these reached acquire()
    as a bare ValueError (a result type lockkit never asks for), RuntimeError (kazoo's answer to an error
    code it does not know) or struct.error (a reply cut short). Driven at the parser: a real ZooKeeper server
    never sends them."""
    from kazoo.protocol.serialization import int_struct, multiheader_struct

    assert Multi.deserialize(_multi_reply(multiheader_struct.pack(CHECK, False, 0)), 0) == [True]
    unknown_type = _multi_reply(multiheader_struct.pack(99, False, 0))
    unknown_code = _multi_reply(multiheader_struct.pack(-1, False, 12345) + int_struct.pack(12345))
    cut_short = multiheader_struct.pack(CREATE, False, 0)  # a create's result without its path
    for reply in (unknown_type, unknown_code, cut_short):
        with pytest.raises(lockkit.BackendUnavailable, match=r"echo srvr \| nc HOST PORT"):
            Multi.deserialize(reply, 0)


def test_a_zookeeper_multi_reply_with_other_results_than_sent_is_backend_unavailable() -> None:
    """A well-formed reply whose results do not match the two creates sent (one result, or a check's True):
    unpacking them raised a bare ValueError or TypeError from acquire()."""
    from kazoo.protocol.states import ZnodeStat

    stat = ZnodeStat(*([1] * 11))
    assert founded([("/p", stat), ("/p/c-0000000001", None)]) == ("c-0000000001", 1)
    for results in ([("/p", stat)], [True, True], [("/p", stat), ("/p/c", None), True]):
        with pytest.raises(lockkit.BackendUnavailable, match=r"echo srvr \| nc HOST PORT"):
            founded(results)
