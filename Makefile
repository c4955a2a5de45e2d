# triscope: two commands on a fresh Debian/Ubuntu machine.
#   make run    the main job: agent + remediation engine (dry-run) + dashboard on a local SQLite store
#   make test   the whole suite (installs what it needs, starts its own servers)
#   make bench  every benchmark, one table

SHELL := /bin/bash
PYTHON ?= /usr/bin/python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test bench lint typecheck setup system clean

system:
	@bash scripts/setup-system.sh

$(STAMP): pyproject.toml | system
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(PY) -m pip install -q --upgrade pip
	@$(PY) -m pip install -q -e '.[test]'
	@touch $(STAMP)

setup: system $(STAMP)

run: setup
	@$(VENV)/bin/triscope run

test: setup
	@$(PY) -m pytest tests

bench: setup
	@$(PY) -m bench

lint: setup
	@$(VENV)/bin/ruff check .

typecheck: setup
	@$(VENV)/bin/mypy

clean:
	rm -rf $(VENV) triscope.db triscope.db-* artifacts
