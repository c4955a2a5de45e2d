"""deploy/prometheus/slo-rules.yaml is what 'triscope slo rules' makes of deploy/slo.example.yaml."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.prometheus


def test_shipped_slo_rules_are_generated_from_the_example(tmp_path: Path) -> None:
    out = tmp_path / "rules.yaml"
    res = subprocess.run([sys.executable, "-m", "triscope", "slo", "rules", str(REPO / "deploy" / "slo.example.yaml"),
                          "-o", str(out)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    shipped = (REPO / "deploy" / "prometheus" / "slo-rules.yaml").read_text()
    assert out.read_text() == shipped, ("deploy/prometheus/slo-rules.yaml is stale: regenerate with "
                                        "'triscope slo rules deploy/slo.example.yaml -o deploy/prometheus/slo-rules.yaml'")
    promtool = shutil.which("promtool")
    assert promtool
    check = subprocess.run([promtool, "check", "rules", str(REPO / "deploy" / "prometheus" / "slo-rules.yaml")],
                           capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
