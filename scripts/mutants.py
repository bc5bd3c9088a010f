"""Mutation testing for lockkit (`make mutants`; see CONTRIBUTING.md, "Mutation testing").

Two parts, both run on a throw-away copy of the committed tree (``git archive HEAD`` into a temporary
directory), never on the working tree, which other people may be editing:

``tool``
    mutmut over the pure core (lease, timing, renewal, names, urls, config, the Redlock arithmetic and the
    Redis acquire flows) with the fast tests that exercise it; prints the score and the survivors.
``curated``
    the hand-written mutants of ``scripts/mutants.toml`` (the Lua scripts' owner checks, the drivers'
    safety guards), applied one at a time; each runs the tests it names with ``PYTHONPATH`` pointing at the
    copy and is *killed* if they fail. A mutant whose original text no longer occurs exactly once is
    reported *stale*, never silently skipped. Exits 1 if a ``safety = true`` mutant survives (or is stale).

    python scripts/mutants.py curated [--only ID ...] [--overlay PATH ...] [--list]
    python scripts/mutants.py tool [--overlay PATH ...]
    python scripts/mutants.py all

``--overlay PATH`` copies these files from the working tree over the committed copy (to try new tests
before committing them).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
CATALOGUE = ROOT / "scripts" / "mutants.toml"
PYTHON = sys.executable
TEST_TIMEOUT = 900  # seconds per curated mutant: a mutant that hangs the tests counts as killed ("timeout")

CORE = [
    "lockkit/lease.py",
    "lockkit/timing.py",
    "lockkit/renewal.py",
    "lockkit/names.py",
    "lockkit/urls.py",
    "lockkit/config.py",
    "lockkit/drivers/redis/quorum.py",
    "lockkit/drivers/redis/flow.py",
]
CORE_TESTS = [
    "tests/test_lease.py",
    "tests/test_renewal.py",
    "tests/test_urls.py",
    "tests/test_config.py",
    "tests/test_core_mutants.py",
    "tests/test_redis_driver.py",
    "tests/test_redlock_conformance.py",
]
ISOLATION_PLUGIN = "_mutmut_fresh_memory"
ISOLATION_SOURCE = '''"""Written by scripts/mutants.py into mutmut's copy only: mutmut runs the tests twice in one
process (to map tests to functions, then the clean run), and tests that take fixed memory:// names with a fake clock
would find the first run's locks still held. Each test starts with no memory:// space."""

import pytest


@pytest.fixture(autouse=True)
def _fresh_memory_spaces() -> None:
    from lockkit.drivers.embedded import memory

    memory._spaces.clear()
