"""scripts/mutants.toml stays applicable: every curated mutant's original text occurs exactly once where it says.

A refactor that moves guarded code leaves a mutant "stale" (it cannot be applied, so it guards nothing); this
fails in `make test` instead of only in the long `make mutants` run.
"""

from __future__ import annotations

import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent


def test_every_curated_mutant_applies_exactly_once() -> None:
    catalogue = tomllib.loads((ROOT / "scripts" / "mutants.toml").read_text())
    stale = []
    for mutant in catalogue["mutant"]:
        edits = [mutant, *mutant.get("also", [])]
        for edit in edits:
            path = ROOT / edit["file"]
            count = path.read_text().count(edit["original"]) if path.exists() else 0
            if count != 1:
                stale.append(f"{mutant['id']}: {edit['file']} holds its original text {count} times")
    assert not stale, "update scripts/mutants.toml: " + "; ".join(stale)
