"""Generate lockkit's blocking face from its hand-written asyncio face (httpcore's approach).

Every file listed in :data:`FILES` is written by hand as asyncio code in an ``_async`` folder; this script
writes its blocking twin in the sibling ``_sync`` folder by token substitution (:data:`RULES`, plus a few
per-file rules), with a header that says so. Generated files are checked in and never edited: change the
async source, then run ``python scripts/unasync.py``.

``--check`` (run by ``make test`` and by tests/test_unasync.py) writes nothing and fails when a generated
file is missing or stale, when a substitution matched nothing (a dead rule hides a typo in a new one), or
when a ``_sync`` folder holds a file that is neither generated nor declared hand-written in
:data:`HAND_WRITTEN` (what really differs per face: the transport, waiters, the renewal runner).

What each rule does is deliberately dumb: whole-word replacements applied to every line, strings and
comments included, so that a docstring that names ``AsyncLock`` names ``Lock`` in the blocking face. Code
that would not survive that (``(await x)[0]`` is rewritten to ``x[0]``) is written so that it does.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

Rule = tuple[str, str]

RULES: list[Rule] = [
    # syntax
    (r"async def ", "def "),
    (r"async with ", "with "),
    (r"await ", ""),
    (r"__aenter__", "__enter__"),
    (r"__aexit__", "__exit__"),
    (r"aclose", "close"),
    # lockkit's own twins: the async name, then the blocking one
    (r"AsyncLocker", "Locker"),
    (r"AsyncLock", "Lock"),
    (r"AsyncDriver", "Driver"),
    (r"AsyncEpochDriver", "EpochDriver"),
    (r"async_scheduler", "scheduler"),
    (r"open_async_driver", "open_driver"),
    (r"connect_async", "connect"),
    (r"from_config_async", "from_config"),
    # the Redis drivers (lockkit/drivers/redis/_async)
    (r"AsyncRedisDriver", "RedisDriver"),
    (r"AsyncRedlockDriver", "RedlockDriver"),
    (r"AsyncNode", "SyncNode"),
    (r"AsyncConnectionPool", "ConnectionPool"),
    (r"AsyncConnection", "Connection"),
    (r"AsyncStream", "Stream"),
    (r"AsyncWatcher", "SyncWatcher"),
    (r"AsyncBackground", "Background"),
    (r"adrive", "drive"),
]


@dataclass(frozen=True)
class Pair:
    source: str
    """The hand-written async file, relative to the repository root (in an ``_async`` folder)."""
    extra: Sequence[Rule] = field(default_factory=tuple)
    """Rules for this file only (applied before :data:`RULES`); each must match in it."""

    @property
    def target(self) -> str:
        return self.source.replace("/_async/", "/_sync/")


FILES: list[Pair] = [
    Pair("lockkit/_async/lock.py", extra=[(r"AsyncRenewalScheduler", "RenewalScheduler")]),
    Pair("lockkit/_async/locker.py"),
    Pair("lockkit/drivers/_async/epoch_driver.py"),
    # the flow runner: a blocking ``perform`` returns the result itself, not an awaitable
    Pair("lockkit/drivers/redis/_async/drive.py", extra=[(r"Awaitable\[Any\]", "Any"), (r"Awaitable, ", "")]),
    Pair("lockkit/drivers/redis/_async/connection.py"),
    Pair("lockkit/drivers/redis/_async/node.py"),
    Pair("lockkit/drivers/redis/_async/single.py"),
    Pair("lockkit/drivers/redis/_async/redlock.py"),
]

HAND_WRITTEN: set[str] = {
    "lockkit/_sync/__init__.py",
    "lockkit/_sync/primitives.py",
    "lockkit/drivers/_sync/__init__.py",
    "lockkit/drivers/redis/_sync/__init__.py",
    "lockkit/drivers/redis/_sync/primitives.py",
    "lockkit/drivers/redis/_sync/stream.py",
}
"""Files in ``_sync`` folders written by hand: the per-face primitives and package markers."""

# --- the conformance suite, lockkit/testing (issue 13): its own block, to keep merges with other rules easy ---
RULES += [
    (r"AsyncIterator", "Iterator"),
    (r"AsyncConformanceSuite", "ConformanceSuite"),
]
FILES += [
    Pair(
        "lockkit/testing/_async/conformance.py",
        extra=[
            # the cited names of the two faces' concurrency test (docs/reliability.md): tasks vs threads
            (r"test_tasks_exclude_each_other", "test_mutual_exclusion_threads"),
        ],
    ),
    Pair("lockkit/testing/_async/workers.py"),
]
HAND_WRITTEN |= {
    "lockkit/testing/_sync/__init__.py",
    "lockkit/testing/_sync/face_tests.py",
    "lockkit/testing/_sync/primitives.py",
}
# --- end of the conformance suite's block ---

# --- the Sentinel driver, lockkit/drivers/redis/_async (issue 14): its own block, to keep merges easy ---
RULES += [
    (r"AsyncSentinelDriver", "SentinelDriver"),
    (r"AsyncSentinels", "SyncSentinels"),
]
FILES += [
    Pair("lockkit/drivers/redis/_async/sentinels.py"),
    Pair("lockkit/drivers/redis/_async/sentinel.py"),
]
# --- end of the Sentinel driver's block ---

# --- semaphores and reader-writer locks (issue 18): their own block, to keep merges easy ---
RULES += [
    (r"AsyncPermitDriver", "PermitDriver"),
    (r"AsyncPermitView", "PermitView"),
    (r"AsyncPermit", "Permit"),
    (r"AsyncSemaphore", "Semaphore"),
    (r"AsyncRWLock", "RWLock"),
    (r"async_permits", "sync_permits"),
    (r"AsyncSemaphoreSuite", "SemaphoreSuite"),
    (r"AsyncRedisPermits", "RedisPermits"),
]
FILES += [
    Pair("lockkit/_async/permit_view.py"),
    Pair("lockkit/_async/semaphore.py"),
    Pair("lockkit/testing/_async/semaphore_conformance.py"),
    Pair("lockkit/testing/_async/semaphore_workers.py"),
    Pair("lockkit/drivers/redis/_async/semaphore.py"),
]
# --- end of the semaphores' block ---

# --- the PostgreSQL driver, lockkit/drivers/postgres/_async (issue 19): its own block, to keep merges easy ---
# psycopg's AsyncConnection -> Connection is the Redis block's rule already.
RULES += [
    (r"AsyncPostgresDriver", "PostgresDriver"),
]
FILES += [
    Pair("lockkit/drivers/postgres/_async/driver.py"),
]
HAND_WRITTEN |= {
    "lockkit/drivers/postgres/_sync/__init__.py",
    "lockkit/drivers/postgres/_sync/primitives.py",
}
# --- end of the PostgreSQL driver's block ---

# --- PostgreSQL semaphores and reader-writer locks (issue 18): their own block ---
RULES += [
    (r"AsyncPostgresPermits", "PostgresPermits"),
    (r"AsyncClientCursor", "ClientCursor"),
]
FILES += [
    Pair("lockkit/drivers/postgres/_async/permits.py"),
]
# --- end of the PostgreSQL permits' block ---

# --- the Redis Cluster driver, lockkit/drivers/redis/_async (issue 14): its own block, to keep merges easy ---
RULES += [
    (r"AsyncClusterDriver", "ClusterDriver"),
]
FILES += [
    Pair("lockkit/drivers/redis/_async/cluster.py"),
]
# --- end of the Redis Cluster driver's block ---

# --- permits on Sentinel and Cluster (issue 18): their own block, to keep merges easy ---
RULES += [
    (r"AsyncSentinelPermits", "SentinelPermits"),
    (r"AsyncClusterPermits", "ClusterPermits"),
]
# --- end of the permits on Sentinel and Cluster block ---

HEADER = (
    "# GENERATED by scripts/unasync.py from {source} -- do not edit.\n"
    "# Change the async source, then run: .venv/bin/python scripts/unasync.py\n"
)


def _word(pattern: str) -> re.Pattern[str]:
    """Whole-word match: ``AsyncLock`` must not rewrite ``AsyncLocker``'s prefix, nor ``aclose`` ``_aclosed``."""
    left = r"(?<![\w])" if pattern[0].isalnum() or pattern[0] == "_" else ""
    right = r"(?![\w])" if pattern[-1].isalnum() or pattern[-1] == "_" else ""
    return re.compile(left + pattern + right)


