"""lockkit's Prometheus metrics for prefork servers (gunicorn, uWSGI): a file per process, summed at scrape time.

Each worker of a prefork server has its own registry, so a scrape answered by one worker showed that worker's
locks only; and prometheus_client's multiprocess mode only knows the metric objects it writes to its mmap
files, not a collector like lockkit's that reads its figures at scrape time. Here, instead:

- every process writes its totals (counters, histogram buckets and sums) to
  ``<dir>/lockkit_<pid>_<random>.json``, atomically, at most :data:`FLUSH_INTERVAL` seconds old and once more
  when it exits normally (``dir``: ``PROMETHEUS_MULTIPROC_DIR``, read when the process opens its first
  backend, or :func:`enable`);
- :class:`MultiProcessCollector` sums the files at scrape time: counters and fixed-bucket histograms add up
  exactly (the reservoir quantiles of ``locker.stats()`` do not, so they stay per process);
- :func:`mark_process_dead` folds a dead worker's file into ``lockkit_dead.json``, so the directory stays one
  file per live worker and the totals never go down (a counter that drops reads as a reset to Prometheus).

A forked child starts from zero (its parent's file has the parent's counts) with a file of its own.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import json
import logging
import os
import secrets
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .errors import BackendUnavailable, ConfigError, LockError
from .metrics import HISTOGRAMS, Totals, _Exporter, families

__all__ = ["FLUSH_INTERVAL", "MultiProcessCollector", "enable", "flush", "mark_process_dead"]

log = logging.getLogger("lockkit")

ENV = "PROMETHEUS_MULTIPROC_DIR"
FLUSH_INTERVAL = 1.0
"""Seconds between two writes of a process's file: how old a scrape's figures of the other processes can be."""
FORMAT = 1
DEAD = "lockkit_dead.json"
LOCK = "lockkit.lock"
"""Readers hold it shared, :func:`mark_process_dead` exclusive: a scrape never sees a fold half done."""


def _bounds() -> dict[str, list[float]]:
    return {name: list(h.buckets) for name, h in HISTOGRAMS.items()}


def _dump(totals: dict[str, Totals], **extra: Any) -> str:
    backends = {backend: t.to_json() for backend, t in sorted(totals.items())}
    return json.dumps({"format": FORMAT, "bounds": _bounds(), "backends": backends, **extra}, sort_keys=True)


def _load(path: Path) -> tuple[dict[str, Totals], dict[str, Any]]:
    """A file's totals by backend, and the whole document; ``ValueError`` if it is not one of ours."""
    data = json.loads(path.read_text())
    if not isinstance(data, dict) or data.get("format") != FORMAT or data.get("bounds") != _bounds():
        raise ValueError("another format or other histogram bounds (a process running another lockkit version?)")
    backends, folded = data.get("backends"), data.get("folded", [])
    # Checked here, where the callers catch ValueError: a bare KeyError or TypeError from a damaged file reached a
    # scrape (collect) and mark_process_dead unhandled.
    if not isinstance(backends, dict) or not isinstance(folded, list):
        raise ValueError("not a lockkit metrics file: no 'backends' table, or a 'folded' that is not a list")
    return {str(backend): Totals.from_json(t) for backend, t in backends.items()}, data


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")  # not a *.json: readers never see it
    tmp.write_text(text)
    os.replace(tmp, path)  # atomic: a reader gets the old file or the new one, never a part


