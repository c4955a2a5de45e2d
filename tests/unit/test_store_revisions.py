"""Migration revisions are frozen records: none imports the project's live code, so editing a
module of the store (partitions, models) can never change what an old revision does.  (The
Alembic environment, migrations/env.py, is not a revision: it imports the live models for
autogenerate.)  What the revisions do is tested against a real PostgreSQL server in
tests/integration/test_deploy_pg_partitions.py."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
VERSIONS = REPO / "migrations" / "versions"
PROJECT = {"triscope", *(p.name for p in REPO.iterdir() if (p / "__init__.py").is_file())}


def _imported(path: Path) -> set[str]:
    """Every module a file imports, at any depth (function-level imports included)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            out.add("." * node.level + (node.module or ""))
    return out


def test_no_revision_imports_the_project() -> None:
    revisions = sorted(p for p in VERSIONS.glob("*.py") if p.name != "__init__.py")
    assert [p.name[:4] for p in revisions][:5] == ["0001", "0002", "0003", "0004", "0005"]
    assert {"store", "agent", "triscope"} <= PROJECT
    for path in revisions:
        mods = _imported(path)
        live = sorted(m for m in mods if m.startswith(".") or m.split(".")[0] in PROJECT)
        assert not live, f"{path.name} imports {live}: copy what it needs into the revision"


def test_the_check_sees_an_import_of_the_live_store(tmp_path: Path) -> None:
    f = tmp_path / "rev.py"
    f.write_text("def upgrade():\n    from triscope.store import partitions\n    return partitions\n")
    assert "triscope.store" in _imported(f)