def _unwrap_awaits(text: str) -> str:
    """``(await f(x))[0]`` → ``f(x)[0]``: the parentheses only grouped the await."""
    out: list[str] = []
    i = 0
    while True:
        start = text.find("(await ", i)
        if start < 0:
            out.append(text[i:])
            return "".join(out)
        depth, j = 0, start
        while j < len(text):
            if text[j] == "(":
                depth += 1
            elif text[j] == ")":
                depth -= 1
                if depth == 0:
                    break
            j += 1
        inner = text[start + len("(await ") : j]
        if start > 0 and (text[start - 1].isalnum() or text[start - 1] in "_)]"):
            # A call's own parentheses, ``f(await x)``: not a grouping; only ``await `` goes (by its rule).
            out.append(text[i : start + 1])
            i = start + 1
            continue
        # Only unwrap a single call or name (``(await f(x))``); anything else keeps its parentheses.
        simple = re.fullmatch(r"[\w.]+(\(.*\))?", inner, re.DOTALL) is not None and "\n" not in inner
        out.append(text[i:start])
        out.append(inner if simple else "(await " + inner + ")")
        i = j + 1


def generate(pair: Pair, used: dict[Rule, int]) -> tuple[str, list[Rule]]:
    """The blocking text for ``pair`` and the per-file rules that matched nothing."""
    text = (ROOT / pair.source).read_text()
    text = _unwrap_awaits(text)
    unused: list[Rule] = []
    for rule in pair.extra:
        text, n = _word(rule[0]).subn(rule[1], text)
        if n == 0:
            unused.append(rule)
    for rule in RULES:
        text, n = _word(rule[0]).subn(rule[1], text)
        used[rule] = used.get(rule, 0) + n
    return _sort_imports(HEADER.format(source=pair.source) + text, pair.target), unused


