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

REPO = Path(__file__).resolve().parents[2]
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


def test_every_alert_is_documented_linked_and_routed_by_node_or_slo(rule_file: Path) -> None:
    spec = yaml.safe_load(rule_file.read_text())
    alerts = [r for g in spec["groups"] for r in g["rules"] if "alert" in r]
    assert {a["alert"] for a in alerts} >= {"TriscopeIOSaturated", "TriscopeStagingBound", "TriscopeNetworkBound",
                                           "TriscopeMismatchSevere", "H200InferenceRequestsLate",
                                           "H200InferenceLatency", "TriscopeAgentDown"}
    runbook = (REPO / "docs" / "alerts.md").read_text()
    sections = {line[3:].strip().lower() for line in runbook.splitlines() if line.startswith("## ")}
    for a in alerts:
        ann = a["annotations"]
        assert a["labels"]["severity"] in {"page", "ticket", "warning", "info"}, a["alert"]
        if "sloth_severity" in a["labels"]:     # generated from the SLO file: fleet-wide, per SLO
            assert ann["title"] and ann["summary"], a["alert"]
            assert ann["dashboard_url"] == "{{ $externalLabels.triscope_dashboard_url }}/slos?range=1h"
        else:
            assert ann["summary"] and ann["description"], a["alert"]
            assert "node" in ann["summary"], a["alert"]
            assert ann["dashboard_url"].startswith(
                "{{ $externalLabels.triscope_dashboard_url }}/node/{{ $labels.node }}?"), a["alert"]
            assert ann["dashboard_url"].endswith("range=1h"), a["alert"]
        assert ann["runbook_url"] == f"{{{{ $externalLabels.triscope_docs_url }}}}/alerts.md#{a['alert'].lower()}"
        assert a["alert"].lower() in sections, f"docs/alerts.md has no section '## {a['alert']}'"


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


# the two external labels the annotations' links are built from (docs/deploy.md)
LINKS = "{triscope_docs_url: 'https://docs.example.com/triscope', triscope_dashboard_url: 'https://triscope.example.com'}"