@contextlib.contextmanager
def _locked(directory: Path, how: int) -> Iterator[None]:
    try:
        fd = os.open(directory / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise BackendUnavailable(
            f"cannot open the metrics lock file {directory / LOCK}: {exc.strerror or exc}; every worker must be able "
            "to create and write files in the metrics directory (check its owner and mode, and that the name is a "
            "plain file)"
        ) from exc
    try:
        fcntl.flock(fd, how)
        yield
    finally:
        os.close(fd)  # closing drops the flock


def _directory(path: str | os.PathLike[str] | None) -> Path:
    if path is None:
        path = os.environ.get(ENV)
        if not path:
            raise ConfigError(f"give the metrics directory: {ENV} is not set (set it, or pass the directory)")
    if not os.path.isdir(path):
        raise ConfigError(f"the metrics directory {os.fspath(path)!r} is not a directory (create it at server start)")
    return Path(path)


class _Writer:
    """This process's file, rewritten by a daemon thread every FLUSH_INTERVAL when the totals changed."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        # The random part keeps a reused pid from overwriting the file of a dead process not yet folded.
        self.path = directory / f"lockkit_{os.getpid()}_{secrets.token_hex(4)}.json"
        self._mutex = threading.Lock()
        self._written: str | None = None
        self._warned = False
        self._thread = threading.Thread(target=self._run, name="lockkit-metrics-files", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        stop = threading.Event()  # never set: a daemon thread ends with the process
        while not stop.wait(FLUSH_INTERVAL):
            if _writer is not self:
                return  # replaced by enable() elsewhere
            self.flush()

    def flush(self) -> None:
        # Read and written under one mutex: two flushes must not land out of order (the older last), or the
        # file's counters would go down.
        with self._mutex:
            text = _dump(_Exporter.totals())
            if text == self._written:
                return
            try:
                _write(self.path, text)
            except OSError as exc:
                if not self._warned:  # once: the thread retries every interval
                    self._warned = True
                    log.warning("lockkit: cannot write metrics file %s (%s); scrapes miss this process", self.path, exc)
                return
            self._written = text


_writer: _Writer | None = None
_enabling = threading.Lock()


def enable(directory: str | os.PathLike[str]) -> None:
    """Write this process's lockkit totals to a file in ``directory`` from now on (its children's too).

    Called for you when ``PROMETHEUS_MULTIPROC_DIR`` is set as the process opens its first backend. The
    figures are the Prometheus tallies: nothing is written unless prometheus_client is installed.
    """
    global _writer
    with _enabling:
        if _writer is not None and _writer.directory == Path(directory):
            return
        _writer = _Writer(Path(directory))


def flush() -> None:
    """Write this process's file now: before an exit that skips ``atexit`` (``os._exit``, multiprocessing's
    children), or to make the next scrape current."""
    writer = _writer
    if writer is not None:
        writer.flush()


def _after_fork_in_child() -> None:
    global _writer, _enabling
    _enabling = threading.Lock()
    if _writer is None:
        return
    _Exporter.forget_parent()
    _writer = _Writer(_writer.directory)  # the parent's thread did not come along; nor must its file name


if hasattr(os, "register_at_fork"):  # not on Windows, where there is no fork
    os.register_at_fork(after_in_child=_after_fork_in_child)  # after metrics.py's hook, which frees the export lock
atexit.register(flush)


def mark_process_dead(pid: int, path: str | os.PathLike[str] | None = None) -> None:
    """Fold the files of dead process ``pid`` into the directory's total of dead processes.

    Call it when a worker has exited (gunicorn's ``child_exit`` hook), never for a live one: it would write
    its file again and be counted twice. Without it the totals are right all the same, and the directory
    keeps one file per worker ever started.
    """
    directory = _directory(path)
    with _locked(directory, fcntl.LOCK_EX):
        files = sorted(directory.glob(f"lockkit_{pid}_*.json"))
        if not files:
            return
        try:
            dead, folded = _read_dead(directory)
        except (OSError, ValueError) as exc:
            # Not dropped, as a scrape drops it: rewriting it would lose the dead workers' counts for good.
            raise LockError(
                f"cannot fold the metrics of process {pid}: {directory / DEAD} is unreadable ({exc}); move it "
                "aside to start the dead workers' totals from zero (Prometheus reads the drop as a counter reset)"
            ) from exc
        for file in files:
            try:
                totals, _ = _load(file)
            except (OSError, ValueError) as exc:
                log.warning("lockkit: dropping unreadable metrics file %s (%s)", file, exc)
                totals = {}
            for backend, t in totals.items():
                dead.setdefault(backend, Totals()).merge(t)
        # The folded names are written with the sum, then the files removed: a crash in between leaves files
        # that readers skip (they are in the sum already), and the next fold removes them.
        folded = {name for name in folded if (directory / name).exists()} | {file.name for file in files}
        try:
            _write(directory / DEAD, _dump(dead, folded=sorted(folded)))
        except OSError as exc:
            raise BackendUnavailable(
                f"cannot write {directory / DEAD}: {exc.strerror or exc}; check free space and the metrics "
                "directory's permissions, then call mark_process_dead again (the worker's files are kept)"
            ) from exc
        for name in folded:
            (directory / name).unlink(missing_ok=True)


def _read_dead(directory: Path) -> tuple[dict[str, Totals], set[str]]:
    try:
        totals, data = _load(directory / DEAD)
    except FileNotFoundError:
        return {}, set()
    return totals, {str(name) for name in data.get("folded", [])}


def _read_all(path: str | os.PathLike[str] | None = None) -> dict[str, Totals]:
    """The totals of every process that wrote to the directory, dead ones included, by backend."""
    directory = _directory(path)
    with _locked(directory, fcntl.LOCK_SH):
        try:
            merged, folded = _read_dead(directory)
        except (OSError, ValueError) as exc:
            log.warning("lockkit: ignoring unreadable %s (%s)", directory / DEAD, exc)
            merged, folded = {}, set()
        for file in sorted(directory.glob("lockkit_*.json")):
            if file.name == DEAD or file.name in folded:
                continue
            try:
                totals, _ = _load(file)
            except FileNotFoundError:
                continue  # the directory was emptied by hand meanwhile
            except (OSError, ValueError) as exc:
                log.warning("lockkit: ignoring unreadable metrics file %s (%s)", file, exc)
                continue
            for backend, t in totals.items():
                merged.setdefault(backend, Totals()).merge(t)
    return merged


class MultiProcessCollector:
    """The ``lockkit_*`` metrics of every process writing to ``path`` (default ``PROMETHEUS_MULTIPROC_DIR``).

    Register it in a fresh ``CollectorRegistry``, next to prometheus_client's own ``MultiProcessCollector``:
    the default registry already has this process's lockkit collector, and the two would repeat the families.
    """

    def __init__(self, registry: Any, path: str | os.PathLike[str] | None = None) -> None:
        from prometheus_client import REGISTRY

        self.directory = _directory(path)
        if registry is REGISTRY:
            raise ConfigError(
                "register lockkit's MultiProcessCollector in a fresh prometheus_client.CollectorRegistry(): the "
                "default registry already exports this process's lockkit metrics under the same names"
            )
        if registry is not None:
            registry.register(self)

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterator[Any]:
        writer = _writer
        if writer is not None and writer.directory.resolve() == self.directory.resolve():
            writer.flush()  # the scraped process's own figures, current to the scrape
        yield from families(sorted(_read_all(self.directory).items()))
