"""The agent profiles in the repo print the tables docs/inference-validation.md and
docs/workloads.md quote (``python -m examples.hostlab.profile_summary``)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from examples.hostlab.profile_summary import summary

TRACES = Path(__file__).resolve().parents[2] / "examples" / "hostlab" / "traces"


def _table(node: str) -> dict[str, str]:
    wall = json.loads((TRACES / f"{node}.agent.json").read_text())["wall_seconds"]
    with gzip.open(TRACES / f"{node}.agent-profile.txt.gz", "rt") as f:
        lines = summary(f.read().splitlines(), wall)
    return {cells[1].strip(): cells[2].strip() for cells in (ln.split("|") for ln in lines[3:])}


def test_the_profiles_print_the_figures_the_docs_quote() -> None:
    before = _table("h200-lab-3")
    assert before["NVML per-process utilization (SM shares)"] == "2.05"
    assert before["the store writer"] == "1.03"
    after = _table("h200-lab-4")
    assert after["NVML per-process utilization (SM shares)"] == "0.50"
    assert after["the store writer"] == "1.00"
    dumps = [_table(n)["of which whole-table sock_diag dumps"] for n in ("h200-lab-4", "h200-lab-5", "h200-lab-6")]
    assert dumps == ["0.20", "0.14", "0.25"]