def _sort_imports(text: str, target: str) -> str:
    """Renaming can unsort an import list (``async_scheduler, finish…`` → ``scheduler, finish…``): let ruff's
    import sorter, the one ``make lint`` checks with, put it back in order."""
    places = [str(Path(sys.executable).parent), str(ROOT / ".venv" / "bin"), os.environ.get("PATH", "")]
    ruff = shutil.which("ruff", path=os.pathsep.join(places))
    if ruff is None:
        raise SystemExit("unasync: ruff is needed to sort the generated imports (make venv installs it)")
    done = subprocess.run(
        [ruff, "check", "--quiet", "--select", "I", "--fix-only", "--exit-zero", "--stdin-filename", target, "-"],
        input=text, capture_output=True, text=True, cwd=ROOT, check=True,
    )  # fmt: skip
    return done.stdout


def strays() -> list[str]:
    """Files in a ``_sync`` folder that are neither generated nor declared hand-written."""
    targets = {pair.target for pair in FILES}
    found: list[str] = []
    for path in sorted(ROOT.glob("lockkit/**/_sync/*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel not in targets and rel not in HAND_WRITTEN:
            found.append(rel)
    return found


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="write nothing; fail if anything is stale")
    args = parser.parse_args(argv)
    used: dict[Rule, int] = {}
    problems: list[str] = []
    for pair in FILES:
        text, unused = generate(pair, used)
        problems += [f"{pair.source}: per-file rule {r[0]!r} -> {r[1]!r} matched nothing" for r in unused]
        target = ROOT / pair.target
        current = target.read_text() if target.exists() else None
        if current == text:
            continue
        if args.check:
            problems.append(f"{pair.target} is stale: run .venv/bin/python scripts/unasync.py")
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
            print(f"wrote {pair.target}")
    problems += [f"substitution {r[0]!r} -> {r[1]!r} matched nothing in any source" for r in RULES if not used.get(r)]
    problems += [f"{p} is in a _sync folder but neither generated nor in HAND_WRITTEN" for p in strays()]
    for problem in problems:
        print(f"unasync: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
