"""The doc run itself (tests/docs_plugin.py): every block is run or marked, and a doc that drifts fails."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

from markdown_it import MarkdownIt

from tests.docs_plugin import PYTHON_LANGS, ROOT, SHELL_LANGS, pytest_markdown_docs_markdown_it

NOT_CODE = {"", "sql", "go", "java"}
"""Fences that are not run: plain ``` blocks (key layouts, ACL rules, output, trees), SQL, and the Go and Java
examples of docs/interop.md (the Java encoder there is compiled and checked against lockkit's by
tests/test_interop_curator.py; the Go ones need a Go toolchain the test machines do not have)."""


def _doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def test_every_block_is_run_or_marked_with_a_reason() -> None:
    parser = pytest_markdown_docs_markdown_it()
    run = 0
    for doc in _doc_files():
        original = MarkdownIt("commonmark").parse(doc.read_text())
        routed = parser.parse(doc.read_text())
        fences = [(o, r) for o, r in zip(original, routed, strict=True) if o.type == "fence"]
        for before, after in fences:
            lang = before.info.split()[0].lower() if before.info.split() else ""
            where = f"{doc.relative_to(ROOT)}:{before.map[0] + 1 if before.map else '?'}"
            if lang in PYTHON_LANGS | SHELL_LANGS | {"toml"}:
                assert "runner:Docs" in after.info, where
                if "runner:DocsSkip" in after.info:
                    assert not after.content.startswith("!"), f"{where}: a skip marker without a reason"
                else:
                    run += 1
            else:
                assert lang in NOT_CODE, f"{where}: a ```{lang} block the doc run does not know; run it or add it here"
    assert run >= 15  # README's and the backend pages' examples, the lockkit.toml examples


DRIFTED = {
    "good.md": """
        ```python
        locks = lockkit.connect("memory://docs-meta")
        with locks.lock("a", ttl=5) as lease:
            write_stock(read_stock() - 1, fencing_token=lease.fencing_token)
        ```
    """,
    "renamed_api.md": """
        ```python
        locks = lockkit.connect("memory://docs-meta")
        locks.lock("a", ttl=5).acquire(timeot=1)
        ```
    """,
    "literal_variable.md": """
        ```python
        locks = lockkit.connect("redis://app:${REDIS_PASSWORD}@cache:6379/0")
        ```
    """,
    "bad_option.md": """
        ```sh
        lockkit status nightly --url memory://docs-meta --jsn
        ```
    """,
    "good_shell.md": """
        ```sh
        lockkit status nightly --url memory://docs-meta --json   # who holds it
        ```
    """,
    "setup_line.md": """
        ```sh
        pip install 'lockkit[redis]'
        ```
    """,
    "bad_toml.md": """
        ```toml
        default = "fast"
        [backends.fast]
        url = "memory://docs-meta"
        [routs]
        "payment:*" = "fast"
        ```
    """,
    "good_toml.md": """
        ```toml
        [backends.fast]
        url = "memory://docs-meta"
        ```
    """,
    "reasonless_skip.md": """
        ```python notest
        raise SystemExit("never run")
        ```
    """,
    "skip.md": """
        <!-- doc-test: skip needs a production cluster -->
        ```python
        raise SystemExit("never run")
        ```
    """,
}
EXPECTED = {
    "good.md": "PASSED",
    "renamed_api.md": "FAILED",
    "literal_variable.md": "FAILED",
    "bad_option.md": "FAILED",
    "good_shell.md": "PASSED",
    "setup_line.md": "FAILED",
    "bad_toml.md": "FAILED",
    "good_toml.md": "PASSED",
    "reasonless_skip.md": "FAILED",
    "skip.md": "SKIPPED",
}


def test_a_doc_that_drifts_fails(tmp_path: Path) -> None:
    for name, text in DRIFTED.items():
        (tmp_path / name).write_text(textwrap.dedent(text).lstrip())
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-c", str(ROOT / "pyproject.toml"), "--rootdir", str(tmp_path),
         "--markdown-docs", "-p", "no:cacheprovider", "-q", "-rA", "--setup-show",
         *sorted(str(tmp_path / name) for name in DRIFTED)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    outcomes = {
        m.group(2): m.group(1)
        for m in re.finditer(r"^(PASSED|FAILED|SKIPPED|ERROR)\S* .*?([a-z_]+\.md)", done.stdout, re.M)
    }
    assert outcomes == EXPECTED, done.stdout[-6000:]
    assert "stale write refused" not in done.stdout
    assert "literal ${…} text" in done.stdout and "unrecognized arguments: --jsn" in done.stdout
    assert "unknown top-level key" in done.stdout or "routs" in done.stdout
    assert "needs a production cluster" in done.stdout and "give the reason" in done.stdout
    # the session's servers start for the blocks that name them only: none of these needs a cluster or PostgreSQL
    assert not re.search(r"SETUP +S (sentinel_set|redis_cluster|postgres_server)\b", done.stdout), done.stdout[-6000:]
