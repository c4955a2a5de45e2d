"""Policy parsing: the shipped example is valid; malformed policies are refused with file, line and reason."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from kube_server import policy_text

from triscope.remediation.policy import PolicyError, load_policy, parse_policy

REPO = Path(__file__).resolve().parents[2]
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
    assert pol.rule("fallback-when-network-bound").params.model_dump()["ttl"] == 1800
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


# Targets only from the verdict: a per-accelerator trigger acts on what it names, or not at all -----
NODES = "  namespaces: [inference]\n  node_names: [gpu-*]\n"
FROM_VERDICT = "{namespace: {label: namespace}, deployment: {from: workload}}"


def _rule(trigger: str, action: str, target: str, params: str = "") -> str:
    return (f"  - name: v\n    trigger: {trigger}\n    action: {action}\n    target: {target}\n"
            + (f"    params: {params}\n" if params else ""))


@pytest.mark.parametrize("trigger,action,target,params,needle", [
    # the workload: from the verdict, never a name or another label
    ("{mismatch: staging-bound}", "rolling_restart", "{namespace: {label: namespace}, deployment: web}", "",
     "target.deployment: a mismatch trigger acts only on the workload it names"),
    ("{mismatch: staging-bound}", "rolling_restart", "{namespace: {label: namespace}, deployment: {label: app}}", "",
     "target.deployment: a mismatch trigger acts only on the workload it names"),
    ("{metric: triscope_gpu_pcie_replays_total, threshold: 1}", "rolling_restart",
     "{namespace: {label: namespace}, deployment: web}", "",
     "a per-accelerator metric trigger (triscope_gpu_pcie_replays_total) acts only on the workload it names"),
    ("{xid: [79]}", "rolling_restart", "{namespace: inference, deployment: {label: deployment}}", "",
     "target.deployment: an xid trigger acts only on the workload it names"),
    # its namespace: the verdict's
    ("{mismatch: network-bound}", "rolling_restart", "{namespace: inference, deployment: {from: workload}}", "",
     "target.namespace: a mismatch trigger acts only in its workload's namespace"),
    ("{mismatch: network-bound}", "rolling_restart", "{namespace: {label: team}, deployment: {from: workload}}", "",
     "target.namespace: a mismatch trigger acts only in its workload's namespace"),
    # the node: the one it fired on, never a name or a default
    ("{xid: [79]}", "reschedule", "{node: gpu-1, " + FROM_VERDICT[1:], "",
     "target.node: an xid trigger acts only on the node it fired on"),
    ("{xid: [79]}", "reschedule", "{node: {label: node, default: gpu-1}, " + FROM_VERDICT[1:], "",
     "target.node.default: an xid trigger acts only on the node it fired on"),
    # a ConfigMap fallback switches that workload's dependency, not the namespace's
    ("{mismatch: network-bound}", "dependency_fallback", "{namespace: {label: namespace}}",
     "{configmap: deps, key: mode}", "a ConfigMap fallback needs deployment: {from: workload}"),
    ("{mismatch: network-bound}", "dependency_fallback", FROM_VERDICT, "{configmap: deps, key: mode}",
     "params: a mismatch trigger switches one workload's dependency, not a namespace's"),
    # a node-wide metric names no workload
    ("{metric: triscope_tcp_retransmits_total, threshold: 50}", "rolling_restart", FROM_VERDICT, "",
     "action: triscope_tcp_retransmits_total is node-wide (no gpu, npu or workload label): it names no workload"),
    ("{metric: triscope_tcp_retransmits_total, threshold: 50}", "command", "{node: gpu-1}", "{argv: ['true']}",
     "target.node: a node-wide trigger acts on the node it fired on"),
])
def test_a_per_accelerator_trigger_takes_its_targets_from_the_verdict(trigger: str, action: str, target: str,
                                                                      params: str, needle: str) -> None:
    with pytest.raises(PolicyError) as e:
        parse_policy(policy_text(_rule(trigger, action, target, params), NODES), "p.yaml")
    assert str(e.value).startswith("p.yaml:") and e.value.line > 0
    assert needle in str(e.value), str(e.value)


@pytest.mark.parametrize("trigger,action,target,params", [
    ("{mismatch: staging-bound}", "rolling_restart", FROM_VERDICT, ""),
    ("{mismatch: network-bound}", "dependency_fallback", FROM_VERDICT, "{configmap: deps, key: '{deployment}.mode'}"),
    ("{mismatch: network-bound}", "dependency_fallback", FROM_VERDICT, "{configmap: '{deployment}-deps', key: mode}"),
    ("{xid: [79]}", "reschedule", "{node: {label: node}, " + FROM_VERDICT[1:], ""),
    ("{metric: triscope_tcp_retransmits_total, threshold: 50}", "command", "{node: {label: node}}", "{argv: ['true']}"),
    # explicit targets stay for alerts and an application's own metrics, inside the allow-lists
    ("{alert: A}", "rolling_restart", "{namespace: inference, deployment: web}", ""),
    ("{metric: http_requests_in_flight, threshold: 100}", "rolling_restart", "{namespace: inference, deployment: web}",
     ""),
])
def test_targets_the_trigger_names_are_accepted(trigger: str, action: str, target: str, params: str) -> None:
    pol = parse_policy(policy_text(_rule(trigger, action, target, params), NODES), "p.yaml")
    assert pol.rule("v").action == action


def test_a_per_workload_fallback_switches_only_that_workloads_key() -> None:
    from triscope.remediation.target_resolution import target_key
    from triscope.remediation.targets import per_workload

    pol = parse_policy(policy_text(_rule("{mismatch: network-bound}", "dependency_fallback", FROM_VERDICT,
                                         "{configmap: deps, key: '{deployment}.mode'}"), NODES), "p.yaml")
    r = pol.rule("v")
    a = target_key(r, {"namespace": "inference", "deployment": "web"})
    b = target_key(r, {"namespace": "inference", "deployment": "ocr"})
    assert a[0] == "configmap/inference/deps/web.mode" and a != b     # own cooldowns, own fallbacks
    assert per_workload("{deployment}-deps", {"deployment": "ocr"}) == "ocr-deps"


def test_the_shipped_and_example_policies_pass_check(tmp_path: Path) -> None:
    """Every policy the project ships or runs (the H200 loop's, its knobs folder filled in as its
    record script does) passes the same checks as `remediate check`, verdict-only targets included."""
    load_policy(EXAMPLE)
    text = (REPO / "examples" / "inference" / "policy.yaml").read_text().replace("@KNOBS_DIR@", str(tmp_path))
    pol = parse_policy(text, "examples/inference/policy.yaml")
    assert all(r.trigger.kind == "mismatch" for r in pol.rules)
