"""The layout the README promises: a module imports another of ours at its top.

An import inside a function is allowed only where waiting is the point, and each such place is
listed here with its reason.  None may dodge an import cycle: a cycle is opened by moving the shared
names to the module both sides import (``triscope.remediation.targets``, ``triscope.analysis.slo_spec``).
A new in-function import of our own modules fails this test until it is moved to the top or given
a reason below; an entry that no longer matches anything fails it too, so the list stays true.
"""

from __future__ import annotations

import ast
from fnmatch import fnmatch
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PARTS = ("agent", "analysis", "dashboard", "remediation", "store", "triscope")
LINKED = {"agent", "analysis", "dashboard", "remediation", "store", "migrations"}   # triscope/<part> links

# (file pattern, imported module pattern) -> why the import waits for the function to run
LAZY: dict[tuple[str, str], str] = {
    ("triscope/cli.py", "triscope.*"):
        "the CLI imports a command's part when that command runs: `triscope --help` loads no part",
    ("triscope/commands/*.py", "triscope.*"):
        "a command loads its part when it runs (the agent's process never loads Dash, SQLAlchemy's "
        "PostgreSQL dialect or the engine)",
    ("agent/registry.py", "triscope.agent.collectors.*"):
        "a collector's module (and its library: BCC, NVML, gRPC) loads only when it is enabled",
    ("agent/registry.py", "triscope.agent.workloads.*"):
        "the workloads collector's modules (and NVML for its process lists) load only when it is enabled",
    ("agent/registry.py", "triscope.analysis.online"):
        "the detector loads only when the agent publishes verdicts",
    ("agent/runtime.py", "triscope.agent.otlp"):
        "the OTLP receiver (protobuf) loads only with --otlp: the agent's memory target",
    ("analysis/config.py", "triscope.core.configfile"):
        "pydantic loads only when a thresholds file or value is read: the agent runs on the defaults",
    ("analysis/config.py", "triscope.core.durations"):
        "the thresholds file model is built only when a file is read (pydantic, as above)",
    ("store/api.py", "triscope.store.db"):
        "Alembic loads only when a schema is upgraded",
    ("store/db.py", "triscope"):
        "the migrations' location is looked up only when Alembic runs",
    ("analysis/slo.py", "triscope"):
        "the packaged default SLO file is located only when no file was given",
    ("dashboard/app.py", "triscope.dashboard.pages"):
        "Dash registers pages only once the app exists (dash.register_page needs it)",
}


def _product_files() -> list[Path]:
    files: list[Path] = []
    for part in PARTS:
        for p in sorted((REPO / part).rglob("*.py")):
            rel = p.relative_to(REPO)
            if part == "triscope" and len(rel.parts) > 1 and rel.parts[1] in LINKED:
                continue          # the same files, reached through the links
            if "versions" in rel.parts:
                continue          # Alembic revisions import nothing of ours (an import contract)
            files.append(rel)
    return files


def in_function_imports() -> list[tuple[str, int, str]]:
    """(file, line, module) of every import of our own modules inside a function."""
    out: list[tuple[str, int, str]] = []
    for rel in _product_files():
        tree = ast.parse((REPO / rel).read_text(), str(rel))
        for fn in ast.walk(tree):
            if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in ast.walk(fn):
                if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    names = [node.module]
                elif isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                else:
                    continue
                out += [(str(rel), node.lineno, m) for m in names if m == "triscope" or m.startswith("triscope.")]
    return sorted(set(out))


def _reason(file: str, module: str) -> tuple[str, str] | None:
    for (fpat, mpat) in LAZY:
        if fnmatch(file, fpat) and fnmatch(module, mpat):
            return fpat, mpat
    return None


def test_every_in_function_import_of_ours_is_a_listed_lazy_one() -> None:
    found = in_function_imports()
    assert len(found) > 10, "the scan found almost nothing: it reads the wrong folders"
    stray = [f"{f}:{line}: import {m}" for f, line, m in found if _reason(f, m) is None]
    assert not stray, ("in-function imports of our own modules that are not listed lazy ones in "
                       "tests/unit/test_layout.py (move them to the top; open a cycle by moving the shared "
                       "names to one module):\n  " + "\n  ".join(stray))


def test_every_listed_lazy_import_still_exists() -> None:
    used = {_reason(f, m) for f, _line, m in in_function_imports()}
    stale = [f"{f} -> {m}" for (f, m) in LAZY if (f, m) not in used]
    assert not stale, "listed lazy imports that no longer exist (remove them from LAZY):\n  " + "\n  ".join(stale)


def test_the_scan_sees_an_in_function_import(tmp_path: Path) -> None:
    """The scan itself: an import inside a function is found, one at the top is not."""
    src = "from triscope.core import names\n\ndef f():\n    from triscope.store import Store\n    return Store\n"
    tree = ast.parse(src)
    inner = [n.module for fn in ast.walk(tree) if isinstance(fn, ast.FunctionDef)
             for n in ast.walk(fn) if isinstance(n, ast.ImportFrom)]
    assert inner == ["triscope.store"]
