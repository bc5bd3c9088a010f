"""Generated documentation stays in step with the code."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_guarantees_table_is_current() -> None:
    done = subprocess.run([sys.executable, "scripts/gen_docs.py", "--check"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_readme_links_resolve() -> None:
    text = (ROOT / "README.md").read_text()
    for target in ("docs/semantics.md", "docs/configuration.md", "docs/cli.md", "docs/plugins.md", "CONTRIBUTING.md"):
        assert target in text and (ROOT / target).exists(), target


# The lockkit.toml examples (and every Python and shell block) run through tests/docs_plugin.py.
