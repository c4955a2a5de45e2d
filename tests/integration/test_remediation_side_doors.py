"""No side door around "act only where the verdict points", and no trigger that can never fire.

* A ``command`` on a verdict trigger (``mismatch``, ``xid``, a per-accelerator metric) must carry its
  target through a placeholder (``{namespace}``, ``{pod}``, ``{gpu}``...: each value checked as a
  Kubernetes name, never an option, one argv word) or say ``literal_targets: true``, which the audit
  row and the Event show; ``remediate check`` refuses the rest, and any inline script (``sh -c``).
* A ``metric`` trigger on a ``triscope_`` name the catalogue does not list is refused with the
  closest known names.
"""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path
from typing import Any

import pytest
from kube_server import KubeTestServer, policy_text

from triscope.core.samples import Sample, Tick
from triscope.remediation.engine import Engine
from triscope.remediation.kube.adapter import KubeAdapter
from triscope.remediation.params import fill_argv
from triscope.remediation.policy import PolicyError, parse_policy
from triscope.store import audit

SETTINGS = ("  namespaces: [inference]\n  evaluate_interval: 1s\n"
            "  breaker: {window: 15m, max_targets: 50, max_percent: 100, min_population: 1000}\n"
            "  kubernetes: {mode: none, events: true, events_namespace: triscope}\n")


def rule(argv: str, trigger: str = "{mismatch: staging-bound, for: 30s}", target: str = "",
         extra: str = "") -> str:
    return (f"  - name: cmd\n    trigger: {trigger}\n    action: command\n"
            + (f"    target: {target}\n" if target else "")
            + f"    params: {{argv: {argv}{extra}}}\n    limits: {{cooldown: 0s}}\n")


def check(text: str) -> None:
    parse_policy(policy_text(text, SETTINGS), "p.yaml")


@pytest.mark.parametrize("argv", [
    '[kubectl, rollout, restart, deploy/x]',
    '[kubectl, -n, ns, delete, pod, p]',
    "[sh, -c, 'kubectl delete pod p']",
])
@pytest.mark.parametrize("trigger", ["{mismatch: staging-bound, for: 30s}", "{xid: [79]}",
                                     "{metric: triscope_gpu_pcie_replays_total, threshold: 1}"],
                         ids=["mismatch", "xid", "per-accelerator-metric"])
def test_a_verdict_trigger_refuses_a_command_with_fixed_targets(argv: str, trigger: str) -> None:
    with pytest.raises(PolicyError) as e:
        check(rule(argv, trigger))
    msg = str(e.value)
    assert msg.startswith("p.yaml:") and ": rules[0].params.argv: " in msg, msg
    assert "acts only on what it names" in msg and "literal_targets: true" in msg, msg


@pytest.mark.parametrize("argv", [
    "[sh, -c, 'kubectl delete pod {pod}']",          # a placeholder inside a script is still a script
    "[bash, -lc, 'echo {pod}']",
    "[/usr/bin/env, FOO=1, sh, -ec, 'echo {pod}']",
    "[python3, -c, 'import os; print(\"{pod}\")']",
])
def test_an_inline_script_is_refused_even_with_a_placeholder(argv: str) -> None:
    with pytest.raises(PolicyError, match=r"-[ce] runs a script whose targets the engine cannot check"):
        check(rule(argv, target="{namespace: {label: namespace}}"))


def test_what_a_verdict_trigger_may_run() -> None:
    # the target through placeholders: the verdict's namespace and pod, its GPU
    check(rule("[kubectl, -n, '{namespace}', delete, pod, '{pod}']", target="{namespace: {label: namespace}}"))
    check(rule("[/usr/local/bin/drain-gpu, '--gpu={gpu}', '--node={node}']", target="{node: {label: node}}"))
    # fixed targets, said so
    check(rule("[kubectl, rollout, restart, deploy/x]", extra=", literal_targets: true"))
    check(rule("[sh, -c, 'kubectl delete pod p']", extra=", literal_targets: true"))
    # an alert names its own targets: unchanged
    check(rule("[kubectl, rollout, restart, deploy/x]", trigger="{alert: GpuSlow}"))


def test_placeholders_are_checked_at_load() -> None:
    with pytest.raises(PolicyError, match=r"rules\[0\]\.params\.argv\[1\]: unknown placeholder \{deploymnet\}"):
        check(rule("[restart, '{deploymnet}']", extra=", literal_targets: true"))
    with pytest.raises(PolicyError, match=r"the argv uses \{namespace\}: give target.namespace"):
        check(rule("[kubectl, -n, '{namespace}', delete, pod, '{pod}']"))
    with pytest.raises(PolicyError, match=r"no placeholder in argv\[0\]"):
        check(rule("['{pod}']"))


def test_each_value_is_one_argv_word_and_never_an_option() -> None:
    assert fill_argv(["kubectl", "-n", "{namespace}", "delete", "pod/{pod}"], {"namespace": "inference", "pod": "llm-0"}) == [
        "kubectl", "-n", "inference", "delete", "pod/llm-0"]
    for bad in ("--all", "-rf", "a b", "x;rm -rf /", "$(id)", "", "UPPER"):
        with pytest.raises(ValueError, match="not a Kubernetes name"):
            fill_argv(["kubectl", "delete", "pod", "{pod}"], {"pod": bad})


