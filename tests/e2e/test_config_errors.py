"""Configuration files as pydantic models: every problem is one line, ``FILE:LINE: field: what is
wrong``, for the policy (each action's params included), the SLO file and the mismatch thresholds;
unknown keys are refused everywhere; a file with several problems reports the first in the file."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from kube_server import policy_text

from triscope.analysis.config import ConfigError, load_thresholds
from triscope.analysis.slo import SLOSpecError, parse_slo_text
from triscope.core import yamlsafe
from triscope.core.configfile import ConfigFileError, ConfigModel
from triscope.remediation.params import (
    CommandParams,
    DependencyFallbackParams,
    IsolateAcceleratorParams,
    RescheduleParams,
    RollingRestartParams,
)
from triscope.remediation.policy import PolicyError, parse_policy

REPO = Path(__file__).resolve().parents[2]
SETTINGS = "  namespaces: [inference]\n  node_names: [gpu-*]\n"
ACTION_PARAMS: dict[str, type[ConfigModel]] = {   # each action's params model
    "rolling_restart": RollingRestartParams,
    "dependency_fallback": DependencyFallbackParams,
    "reschedule": RescheduleParams,
    "isolate_accelerator": IsolateAcceleratorParams,
    "command": CommandParams,
}
# with SETTINGS (two lines) each rule starts on line 6; its params follow one per line
RULES = {
    "rolling_restart": """  - name: r
    trigger: {alert: A}
    action: rolling_restart
    target: {namespace: inference, deployment: web}
    params:
      timeout: 5m
      follow: true
""",
    "dependency_fallback": """  - name: r
    trigger: {alert: DepSlow}
    action: dependency_fallback
    target: {namespace: inference}
    params:
      configmap: deps
      key: mode
      value: fallback
      ttl: 30m
      hold: 5m
""",
    "reschedule": """  - name: r
    trigger: {xid: 79}
    action: reschedule
    target: {node: {label: node}, namespace: {label: namespace}, deployment: {from: workload}}
    params:
      weights: {compute: 1, link: 1, storage: 0.5}
      eviction_timeout: 2m
      affinity_weight: 100
      cordon: true
""",
    "command": """  - name: r
    trigger: {alert: A}
    action: command
    params:
      argv: [systemctl, restart, x]
      timeout: 60s
