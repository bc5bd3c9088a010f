"""lockkit_* metrics of several processes, summed at one scrape (lockkit.metrics_multiprocess).

The workers are real processes (fresh interpreters, and children forked the way a preloading gunicorn forks
its workers) taking one file:// lock in turn; the test process only scrapes the directory.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

prometheus_client = pytest.importorskip("prometheus_client")

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402  (after the skip)

from lockkit import ConfigError, metrics_multiprocess  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent

# Each worker: n acquisitions of a lock all workers share, and one try_acquire that finds it held (a timeout).
WORKER = textwrap.dedent(
    """
    import sys

    import lockkit

    url, n = sys.argv[1], int(sys.argv[2])
    with lockkit.connect(url) as locks:
        lock = locks.lock("shared", ttl=10, timeout=60)
        for _ in range(n):
            with lock:
                pass
        with lock:
            assert locks.lock("shared").try_acquire() is None
        if len(sys.argv) > 3:  # stay alive, still holding nothing, until the test lets go
            print("ready", flush=True)
            sys.stdin.readline()
    """
)


def run(script: str, *args: str, directory: Path, **popen: object) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PROMETHEUS_MULTIPROC_DIR": str(directory)}
    return subprocess.Popen(  # type: ignore[call-overload, no-any-return]
        [sys.executable, "-c", script, *args], env=env, text=True, **popen
    )


def scrape(directory: Path) -> tuple[dict[str, float], str]:
    """One scrape of the directory: (name -> value of the backend="default" samples, the exposition text)."""
    registry = prometheus_client.CollectorRegistry()
    metrics_multiprocess.MultiProcessCollector(registry, path=directory)
    text = prometheus_client.generate_latest(registry).decode()
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.labels.get("backend") == "default":
                key = sample.name + (f"{{le={sample.labels['le']}}}" if "le" in sample.labels else "")
                values[key] = sample.value
    return values, text


@pytest.fixture
def directory(tmp_path: Path) -> Path:
    path = tmp_path / "metrics"
    path.mkdir()
    return path


def lock_url(tmp_path: Path) -> str:
    return f"file://{tmp_path}/locks"


def test_one_scrape_sums_every_worker(tmp_path: Path, directory: Path) -> None:
    workers = [run(WORKER, lock_url(tmp_path), str(10 + i), directory=directory) for i in range(4)]
    for worker in workers:
        assert worker.wait(60) == 0
    values, _ = scrape(directory)
    acquired = sum(10 + i + 1 for i in range(4))  # each worker's n, and the hold around its try_acquire
    assert values["lockkit_acquisitions_total"] == acquired
    assert values["lockkit_releases_total"] == acquired
    assert values["lockkit_timeouts_total"] == 4
    assert values["lockkit_wait_seconds_count"] == acquired
    assert values["lockkit_wait_seconds_bucket{le=+Inf}"] == acquired
    assert values["lockkit_hold_seconds_count"] == acquired
    assert values["lockkit_ttl_used_ratio_count"] == acquired
    assert values["lockkit_ttl_used_ratio_bucket{le=0.5}"] == acquired  # nothing came near its 10 s TTL
    assert len(list(directory.glob("lockkit_*.json"))) == 4  # one file each, written as they exited


def test_a_live_worker_is_seen_then_folded_when_dead(tmp_path: Path, directory: Path) -> None:
    worker = run(WORKER, lock_url(tmp_path), "5", "stay", directory=directory, stdin=subprocess.PIPE,
                 stdout=subprocess.PIPE)  # fmt: skip
    try:
        assert worker.stdout is not None and worker.stdout.readline() == "ready\n"
        deadline = time.monotonic() + 10 * metrics_multiprocess.FLUSH_INTERVAL
        while scrape(directory)[0].get("lockkit_acquisitions_total") != 6:  # written by its thread, not at exit
            assert time.monotonic() < deadline, "a live worker's figures never reached the directory"
            time.sleep(0.05)
    finally:
        assert worker.stdin is not None and worker.stdout is not None
        worker.stdin.close()
        assert worker.wait(60) == 0
        worker.stdout.close()
    before, _ = scrape(directory)
    survivor = run(WORKER, lock_url(tmp_path), "2", directory=directory)  # one that lives on: never folded
    assert survivor.wait(60) == 0
    metrics_multiprocess.mark_process_dead(worker.pid, directory)
    names = sorted(p.name for p in directory.glob("lockkit_*.json"))
    assert "lockkit_dead.json" in names and not any(n.startswith(f"lockkit_{worker.pid}_") for n in names)
    after, _ = scrape(directory)
    assert after["lockkit_acquisitions_total"] == before["lockkit_acquisitions_total"] + 3
    metrics_multiprocess.mark_process_dead(worker.pid, directory)  # again: nothing left to fold, nothing changes
    assert scrape(directory)[0] == after


def test_a_fold_cut_short_counts_nothing_twice(
    tmp_path: Path, directory: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A crash between writing the dead processes' sum and removing the files: the readers skip those files."""
    workers = [run(WORKER, lock_url(tmp_path), "3", directory=directory) for _ in range(2)]
    for worker in workers:
        assert worker.wait(60) == 0
    before, _ = scrape(directory)

    def crash(self: Path, missing_ok: bool = False) -> None:
        raise KeyboardInterrupt  # as if the process died right here

    monkeypatch.setattr(Path, "unlink", crash)
    with pytest.raises(KeyboardInterrupt):
        metrics_multiprocess.mark_process_dead(workers[0].pid, directory)
    monkeypatch.undo()
    assert len(list(directory.glob(f"lockkit_{workers[0].pid}_*.json"))) == 1  # still there, and in the sum
    assert scrape(directory)[0] == before
    metrics_multiprocess.mark_process_dead(workers[1].pid, directory)  # the next fold finishes the cut one
    assert scrape(directory)[0] == before
    assert sorted(p.name for p in directory.glob("lockkit_*.json")) == ["lockkit_dead.json"]


