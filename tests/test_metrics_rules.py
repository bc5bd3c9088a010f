"""monitoring/lockkit.rules.yml: promtool checks it and runs its unit tests, and it reads only exported metrics.

promtool comes with Debian's ``prometheus`` package (``make servers`` installs it). Without it these tests
skip, unless ``LOCKKIT_REQUIRE_PROMTOOL=1`` makes that a failure (``make test``).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

import lockkit

ROOT = Path(__file__).resolve().parent.parent
MONITORING = ROOT / "monitoring"
RULES = MONITORING / "lockkit.rules.yml"
RULE_TESTS = MONITORING / "lockkit.rules.test.yml"
METRIC = re.compile(r"\blockkit_[a-z_]+\b")
BUCKET = re.compile(r"\b(lockkit_[a-z_]+_bucket)\{[^}]*\ble=\"([^\"]+)\"")


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        if os.environ.get("LOCKKIT_REQUIRE_PROMTOOL") == "1":
            pytest.fail("promtool is missing and LOCKKIT_REQUIRE_PROMTOOL=1: install Debian's prometheus package "
                        "(make servers does)")  # fmt: skip
        pytest.skip("promtool is not installed (apt-get install prometheus, or make servers); "
                    "LOCKKIT_REQUIRE_PROMTOOL=1 makes this a failure")  # fmt: skip
    return path


def run_promtool(*args: str) -> None:
    done = subprocess.run([promtool(), *args], cwd=MONITORING, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"promtool {' '.join(args)} exited {done.returncode}\n{done.stdout}{done.stderr}"


def test_promtool_checks_the_rules() -> None:
    run_promtool("check", "rules", RULES.name)


def test_promtool_unit_tests_of_the_rules_pass() -> None:
    run_promtool("test", "rules", RULE_TESTS.name)


def exported() -> tuple[set[str], set[tuple[str, str]]]:
    """The sample names lockkit exports, and (bucket series, le) pairs, after one of each kind of event."""
    prometheus_client = pytest.importorskip("prometheus_client")
    from prometheus_client.parser import text_string_to_metric_families

    with lockkit.connect("memory://rules") as locks:
        lock = locks.lock("r", ttl=5)
        with lock:
            assert locks.lock("r").try_acquire() is None
    names: set[str] = set()
    buckets: set[tuple[str, str]] = set()
    text = prometheus_client.generate_latest(prometheus_client.REGISTRY).decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            names.add(sample.name)
            if "le" in sample.labels:
                buckets.add((sample.name, sample.labels["le"]))
    return names, buckets


@pytest.mark.parametrize("path", [RULES, RULE_TESTS], ids=lambda p: p.name)
def test_every_metric_named_is_exported(path: Path) -> None:
    """The rules (and the series their tests feed them) use the names and bucket bounds the code exports."""
    names, buckets = exported()
    text = path.read_text()
    named = set(METRIC.findall(text))
    assert named, f"{path.name} names no lockkit metric"
    assert named <= names, f"{path.name} names metrics lockkit does not export: {sorted(named - names)}"
    bounds = set(BUCKET.findall(text))
    assert bounds <= buckets, f"{path.name} uses bucket bounds lockkit does not export: {sorted(bounds - buckets)}"


def test_the_multi_process_scrape_exports_the_same_names(tmp_path: Path) -> None:
    prometheus_client = pytest.importorskip("prometheus_client")
    from lockkit import metrics, metrics_multiprocess

    metrics_multiprocess._write(tmp_path / "lockkit_1_0.json", metrics_multiprocess._dump({"x": metrics.Totals()}))
    registry = prometheus_client.CollectorRegistry()
    metrics_multiprocess.MultiProcessCollector(registry, path=tmp_path)
    merged = {s.name for family in registry.collect() for s in family.samples}
    assert set(METRIC.findall(RULES.read_text())) <= merged


def test_every_alert_is_tested_firing_and_not_firing() -> None:
    yaml = pytest.importorskip("yaml")
    alerts = {rule["alert"] for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]}
    fired: set[str] = set()
    quiet: set[str] = set()
    for case in yaml.safe_load(RULE_TESTS.read_text())["tests"]:
        for check in case.get("alert_rule_test", []):
            (fired if check["exp_alerts"] else quiet).add(check["alertname"])
    assert fired | quiet <= alerts, f"tests of alerts that do not exist: {sorted((fired | quiet) - alerts)}"
    assert alerts == fired, f"alerts never tested firing: {sorted(alerts - fired)}"
    assert alerts == quiet, f"alerts never tested not firing: {sorted(alerts - quiet)}"
