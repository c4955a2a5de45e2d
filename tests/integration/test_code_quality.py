"""The whole repo is lint-clean (ruff), type-check clean (mypy) and keeps its import contracts
(import-linter), with the configs in pyproject.toml."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent  # the virtualenv's bin/ ('make test' runs .venv/bin/python)

pytestmark = pytest.mark.slow


def _tool(name: str) -> str:
    for cand in (BIN / name, REPO / ".venv" / "bin" / name):
        if cand.exists():
            return str(cand)
    pytest.fail(f"{name} is not installed in the virtualenv: pip install -e '.[test]'")


def _run(*cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)


def test_ruff_reports_nothing() -> None:
    res = _run(_tool("ruff"), "check", "--no-cache", "--output-format", "concise", ".")
    assert res.returncode == 0, f"ruff check found problems:\n{res.stdout}{res.stderr}"
    assert "All checks passed" in res.stdout


def test_mypy_reports_nothing() -> None:
    res = _run(_tool("mypy"))
    assert res.returncode == 0, f"mypy found problems:\n{res.stdout}{res.stderr}"
    assert res.stdout.startswith("Success: no issues found"), res.stdout


def test_import_contracts_hold() -> None:
    """The layering in pyproject.toml's [tool.importlinter] (lint-imports)."""
    res = _run(_tool("lint-imports"), "--no-cache")
    assert res.returncode == 0, f"import contracts broken:\n{res.stdout}{res.stderr}"
    assert "0 broken" in res.stdout, res.stdout


def test_no_module_of_ours_is_loaded_by_a_string() -> None:
    """Lazy imports are plain import statements inside functions, which the import checker sees;
    importlib.import_module / __import__ with a module name in a string would hide an edge."""
    import re

    pat = re.compile(r"\bimportlib\.import_module\(|\b__import__\(|\bimport_module\(")
    offenders = []
    for part in ("agent", "store", "analysis", "dashboard", "remediation", "migrations", "triscope"):
        for p in (REPO / part).rglob("*.py"):
            rel = p.relative_to(REPO)
            if part == "triscope" and rel.parts[1] in ("agent", "store", "analysis", "dashboard", "remediation",
                                                       "migrations"):
                continue   # the links to the part folders: the same files
            for i, line in enumerate(p.read_text().splitlines(), 1):
                if pat.search(line) and not line.lstrip().startswith("#"):
                    offenders.append(f"{rel}:{i}: {line.strip()}")
    assert not offenders, offenders
