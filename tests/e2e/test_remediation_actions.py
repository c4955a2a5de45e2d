"""Actions against the Kubernetes test server, stored-data triggers, and what each decision leaves behind
(audit row, timeline event, Kubernetes Event, the actions counter)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kube_server import BASE_SETTINGS, KubeTestServer, policy_text, webhook_payload

from triscope.core.samples import EventRecord, Sample, Tick
from triscope.remediation import metrics
from triscope.remediation.engine import Engine
from triscope.remediation.kube.adapter import KubeAdapter
from triscope.remediation.kube.errors import NotOurCordon
from triscope.remediation.policy import parse_policy
from triscope.store import audit


@pytest.fixture
def srv() -> Iterator[KubeTestServer]:
    s = KubeTestServer(rollout_delay=0.1).start()
    for n in ("node-a", "node-b", "node-c"):
        s.add_node(n)
    yield s
    s.stop()


@pytest.fixture
def store(any_store: Any) -> Any:
    """These tests run on SQLite and on PostgreSQL: conftest's ``any_store``."""
    return any_store


NODES = BASE_SETTINGS + "  node_names: [node-*]\n"   # the node allow-list reschedule rules need


def engine(store: Any, srv: KubeTestServer, rules: str, dry_run: bool = False, settings: str = "") -> Engine:
    return Engine(store, parse_policy(policy_text(rules, settings), "t.yaml"), kube=KubeAdapter.connect(url=srv.url),
                  dry_run=dry_run)


def counter(action: str, outcome: str) -> float:
    v = metrics.REGISTRY.get_sample_value("triscope_remediation_actions_total", {"action": action, "outcome": outcome})
    return v or 0.0


def test_rolling_restart_follows_rollout_and_records_everywhere(store: Any, srv: KubeTestServer) -> None:
    srv.add_deployment("inference", "web", replicas=3)
    old_pods = {p["metadata"]["name"] for p in srv.list("pods", "inference")}
    before = counter("rolling_restart", "acted")
    eng = engine(store, srv, """  - name: restart
    trigger: {alert: Storm}
    action: rolling_restart
    target: {namespace: {label: namespace}, deployment: {label: deployment}}
    params: {timeout: 10s}
""")
    eng.submit_alerts(webhook_payload([{"labels": {"alertname": "Storm", "namespace": "inference", "deployment": "web",
                                                 "node": "node-a"}}]))
    assert eng.drain(20)
    eng.close()
    row = audit.audit_log(store)[0]
    assert row.outcome == "acted" and row.response["rollout"]["complete"] is True
    assert row.issued_ts and row.received_ts and row.issued_ts >= row.received_ts
    patch = srv.calls("PATCH", "/apis/apps/v1/namespaces/inference/deployments/web")[0]
    assert patch.content_type == "application/strategic-merge-patch+json"
    assert "kubectl.kubernetes.io/restartedAt" in patch.body["spec"]["template"]["metadata"]["annotations"]
    new_pods = {p["metadata"]["name"] for p in srv.list("pods", "inference")}
    assert len(new_pods) == 3 and not (new_pods & old_pods)
    assert counter("rolling_restart", "acted") == before + 1
    # the decision is on the node's timeline and is a Kubernetes Event on the Deployment
    ev = store.events(node="node-a", kinds=["remediation"])
    assert ev and ev[0].details["outcome"] == "acted" and ev[0].details["audit_id"] == row.id
    kev = srv.list("events", "inference")
    assert kev and kev[0]["reason"] == "RemediationActed" and kev[0]["involvedObject"]["name"] == "web"


def test_rolling_restart_timeout_is_failed(store: Any, srv: KubeTestServer) -> None:
    srv.add_deployment("inference", "web")
    srv.stuck_rollouts = True
    eng = engine(store, srv, """  - name: restart
    trigger: {alert: Storm}
    action: rolling_restart
    target: {namespace: inference, deployment: web}
    params: {timeout: 1s}
""")
    eng.submit_alerts(webhook_payload([{"labels": {"alertname": "Storm"}}]))
    assert eng.drain(20)
    eng.close()
    row = audit.audit_log(store)[0]
    assert row.outcome == "failed" and "not complete after 1s" in row.reason


