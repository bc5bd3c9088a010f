"""Generated documentation stays in step with the code."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_guarantees_table_is_current() -> None:
    done = subprocess.run([sys.executable, "scripts/gen_docs.py", "--check"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_readme_links_resolve() -> None:
    text = (ROOT / "README.md").read_text()
    for target in ("docs/semantics.md", "docs/configuration.md", "docs/cli.md", "CONTRIBUTING.md"):
        assert target in text and (ROOT / target).exists(), target


def test_configuration_examples_load(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every lockkit.toml example in the docs parses and opens (drivers connect lazily: no server needed)."""
    import re

    import lockkit

    monkeypatch.setenv("REDIS_PASSWORD", "example")
    for doc in ("docs/configuration.md", "docs/migration.md", "README.md"):
        blocks = re.findall(r"```toml\n(.*?)```", (ROOT / doc).read_text(), re.S)
        for i, block in enumerate(b for b in blocks if "[backends" in b):
            path = tmp_path / f"{Path(doc).stem}-{i}.toml"
            path.write_text(block)
            lockkit.from_config(path).close()
