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

REPO = Path(__file__).resolve().parents[2]

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
SLO_EXAMPLE = REPO / "deploy" / "slo.example.yaml"
PLAIN_RULES = REPO / "deploy" / "prometheus" / "triscope-rules.yaml"
REGENERATE = ("triscope slo rules deploy/slo.example.yaml --format prometheusrule "
              "--include deploy/prometheus/triscope-rules.yaml -o deploy/kustomize/base/prometheusrule.yaml")
SLO_ID = "h200-inference-requests-on-time"
EXTERNAL = {"triscope_docs_url": "https://docs.example.com/triscope",
            "triscope_dashboard_url": "https://triscope.example.com"}


def test_prometheusrule_is_generated_from_the_slo_example_and_the_plain_rules(tmp_path: Path) -> None:
    """One source for the SLO rules: the PrometheusRule is what the command in its header writes,
    run from the repository root (the header repeats the command with the paths given)."""
    out = tmp_path / "prometheusrule.yaml"
    args = REGENERATE.split()[1:]
    args[args.index("-o") + 1] = str(out)
    res = subprocess.run([sys.executable, "-m", "triscope", *args], capture_output=True, text=True, timeout=60,
                         cwd=REPO)
    assert res.returncode == 0, res.stderr
    # the header names the real output path, not the temporary one
    got = out.read_text().replace(str(out), "deploy/kustomize/base/prometheusrule.yaml")
    assert got == RULE_CR.read_text(), (
        f"deploy/kustomize/base/prometheusrule.yaml is stale: regenerate it with '{REGENERATE}' (from the repository root)")
    assert REGENERATE in RULE_CR.read_text().split("apiVersion:")[0], "the header must say how to regenerate"
    assert REGENERATE in (REPO / "docs" / "deploy.md").read_text(), "docs/deploy.md must give the command"
    cr = yaml.safe_load(RULE_CR.read_text())
    assert cr["metadata"]["labels"] == {"app.kubernetes.io/name": "triscope", "release": "kube-prometheus-stack"}
    names = [g["name"] for g in cr["spec"]["groups"]]
    plain = [g["name"] for g in yaml.safe_load(PLAIN_RULES.read_text())["groups"]]
    assert names[:len(plain)] == plain and all(n.startswith("sloth-slo-") for n in names[len(plain):])