UNIT_TESTS = """
rule_files: [{rules}]
evaluation_interval: 30s
tests:
  # io-saturated held for 6 minutes with a high score on GPU 0 of node-a: fires, labelled with the
  # accelerator and its workload, the evidence read from the GPU's series; the same state with a
  # low score (node-b) and a short episode (node-c) must not.
  - interval: 30s
    external_labels: {links}
    input_series:
      - series: 'triscope_mismatch_state{{state="io-saturated", node="node-a", gpu="0", namespace="inference", pod="p-a", container="server"}}'
        values: '1x20'
      - series: 'triscope_mismatch_score{{node="node-a", gpu="0", namespace="inference", pod="p-a", container="server"}}'
        values: '0.6x20'
      - series: 'triscope_gpu_sm_active_ratio{{node="node-a", gpu="0"}}'
        values: '0x20'
      - series: 'triscope_gpu_pcie_rx_bytes_total{{node="node-a", gpu="0"}}'
        values: '0+1500000000000x20'
      - series: 'triscope_gpu_pcie_tx_bytes_total{{node="node-a", gpu="0"}}'
        values: '0x20'
      - series: 'triscope_mismatch_state{{state="io-saturated", node="node-b", gpu="1", namespace="inference", pod="p-b", container="server"}}'
        values: '1x20'
      - series: 'triscope_mismatch_score{{node="node-b", gpu="1", namespace="inference", pod="p-b", container="server"}}'
        values: '0.1x20'
      - series: 'triscope_mismatch_state{{state="io-saturated", node="node-c", gpu="0", workload="cmd:python"}}'
        values: '1 1 1 1 0x16'
      - series: 'triscope_mismatch_score{{node="node-c", gpu="0", workload="cmd:python"}}'
        values: '0.9x20'
    alert_rule_test:
      - eval_time: 6m
        alertname: TriscopeIOSaturated
        exp_alerts:
          - exp_labels: {{node: node-a, gpu: "0", namespace: inference, pod: p-a, container: server, severity: ticket, category: mismatch}}
            exp_annotations:
              summary: "node-a GPU 0: inference/p-a starved by a saturated I/O link"
              description: "Mismatch state io-saturated for 5 minutes; 60% of the accelerator's time lost to I/O. Check batch sizes, host-to-device copy overlap, link generation/width."
              evidence: "SM activity 0%; PCIe host-to-device 50GB/s, device-to-host 0B/s (5-minute averages)."
              runbook_url: https://docs.example.com/triscope/alerts.md#triscopeiosaturated
              dashboard_url: https://triscope.example.com/node/node-a?gpu=0&range=1h
      - eval_time: 3m
        alertname: TriscopeIOSaturated
        exp_alerts: []
  # The SRE's lightly loaded, healthy GPU (issue 18): demand-limited, score 0, for 40 minutes; and a
  # node whose agent only publishes the node roll-up (an agent from before per-accelerator
  # verdicts) with the old false verdict, staging-bound at 0.96. Neither is a workload losing
  # time that the alert can name: nothing fires, nothing pages.
  - interval: 30s
    external_labels: {links}
    input_series:
      - series: 'triscope_mismatch_state{{state="demand-limited", node="node-l", gpu="0", namespace="inference", pod="light-0", container="server"}}'
        values: '1x80'
      - series: 'triscope_mismatch_state{{state="staging-bound", node="node-l", gpu="0", namespace="inference", pod="light-0", container="server"}}'
        values: '0x80'
      - series: 'triscope_mismatch_score{{node="node-l", gpu="0", namespace="inference", pod="light-0", container="server"}}'
        values: '0x80'
      - series: 'triscope_mismatch_state{{state="demand-limited", node="node-l"}}'
        values: '1x80'
      - series: 'triscope_mismatch_score{{node="node-l"}}'
        values: '0x80'
      - series: 'triscope_mismatch_state{{state="staging-bound", node="node-old"}}'
        values: '1x80'
      - series: 'triscope_mismatch_score{{node="node-old"}}'
        values: '0.96x80'
    alert_rule_test:
      - eval_time: 40m
        alertname: TriscopeStagingBound
        exp_alerts: []
      - eval_time: 40m
        alertname: TriscopeMismatchSevere
        exp_alerts: []
      - eval_time: 40m
        alertname: TriscopeIOSaturated
        exp_alerts: []
      - eval_time: 40m
        alertname: TriscopeNetworkBound
        exp_alerts: []
  # A staging-bound workload: llm-7 on GPU 3 of node-s has a pegged feeder thread, its SM idles at
  # 5 % and the link moves 5 GB/s; its verdict (and the node's roll-up) is staging-bound at 0.95.
  # The ticket fires after 10 minutes and the page after 15, each once (the roll-up adds none),
  # labelled with the workload, the evidence in the annotations (the NIC's 5,000 DMA maps/s are
  # not the GPU's device).  Its neighbour on GPU 4 is demand-limited and stays quiet.
  - interval: 30s
    external_labels: {links}
    input_series:
      - series: 'triscope_mismatch_state{{state="staging-bound", node="node-s", gpu="3", namespace="inference", pod="llm-7", container="server"}}'
        values: '1x80'
      - series: 'triscope_mismatch_score{{node="node-s", gpu="3", namespace="inference", pod="llm-7", container="server"}}'
        values: '0.95x80'
      - series: 'triscope_mismatch_state{{state="demand-limited", node="node-s", gpu="4", namespace="inference", pod="llm-8", container="server"}}'
        values: '1x80'
      - series: 'triscope_mismatch_score{{node="node-s", gpu="4", namespace="inference", pod="llm-8", container="server"}}'
        values: '0x80'
      - series: 'triscope_mismatch_state{{state="staging-bound", node="node-s"}}'
        values: '1x80'
      - series: 'triscope_mismatch_score{{node="node-s"}}'
        values: '0.95x80'
      - series: 'triscope_gpu_sm_active_ratio{{node="node-s", gpu="3"}}'
        values: '0.05x80'
      - series: 'triscope_gpu_pcie_rx_bytes_total{{node="node-s", gpu="3"}}'
        values: '0+150000000000x80'
      - series: 'triscope_workload_feeder_busy_ratio{{node="node-s", gpu="3", namespace="inference", pod="llm-7", container="server"}}'
        values: '0.99x80'
      - series: 'triscope_workload_cpu_wait_ratio{{node="node-s", gpu="3", namespace="inference", pod="llm-7", container="server"}}'
        values: '0.02x80'
      - series: 'triscope_gpu_info{{node="node-s", gpu="3", bus_id="0000:3b:00.0"}}'
        values: '1x80'
      - series: 'triscope_dma_map_total{{node="node-s", device="0000:3b:00.0", direction="to_device"}}'
        values: '0+1500x80'
      - series: 'triscope_dma_map_total{{node="node-s", device="0000:5e:00.0", direction="from_device"}}'
        values: '0+150000x80'
    alert_rule_test:
      - eval_time: 9m
        alertname: TriscopeStagingBound
        exp_alerts: []
      - eval_time: 11m
        alertname: TriscopeStagingBound
        exp_alerts:
          - exp_labels: {{node: node-s, gpu: "3", namespace: inference, pod: llm-7, container: server, severity: ticket, category: mismatch}}
            exp_annotations:
              summary: "node-s GPU 3: inference/llm-7 starved by host staging"
              description: "Mismatch state staging-bound for 10 minutes, 95% of the accelerator's time lost: the host cannot feed it (a pegged feeder thread, CPU wait or pressure, pinning). Use pinned host buffers, more loader threads, CPU requests that match the work."
              evidence: "SM activity 5%; PCIe host-to-device 5GB/s; busiest feeder thread 99% of a core; CPU wait 2%; cgroup CPU pressure n/a; DMA maps on its device 50/s (5-minute averages)."
              runbook_url: https://docs.example.com/triscope/alerts.md#triscopestagingbound
              dashboard_url: https://triscope.example.com/node/node-s?gpu=3&range=1h
      - eval_time: 14m
        alertname: TriscopeMismatchSevere
        exp_alerts: []
      - eval_time: 16m
        alertname: TriscopeMismatchSevere
        exp_alerts:
          - exp_labels: {{node: node-s, gpu: "3", namespace: inference, pod: llm-7, container: server, severity: page, category: mismatch}}
            exp_annotations:
              summary: "node-s GPU 3: inference/llm-7 loses over half of its accelerator time to I/O"
              description: "Average mismatch score 95% over 15 minutes, in state staging-bound; the ticket alert of that state carries the evidence."
              runbook_url: https://docs.example.com/triscope/alerts.md#triscopemismatchsevere
              dashboard_url: https://triscope.example.com/node/node-s?gpu=3&range=1h
  # An NPU (Ascend) chip: the dashboard link names npu and chip instead of gpu.
  - interval: 30s
    external_labels: {links}
    input_series:
      - series: 'triscope_mismatch_state{{state="network-bound", node="node-n", npu="2", chip="1", workload="cmd:python"}}'
        values: '1x20'
      - series: 'triscope_mismatch_score{{node="node-n", npu="2", chip="1", workload="cmd:python"}}'
        values: '0.5x20'
    alert_rule_test:
      - eval_time: 6m
        alertname: TriscopeNetworkBound
        exp_alerts:
          - exp_labels: {{node: node-n, npu: "2", chip: "1", workload: "cmd:python", severity: ticket, category: mismatch}}
            exp_annotations:
              summary: "node-n NPU 2 chip 1: cmd:python starved while the network retransmits"
              description: "Mismatch state network-bound for 5 minutes, 50% of the accelerator's time lost."
              evidence: "TCP retransmits n/a; SM activity n/a (5-minute averages)."
              runbook_url: https://docs.example.com/triscope/alerts.md#triscopenetworkbound
              dashboard_url: https://triscope.example.com/node/node-n?npu=2&chip=1&range=1h
  # A node-wide alert (no accelerator): the link opens the node page.
  - interval: 1m
    external_labels: {links}
    input_series:
      - series: 'up{{job="triscope-agent", node="node-d", instance="10.0.0.4:9400"}}'
        values: '0x10'
    alert_rule_test:
      - eval_time: 6m
        alertname: TriscopeAgentDown
        exp_alerts:
          - exp_labels: {{job: triscope-agent, node: node-d, instance: "10.0.0.4:9400", severity: ticket, category: agent}}
            exp_annotations:
              summary: "node-d: triscope agent not scraped for 5 minutes"
              description: "The node's mismatch and kernel signals are blind."
              runbook_url: https://docs.example.com/triscope/alerts.md#triscopeagentdown
              dashboard_url: https://triscope.example.com/node/node-d?range=1h
"""


def test_rules_fire_when_they_must_and_stay_quiet_otherwise(rule_file: Path) -> None:
    tests = rule_file.parent / "triscope.rules.test.yaml"
    tests.write_text(UNIT_TESTS.format(rules=rule_file.name, links=LINKS))
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
    # SLO alerts are named in the SLO file (no Triscope prefix): the engine gets them by their sloth_slo
    # label, people by severity
    slo = ("alertname=H200InferenceRequestsLate", "sloth_slo=requests-on-time", "sloth_id=h200-inference-requests-on-time")
    assert routes(*slo, "severity=page") == ["oncall-pager", "triscope-remediation"]
    assert routes(*slo, "severity=ticket") == ["team-tickets", "triscope-remediation"]
    assert routes("alertname=TriscopeAgentDown", "severity=ticket", "node=n1") == ["team-tickets", "triscope-remediation"]
    assert routes("alertname=SomethingElse", "severity=ticket") == ["team-tickets"]
    assert routes("alertname=SomethingElse", "severity=page") == ["oncall-pager"]