FALLBACK = """  - name: fb
    trigger: {{alert: DepSlow}}
    action: dependency_fallback
    target: {{namespace: inference}}
    params: {{configmap: deps, key: mode, value: fallback, ttl: {ttl}, hold: {hold}}}
"""


def test_dependency_fallback_switch_and_revert_after_hold(store: Any, srv: KubeTestServer) -> None:
    srv.put("configmaps", {"metadata": {"name": "deps", "namespace": "inference"}, "data": {"mode": "normal", "x": "1"}})
    eng = engine(store, srv, FALLBACK.format(ttl="1h", hold="1s"))
    alert = {"labels": {"alertname": "DepSlow"}, "fingerprint": "fp1", "startsAt": "2099-01-01T00:00:00Z"}
    eng.submit_alerts(webhook_payload([alert]))
    assert eng.drain()
    cm = srv.get("configmaps", "inference", "deps")
    assert cm["data"] == {"mode": "fallback", "x": "1"}
    assert cm["metadata"]["annotations"]["triscope.io/fallback-rule"] == "fb"
    assert "triscope.io/fallback-expires-at" in cm["metadata"]["annotations"]
    assert eng.revert_fallbacks() == 0  # still firing: no revert
    eng.submit_alerts(webhook_payload([alert], status="resolved"))
    assert eng.drain()
    assert eng.revert_fallbacks() == 0  # clear, but not for the hold period yet
    time.sleep(1.1)
    assert eng.revert_fallbacks() == 1
    eng.close()
    cm = srv.get("configmaps", "inference", "deps")
    assert cm["data"] == {"mode": "normal", "x": "1"}
    assert "triscope.io/fallback-rule" not in cm["metadata"]["annotations"]
    rows = audit.audit_log(store, action="dependency_fallback", outcome="acted", newest_first=False)
    assert [r.trigger_kind for r in rows] == ["alert", "revert"]
    assert "trigger clear" in rows[1].reason
    assert audit.active_fallbacks(store) == []


def test_dependency_fallback_ttl_revert_and_conflict_retry(store: Any, srv: KubeTestServer) -> None:
    eng = engine(store, srv, FALLBACK.format(ttl="1s", hold="1h"))
    # someone else keeps updating the ConfigMap: the first replace gets a 409 and is retried on a fresh read
    srv.put("configmaps", {"metadata": {"name": "deps", "namespace": "inference"}, "data": {}})
    orig = srv._replace

    def racing_replace(res: str, ns: str, name: str, body: Any):  # type: ignore[no-untyped-def]
        if res == "configmaps" and not getattr(racing_replace, "done", False):
            racing_replace.done = True  # type: ignore[attr-defined]
            srv.put("configmaps", {**srv.get("configmaps", ns, name), "data": {"other": "team"}})
        return orig(res, ns, name, body)

    srv._replace = racing_replace  # type: ignore[method-assign]
    eng.submit_alerts(webhook_payload([{"labels": {"alertname": "DepSlow"}}]))
    assert eng.drain()
    codes = [r.method for r in srv.calls("PUT", "/configmaps/deps")]
    assert len(codes) == 2  # one conflict, one success
    assert srv.get("configmaps", "inference", "deps")["data"] == {"other": "team", "mode": "fallback"}
    time.sleep(1.1)
    assert eng.revert_fallbacks() == 1  # TTL ran out although the alert never resolved
    eng.close()
    assert srv.get("configmaps", "inference", "deps")["data"] == {"other": "team"}
    assert "time-to-live" in audit.audit_log(store, limit=1)[0].reason


def _verdict_on(store: Any, node: str, now: float) -> None:
    """GPU 0 of ``node`` held by Deployment inference/llm, as the agent's verdict says: what an XID
    trigger acts on."""
    store.write_ticks(node, [Tick(now - 2, [Sample("triscope_mismatch_state", 1.0, {
        "gpu": "0", "state": "demand-limited", "namespace": "inference", "pod": "llm-0",
        "workload": "Deployment/llm"})])], rollup=False)


