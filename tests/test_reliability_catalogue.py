"""docs/reliability.md is the catalogue of the scenario IDs that code, tests and docs cite.

* Every scenario ID cited in the repository's code, tests and docs (in text, or in a test's name such as
  ``test_c4a_c4b_…``) is defined in docs/reliability.md, as a heading or in the first cell of a table row.
* Every test the catalogue names as ``path::test`` (or ``path::Class::test``) exists.
* The catalogue's index table and its sections list the same scenarios.

No server is needed: this reads files only.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CATALOGUE = ROOT / "docs" / "reliability.md"

SCANNED_DIRS = ("lockkit", "tests", "backends", "benchmarks", "docs", "scripts")
SCANNED_FILES = ("README.md", "CONTRIBUTING.md", "CHANGELOG.md", "Makefile", "pyproject.toml")
SCANNED_SUFFIXES = {".py", ".md", ".toml", ".lua", ".sh", ".txt", ".cfg", ".ini"}
SKIPPED_PARTS = {"__pycache__", ".venv", ".mypy_cache", ".pytest_cache", ".ruff_cache"}

FAMILIES = "CRLZEMKATPS"  # P: PostgreSQL (issue 19), S: semaphores and reader-writer locks (issue 18)

# A scenario ID: a family letter, a hyphen, a number and an optional variant letter ("C-4a"). The
# look-arounds keep it from matching inside other tokens: no letter, digit, hyphen or dot right before it
# ("SHA-1", "x-E-1", "v1.E-1"), and no word character, hyphen or ".digit" right after it ("C-3PO",
# "E-1-beta", "R-2.5"). Only upper-case letters count, so "t-1" or "a-2" in prose never match.
SCENARIO_ID = re.compile(rf"(?<![\w.\-])([{FAMILIES}])-(\d{{1,3}})([a-z]?)(?![\w\-]|\.\d)")

# IDs in a test's name: test_c2_…, test_E6_…, test_z3_c5_… (every leading <letter><number>[variant] word).
TEST_NAME = re.compile(r"\bdef (test_(?:[a-zA-Z]\d+[a-z]?_)+)")
NAME_ID = re.compile(rf"([{FAMILIES}{FAMILIES.lower()}])(\d+)([a-z]?)_")

# A test reference in the catalogue: `tests/test_x.py::test_y` or `lockkit/testing/conformance.py::Class::test_y`.
TEST_REFERENCE = re.compile(r"\b((?:lockkit|tests|backends|benchmarks|scripts)/[\w/]+\.py)((?:::\w+)+)")


def _canonical(letter: str, number: str, variant: str) -> str:
    return f"{letter.upper()}-{int(number)}{variant.lower()}"


def _scanned_files() -> Iterator[Path]:
    for top in SCANNED_DIRS:
        for path in sorted((ROOT / top).rglob("*")):
            if path.is_file() and path.suffix in SCANNED_SUFFIXES and not SKIPPED_PARTS & set(path.parts):
                yield path
    for name in SCANNED_FILES:
        if (ROOT / name).is_file():
            yield ROOT / name


def cited_ids() -> dict[str, set[str]]:
    """Every scenario ID cited in the repository, with the files (relative paths) that cite it."""
    cited: dict[str, set[str]] = {}
    for path in _scanned_files():
        text = path.read_text(encoding="utf-8", errors="replace")
        found = {_canonical(*m.groups()) for m in SCENARIO_ID.finditer(text)}
        if path.suffix == ".py":
            for name in TEST_NAME.findall(text):
                prefix = name.removeprefix("test_")
                found |= {_canonical(*m.groups()) for m in NAME_ID.finditer(prefix)}
        for scenario in found:
            cited.setdefault(scenario, set()).add(str(path.relative_to(ROOT)))
    return cited


def _catalogue_lines() -> list[str]:
    return CATALOGUE.read_text(encoding="utf-8").splitlines()


def defined_in_headings() -> set[str]:
    """IDs that head a section: the heading's text up to its first " — " ("### C-4a — with fencing")."""
    ids: set[str] = set()
    for line in _catalogue_lines():
        heading = re.match(r"#{1,6}\s+(.*)", line)
        if heading:
            title = heading.group(1).split(" — ")[0]
            ids |= {_canonical(*m.groups()) for m in SCENARIO_ID.finditer(title)}
    return ids


