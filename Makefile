# triscope: two commands on a fresh Debian/Ubuntu machine.
#   make run    the main job: agent + remediation engine (dry-run) + dashboard on a local SQLite store
#   make test   the whole suite (installs what it needs, starts its own servers)
#   make bench  every benchmark, one table
#   make mutants  every recording test under six mutants of the classifier (none may survive)
#   make screenshots  the docs' pictures of every dashboard page (docs/img)

SHELL := /bin/bash
PYTHON ?= /usr/bin/python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
RUN_STAMP := $(VENV)/.installed-run

.PHONY: run test bench lint typecheck setup setup-run system system-run clean screenshots wheels mutants

# make run installs what the demo runs (BCC and the kernel headers where the kernel allows, the
# virtualenv); make test installs the whole test stack (PostgreSQL, Prometheus, Chromium, Patroni, ...)
system:
	@bash scripts/setup-system.sh test

system-run:
	@bash scripts/setup-system.sh run

$(STAMP): pyproject.toml | system
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(PY) -m pip install -q --upgrade pip
	@$(PY) -m pip install -q -e '.[test]'
	@touch $(STAMP) $(RUN_STAMP)

$(RUN_STAMP): pyproject.toml | system-run
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(PY) -m pip install -q --upgrade pip
	@$(PY) -m pip install -q -e .
	@touch $(RUN_STAMP)

setup: system $(STAMP)

setup-run: system-run $(RUN_STAMP)

run: setup-run
	@$(VENV)/bin/triscope run

# the suite in three groups, each with its own summary (tests/unit, tests/integration, tests/e2e);
# every group runs, and make fails if any group failed (or collected nothing: pytest's exit 5);
# TRISCOPE_SUITE=1: a test that needs root (a small filesystem it mounts) fails, never skips
test: setup
	@failed=""; for g in unit integration e2e; do \
	  echo "== $$g tests (tests/$$g)"; \
	  TRISCOPE_SUITE=1 $(PY) -m pytest tests/$$g || failed="$$failed $$g"; \
	done; \
	if [ -n "$$failed" ]; then echo "== failed:$$failed"; exit 1; fi; echo "== unit, integration and e2e tests passed"

bench: setup
	@$(PY) -m bench

# every recording test under six mutants of the classifier (tests/mutants.py); fails if one survives
mutants: setup
	@$(PY) -m tests.mutants

# every dashboard page on the demo store ('triscope run' on a fresh store), for the docs: docs/img/*.png
screenshots: setup
	@$(PY) scripts/screenshot.py --out docs/img

lint: setup
	@$(VENV)/bin/ruff check .

typecheck: setup
	@$(VENV)/bin/mypy

# The wheels examples/workload/h200_setup.sh installs on the GPU machine, which has no package
# registries (.whl/, git-ignored, carried with the working tree): the agent's runtime dependencies
# (and theirs) that machine lacks, for its Python 3.12 on x86_64, pinned in scripts/device-bundle.sh
# (one version each; torch and numpy are there already). The whole bundle (+ BCC, kernel headers,
# nftables in .deb/): sudo bash scripts/device-bundle.sh
wheels:
	@bash scripts/device-bundle.sh wheels

clean:
	rm -rf $(VENV) triscope.db triscope.db-* artifacts
