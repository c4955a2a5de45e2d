"""Prometheus rules and the Alertmanager example, checked with the real promtool and amtool.

The PrometheusRule's spec is exactly a Prometheus rule file, so it is written out as one and
given to ``promtool check rules`` and ``promtool test rules`` (alerts that must fire and alerts
that must not). The Alertmanager example goes through ``amtool check-config`` and
``amtool config routes test``.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
RULE_CR = REPO / "deploy" / "kustomize" / "base" / "prometheusrule.yaml"
AM_EXAMPLE = REPO / "deploy" / "alertmanager" / "alertmanager.example.yaml"

pytestmark = pytest.mark.prometheus


def tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} not found: run 'make test' (it installs Debian's prometheus and prometheus-alertmanager)")
    return path


@pytest.fixture()
def rule_file(tmp_path: Path) -> Path:
    spec = yaml.safe_load(RULE_CR.read_text())["spec"]
    out = tmp_path / "triscope.rules.yaml"
    out.write_text(yaml.safe_dump(spec, sort_keys=False))
    return out


def test_rules_pass_promtool_check(rule_file: Path) -> None:
    out = subprocess.run([tool("promtool"), "check", "rules", str(rule_file)], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout


def test_promtool_rejects_a_broken_rule(tmp_path: Path) -> None:
    spec = yaml.safe_load(RULE_CR.read_text())["spec"]
    spec["groups"][0]["rules"][0]["expr"] = "max by (node) (triscope_mismatch_state{state=)"
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(spec))
    out = subprocess.run([tool("promtool"), "check", "rules", str(bad)], capture_output=True, text=True, timeout=60)
    assert out.returncode != 0


def test_every_alert_is_documented_and_routed_by_node_or_slo(rule_file: Path) -> None:
    spec = yaml.safe_load(rule_file.read_text())
    alerts = [r for g in spec["groups"] for r in g["rules"] if "alert" in r]
    assert {a["alert"] for a in alerts} >= {"TriscopeIOSaturated", "TriscopeStagingBound", "TriscopeNetworkBound",
                                           "TriscopeMismatchSevere", "TriscopeSLOBurnRatePage",
                                           "TriscopeSLOBurnRateTicket", "TriscopeAgentDown"}
    for a in alerts:
        assert a["labels"]["severity"] in {"page", "ticket", "warning", "info"}, a["alert"]
        assert a["annotations"]["summary"] and a["annotations"]["description"], a["alert"]
        assert "node" in a["annotations"]["summary"] or "slo" in a["annotations"]["summary"], a["alert"]


def test_prometheusrule_carries_the_plain_rule_files_groups_unchanged() -> None:
    # deploy/prometheus/triscope-rules.yaml (plain Prometheus) and the PrometheusRule (Operator)
    # must not drift: the example policy acts on alerts defined there
    plain = yaml.safe_load((REPO / "deploy" / "prometheus" / "triscope-rules.yaml").read_text())["groups"]
    operator = {g["name"]: g for g in yaml.safe_load(RULE_CR.read_text())["spec"]["groups"]}
    for group in plain:
        assert operator.get(group["name"]) == group, f"group {group['name']} differs between the two files"
    policy = (REPO / "deploy" / "policy.example.yaml").read_text()
    alerts = {r["alert"] for g in operator.values() for r in g["rules"] if "alert" in r}
    for line in policy.splitlines():
        if line.strip().startswith("alert:"):
            assert line.split(":", 1)[1].strip().strip("'\"") in alerts, line


UNIT_TESTS = """
rule_files: [{rules}]
evaluation_interval: 30s
tests:
  # io-saturated held for 6 minutes with a high score: fires; the same state with a low score
  # (node-b) and a short episode (node-c) must not.
  - interval: 30s
    input_series:
      - series: 'triscope_mismatch_state{{state="io-saturated", node="node-a"}}'
        values: '1x20'
      - series: 'triscope_mismatch_score{{node="node-a"}}'
        values: '0.6x20'
      - series: 'triscope_mismatch_state{{state="io-saturated", node="node-b"}}'
        values: '1x20'
      - series: 'triscope_mismatch_score{{node="node-b"}}'
        values: '0.1x20'
      - series: 'triscope_mismatch_state{{state="io-saturated", node="node-c"}}'
        values: '1 1 1 1 0x16'
      - series: 'triscope_mismatch_score{{node="node-c"}}'
        values: '0.9x20'
    alert_rule_test:
      - eval_time: 6m
        alertname: TriscopeIOSaturated
        exp_alerts:
          - exp_labels: {{node: node-a, severity: ticket, category: mismatch}}
            exp_annotations:
              summary: "node-a: accelerator starved by a saturated I/O link"
              description: "Mismatch state io-saturated for 5 minutes; 60% of accelerator time lost to I/O. Check batch sizes, host-to-device copy overlap, link generation/width."
      - eval_time: 3m
        alertname: TriscopeIOSaturated
        exp_alerts: []
  # availability SLO: 10 % errors (20x the 0.5 % budget) for 2 hours pages; no traffic at all
  # is "no data" and pages nobody.
  - interval: 1m
    input_series:
      - series: 'inference_requests_total{{code="200"}}'
        values: '0+90x180'
      - series: 'inference_requests_total{{code="500"}}'
        values: '0+10x180'
    alert_rule_test:
      - eval_time: 2h
        alertname: TriscopeSLOBurnRatePage
        exp_alerts:
          - exp_labels: {{slo: inference-availability, severity: page, category: slo}}
            exp_annotations:
              summary: "SLO inference-availability: error budget burning fast"
              description: "At this rate the 30-day error budget is gone in under 5 days (burn >= 6x)."
  - interval: 1m
    input_series:
      - series: 'inference_requests_total{{code="200"}}'
        values: '0x180'
      - series: 'inference_requests_total{{code="500"}}'
        values: '0x180'
    alert_rule_test:
      - eval_time: 2h
        alertname: TriscopeSLOBurnRatePage
        exp_alerts: []
  # 0.2 % errors is within the 0.5 % budget: no page
  - interval: 1m
    input_series:
      - series: 'inference_requests_total{{code="200"}}'
        values: '0+998x180'
      - series: 'inference_requests_total{{code="500"}}'
        values: '0+2x180'
    alert_rule_test:
      - eval_time: 2h
        alertname: TriscopeSLOBurnRatePage
        exp_alerts: []