def _staging(store: Any, now: float, pod: str) -> None:
    store.write_ticks("node-a", [Tick(now - 60 + i * 5, [Sample("triscope_mismatch_state", 1.0, {
        "gpu": "1", "state": "staging-bound", "namespace": "inference", "pod": pod,
        "workload": "Deployment/llm"})]) for i in range(13)], rollup=False)


def _recorder(tmp_path: Path) -> tuple[Path, Path]:
    script, out = tmp_path / "record-argv", tmp_path / "argv.txt"
    script.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {out}\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script, out


def test_the_verdict_s_target_reaches_the_command_as_argv_words(store: Any, tmp_path: Path) -> None:
    script, out = _recorder(tmp_path)
    now = time.time()
    _staging(store, now, "llm-0")
    pol = parse_policy(policy_text(rule(f"['{script}', -n, '{{namespace}}', 'pod/{{pod}}', '--gpu={{gpu}}']",
                                        target="{namespace: {label: namespace}}"), SETTINGS), "p.yaml")
    eng = Engine(store, pol)
    try:
        assert eng.evaluate_triggers(now) == 1 and eng.drain(30)
        row = audit.audit_log(store, limit=1)[0]
        assert row.outcome == "acted", row.reason
        assert out.read_text().splitlines() == ["-n", "inference", "pod/llm-0", "--gpu=1"]
        # one cooldown per target the argv carries
        assert row.target == f"command {script} for namespace=inference pod=llm-0 gpu=1 on local", row.target
    finally:
        eng.close()


def test_a_label_that_would_become_an_option_is_refused_and_nothing_runs(store: Any, tmp_path: Path) -> None:
    script, out = _recorder(tmp_path)
    now = time.time()
    _staging(store, now, "--all")
    pol = parse_policy(policy_text(rule(f"['{script}', delete, pod, '{{pod}}']"), SETTINGS), "p.yaml")
    eng = Engine(store, pol)
    try:
        assert eng.evaluate_triggers(now) == 1 and eng.drain(30)
        row = audit.audit_log(store, limit=1)[0]
        assert (row.outcome, row.rail) == ("suppressed", "target"), row.reason
        assert "'--all' is not a valid Kubernetes name" in row.reason
        assert not out.exists()
    finally:
        eng.close()


def test_literal_targets_is_in_the_audit_row_and_the_event(store: Any, tmp_path: Path) -> None:
    script, out = _recorder(tmp_path)
    now = time.time()
    _staging(store, now, "llm-0")
    srv = KubeTestServer().start()
    srv.add_node("node-a")
    pol = parse_policy(policy_text(rule(f"['{script}', rollout, restart, deploy/x]", target="{node: {label: node}}",
                                        extra=", literal_targets: true"), SETTINGS), "p.yaml")
    eng = Engine(store, pol, kube=KubeAdapter.connect(url=srv.url))
    try:
        assert eng.evaluate_triggers(now) == 1 and eng.drain(30)
        row = audit.audit_log(store, limit=1)[0]
        assert row.outcome == "acted" and row.params.get("literal_targets") is True, (row.outcome, row.params)
        assert "literal_targets: the argv's targets are fixed in the policy" in row.reason
        (ev,) = srv.list("events", "triscope")
        assert "literal_targets" in ev["message"], ev["message"]
        assert out.read_text().splitlines() == ["rollout", "restart", "deploy/x"]
    finally:
        eng.close()
        srv.stop()


# a metric trigger that could never fire ---------------------------------------------------------------
def test_a_misspelt_triscope_metric_is_refused_with_the_closest_names() -> None:
    text = rule('["true"]', trigger="{metric: triscope_gpu_pcie_replay_total, threshold: 1}", extra=", literal_targets: true")
    with pytest.raises(PolicyError) as e:
        check(text)
    msg = str(e.value)
    assert ": rules[0].trigger.metric: " in msg and "is not a triscope metric" in msg, msg
    assert "did you mean triscope_gpu_pcie_replays_total" in msg, msg
    # an application's own metric keeps working: it is not triscope's to know
    check(rule('["true"]', trigger="{alert: X}").replace("{alert: X}", "{metric: inference_queue_depth, threshold: 5}"))


def test_the_shipped_example_policy_still_passes() -> None:
    from triscope.remediation.policy import load_policy

    repo = Path(__file__).resolve().parents[2]
    assert load_policy(repo / "deploy" / "policy.example.yaml").rules
    assert os.path.exists(repo / "deploy" / "policy.example.yaml")


def test_the_agent_s_process_metrics_are_refused_too_they_are_never_stored() -> None:
    text = rule('["true"]', trigger="{metric: triscope_process_resident_memory_bytes, threshold: 1e9}")
    with pytest.raises(PolicyError, match="exported for Prometheus only and never stored"):
        check(text)
