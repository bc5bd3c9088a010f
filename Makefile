# The two commands of the README. Both set everything up from nothing.
#   make demo   – venv + lockkit, then the lost-update demo on the embedded file:// backend (no server)
#   make test   – Debian's redis-server, zookeeper, etcd-server (if missing), venv + lockkit[dev], then
#                 the whole suite against real servers it starts itself, ruff and mypy
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
BASE := $(VENV)/.installed-base
DEV := $(VENV)/.installed-dev

.PHONY: demo test lint typecheck generated servers venv bench mutants clean

$(BASE): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet -e .
	touch $(BASE)

$(DEV): $(BASE) pyproject.toml
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(DEV)

venv: $(DEV)

demo: $(BASE)
	$(BIN)/lockkit demo

servers:
	bash backends/install.sh

# The blocking face is generated from the asyncio one (CONTRIBUTING.md, "Changing a face"): fail if stale.
generated: $(DEV)
	$(BIN)/python scripts/unasync.py --check

lint: $(DEV)
	$(BIN)/ruff check lockkit tests backends benchmarks scripts

typecheck: $(DEV)
	$(BIN)/mypy --strict lockkit

test: servers $(DEV)
	$(BIN)/python scripts/unasync.py --check
	LOCKKIT_REQUIRE_PROMTOOL=1 $(BIN)/python -m pytest
	$(MAKE) --no-print-directory lint typecheck

bench: servers $(DEV)
	$(BIN)/python -m benchmarks

# Mutation testing (CONTRIBUTING.md, "Mutation testing"): mutmut over the pure core, then the curated
# mutants of scripts/mutants.toml, each on a throw-away copy of HEAD. Fails if a safety mutant survives.
mutants: servers $(DEV)
	$(BIN)/python scripts/mutants.py all

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache

# The alert rules of monitoring/ (docs/metrics.md): promtool, from Debian's prometheus package (make servers
# installs it), checks them and runs their unit tests. make test runs the same in tests/test_metrics_rules.py.
.PHONY: rules
rules: servers
	promtool check rules monitoring/lockkit.rules.yml
	cd monitoring && promtool test rules lockkit.rules.test.yml