def test_reschedule_cordons_prefers_cheapest_node_and_evicts_through_pdb(store: Any, srv: KubeTestServer) -> None:
    srv.add_deployment("inference", "llm", replicas=2, nodes=["node-a"])
    srv.add_node("node-d", unschedulable=True)  # cordoned by someone else: never a candidate
    srv.add_pdb("inference", "llm-pdb", {"app": "llm"}, disruptions_allowed=0)
    now = time.time()
    # node-b is busy (GPU 90 %, I/O pressure), node-c is quiet: node-c must win
    store.write_ticks("node-b", [Tick(now - 1, [Sample("triscope_gpu_utilization_ratio", 0.9, {"gpu": "0"}),
                                                Sample("triscope_pressure_ratio", 0.6, {"resource": "io", "kind": "some"})])])
    store.write_ticks("node-c", [Tick(now - 1, [Sample("triscope_gpu_utilization_ratio", 0.1, {"gpu": "0"}),
                                                Sample("triscope_pressure_ratio", 0.05, {"resource": "io", "kind": "some"})])])
    store.add_events("node-a", [EventRecord("xid", "GPU fell off the bus", "critical", {"gpu": "0", "xid": 79})])
    _verdict_on(store, "node-a", now)
    eng = engine(store, srv, """  - name: xid
    trigger: {xid: [79]}
    action: reschedule
    target: {node: {label: node}, namespace: {label: namespace}, deployment: {from: workload}}
    params: {eviction_timeout: 20s, weights: {compute: 1, link: 1, storage: 1}}
""", settings=NODES)
    t = __import__("threading").Timer(1.5, lambda: srv.set_pdb_allowed("inference", "llm-pdb", 5))
    t.start()
    assert eng.evaluate_triggers() == 1
    assert eng.evaluate_triggers() == 0  # one XID event acts once
    assert eng.drain(30)
    eng.close()
    row = audit.audit_log(store)[0]
    assert row.outcome == "acted", row.reason
    assert row.response["chosen"] == "node-c"
    assert [c["node"] for c in row.response["candidates"]] == ["node-c", "node-b"]
    node = srv.get("nodes", "", "node-a")
    assert node["spec"]["unschedulable"] is True
    assert node["metadata"]["annotations"]["triscope.io/cordoned-by"] == "triscope"
    evictions = srv.calls("POST", "/eviction")
    assert len(evictions) > 2  # 429s from the PodDisruptionBudget, then accepted
    assert all(r.body["kind"] == "Eviction" for r in evictions)
    assert not srv.calls("DELETE", "/pods/")  # never a forced deletion
    aff = srv.get("deployments", "inference", "llm")["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]
    term = aff["preferredDuringSchedulingIgnoredDuringExecution"][0]
    assert term["preference"]["matchExpressions"][0]["values"] == ["node-c"]


def test_reschedule_blocked_by_pdb_times_out(store: Any, srv: KubeTestServer) -> None:
    srv.add_deployment("inference", "llm", replicas=1, nodes=["node-a"])
    srv.add_pdb("inference", "llm-pdb", {"app": "llm"}, disruptions_allowed=0)
    srv.stuck_rollouts = True  # the affinity change's rollout does not move the pod by itself
    store.add_events("node-a", [EventRecord("xid", "xid 48", "critical", {"gpu": "0", "xid": 48})])
    _verdict_on(store, "node-a", time.time())
    eng = engine(store, srv, """  - name: xid
    trigger: {xid: [48]}
    action: reschedule
    target: {node: {label: node}, namespace: {label: namespace}, deployment: {from: workload}}
    params: {eviction_timeout: 1s, cordon: false}
""", settings=NODES)
    eng.evaluate_triggers()
    assert eng.drain(30)
    eng.close()
    row = audit.audit_log(store)[0]
    assert row.outcome == "failed" and "disruption budget" in row.reason
    assert not srv.get("nodes", "", "node-a")["spec"].get("unschedulable")


def test_cordon_never_undoes_someone_elses(srv: KubeTestServer) -> None:
    kube = KubeAdapter.connect(url=srv.url)
    srv.add_node("manual", unschedulable=True, annotations={"note": "maintenance"})
    assert kube.cordon("manual", by="triscope")["result"] == "cordoned_by_other"
    with pytest.raises(NotOurCordon):
        kube.uncordon("manual", by="triscope")
    assert srv.get("nodes", "", "manual")["spec"]["unschedulable"] is True
    assert kube.cordon("node-a", by="triscope")["result"] == "cordoned"
    assert kube.uncordon("node-a", by="triscope")["result"] == "uncordoned"


def test_command_action_fixed_argv_and_timeout(store: Any, srv: KubeTestServer, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    eng = engine(store, srv, f"""  - name: touch
    trigger: {{alert: Host}}
    action: command
    target: {{node: {{label: node}}}}
    params: {{argv: [touch, "{marker}"]}}
  - name: hang
    trigger: {{alert: Hang}}
    action: command
    params: {{argv: [sleep, "30"], timeout: 0.5s}}
""")
    eng.submit_alerts(webhook_payload([{"labels": {"alertname": "Host", "node": "h1", "extra": "; rm -rf /"}},
                                     {"labels": {"alertname": "Hang"}}]))
    assert eng.drain(20)
    eng.close()
    assert marker.exists()
    rows = {r.rule: r for r in audit.audit_log(store)}
    assert rows["touch"].outcome == "acted" and rows["touch"].response["argv"] == ["touch", str(marker)]
    assert rows["hang"].outcome == "failed" and "timed out" in rows["hang"].reason


def test_metric_threshold_for_duration_and_mismatch_state(store: Any, srv: KubeTestServer) -> None:
    now = time.time()
    ticks = [Tick(now - 40 + i * 2, [Sample("triscope_gpu_utilization_ratio", 0.95 if i >= 8 else 0.3, {"gpu": "0"}),
                                     Sample("triscope_mismatch_state", 1.0 if i >= 15 else 0.0,
                                            {"state": "network-bound", "gpu": "0"})])
             for i in range(20)]
    store.write_ticks("gpu-1", ticks, rollup=False)
    eng = engine(store, srv, """  - name: hot-20s
    trigger: {metric: triscope_gpu_utilization_ratio, op: ">", threshold: 0.9, for: 20s}
    action: command
    target: {node: {label: node}}
    params: {argv: ["true"], literal_targets: true}
  - name: hot-60s
    trigger: {metric: triscope_gpu_utilization_ratio, op: ">", threshold: 0.9, for: 60s}
    action: command
    params: {argv: ["true"], literal_targets: true}
  - name: netbound-5s
    trigger: {mismatch: network-bound, for: 5s}
    action: command
    target: {node: {label: node}}
    params: {argv: ["true"], literal_targets: true}
  - name: netbound-30s
    trigger: {mismatch: network-bound, for: 30s}
    action: command
    params: {argv: ["true"], literal_targets: true}
""", dry_run=True)
    assert eng.evaluate_triggers(now) == 2
    assert eng.evaluate_triggers(now + 1) == 0  # the same episode is not queued twice
    assert eng.drain()
    eng.close()
    rows = audit.audit_log(store)
    assert sorted(r.rule for r in rows) == ["hot-20s", "netbound-5s"]
    assert all(r.outcome == "dry_run" and r.node == "gpu-1" for r in rows)
    hot = next(r for r in rows if r.rule == "hot-20s")
    assert "triscope_gpu_utilization_ratio{gpu=0}=0.95 > 0.9" in hot.trigger


SLO_FILE = """version: "prometheus/v1"
service: "svc"
period: 30d
slos:
  - name: "avail"
    objective: 99.0
    sli:
      events:
        error_query: sum(rate(req_total{code="500"}[{{.window}}]))
        total_query: sum(rate(req_total[{{.window}}]))
    alerting:
      name: SvcAvail
      page_alert: {labels: {severity: page}}
      ticket_alert: {labels: {severity: ticket}}
"""


def test_slo_page_trigger_switches_fallback(store: Any, srv: KubeTestServer, tmp_path: Path) -> None:
    (tmp_path / "slo.yaml").write_text(SLO_FILE)
    now = time.time()
    ok = err = 0.0
    ticks = []
    for i in range(400):  # 66 minutes at 10 s: 30 % of requests fail -> both page windows burn > 14.4x
        ok += 700
        err += 300
        ticks.append(Tick(now - 4000 + i * 10, [Sample("req_total", ok, {"code": "200"}, "counter"),
                                                 Sample("req_total", err, {"code": "500"}, "counter")]))
    store.write_ticks("svc-node", ticks)
    store.write_ticks("quiet-node", [Tick(now - 5, [Sample("req_total", 10.0, {"code": "200"}, "counter")])])
    text = policy_text("""  - name: slo-page
    trigger: {slo: avail, status: page}
    action: dependency_fallback
    target: {namespace: inference}
    params: {configmap: deps, key: mode}
""", settings="  namespaces: [inference]\n  slo_file: slo.yaml\n")
    (tmp_path / "policy.yaml").write_text(text)
    from triscope.remediation.policy import load_policy

    eng = Engine(store, load_policy(tmp_path / "policy.yaml"), kube=KubeAdapter.connect(url=srv.url))
    assert eng.evaluate_triggers(now) == 1
    assert eng.drain()
    eng.close()
    row = audit.audit_log(store)[0]
    assert row.outcome == "acted" and row.node == "svc-node" and "svc-avail on svc-node: page" in row.trigger
    assert srv.get("configmaps", "inference", "deps")["data"] == {"mode": "fallback"}


def test_slo_trigger_names_an_existing_slo(tmp_path: Path) -> None:
    from triscope.remediation.policy import PolicyError, load_policy

    (tmp_path / "slo.yaml").write_text(SLO_FILE)
    (tmp_path / "policy.yaml").write_text(policy_text("""  - name: s
    trigger: {slo: latency, status: page}
    action: command
    params: {argv: ["true"]}
""", settings="  slo_file: slo.yaml\n"))
    with pytest.raises(PolicyError) as ei:
        load_policy(tmp_path / "policy.yaml")
    assert ei.value.line == 6 and "no SLO 'latency'" in ei.value.reason and "svc-avail" in ei.value.reason


def test_fallback_on_mismatch_state_reverts_when_state_clears(store: Any, srv: KubeTestServer) -> None:
    eng = engine(store, srv, """  - name: netbound
    trigger: {mismatch: network-bound, for: 4s}
    action: dependency_fallback
    target: {namespace: {label: namespace}, deployment: {from: workload}}
    params: {configmap: deps, key: "{deployment}.mode", ttl: 1h, hold: 3s}
""")
    t0 = time.time() - 20
    wl = {"namespace": "inference", "workload": "Deployment/web"}
    store.write_ticks("gpu-1", [Tick(t0 + i, [Sample("triscope_mismatch_state", 1.0, {"state": "network-bound", "gpu": "0", **wl})])
                                for i in range(10)], rollup=False)
    assert eng.evaluate_triggers(t0 + 10) == 1
    assert eng.drain()
    assert srv.get("configmaps", "inference", "deps")["data"] == {"web.mode": "fallback"}   # that workload's key only
    # the state clears (the verdict is another state now): the hold period starts at the first evaluation
    # that sees it clear
    store.write_ticks("gpu-1", [Tick(t0 + 10 + i, [
        Sample("triscope_mismatch_state", 0.0, {"state": "network-bound", "gpu": "0", **wl}),
        Sample("triscope_mismatch_state", 1.0, {"state": "balanced", "gpu": "0", **wl})]) for i in range(6)],
        rollup=False)
    assert eng.evaluate_triggers(t0 + 15) == 0
    assert audit.active_fallbacks(store)[0].clear_since == pytest.approx(t0 + 15)
    assert eng.revert_fallbacks(t0 + 16) == 0  # clear for 1 s < hold 3 s
    assert eng.revert_fallbacks(t0 + 18.5) == 1
    eng.close()
    assert srv.get("configmaps", "inference", "deps")["data"] == {}
    rows = audit.audit_log(store, newest_first=False)
    assert [(r.trigger_kind, r.outcome) for r in rows] == [("mismatch", "acted"), ("revert", "acted")]


def test_cli_audit_lists_decisions(store: Any, srv: KubeTestServer, db_url: str) -> None:
    import json
    import subprocess
    import sys

    eng = engine(store, srv, """  - name: cmd
    trigger: {alert: A}
    action: command
    params: {argv: ["true"]}
""", dry_run=True)
    eng.submit_alerts(webhook_payload([{"labels": {"alertname": "A"}}]))
    assert eng.drain()
    eng.close()
    res = subprocess.run([sys.executable, "-m", "triscope", "remediate", "audit", "--db", db_url, "--json"],
                         capture_output=True, text=True, timeout=60, cwd=Path(__file__).resolve().parents[2])
    assert res.returncode == 0, res.stderr
    rows = [json.loads(line) for line in res.stdout.splitlines()]
    assert [(r["rule"], r["outcome"], r["dry_run"]) for r in rows] == [("cmd", "dry_run", True)]