def test_prometheusrule_output_refuses_duplicate_groups_and_bad_labels(tmp_path: Path) -> None:
    base = [sys.executable, "-m", "triscope", "slo", "rules", str(SLO_EXAMPLE), "--format", "prometheusrule"]
    res = subprocess.run([*base, "--include", str(PLAIN_RULES), "--include", str(PLAIN_RULES)],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode != 0 and "triscope-mismatch" in res.stderr and "twice" in res.stderr
    res = subprocess.run([*base, "--label", "novalue"], capture_output=True, text=True, timeout=60)
    assert res.returncode != 0 and "KEY=VALUE" in res.stderr
    res = subprocess.run([*base, "--name", "slo", "--namespace", "mon", "--label", "release=prom"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    meta = yaml.safe_load(res.stdout)["metadata"]
    assert meta == {"name": "slo", "namespace": "mon", "labels": {"release": "prom"}}


def _exported_labels() -> dict[str, set[str]]:
    """Series name -> label names, from the example inference service's prometheus_client metrics
    (Counter adds _total; Histogram _bucket with le, _count, _sum)."""
    src = (REPO / "examples" / "inference" / "metrics.py").read_text()
    out: dict[str, set[str]] = {}
    for kind, name, labels in re.findall(r'(Counter|Histogram)\(\s*"(\w+)",\s*"[^"]*",\s*\[([^\]]*)\]', src):
        names = set(re.findall(r'"(\w+)"', labels))
        if kind == "Counter":
            out[f"{name}_total"] = names
        else:
            out[f"{name}_bucket"] = names | {"le"}
            out[f"{name}_count"] = out[f"{name}_sum"] = names
    assert {"inference_requests_total", "inference_request_errors_total"} <= set(out)
    return out


def test_slo_example_queries_use_only_labels_the_example_service_exports() -> None:
    """A matcher on a label the service does not export matches nothing (an SLI of 0 errors that
    never alerts): every SLI term must name an exported series and only its labels, or the ones the
    scrape adds (job, instance)."""
    from triscope.analysis.slo import load_slo_file

    exported = _exported_labels()
    assert exported["inference_requests_total"] == {"route", "status"}
    assert exported["inference_request_errors_total"] == {"route", "reason"}
    slos = load_slo_file(SLO_EXAMPLE)
    assert slos
    for slo in slos:
        for q in (slo.error_query, slo.total_query):
            for t in q.terms:
                assert t.metric in exported, f"{slo.id}: {t.metric} is not exported by examples/inference/metrics.py"
                for m in t.matchers:
                    assert m.name in exported[t.metric] | {"job", "instance"}, \
                        f"{slo.id}: {t.selector()}: the service exports no label {m.name!r}"


def _cr_slo_rules(tmp_path: Path, strip_guard: bool = False) -> Path:
    """The PrometheusRule's SLO groups of requests-on-time as a plain rule file (optionally without
    the coverage guards)."""
    spec = yaml.safe_load(RULE_CR.read_text())["spec"]
    groups = [g for g in spec["groups"] if g["name"].startswith("sloth-slo-") and g["name"].endswith(SLO_ID)]
    assert len(groups) == 3, [g["name"] for g in groups]
    if strip_guard:
        for r in groups[2]["rules"]:
            r["expr"] = re.sub(r"\s*and\s*max\(slo:sli_data_coverage:ratio\{[^}]*\} >= 0\.9\) without \(sloth_window\)",
                               "", r["expr"])
            assert "coverage" not in r["expr"]
    out = tmp_path / "cr-slo.rules.yaml"
    out.write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
    return out


def _alert(severity: str) -> dict[str, object]:
    title = {"page": "(page) h200-inference requests-on-time SLO error budget burn rate is over expected.",
             "ticket": "(ticket) h200-inference requests-on-time SLO error budget burn rate is too fast."}
    return {"exp_labels": {"category": "availability", "severity": severity, "sloth_severity": severity,
                           "owner": "ml-platform", "sloth_id": SLO_ID, "sloth_service": "h200-inference",
                           "sloth_slo": "requests-on-time"},
            "exp_annotations": {
                "title": title[severity],
                "summary": "Inference requests miss their deadline: the error budget burns too fast.",
                "runbook": "Run 'triscope rca --node NODE --start -1h' and check the mismatch state.",
                "runbook_url": "https://docs.example.com/triscope/alerts.md#h200inferencerequestslate",
                "dashboard_url": "https://triscope.example.com/slos?range=1h"}}


def _requests(good: str, bad: str) -> list[dict[str, str]]:
    return [{"series": 'inference_requests_total{route="/v1/infer", status="ok"}', "values": good},
            {"series": 'inference_requests_total{route="/v1/infer", status="deadline_exceeded"}', "values": bad}]


def _checks(*at: tuple[str, list[str]]) -> list[dict[str, object]]:
    return [{"eval_time": t, "alertname": "H200InferenceRequestsLate",
             "exp_alerts": [_alert(sev) for sev in ("page", "ticket") if sev in sevs]} for t, sevs in at]


def _promtool_test(tmp_path: Path, rules: Path, tests: list[dict[str, object]]) -> subprocess.CompletedProcess[str]:
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: run 'make test' (it installs prometheus)"
    f = tmp_path / "cr-slo.test.yaml"
    tests = [dict(t, external_labels=EXTERNAL) for t in tests]
    f.write_text(yaml.safe_dump({"rule_files": [rules.name], "evaluation_interval": "1m", "tests": tests},
                                sort_keys=False))
    return subprocess.run([promtool, "test", "rules", f.name], capture_output=True, text=True, cwd=tmp_path, timeout=300)


# every request misses its deadline for three minutes after an install: nothing is decided
THREE_MINUTES = {"interval": "1m", "input_series": _requests("0x3", "0+100x3"),
                 "alert_rule_test": _checks(("3m", []), ("5m", []))}
# 20 % late (20x the 1 % budget) for two hours: the covered hour pages; the 3 days are not covered
TWO_HOURS = {"interval": "1m", "input_series": _requests("0+80x180", "0+20x180"),
             "alert_rule_test": _checks(("2h", ["page"]))}
# 2 % late (2x) for three days: below the page factors; the ticket once 90 % of 3 days are covered
# (64.8 h)
THREE_DAYS = {"interval": "1m", "input_series": _requests("0+98x4100", "0+2x4100"),
              "alert_rule_test": _checks(("48h", []), ("67h", ["ticket"]))}

# no traffic at all is "no data" (a NaN ratio), and 0.4 % late is within the 1 % budget: nothing
NO_TRAFFIC = {"interval": "1m", "input_series": _requests("0x180", "0x180"), "alert_rule_test": _checks(("2h", []))}
WITHIN_BUDGET = {"interval": "1m", "input_series": _requests("0+996x180", "0+4x180"),
                 "alert_rule_test": _checks(("2h", []))}


def test_prometheusrule_slo_alerts_need_their_long_window_covered(tmp_path: Path) -> None:
    res = _promtool_test(tmp_path, _cr_slo_rules(tmp_path), [THREE_MINUTES, TWO_HOURS, THREE_DAYS, NO_TRAFFIC, WITHIN_BUDGET])
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SUCCESS" in res.stdout
    # without the guard the two hours of errors also raise the 3-day ticket: the guard is what stops it
    bare = _cr_slo_rules(tmp_path, strip_guard=True)
    res = _promtool_test(tmp_path, bare, [dict(TWO_HOURS, alert_rule_test=_checks(("2h", ["page", "ticket"])))])
    assert res.returncode == 0, res.stdout + res.stderr
    res = _promtool_test(tmp_path, _cr_slo_rules(tmp_path), [dict(TWO_HOURS, alert_rule_test=_checks(("2h", ["page", "ticket"])))])
    assert res.returncode != 0 and "H200InferenceRequestsLate" in res.stdout + res.stderr