""",
}


def refused(text: str, file: str = "p.yaml") -> PolicyError:
    with pytest.raises(PolicyError) as ei:
        parse_policy(text, file)
    e = ei.value
    msg = str(e)
    assert "\n" not in msg and "errors.pydantic.dev" not in msg and "Input should" not in msg, msg
    assert msg == f"{file}:{e.line}: {e.reason}"
    return e


def test_each_action_template_is_valid() -> None:
    for action, rule in RULES.items():
        r = parse_policy(policy_text(rule, SETTINGS), "p.yaml").rule("r")
        assert r.action == action
        assert isinstance(r.params, ACTION_PARAMS[action]), action   # the validated model itself


@pytest.mark.parametrize("action, old, new, line, reason", [
    ("rolling_restart", "timeout: 5m", "timeout: soon", 11,
     "rules[0].params.timeout: 'soon' is not a duration (e.g. 30s, 5m, 1h30m, 7d, 1w, 500ms, or a number of seconds)"),
    ("rolling_restart", "follow: true", "follow: 'yes'", 12, "rules[0].params.follow: must be true or false, not 'yes'"),
    ("rolling_restart", "follow: true", "folow: true", 12,
     "rules[0].params: unknown key 'folow' (allowed: timeout, follow)"),
    ("dependency_fallback", "configmap: deps", "configmap: Deps_Map", 11,
     "rules[0].params.configmap: 'Deps_Map' is not a valid Kubernetes name"),
    ("dependency_fallback", "key: mode", "key: 'a key'", 12, "rules[0].params.key: 'a key' is not a valid ConfigMap key"),
    ("dependency_fallback", "value: fallback", "value: [a]", 13, "rules[0].params.value: must be a string, not ['a']"),
    ("dependency_fallback", "ttl: 30m", "ttl: 0s", 14, "rules[0].params.ttl: must be longer than 0s"),
    ("dependency_fallback", "hold: 5m", "hold: -5m", 15, "rules[0].params.hold: '-5m' is not a duration"),
    ("dependency_fallback", "      configmap: deps\n", "", 10, "rules[0].params.configmap: missing (required)"),
    ("reschedule", "compute: 1, link: 1, storage: 0.5", "compute: 0, link: 0, storage: 0", 11,
     "rules[0].params.weights: at least one weight must be positive"),
    ("reschedule", "compute: 1,", "cpu: 1,", 11,
     "rules[0].params.weights: unknown key 'cpu' (allowed: compute, link, storage)"),
    ("reschedule", "storage: 0.5", "storage: 2000", 11, "rules[0].params.weights.storage: must be <= 1000.0, not 2000"),
    ("reschedule", "eviction_timeout: 2m", "eviction_timeout: two minutes", 12,
     "rules[0].params.eviction_timeout: 'two minutes' is not a duration"),
    ("reschedule", "affinity_weight: 100", "affinity_weight: 101", 13,
     "rules[0].params.affinity_weight: must be <= 100, not 101"),
    ("reschedule", "cordon: true", "cordon: 1", 14, "rules[0].params.cordon: must be true or false, not 1"),
    ("command", "argv: [systemctl, restart, x]", "argv: systemctl restart x", 10,
     "rules[0].params.argv: must be a non-empty list of arguments (fixed in the policy, no shell), "
     "not 'systemctl restart x'"),
    ("command", "timeout: 60s", "timeout: true", 11, "rules[0].params.timeout: must be a duration"),
    ("command", "    params:\n      argv: [systemctl, restart, x]\n      timeout: 60s\n", "", 6,
     "rules[0].params: missing (required)"),
])
def test_each_action_params_model_refuses_a_bad_param_on_its_line(action: str, old: str, new: str, line: int,
                                                                   reason: str) -> None:
    rule = RULES[action]
    assert old in rule
    e = refused(policy_text(rule.replace(old, new), SETTINGS))
    assert e.line == line and e.reason.startswith(reason), str(e)


def test_params_models_on_their_own() -> None:
    assert DependencyFallbackParams.model_validate({"configmap": "deps", "key": "mode", "value": 1}).model_dump() == {
        "configmap": "deps", "key": "mode", "value": "1", "ttl": 1800.0, "hold": 300.0}
    assert CommandParams.model_validate({"argv": ["sleep", 1]}).argv == ["sleep", "1"]


@pytest.mark.parametrize("text, line, reason", [
    # unknown keys, at every level, on the key's line, the allowed keys listed
    ("versoin: 1\nrules: []\n", 1, "unknown key 'versoin' (allowed: version, settings, rules)"),
    (policy_text(RULES["command"], "  dry_rn: true\n"), 3, "settings: unknown key 'dry_rn' (allowed: dry_run, "),
    (policy_text(RULES["command"], "  breaker: {windw: 5m}\n"), 3, "settings.breaker: unknown key 'windw' (allowed: "
                                                                  "window, max_targets, max_percent, min_population)"),
    (policy_text(RULES["command"], "  kubernetes:\n    mode: none\n    contxt: x\n"), 5,
     "settings.kubernetes: unknown key 'contxt'"),
    (policy_text(RULES["command"], "  leader_election: {lease_duraton: 15s}\n"), 3,
     "settings.leader_election: unknown key 'lease_duraton'"),
    (policy_text(RULES["command"].replace("action: command", "action: command\n    dryrun: true")), 11,
     "rules[0]: unknown key 'dryrun' (allowed: name, trigger, action, target, params, limits, dry_run)"),
    (policy_text(RULES["command"].replace("{alert: A}", "{alert: A, for: 5m}")), 9,
     "rules[0].trigger: unknown key 'for' (allowed: alert, matchers)"),
    (policy_text(RULES["command"].replace("{alert: A}", "{alrt: A}")), 9,
     "rules[0].trigger: unknown key 'alrt' (allowed: alert, matchers, metric, labels, op, threshold, for, nodes, "),
    (policy_text(RULES["command"] + "    limits:\n      cooldwn: 5m\n"), 15,
     "rules[0].limits: unknown key 'cooldwn' (allowed: cooldown, max_actions, per)"),
    (policy_text(RULES["command"] + "    target: {nod: x}\n"), 14, "rules[0].target: unknown key 'nod' (allowed: "
                                                                   "namespace, deployment, node, workload)"),
    (policy_text(RULES["command"] + "    target: {node: {label: node, defualt: x}}\n"), 14,
     "rules[0].target.node: unknown key 'defualt' (allowed: label, default)"),
    # a missing key on its mapping's line
    (policy_text(RULES["command"].replace("  - name: r\n    trigger", "  - trigger")), 8, "rules[0].name: missing (required)"),
    (policy_text(RULES["command"].replace("    action: command\n", "")), 8, "rules[0].action: missing (required)"),
    ("version: 1\nsettings: {}\n", 1, "rules: missing (required)"),
    # types and values, named by their path
    (policy_text(RULES["command"], "  workers: 100\n"), 3, "settings.workers: must be <= 64, not 100"),
    (policy_text(RULES["command"], "  kubernetes: {mode: cluster}\n"), 3,
     "settings.kubernetes.mode: must be 'none', 'kubeconfig', 'in-cluster' or 'url', not 'cluster'"),
    (policy_text(RULES["command"], "  slo_file:\n"), 3, "settings.slo_file: has no value: give one, or leave the key out"),
    (policy_text(RULES["command"].replace("{alert: A}", "{metric: m, threshold: high}")), 9,
     "rules[0].trigger.threshold: must be a number, not 'high'"),
    (policy_text(RULES["command"].replace("{alert: A}", "{metric: m, threshold: 1, op: '=>'}")), 9,
     "rules[0].trigger.op: must be '>', '>=', '<', '<=', '==' or '!=', not '=>'"),
    (policy_text(RULES["command"].replace("{alert: A}", "{alert: A, matchers: [sev]}")), 9,
     "rules[0].trigger.matchers[0]: matcher 'sev' is not LABEL=VALUE"),
    (policy_text(RULES["command"].replace("{alert: A}", "{alert: A, matchers: {sev: '~(', x: y}}")), 9,
     "rules[0].trigger.matchers.sev: matcher 'sev=~(': bad regular expression: "),
    (policy_text(RULES["command"], "  node_selector: {'bad key!': x}\n"), 3,
     "settings.node_selector['bad key!']: 'bad key!' is not a valid label key"),
    (policy_text(RULES["rolling_restart"].replace("deployment: web", "deployment: 5")), 11,
     "rules[0].target.deployment: must be a name or {label: LABEL, default: NAME}, not 5"),
    (policy_text(RULES["rolling_restart"].replace(", deployment: web", "")), 11,
     "rules[0].target: action rolling_restart needs target.deployment"),
    (policy_text(RULES["reschedule"], "  namespaces: [inference]\n"), 7,
     "rules[0].action: reschedule cordons and drains nodes: settings.node_names or settings.node_selector"),
    (policy_text(RULES["rolling_restart"], "  dry_run: true\n"), 2,
     "settings.namespaces: required when a rule acts on Kubernetes (the namespace allow-list)"),
])
def test_policy_problems_name_file_line_and_field(text: str, line: int, reason: str) -> None:
    e = refused(text)
    assert e.line == line and e.reason.startswith(reason), str(e)


def test_the_first_problem_in_the_file_is_reported_and_all_are_kept() -> None:
    text = policy_text(RULES["dependency_fallback"].replace("ttl: 30m", "ttl: later").replace("key: mode", "key: 'a b'"),
                       SETTINGS + "  workers: 0\n")
    e = refused(text)
    assert (e.line, e.field) == (5, "settings.workers")
    assert [(p.line, p.field) for p in e.problems] == [(5, "settings.workers"), (13, "rules[0].params.key"),
                                                      (15, "rules[0].params.ttl")]
    assert isinstance(e, ConfigFileError) and isinstance(e, yamlsafe.YAMLFileError)


def test_remediate_check_prints_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "policy.yaml"
    bad.write_text(policy_text(RULES["reschedule"].replace("affinity_weight: 100", "affinity_weight: lots"), SETTINGS))
    res = subprocess.run([sys.executable, "-m", "triscope", "remediate", "check", str(bad)], capture_output=True,
                         text=True, cwd=REPO, timeout=60)
    assert res.returncode == 1 and "Traceback" not in res.stderr
    assert res.stdout == f"{bad}:13: rules[0].params.affinity_weight: must be an integer, not 'lots'\n"


# ---------------------------------------------------------------------------------------------- SLO file
SLO = """version: prometheus/v1
service: app
labels: {team: ml}
slos:
  - name: avail
    objective: 99.9
    sli:
      events:
        error_query: sum(rate(errors_total[{{.window}}]))
        total_query: sum(rate(requests_total[{{.window}}]))
    alerting:
      name: AppAvail
      page_alert: {labels: {severity: page}}
      ticket_alert: {disable: true}
