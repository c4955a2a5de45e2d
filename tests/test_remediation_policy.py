"""Policy parsing: the shipped example is valid; malformed policies are refused with file, line and reason."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from kube_server import policy_text

from triscope.remediation.policy import PolicyError, load_policy, parse_policy

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "deploy" / "policy.example.yaml"

RULE = """  - name: r1
    trigger: {alert: A}
    action: rolling_restart
    target: {namespace: inference, deployment: {label: deployment}}
"""
RESCHEDULE = """  - name: mv
    trigger: {alert: A}
    action: reschedule
    target: {node: {label: node}, namespace: inference, deployment: web}
"""


def test_example_policy_is_valid_and_complete() -> None:
    pol = load_policy(EXAMPLE)
    kinds = {r.trigger.kind for r in pol.rules}
    actions = {r.action for r in pol.rules}
    assert kinds == {"alert", "metric", "mismatch", "slo", "xid"}
    assert actions == {"rolling_restart", "dependency_fallback", "reschedule", "command"}
    r = pol.rule("restart-on-retransmit-storm")
    assert r.cooldown_s == 1800 and r.max_actions == 3 and r.per_s == 3600
    assert r.trigger.matchers[0].matches({"severity": "page"})
    assert not r.trigger.matchers[0].matches({"severity": "info"})
    assert pol.rule("fallback-when-network-bound").params["ttl"] == 1800
    assert "inference" in pol.settings.namespaces
    # the rules that reschedule are bounded by a node allow-list
    assert pol.settings.nodes_bounded and pol.settings.node_selector == (("triscope.io/remediation", "allowed"),)


@pytest.mark.parametrize("text,line,needle", [
    ("version: 1\nrules: [\n", 3, "not valid YAML"),
    ("version: 2\nrules: []\n", 1, "unsupported policy version"),
    (policy_text(RULE.replace("action: rolling_restart", "action: reboot")), 10, "unknown action 'reboot'"),
    (policy_text(RULE.replace("{alert: A}", "{alert: A, metric: m}")), 9, "exactly one of"),
    (policy_text(RULE + "    limits: {cooldown: soon}\n"), 12, "not a duration"),
    (policy_text(RULE + "    limits:\n      cooldwn: 5m\n"), 13, "unknown key 'cooldwn'"),
    (policy_text(RULE.replace("namespace: inference,", "namespace: kube-system,")), 11, "not in settings.namespaces"),
    (policy_text(RULE.replace("deployment: {label: deployment}", "deploymnt: x")), 11, "unknown key 'deploymnt'"),
    (policy_text(RULE + RULE), 12, "duplicate rule name 'r1'"),
    (policy_text("""  - name: c
    trigger: {xid: [79, "x"]}
    action: command
    params: {argv: []}
"""), 9, "trigger.xid: must be an XID code"),
    (policy_text("""  - name: c
    trigger: {metric: m, threshold: 1}
    action: command
    params: {argv: []}
"""), 11, "params.argv"),
    (policy_text("""  - name: f
    trigger: {mismatch: network-bound}
    action: dependency_fallback
    target: {namespace: inference}
    params: {key: mode}
"""), 12, "params.configmap: missing"),
    (policy_text(RULE, settings="  leader_election: {enabled: true}\n  namespaces: [inference]\n"), 3,
     "needs a Kubernetes API"),
    (policy_text(RULE, settings="  max_in_flight: 0\n  namespaces: [inference]\n"), 3, "settings.max_in_flight: must be >= 1"),
    (policy_text(RULE.replace("trigger: {alert: A}", "trigger: {alert: A, matchers: ['sev=~(']}")), 9,
     "bad regular expression"),
    # node targets are bounded like namespaces: a reschedule rule needs the node allow-list ...
    (policy_text(RESCHEDULE), 10, "settings.node_names or settings.node_selector (the node allow-list) is required"),
    # ... which cannot be "every node" ...
    (policy_text(RESCHEDULE, settings="  namespaces: [inference]\n  node_names: [gpu-*, '*']\n"), 4,
     "'*' matches any node name"),
    (policy_text(RESCHEDULE, settings="  namespaces: [inference]\n  node_selector: {}\n"), 4,
     "node_selector: must be a non-empty mapping"),
    # ... and a node named in the rule must be in it
    (policy_text(RESCHEDULE.replace("{label: node}", "cpu-1"), settings="  namespaces: [inference]\n"
                 "  node_names: [gpu-*]\n"), 9, "node 'cpu-1' is not in settings.node_names"),
])
def test_malformed_policy_reports_file_line_reason(text: str, line: int, needle: str) -> None:
    with pytest.raises(PolicyError) as ei:
        parse_policy(text, "p.yaml")
    assert ei.value.line == line, str(ei.value)
    assert needle in ei.value.reason
    assert str(ei.value).startswith(f"p.yaml:{line}: ")


def test_cli_check_ok_and_refusal(tmp_path: Path) -> None:
    ok = subprocess.run([sys.executable, "-m", "triscope", "remediate", "check", str(EXAMPLE)],
                        capture_output=True, text=True, cwd=REPO)
    assert ok.returncode == 0, ok.stderr
    assert "OK, 6 rule(s)" in ok.stdout and "restart-on-retransmit-storm" in ok.stdout
    bad = tmp_path / "bad.yaml"
    bad.write_text(policy_text(RULE.replace("rolling_restart", "nuke")))
    res = subprocess.run([sys.executable, "-m", "triscope", "remediate", "check", str(bad)],
                         capture_output=True, text=True, cwd=REPO)
    assert res.returncode == 1
    assert f"{bad}:10: rules[0].action: unknown action 'nuke'" in res.stdout
    assert "Traceback" not in res.stdout + res.stderr


def test_engine_refuses_malformed_policy_at_start(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(policy_text(RULE + "    dry_run: maybe\n"))
    res = subprocess.run([sys.executable, "-m", "triscope", "remediate", "--db", f"sqlite:///{tmp_path}/t.db",
                          "--policy", str(bad), "--insecure-no-auth"], capture_output=True, text=True, cwd=REPO,
                         timeout=60)
    assert res.returncode == 2
    assert f"policy refused: {bad}:12: rules[0].dry_run: must be true or false" in res.stderr