# A preloading server: the parent opens a locker and locks before it forks; each child locks on its own.
PRELOAD = textwrap.dedent(
    """
    import os
    import sys

    import lockkit

    url = sys.argv[1]
    locks = lockkit.connect(url)
    for _ in range(7):  # still queued in the parent at fork: the children must not count them
        with locks.lock("shared", ttl=10):
            pass
    children = []
    for _ in range(3):
        pid = os.fork()
        if pid == 0:
            with lockkit.connect(url) as mine:
                for _ in range(5):
                    with mine.lock("shared", ttl=10, timeout=60):
                        pass
            sys.exit(0)  # a normal exit, as a gunicorn worker's: atexit writes the file
        children.append(pid)
    for pid in children:
        assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
    locks.close()
    """
)


def test_forked_children_count_their_own_and_not_their_parents(tmp_path: Path, directory: Path) -> None:
    parent = run(PRELOAD, lock_url(tmp_path), directory=directory)
    assert parent.wait(60) == 0
    values, _ = scrape(directory)
    assert values["lockkit_acquisitions_total"] == 7 + 3 * 5
    assert values["lockkit_wait_seconds_count"] == 7 + 3 * 5
    assert len(list(directory.glob("lockkit_*.json"))) == 4  # the parent's and one per child


def test_the_scraped_worker_counts_its_latest_events(tmp_path: Path, directory: Path) -> None:
    """A worker that serves /metrics writes its own file first: its events of a moment ago are in."""
    script = textwrap.dedent(
        """
        import sys

        import prometheus_client

        import lockkit
        from lockkit import metrics_multiprocess

        with lockkit.connect(sys.argv[1]) as locks:
            for _ in range(3):
                with locks.lock("x", ttl=10):
                    pass
            registry = prometheus_client.CollectorRegistry()
            metrics_multiprocess.MultiProcessCollector(registry)
            print(registry.get_sample_value("lockkit_acquisitions_total", {"backend": "default"}))
        """
    )
    worker = run(script, lock_url(tmp_path), directory=directory, stdout=subprocess.PIPE)
    out, _ = worker.communicate(timeout=60)
    assert worker.returncode == 0 and float(out) == 3


def test_backends_are_labelled_apart(tmp_path: Path, directory: Path) -> None:
    script = textwrap.dedent(
        """
        import sys

        import lockkit

        config = {"default": "a", "backends": {"a": {"url": sys.argv[1] + "-a"}, "b": {"url": sys.argv[1] + "-b"}}}
        with lockkit.from_config(config) as locks:
            with locks.lock("x", backend="a"):
                pass
            for _ in range(2):
                with locks.lock("x", backend="b"):
                    pass
        """
    )
    for _ in range(2):
        assert run(script, lock_url(tmp_path), directory=directory).wait(60) == 0
    registry = prometheus_client.CollectorRegistry()
    metrics_multiprocess.MultiProcessCollector(registry, path=directory)
    assert registry.get_sample_value("lockkit_acquisitions_total", {"backend": "a"}) == 2
    assert registry.get_sample_value("lockkit_acquisitions_total", {"backend": "b"}) == 4


def test_files_of_another_format_are_skipped_not_summed(directory: Path, caplog: pytest.LogCaptureFixture) -> None:
    (directory / "lockkit_1_0000.json").write_text('{"format": 99}')
    (directory / "lockkit_2_0000.json").write_text("{not json")
    values, text = scrape(directory)
    assert values == {} and "lockkit_acquisitions_total" in text  # the families, with no samples
    assert sum("ignoring unreadable metrics file" in r.message for r in caplog.records) == 2


def test_misuse_is_refused_with_the_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    with pytest.raises(ConfigError, match="PROMETHEUS_MULTIPROC_DIR is not set"):
        metrics_multiprocess.MultiProcessCollector(prometheus_client.CollectorRegistry())
    with pytest.raises(ConfigError, match="not a directory"):
        metrics_multiprocess.MultiProcessCollector(None, path=tmp_path / "missing")
    with pytest.raises(ConfigError, match=r"fresh prometheus_client\.CollectorRegistry"):
        metrics_multiprocess.MultiProcessCollector(prometheus_client.REGISTRY, path=tmp_path)