def defined_in_tables() -> set[str]:
    """IDs in the first cell of a table row ("| C-4a | … |")."""
    ids: set[str] = set()
    for line in _catalogue_lines():
        row = re.match(r"\|([^|]*)\|", line.strip())
        if row:
            ids |= {_canonical(*m.groups()) for m in SCENARIO_ID.finditer(row.group(1))}
    return ids


def catalogue_references() -> list[tuple[str, list[str]]]:
    """Every ``path::name[::name]`` the catalogue mentions, as (path, [names])."""
    text = CATALOGUE.read_text(encoding="utf-8")
    return [(path, names.split("::")[1:]) for path, names in TEST_REFERENCE.findall(text)]


def _defines(tree: ast.Module, names: list[str]) -> bool:
    """Whether ``names`` (classes, then a test function) are nested definitions in ``tree``."""
    scope: list[ast.stmt] = tree.body
    *classes, function = names
    for name in classes:
        found = [node for node in scope if isinstance(node, ast.ClassDef) and node.name == name]
        if not found:
            return False
        scope = found[0].body
    return any(isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == function for node in scope)


def test_the_scan_finds_what_the_repository_cites() -> None:
    cited = cited_ids()
    # a sanity check of the scanner itself: IDs cited today in text and in test names
    assert {"C-2", "C-4a", "C-12", "R-5", "L-7", "Z-4", "E-6", "M-1", "K-1"} <= cited.keys(), sorted(cited)
    assert "tests/test_redlock_faults.py" in cited["L-3"]  # only in the name test_L3_…
    assert "tests/test_zookeeper_faults.py" in cited["C-5"]  # the second ID of test_z3_c5_…
    for text in ("SHA-1", "x-E-1", "C-3PO", "E-1-beta", "R-2.5", "t-1", "MAC-1"):
        assert not SCENARIO_ID.search(text), text
    for text, expected in (("(C-4a/b)", "C-4a"), ("E-6 (slow)", "E-6"), ("see K-1.", "K-1"), ("`A-2`", "A-2")):
        match = SCENARIO_ID.search(text)
        assert match is not None and _canonical(*match.groups()) == expected, text


def test_every_cited_scenario_is_defined_in_the_catalogue() -> None:
    defined = defined_in_headings() | defined_in_tables()
    missing = {scenario: sorted(files) for scenario, files in cited_ids().items() if scenario not in defined}
    assert not missing, (
        "scenario IDs cited but not defined in docs/reliability.md (add a section and an index row, "
        f"or fix the citation): {missing}"
    )


def test_every_test_the_catalogue_names_exists() -> None:
    references = catalogue_references()
    assert len(references) >= 50, "the catalogue should name the tests that cover its scenarios"
    trees: dict[str, ast.Module | None] = {}
    broken: list[str] = []
    for path, names in references:
        if path not in trees:
            file = ROOT / path
            trees[path] = ast.parse(file.read_text(encoding="utf-8")) if file.is_file() else None
        tree = trees[path]
        if tree is None:
            broken.append(f"{path}::{'::'.join(names)} (no such file)")
        elif not _defines(tree, names):
            broken.append(f"{path}::{'::'.join(names)} (no such test)")
    assert not broken, "docs/reliability.md names tests that do not exist:\n" + "\n".join(broken)


def test_index_and_sections_list_the_same_scenarios() -> None:
    in_index, in_sections = defined_in_tables(), defined_in_headings()
    assert set(FAMILIES) <= {scenario[0] for scenario in in_sections}
    assert in_index == in_sections, {
        "in the index only": sorted(in_index - in_sections),
        "in a section only": sorted(in_sections - in_index),
    }
