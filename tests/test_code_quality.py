"""The whole repo is lint-clean (ruff) and type-check clean (mypy), with the configs in pyproject.toml."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
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