"""


def test_rules_fire_when_they_must_and_stay_quiet_otherwise(rule_file: Path) -> None:
    tests = rule_file.parent / "triscope.rules.test.yaml"
    tests.write_text(UNIT_TESTS.format(rules=rule_file.name))
    out = subprocess.run([tool("promtool"), "test", "rules", tests.name], capture_output=True, text=True,
                         timeout=120, cwd=rule_file.parent)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout


def test_alertmanager_example_passes_amtool(tmp_path: Path) -> None:
    out = subprocess.run([tool("amtool"), "check-config", str(AM_EXAMPLE)], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout
    broken = tmp_path / "broken.yaml"
    cfg = yaml.safe_load(AM_EXAMPLE.read_text())
    cfg["route"]["receiver"] = "no-such-receiver"
    broken.write_text(yaml.safe_dump(cfg))
    out = subprocess.run([tool("amtool"), "check-config", str(broken)], capture_output=True, text=True, timeout=60)
    assert out.returncode != 0


def test_alertmanager_example_sends_triscope_alerts_to_the_webhook_with_a_bearer_token() -> None:
    cfg = yaml.safe_load(AM_EXAMPLE.read_text())
    (rx,) = [r for r in cfg["receivers"] if r["name"] == "triscope-remediation"]
    (hook,) = rx["webhook_configs"]
    assert hook["url"].endswith("/api/v1/alerts")
    auth = hook["http_config"]["authorization"]
    assert auth["type"] == "Bearer" and auth["credentials_file"].endswith("/token")
    assert "credentials" not in auth, "the token must come from a file, not the config"

    def routes(*labels: str) -> list[str]:
        out = subprocess.run([tool("amtool"), "config", "routes", "test", f"--config.file={AM_EXAMPLE}", *labels],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stdout + out.stderr
        return sorted(out.stdout.strip().split(","))

    assert routes("alertname=TriscopeIOSaturated", "severity=ticket", "node=n1") == ["team-tickets",
                                                                                     "triscope-remediation"]
    assert routes("alertname=TriscopeSLOBurnRatePage", "severity=page") == ["oncall-pager", "triscope-remediation"]
    assert routes("alertname=SomethingElse", "severity=page") == ["oncall-pager"]
