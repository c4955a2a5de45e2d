"""deploy/prometheus/slo-rules.yaml is what 'triscope slo rules' makes of deploy/slo.example.yaml, and
every SLO alert shipped (there and in the PrometheusRule's SLO groups) needs its long window covered
by data: checked by the real promtool on counters that would fire without the guard."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

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


def test_shipped_slo_alerts_require_their_long_windows_covered() -> None:
    """Every burn-rate clause of every generated alert carries the coverage of its long window."""
    from triscope.analysis.slo import ALERT_RULES, BURN_MIN_COVERAGE

    groups = yaml.safe_load((REPO / "deploy" / "prometheus" / "slo-rules.yaml").read_text())["groups"]
    alerts = [r for g in groups for r in g["rules"] if "alert" in r]
    assert len(alerts) == 4    # two SLOs, page + ticket each
    for a in alerts:
        sev = a["labels"]["sloth_severity"]
        clauses = a["expr"].split("\nor\n")
        longs = [lw for s, lw, _sw, _share in ALERT_RULES if s == sev]
        assert len(clauses) == len(longs), a["expr"]
        for clause, lw in zip(clauses, longs, strict=True):
            assert f'sloth_window="{lw}"}} >= {BURN_MIN_COVERAGE:g})' in clause, clause
            assert f"slo:sli_error:ratio_rate{lw}" in clause


# ---------------------------------------------------------------------------------------------- PrometheusRule
RULE_CR = REPO / "deploy" / "kustomize" / "base" / "prometheusrule.yaml"
SLO_GROUPS = ("triscope-slo-recording", "triscope-slo-alerts")


def _cr_slo_rules(tmp_path: Path, strip_guard: bool = False) -> Path:
    """The PrometheusRule's SLO groups as a plain rule file (optionally without the coverage guards)."""
    spec = yaml.safe_load(RULE_CR.read_text())["spec"]
    groups = [g for g in spec["groups"] if g["name"] in SLO_GROUPS]
    assert [g["name"] for g in groups] == list(SLO_GROUPS)
    if strip_guard:
        for r in groups[1]["rules"]:
            r["expr"] = re.sub(r"\s*and on \(slo\)\s*triscope:slo_data_coverage:ratio\w+ >= 0\.9", "", r["expr"])
            assert "coverage" not in r["expr"]
    out = tmp_path / "cr-slo.rules.yaml"
    out.write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
    return out


def _alert(severity: str) -> dict[str, object]:
    desc = {"page": "At this rate the 30-day error budget is gone in under 5 days (burn >= 6x).",
            "ticket": "Burn rate above 1x over 3 days and 6 hours, with data over 90 % of the 3 days."}
    summary = {"page": "SLO inference-availability: error budget burning fast",
               "ticket": "SLO inference-availability: error budget burning faster than it refills"}
    return {"exp_labels": {"slo": "inference-availability", "severity": severity, "category": "slo"},
            "exp_annotations": {"summary": summary[severity], "description": desc[severity]}}


def _requests(good: str, bad: str) -> list[dict[str, str]]:
    return [{"series": 'inference_requests_total{code="200"}', "values": good},
            {"series": 'inference_requests_total{code="500"}', "values": bad}]


def _checks(*at: tuple[str, list[str]]) -> list[dict[str, object]]:
    return [{"eval_time": t, "alertname": name, "exp_alerts": [_alert(sev)] if sev in sevs else []}
            for t, sevs in at for name, sev in (("TriscopeSLOBurnRatePage", "page"),
                                                 ("TriscopeSLOBurnRateTicket", "ticket"))]


def _promtool_test(tmp_path: Path, rules: Path, tests: list[dict[str, object]]) -> subprocess.CompletedProcess[str]:
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: run 'make test' (it installs prometheus)"
    f = tmp_path / "cr-slo.test.yaml"
    f.write_text(yaml.safe_dump({"rule_files": [rules.name], "evaluation_interval": "1m", "tests": tests},
                                sort_keys=False))
    return subprocess.run([promtool, "test", "rules", f.name], capture_output=True, text=True, cwd=tmp_path, timeout=300)


# every request fails for three minutes after an install: nothing is decided
THREE_MINUTES = {"interval": "1m", "input_series": _requests("0x3", "0+100x3"),
                 "alert_rule_test": _checks(("3m", []), ("5m", []))}
# 10 % errors (20x the 0.5 % budget) for two hours: the covered hour pages; the 3 days are not covered
TWO_HOURS = {"interval": "1m", "input_series": _requests("0+90x180", "0+10x180"),
             "alert_rule_test": _checks(("2h", ["page"]))}
# 1 % errors (2x) for three days: below the page factors; the ticket once 90 % of 3 days are covered
# (64.8 h) and held for its 'for: 1h'
THREE_DAYS = {"interval": "1m", "input_series": _requests("0+99x4100", "0+1x4100"),
              "alert_rule_test": _checks(("48h", []), ("67h", ["ticket"]))}


def test_prometheusrule_slo_alerts_need_their_long_window_covered(tmp_path: Path) -> None:
    res = _promtool_test(tmp_path, _cr_slo_rules(tmp_path), [THREE_MINUTES, TWO_HOURS, THREE_DAYS])
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SUCCESS" in res.stdout
    # without the guard the two hours of errors also raise the 3-day ticket: the guard is what stops it
    bare = _cr_slo_rules(tmp_path, strip_guard=True)
    res = _promtool_test(tmp_path, bare, [dict(TWO_HOURS, alert_rule_test=_checks(("2h", ["page", "ticket"])))])
    assert res.returncode == 0, res.stdout + res.stderr
    res = _promtool_test(tmp_path, _cr_slo_rules(tmp_path), [dict(TWO_HOURS, alert_rule_test=_checks(("2h", ["page", "ticket"])))])
    assert res.returncode != 0 and "TriscopeSLOBurnRateTicket" in res.stdout + res.stderr