"""


@pytest.mark.parametrize("old, new, line, reason", [
    ("version: prometheus/v1", "version: prometheus/v2", 1,
     "version: must be \"prometheus/v1\" (Sloth's spec), not 'prometheus/v2'"),
    ("service: app\n", "", 1, "service: missing (required)"),
    ("labels: {team: ml}", "labels: {team-name: ml}", 3, "labels['team-name']: 'team-name' is not a valid label name"),
    ("labels: {team: ml}", "labels: {team: [ml]}", 3, "labels.team: must be a string (or a number), not ['ml']"),
    ("    objective: 99.9", "    objectve: 99.9", 6,
     "slos[0]: unknown key 'objectve' (allowed: name, objective, description, labels, sli, alerting)"),
    ("    objective: 99.9", "    objective: 100", 6,
     "slos[0].objective: must be a percentage between 0 and 100 (exclusive), not 100"),
    ("  - name: avail", "  - name: -avail", 5, "slos[0].name: must be a non-empty string of letters"),
    ("      events:\n", "      evnts:\n", 8, "slos[0].sli: unknown key 'evnts' (allowed: events)"),
    ("        total_query: sum(rate(requests_total[{{.window}}]))\n", "", 8,
     "slos[0].sli.events.total_query: missing (required)"),
    ("sum(rate(errors_total[{{.window}}]))", "rate(errors_total[5m])", 9, "slos[0].sli.events.error_query: unsupported query"),
    ("      name: AppAvail", "      name: App Avail", 12, "slos[0].alerting.name: 'App Avail' is not a valid alert name"),
    ("{disable: true}", "{disable: 'yes'}", 14, "slos[0].alerting.ticket_alert.disable: must be true or false, not 'yes'"),
    ("{disable: true}", "{disabled: true}", 14,
     "slos[0].alerting.ticket_alert: unknown key 'disabled' (allowed: disable, labels, annotations)"),
])
def test_slo_problems_name_file_line_and_field(old: str, new: str, line: int, reason: str) -> None:
    assert old in SLO
    with pytest.raises(SLOSpecError) as ei:
        parse_slo_text(SLO.replace(old, new), "s.yaml")
    e = ei.value
    assert e.line == line and e.reason.startswith(reason), str(e)
    assert str(e) == f"s.yaml:{line}: {e.reason}" and "\n" not in str(e)


def test_slo_file_still_builds_the_same_specs() -> None:
    (slo,) = parse_slo_text(SLO, "s.yaml")
    assert slo.id == "app-avail" and slo.labels == {"team": "ml"} and slo.source == "s.yaml:5"
    assert slo.alerting is not None and slo.alerting.page_labels == {"severity": "page"}
    assert slo.alerting.ticket_labels is None and slo.period_s == 30 * 86400
    derived = parse_slo_text(SLO.replace("      name: AppAvail\n", ""), "s.yaml")[0]
    assert derived.alerting is not None and derived.alerting.name == "AppAvailErrorBudgetBurn"


# ---------------------------------------------------------------------------------------------- thresholds
@pytest.mark.parametrize("text, line, reason", [
    ("mismatch:\n  idle_busy: 0.1\n  cpu_busy: high\n", 3, "mismatch.cpu_busy: must be a number, not 'high'"),
    ("mismatch:\n  idle_busy: 0.1\n  cpu_busy: -0.5\n", 3, "mismatch.cpu_busy: must be a finite number >= 0, not -0.5"),
    ("# comment\nidle_busy: 0.1\n\ncpu_bussy: 0.5\n", 4, "unknown mismatch threshold 'cpu_bussy' (allowed: window_s, "),
    ("mismatch:\n  idle_busy: 0.1\n  pin_churn_rate: .nan\n", 3, "mismatch.pin_churn_rate: must be a finite number"),
    ("mismatch:\n  window_s: soon\n", 2, "mismatch.window_s: 'soon' is not a duration"),
    ("mismatch: [0.1]\n", 1, "mismatch: must be a mapping, not [0.1]"),
    ("idle_busy: true\n", 1, "idle_busy: must be a number, not True"),
])
def test_threshold_problems_name_file_line_and_field(tmp_path: Path, text: str, line: int, reason: str) -> None:
    p = tmp_path / "th.yaml"
    p.write_text(text)
    with pytest.raises(ConfigError) as ei:
        load_thresholds(p, environ={})
    e = ei.value
    assert e.file == str(p) and e.line == line and e.reason.startswith(reason), str(e)
    assert str(e) == f"{p}:{line}: {e.reason}"


def test_thresholds_still_read_numbers_as_text_and_the_environment(tmp_path: Path) -> None:
    p = tmp_path / "th.yaml"
    p.write_text("mismatch:\n  io_saturated_link: '0.6'\n  min_ceiling_bytes_per_second: 2e9\n")
    th = load_thresholds(p, environ={"TRISCOPE_MISMATCH_IDLE_BUSY": "0.02"})
    assert th.io_saturated_link == 0.6 and th.min_ceiling_bytes_per_second == 2e9 and th.idle_busy == 0.02
    with pytest.raises(ConfigError) as ei:
        load_thresholds(p, environ={"TRISCOPE_MISMATCH_IDLE_BUSY": "-1"})
    assert str(ei.value) == "environment TRISCOPE_MISMATCH_IDLE_BUSY: must be a finite number >= 0, not '-1'"