'''


@dataclass(frozen=True)
class Edit:
    file: str
    original: str
    replacement: str


@dataclass(frozen=True)
class Mutant:
    id: str
    edits: tuple[Edit, ...]
    tests: tuple[str, ...]
    safety: bool
    why: str


@dataclass
class Outcome:
    mutant: Mutant
    status: str  # killed | survived | stale | timeout
    seconds: float
    detail: str = ""
    extra: list[str] = field(default_factory=list)


def load(path: Path = CATALOGUE) -> list[Mutant]:
    data = tomllib.loads(path.read_text())
    out: list[Mutant] = []
    seen: set[str] = set()
    for raw in data["mutant"]:
        if raw["id"] in seen:
            raise SystemExit(f"{path}: mutant id {raw['id']!r} appears twice")
        seen.add(raw["id"])
        edits = [Edit(raw["file"], raw["original"], raw["replacement"])]
        edits += [Edit(e["file"], e["original"], e["replacement"]) for e in raw.get("also", [])]
        out.append(Mutant(raw["id"], tuple(edits), tuple(raw["tests"]), bool(raw["safety"]), raw["why"]))
    return out


def copy_tree(overlay: list[str], rev: str = "HEAD") -> Path:
    """The committed tree (``rev``) in a fresh temporary directory, plus ``overlay`` files from the working tree."""
    dest = Path(tempfile.mkdtemp(prefix="lockkit-mutants-"))
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev], check=True, capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(dest, filter="data")
    for rel in overlay:
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, target)
    return dest


def env_for(tree: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(tree) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def apply(tree: Path, mutant: Mutant) -> tuple[dict[Path, str], str | None]:
    """Apply every edit; (original contents to restore, None) or ({}, why it is stale)."""
    saved: dict[Path, str] = {}
    for edit in mutant.edits:
        path = tree / edit.file
        if not path.exists():
            restore(saved)
            return {}, f"{edit.file} does not exist"
        text = saved.get(path, path.read_text())
        current = path.read_text()
        count = current.count(edit.original)
        if count != 1:
            restore(saved)
            return {}, f"original text found {count} times in {edit.file} (must be exactly once)"
        saved.setdefault(path, text)
        path.write_text(current.replace(edit.original, edit.replacement))
    if any("/_async/" in edit.file for edit in mutant.edits):
        # A mutant of a face's source reaches the blocking face too: regenerate it, as a developer would.
        for generated in tree.glob("lockkit/**/_sync/*.py"):
            saved.setdefault(generated, generated.read_text())
        subprocess.run([sys.executable, str(tree / "scripts" / "unasync.py")], check=True, capture_output=True)
    return saved, None


def restore(saved: dict[Path, str]) -> None:
    for path, text in saved.items():
        path.write_text(text)


def test_paths(tests: tuple[str, ...]) -> list[str]:
    """The file paths among pytest arguments (skipping options and the expression after -k / -m)."""
    out, skip = [], False
    for arg in tests:
        if skip:
            skip = False
        elif arg in ("-k", "-m"):
            skip = True
        elif not arg.startswith("-"):
            out.append(arg.split("::")[0])
    return out


def missing_tests(tree: Path, mutant: Mutant) -> list[str]:
    return [p for p in test_paths(mutant.tests) if not (tree / p).exists()]


def pytest_cmd(tests: tuple[str, ...] | list[str]) -> list[str]:
    return [PYTHON, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "--no-header", "-o", "addopts=", *tests]


def run_tests(tree: Path, tests: tuple[str, ...]) -> tuple[int | None, str]:
    try:
        proc = subprocess.run(
            pytest_cmd(tests), cwd=tree, env=env_for(tree), capture_output=True, text=True, timeout=TEST_TIMEOUT
        )
    except subprocess.TimeoutExpired:
        return None, "timed out"
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    return proc.returncode, lines[-1] if lines else proc.stderr.strip()[-200:]


def curated(only: list[str], overlay: list[str], baseline: bool, rev: str = "HEAD") -> int:
    mutants = load()
    if only:
        unknown = set(only) - {m.id for m in mutants}
        if unknown:
            raise SystemExit(f"unknown mutant id(s): {', '.join(sorted(unknown))}")
        mutants = [m for m in mutants if m.id in only]
    tree = copy_tree(overlay, rev)
    print(f"curated mutants: {len(mutants)}, on a copy of {rev} in {tree}", flush=True)
    outcomes: list[Outcome] = []
    started = time.monotonic()
    try:
        if baseline:  # the named tests must pass on the unmutated copy, or a "kill" proves nothing
            runnable = [m.tests for m in mutants if not missing_tests(tree, m)]
            plain = sorted({t for tests in runnable if "-k" not in tests for t in tests})
            groups = ([tuple(plain)] if plain else []) + sorted({tests for tests in runnable if "-k" in tests})
            for group in groups:
                code, last = run_tests(tree, group)
                verdict = "pass" if code == 0 else "FAIL"
                print(f"baseline (unmutated, {len(group)} args): {verdict} — {last}", flush=True)
                if code != 0:
                    print("the named tests fail without any mutant: fix them first")
                    return 2
        for mutant in mutants:
            t0 = time.monotonic()
            gone = missing_tests(tree, mutant)
            saved, stale = apply(tree, mutant)
            if stale is None and gone:
                restore(saved)
                stale = f"test file(s) missing: {', '.join(gone)}"
            if stale is not None:
                outcome = Outcome(mutant, "stale", 0.0, stale)
            else:
                try:
                    code, last = run_tests(tree, mutant.tests)
                finally:
                    restore(saved)
                if code is None:
                    status = "timeout"
                elif code == 0:
                    status = "survived"
                elif code in (4, 5):  # usage error (a node id not found) or nothing collected
                    status, last = "stale", f"the named tests did not run (pytest exit {code}): {last}"
                else:
                    status = "killed"
                outcome = Outcome(mutant, status, time.monotonic() - t0, last)
            outcomes.append(outcome)
            flag = " [safety]" if mutant.safety else ""
            shown = f"{outcome.status.upper():9} {mutant.id}{flag} ({outcome.seconds:.0f} s)"
            print(f"{shown} — {outcome.detail}", flush=True)
    finally:
        shutil.rmtree(tree, ignore_errors=True)
    return summarize(outcomes, time.monotonic() - started)


def summarize(outcomes: list[Outcome], seconds: float) -> int:
    counts = {s: sum(o.status == s for o in outcomes) for s in ("killed", "timeout", "survived", "stale")}
    print(
        f"\nsummary: {counts['killed'] + counts['timeout']} killed ({counts['timeout']} by timeout), "
        f"{counts['survived']} survived, {counts['stale']} stale, of {len(outcomes)} in {seconds:.0f} s"
    )
    bad = [o for o in outcomes if o.mutant.safety and o.status in ("survived", "stale")]
    for o in outcomes:
        if o.status in ("survived", "stale"):
            print(f"  {o.status}: {o.mutant.id}{' [safety]' if o.mutant.safety else ''} — {o.mutant.why}")
    if bad:
        print(f"FAIL: {len(bad)} safety mutant(s) survived or went stale: {', '.join(o.mutant.id for o in bad)}")
        return 1
    return 0


# -- part (a): mutmut over the pure core ---------------------------------------------------------------------


def mutmut_config(tree: Path) -> str:
    def block(key: str, values: list[str]) -> str:
        return key + "=\n" + "".join(f"    {v}\n" for v in values)

    tests = [t for t in CORE_TESTS if (tree / t).exists()]
    return (
        "[mutmut]\nsource_paths=lockkit\n"
        + block("only_mutate", CORE)
        + block("also_copy", ["backends", ISOLATION_PLUGIN + ".py"])
        + block("pytest_add_cli_args_test_selection", tests)
        + block("pytest_add_cli_args", ["-p", "no:cacheprovider", "-q", "-x", "-p", ISOLATION_PLUGIN])
    )


def tool(overlay: list[str], rev: str = "HEAD") -> int:
    tree = copy_tree(overlay, rev)
    (tree / "setup.cfg").write_text(mutmut_config(tree))
    (tree / (ISOLATION_PLUGIN + ".py")).write_text(ISOLATION_SOURCE)
    # mutmut passes the ini addopts on itself as well, and a plugin named there (-p ...) registered twice stops
    # pytest; and mutmut finds its mutated tree by itself (a PYTHONPATH breaks the imports of its stats run).
    pyproject = tree / "pyproject.toml"
    pyproject.write_text(re.sub(r"(?m)^addopts = .*\n", "", pyproject.read_text()))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    mutmut = str(Path(PYTHON).with_name("mutmut"))
    print(f"mutmut over the pure core, on a copy of HEAD in {tree}", flush=True)
    started = time.monotonic()
    try:
        run = subprocess.run([mutmut, "run"], cwd=tree, env=env, capture_output=True, text=True)
        if run.returncode != 0:
            print(run.stdout[-3000:], run.stderr[-3000:], sep="\n")
            print("mutmut run failed")
            return 2
        results = subprocess.run(
            [mutmut, "results", "--all", "true"], cwd=tree, env=env, capture_output=True, text=True
        ).stdout
    finally:
        elapsed = time.monotonic() - started
    statuses: dict[str, list[str]] = {}
    for line in results.splitlines():
        match = re.match(r"\s*(\S+): (.+)$", line)
        if match:
            statuses.setdefault(match.group(2).strip(), []).append(match.group(1))
    killed = len(statuses.get("killed", [])) + len(statuses.get("timeout", []))
    survived = statuses.get("survived", [])
    untested = statuses.get("no tests", [])
    scored = killed + len(survived) + len(untested)
    per_file: dict[str, list[int]] = {}
    for status, names in statuses.items():
        for name in names:
            module = name.split(".x")[0].split(".xǁ")[0]
            counts = per_file.setdefault(module, [0, 0])
            counts[1] += 1
            counts[0] += status in ("killed", "timeout")
    print(json.dumps({k: len(v) for k, v in sorted(statuses.items())}))
    for module, (k, n) in sorted(per_file.items()):
        print(f"  {module:40} {k}/{n} killed")
    score = 100.0 * killed / scored if scored else 0.0
    print(f"mutmut score: {killed}/{scored} killed = {score:.1f} % ({len(survived)} survived, "
          f"{len(untested)} not reached by the tests) in {elapsed:.0f} s")
    for name in survived:
        print(f"  survived: {name}")
    keep = os.environ.get("LOCKKIT_KEEP_MUTANTS")
    if keep:
        print(f"kept the mutmut tree in {tree} (mutmut show NAME there)")
    else:
        shutil.rmtree(tree, ignore_errors=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("part", choices=["curated", "tool", "all"])
    parser.add_argument("--only", nargs="*", default=[], help="curated mutant ids to run")
    parser.add_argument("--overlay", nargs="*", default=[], help="working-tree files to copy over HEAD's")
    parser.add_argument("--list", action="store_true", help="list the curated mutants and exit")
    parser.add_argument("--rev", default="HEAD", help="the commit to copy (default HEAD)")
    parser.add_argument("--no-baseline", action="store_true", help="skip the unmutated run of the named tests")
    args = parser.parse_args(argv)
    if args.list:
        for m in load():
            print(f"{m.id:42} {'safety' if m.safety else '      '} {m.edits[0].file}: {m.why}")
        return 0
    code = 0
    if args.part in ("tool", "all"):
        code = max(code, tool(args.overlay, args.rev))
    if args.part in ("curated", "all"):
        code = max(code, curated(args.only, args.overlay, not args.no_baseline, args.rev))
    return code


if __name__ == "__main__":
    sys.exit(main())
