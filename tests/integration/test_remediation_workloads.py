"""Acting on the right workload (docs/workloads.md section 4): alerts and stored per-accelerator verdicts
name a namespace and a pod; the engine resolves the pod's owner through ownerReferences on the
Kubernetes test server (the official client, the real REST protocol), keeps it in the store's
``workloads`` table, and acts on that Deployment only.  SQLite and PostgreSQL."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from kube_server import BASE_SETTINGS, KubeTestServer, policy_text, webhook_payload

from triscope.core.samples import EventRecord, Sample, Tick
from triscope.remediation.engine import Engine
from triscope.remediation.kube.adapter import KubeAdapter
from triscope.remediation.policy import parse_policy
from triscope.remediation.workloads import ResolveError, WorkloadResolver
from triscope.store import audit
from triscope.store import workloads as wstore

STATES = ("idle", "demand-limited", "compute-bound", "balanced", "io-saturated", "staging-bound", "network-bound")
NODE = "gpu-node"


@pytest.fixture
def srv() -> Iterator[KubeTestServer]:
    s = KubeTestServer(rollout_delay=0.1).start()
    s.add_node(NODE, labels={"triscope.io/remediation": "allowed"})
    s.add_node("spare", labels={"triscope.io/remediation": "allowed"})
    yield s
    s.stop()


@pytest.fixture
def store(any_store: Any) -> Any:
    """These tests run on SQLite and on PostgreSQL: conftest's ``any_store``."""
    return any_store


def pod_of(srv: KubeTestServer, deployment: str) -> str:
    pods = srv.pods_of("inference", deployment)
    assert len(pods) == 1, pods
    return str(pods[0]["metadata"]["name"])


def accelerator(gpu: str, state: str, pod: str, sm: float, score: float) -> list[Sample]:
    """What the agent's tracker writes for one GPU per tick (docs/workloads.md sections 1 and 2): every
    state as 0/1 with the dominant workload's labels (``workload`` empty on Kubernetes), the score,
    the attribution series and the SM activity."""
    wl = {"gpu": gpu, "namespace": "inference" if pod else "", "pod": pod, "container": "app" if pod else "",
          "workload": ""}
    out = [Sample("triscope_mismatch_state", 1.0 if s == state else 0.0, {"state": s, **wl}) for s in STATES]
    out.append(Sample("triscope_mismatch_score", score, wl))
    if pod:
        out.append(Sample("triscope_accelerator_workload_info", 1.0, {**wl, "uuid": f"GPU-{gpu}"}))
    out.append(Sample("triscope_gpu_sm_active_ratio", sm, {"gpu": gpu}))
    return out


def write_verdicts(store: Any, gpus: list[tuple[str, str, str, float, float]], now: float, seconds: int = 60) -> None:
    """``gpus``: (gpu, state, pod, sm, score) held for ``seconds`` up to ``now``, and the node's roll-up
    (the worst accelerator's state), as the tracker writes it."""
    worst = next((g[1] for g in gpus if g[1] in ("io-saturated", "staging-bound", "network-bound")), gpus[0][1])
    ticks = []
    for i in range(seconds // 2 + 1):
        samples = [s for g in gpus for s in accelerator(*g)]
        samples += [Sample("triscope_mismatch_state", 1.0 if s == worst else 0.0, {"state": s}) for s in STATES]
        ticks.append(Tick(now - seconds + 2 * i, samples))
    store.write_ticks(NODE, ticks, rollup=False)


ALERT_RULE = """  - name: restart-on-alert
    trigger: {alert: TriscopeStagingBound}
    action: rolling_restart
    target: {namespace: {label: namespace}, deployment: {from: workload}}
    params: {timeout: 10s}
    limits: {cooldown: 0s}
"""
RESTART_RULES = """  - name: restart-staging-bound
    trigger: {mismatch: staging-bound, for: 20s}
    action: rolling_restart
    target: {namespace: {label: namespace}, deployment: {from: workload}}
    params: {timeout: 10s}
    limits: {cooldown: 0s}
""" + ALERT_RULE


def engine(store: Any, srv: KubeTestServer, rules: str, *, settings: str = BASE_SETTINGS,
           dry_run: bool = False) -> Engine:
    return Engine(store, parse_policy(policy_text(rules, settings), "t.yaml"), kube=KubeAdapter.connect(url=srv.url),
                  dry_run=dry_run)


def writes(srv: KubeTestServer) -> list[tuple[str, str]]:
    return [(r.method, r.path) for r in srv.requests if r.method in ("PATCH", "PUT", "DELETE")
            or (r.method == "POST" and "/events" not in r.path)]


def test_only_the_staging_bound_gpus_deployment_is_restarted(store: Any, srv: KubeTestServer) -> None:
    """One node, two GPUs, two Deployments: GPU 0's workload is staging-bound, GPU 1's a healthy,
    lightly loaded demand-limited.  A mismatch rule and an alert carrying only namespace + pod of
    GPU 0's pod restart GPU 0's Deployment; GPU 1's is never touched."""
    srv.add_deployment("inference", "encoder", replicas=1, nodes=[NODE])
    srv.add_deployment("inference", "decoder", replicas=1, nodes=[NODE])
    enc, dec = pod_of(srv, "encoder"), pod_of(srv, "decoder")
    now = time.time()
    write_verdicts(store, [("0", "staging-bound", enc, 0.12, 0.6), ("1", "demand-limited", dec, 0.15, 0.0)], now)
    eng = engine(store, srv, RESTART_RULES)
    before = list(srv.requests)

    # Alertmanager's payload: the alert names the namespace and GPU 0's pod, nothing else
    assert eng.submit_alerts(webhook_payload([{"labels": {"alertname": "TriscopeStagingBound", "namespace": "inference",
                                                        "pod": enc}}])) == (1, 1)
    assert eng.drain(30)
    # stored data: one trigger, for GPU 0 (not for the node, not for GPU 1), once
    assert eng.evaluate_triggers(now) == 1
    assert eng.evaluate_triggers(now + 1) == 0
    assert eng.drain(30)
    eng.close()

    rows = [r for r in audit.audit_log(store, newest_first=False) if r.outcome != "in_progress"]
    assert [(r.rule, r.trigger_kind, r.outcome) for r in rows] == [
        ("restart-on-alert", "alert", "acted"), ("restart-staging-bound", "mismatch", "acted")], rows
    for r in rows:
        assert r.target == "deployment inference/encoder" and r.target_key == "deployment/inference/encoder"
        assert r.params["target"] == {"namespace": "inference", "deployment": "encoder"}
        wl = r.params["workload"]
        assert (wl["namespace"], wl["workload"], wl["pod"]) == ("inference", "Deployment/encoder", enc)
        assert r.response["rollout"]["complete"] is True
    assert rows[0].params["workload"]["via"] == "ownerReferences"
    assert rows[1].params["workload"]["gpu"] == "0" and "gpu=0" in rows[1].trigger_key
    assert "staging-bound" in rows[1].trigger

    # over the wire: the pod and its ReplicaSet read once (then cached), two restartedAt patches on
    # encoder, nothing written to decoder or to any node, no eviction
    new = srv.requests[len(before):]
    assert [r.path for r in new if r.method == "GET" and "/pods/" in r.path] == [
        f"/api/v1/namespaces/inference/pods/{enc}"]
    rs_reads = [r.path for r in new if "/replicasets/" in r.path]
    assert len(rs_reads) == 1 and rs_reads[0].startswith("/apis/apps/v1/namespaces/inference/replicasets/encoder-")
    patches = srv.calls("PATCH", "/apis/apps/v1/namespaces/inference/deployments/encoder")
    assert len(patches) == 2 and all(p.content_type == "application/strategic-merge-patch+json" for p in patches)
    stamps = [p.body["spec"]["template"]["metadata"]["annotations"]["kubectl.kubernetes.io/restartedAt"] for p in patches]
    assert len(set(stamps)) == 2
    assert sorted(set(writes(srv))) == [("PATCH", "/apis/apps/v1/namespaces/inference/deployments/encoder")]
    assert not srv.calls(None, "/deployments/decoder") or all(r.method == "GET" for r in srv.calls(None, "/deployments/decoder"))
    assert pod_of(srv, "decoder") == dec and pod_of(srv, "encoder") != enc
    assert not srv.calls(None, "/api/v1/nodes") and not srv.calls("POST", "/eviction")
    assert not (srv.get("nodes", "", NODE) or {}).get("spec", {}).get("unschedulable")
    # the resolution is in the store for the dashboard
    assert wstore.owners(store, [("inference", enc)]) == {("inference", enc): "Deployment/encoder"}


def test_one_trigger_per_accelerator_and_workload_and_quiet_accelerators_never_trigger(
        store: Any, srv: KubeTestServer) -> None:
    srv.add_deployment("inference", "encoder", replicas=1, nodes=[NODE])
    srv.add_deployment("inference", "decoder", replicas=1, nodes=[NODE])
    srv.add_deployment("inference", "ranker", replicas=1, nodes=[NODE])
    enc, dec, rnk = pod_of(srv, "encoder"), pod_of(srv, "decoder"), pod_of(srv, "ranker")
    now = time.time()
    # GPU 0 and GPU 2 staging-bound (two workloads), GPU 1 demand-limited, GPU 3 idle (no process);
    # every SM low, so a threshold on SM activity holds on all four
    write_verdicts(store, [("0", "staging-bound", enc, 0.1, 0.6), ("1", "demand-limited", dec, 0.1, 0.0),
                           ("2", "staging-bound", rnk, 0.1, 0.5), ("3", "idle", "", 0.0, 0.0)], now)
    eng = engine(store, srv, """  - name: staging
    trigger: {mismatch: staging-bound, for: 20s}
    action: rolling_restart
    target: {namespace: {label: namespace}, deployment: {from: workload}}
    limits: {cooldown: 0s}
  - name: low-sm
    trigger: {metric: triscope_gpu_sm_active_ratio, op: "<", threshold: 0.3, for: 20s}
    action: rolling_restart
    target: {namespace: {label: namespace}, deployment: {from: workload}}
    limits: {cooldown: 0s}
""", dry_run=True)
    assert eng.evaluate_triggers(now) == 4
    assert eng.drain(30)
    eng.close()
    rows = audit.audit_log(store)
    got = sorted((r.rule, r.params["workload"]["gpu"], r.target, r.outcome) for r in rows)
    assert got == [
        ("low-sm", "0", "deployment inference/encoder", "dry_run"),
        ("low-sm", "2", "deployment inference/ranker", "dry_run"),
        ("staging", "0", "deployment inference/encoder", "dry_run"),
        ("staging", "2", "deployment inference/ranker", "dry_run"),
    ], got
    # the metric series carries only `gpu`: its workload came from that GPU's verdict
    low = next(r for r in rows if r.rule == "low-sm" and r.params["workload"]["gpu"] == "0")
    assert "triscope_gpu_sm_active_ratio{gpu=0}" in low.trigger
    assert not [w for w in writes(srv) if "decoder" in w[1]]


def test_workload_matchers_restrict_which_workloads_a_rule_acts_for(store: Any, srv: KubeTestServer) -> None:
    """``workloads: [...]`` on a mismatch / metric trigger: only the accelerators whose workload labels
    match hold (the rest are not this rule's business, e.g. a copy hog sharing the GPU)."""
    srv.add_deployment("inference", "encoder", replicas=1, nodes=[NODE])
    srv.add_deployment("inference", "ranker", replicas=1, nodes=[NODE])
    enc, rnk = pod_of(srv, "encoder"), pod_of(srv, "ranker")
    now = time.time()
    write_verdicts(store, [("0", "staging-bound", enc, 0.1, 0.6), ("2", "staging-bound", rnk, 0.1, 0.5)], now)
    eng = engine(store, srv, """  - name: staging-encoder-only
    trigger: {mismatch: staging-bound, for: 20s, workloads: ["pod=~encoder-.+"]}
    action: rolling_restart
    target: {namespace: {label: namespace}, deployment: {from: workload}}
    limits: {cooldown: 0s}
  - name: low-sm-elsewhere
    trigger: {metric: triscope_gpu_sm_active_ratio, op: "<", threshold: 0.3, for: 20s, workloads: ["namespace!=inference"]}
    action: rolling_restart
    target: {namespace: {label: namespace}, deployment: {from: workload}}
    limits: {cooldown: 0s}
""", dry_run=True)
    assert eng.evaluate_triggers(now) == 1
    assert eng.drain(30)
    eng.close()
    got = [(r.rule, r.params["workload"]["gpu"], r.target) for r in audit.audit_log(store)]
    assert got == [("staging-encoder-only", "0", "deployment inference/encoder")], got


def test_alert_targets_from_labels_and_what_suppresses_them(store: Any, srv: KubeTestServer) -> None:
    srv.add_deployment("inference", "encoder", replicas=1, nodes=[NODE])
    enc = pod_of(srv, "encoder")
    srv.add_pod("inference", "db-0", NODE, owner={"kind": "StatefulSet", "name": "db"})
    srv.add_pod("kube-system", "coredns-abc", NODE, owner={"kind": "ReplicaSet", "name": "coredns-5d7"})
    eng = engine(store, srv, ALERT_RULE, dry_run=True)
    cases = {
        "by-workload": {"namespace": "inference", "workload": "Deployment/encoder"},
        "by-pod": {"namespace": "inference", "pod": enc},
        "statefulset": {"namespace": "inference", "pod": "db-0"},
        "no-workload": {"namespace": "inference", "node": NODE},
        "no-namespace": {"pod": enc},
        "gone": {"namespace": "inference", "pod": "encoder-0000000000-gone1"},
        "not-allowed": {"namespace": "kube-system", "pod": "coredns-abc"},
        "shared": {"namespace": "inference", "pod": "", "workload": "shared"},
        "off-kubernetes": {"namespace": "inference", "workload": "unit:vllm.service"},
    }
    fingerprints = {}
    for name, labels in cases.items():
        payload = webhook_payload([{"labels": {"alertname": "TriscopeStagingBound", **labels}}])
        fingerprints[payload.alerts[0].fingerprint] = name
        eng.submit_alerts(payload)
        assert eng.drain(20)
    eng.close()
    by_case = {fingerprints[r.trigger_key.split(":")[2]]: r for r in audit.audit_log(store)}
    assert set(by_case) == set(cases)
    assert (by_case["by-workload"].outcome, by_case["by-workload"].params["workload"]["via"]) == ("dry_run", "label")
    assert (by_case["by-pod"].outcome, by_case["by-pod"].target) == ("dry_run", "deployment inference/encoder")
    assert by_case["by-pod"].params["workload"]["via"] == "ownerReferences"
    expect = {
        "statefulset": ("target", "belongs to StatefulSet/db, not a Deployment"),
        "no-workload": ("target", "neither a 'workload' nor a 'pod' label"),
        "no-namespace": ("target", "label 'namespace' is missing"),
        "gone": ("target", "does not exist"),
        "not-allowed": ("namespace", "'kube-system' is not in the allow-list"),
        "shared": ("target", "shared by several workloads"),
        "off-kubernetes": ("target", "is not a Kubernetes workload"),
    }
    for case, (rail, needle) in expect.items():
        r = by_case[case]
        assert (r.outcome, r.rail) == ("suppressed", rail), (case, r)
        assert needle in r.reason, (case, r.reason)
    # no lookup outside the allow-list, no pod read for an alert that names its workload, nothing written
    assert not srv.calls("GET", "/namespaces/kube-system/")
    assert not writes(srv)


def test_resolution_is_cached_kept_in_the_store_and_outlives_the_pod(store: Any, srv: KubeTestServer) -> None:
    srv.add_deployment("inference", "encoder", replicas=1, nodes=[NODE])
    enc = pod_of(srv, "encoder")
    srv.add_pod("inference", "node-exporter-x", NODE, owner={"kind": "DaemonSet", "name": "node-exporter"})
    srv.add_pod("inference", "batch-28193-abc", NODE, owner={"kind": "Job", "name": "batch-28193"})
    srv.add_pod("inference", "debug", NODE)
    srv.put("replicasets", {"metadata": {"name": "loose", "namespace": "inference"}, "spec": {"replicas": 1}})
    srv.add_pod("inference", "loose-x", NODE, owner={"kind": "ReplicaSet", "name": "loose"})
    kube = KubeAdapter.connect(url=srv.url)
    res = WorkloadResolver(store, kube, ttl_s=60.0)
    t0 = time.time()
    got = {p: res.resolve("inference", p, t0).workload
           for p in (enc, "node-exporter-x", "batch-28193-abc", "debug", "loose-x")}
    assert got == {enc: "Deployment/encoder", "node-exporter-x": "DaemonSet/node-exporter",
                   "batch-28193-abc": "Job/batch-28193", "debug": "Pod/debug", "loose-x": "ReplicaSet/loose"}
    n = len(srv.requests)
    assert res.resolve("inference", enc, t0 + 30).via == "cache" and len(srv.requests) == n
    # a second engine (a restart, another replica) reads the store, not the API, while the row is fresh
    other = WorkloadResolver(store, kube, ttl_s=60.0)
    assert other.resolve("inference", enc, t0 + 30).via == "store" and len(srv.requests) == n
    assert {(w.pod, w.workload) for w in wstore.workloads(store, namespace="inference")} >= {
        (enc, "Deployment/encoder"), ("debug", "Pod/debug")}
    # past the TTL the API is asked again
    assert res.resolve("inference", enc, t0 + 61).via == "ownerReferences"
    assert len(srv.calls("GET", f"/pods/{enc}")) == 2
    # the pod is replaced: the API no longer knows it, the store remembers its owner
    srv.objects.__delitem__(("pods", "inference", enc))
    late = WorkloadResolver(store, kube, ttl_s=60.0)
    owner = late.resolve("inference", enc, t0 + 200)
    assert (owner.workload, owner.via) == ("Deployment/encoder", "store")
    # a pod nobody knows: refused with the reason, and not asked again for a while
    with pytest.raises(ResolveError, match="does not exist"):
        late.resolve("inference", "ghost", t0 + 200)
    m = len(srv.requests)
    with pytest.raises(ResolveError):
        late.resolve("inference", "ghost", t0 + 201)
    assert len(srv.requests) == m
    # without an API the store still answers; with neither, the reason says so
    offline = WorkloadResolver(store, None, ttl_s=60.0)
    assert offline.resolve("inference", "debug", t0 + 500).workload == "Pod/debug"
    with pytest.raises(ResolveError, match="no Kubernetes API configured"):
        offline.resolve("inference", "ghost", t0 + 500)
    assert wstore.prune_workloads(store, t0 + 1) == 4   # every row but encoder's (refreshed at t0 + 61)
    assert [w.pod for w in wstore.resolved_workloads(store)] == [enc]


def test_unreachable_api_is_a_failed_decision_and_the_refresh_job_fills_the_table(
        store: Any, srv: KubeTestServer) -> None:
    srv.add_deployment("inference", "encoder", replicas=1, nodes=[NODE])
    srv.add_deployment("inference", "decoder", replicas=1, nodes=[NODE])
    enc, dec = pod_of(srv, "encoder"), pod_of(srv, "decoder")
    now = time.time()
    write_verdicts(store, [("0", "staging-bound", enc, 0.1, 0.6), ("1", "demand-limited", dec, 0.1, 0.0)], now)
    eng = engine(store, srv, RESTART_RULES)
    # the job the scheduler runs: the pods of the stored per-accelerator series, resolved into the table
    assert eng.refresh_workloads(now) == 2
    assert wstore.owners(store, [("inference", enc), ("inference", dec)]) == {
        ("inference", enc): "Deployment/encoder", ("inference", dec): "Deployment/decoder"}
    assert eng.refresh_workloads(now + 1) == 0   # fresh rows: no API call
    assert not writes(srv)
    eng.close()
    # an engine whose API does not answer cannot tell a pod's owner: failed, with the reason
    dead = Engine(store, parse_policy(policy_text(RESTART_RULES), "t.yaml"),
                  kube=KubeAdapter.connect(url="http://127.0.0.1:9"))
    dead.submit_alerts(webhook_payload([{"labels": {"alertname": "TriscopeStagingBound", "namespace": "inference",
                                                  "pod": "never-seen-pod"}}]))
    assert dead.drain(30)
    dead.close()
    row = audit.audit_log(store)[0]
    assert (row.outcome, row.rail) == ("failed", None) and "cannot resolve pod inference/never-seen-pod" in row.reason


def test_fatal_xid_moves_the_workload_on_that_gpu(store: Any, srv: KubeTestServer) -> None:
    srv.add_deployment("inference", "encoder", replicas=1, nodes=[NODE])
    srv.add_deployment("inference", "decoder", replicas=1, nodes=[NODE])
    enc, dec = pod_of(srv, "encoder"), pod_of(srv, "decoder")
    now = time.time()
    write_verdicts(store, [("0", "compute-bound", enc, 0.9, 0.0), ("1", "compute-bound", dec, 0.9, 0.0)], now)
    store.add_events(NODE, [EventRecord("xid", "Xid 79: GPU has fallen off the bus", "critical",
                                        {"gpu": "1", "xid": 79}, ts=now - 1)])
    eng = engine(store, srv, """  - name: xid
    trigger: {xid: [79], within: 10m}
    action: reschedule
    target: {node: {label: node}, namespace: {label: namespace}, deployment: {from: workload}}
""", settings=BASE_SETTINGS + "  node_selector: {triscope.io/remediation: allowed}\n", dry_run=True)
    assert eng.evaluate_triggers(now) == 1
    assert eng.drain(30)
    eng.close()
    row = audit.audit_log(store)[0]
    assert (row.outcome, row.target) == ("dry_run", f"deployment inference/decoder off node {NODE}"), row
    assert row.params["workload"]["pod"] == dec and row.response["pods"] == [dec]
    assert not writes(srv)


# ---------------------------------------------------------------------------------------------- policy
def refused(text: str) -> str:
    from triscope.remediation.policy import PolicyError

    with pytest.raises(PolicyError) as ei:
        parse_policy(text, "p.yaml")
    return str(ei.value)


@pytest.mark.parametrize("rule,needle", [
    ("""    trigger: {alert: A}
    action: rolling_restart
    target: {namespace: {label: namespace}, deployment: {label: deployment, default: llm-server}}
""", "p.yaml:11: rules[0].target.deployment.default: a deployment target has no default"),
    ("""    trigger: {alert: A}
    action: rolling_restart
    target: {namespace: {label: namespace, default: inference}, deployment: {from: workload}}
""", "p.yaml:11: rules[0].target.namespace.default: the deployment comes from the trigger"),
    ("""    trigger: {slo: avail}
    action: rolling_restart
    target: {namespace: inference, deployment: {from: workload}}
""", "p.yaml:11: rules[0].target.deployment: an slo trigger names no workload"),
    ("""    trigger: {mismatch: demand-limited}
    action: rolling_restart
    target: {namespace: {label: namespace}, deployment: {from: workload}}
""", "p.yaml:9: rules[0].trigger.mismatch: 'demand-limited' never triggers"),
    ("""    trigger: {mismatch: idle}
    action: command
    params: {argv: ["true"]}
""", "p.yaml:9: rules[0].trigger.mismatch: 'idle' never triggers"),
    ("""    trigger: {mismatch: staging-bond}
    action: command
    params: {argv: ["true"]}
""", "p.yaml:9: rules[0].trigger.mismatch: unknown mismatch state 'staging-bond'"),
    ("""    trigger: {alert: A}
    action: rolling_restart
    target: {namespace: inference, deployment: {from: pod}}
""", "p.yaml:11: rules[0].target.deployment.from: must be 'workload', not 'pod'"),
    ("""    trigger: {alert: A}
    action: rolling_restart
    target: {namespace: inference, deployment: {from: workload, pod_lable: x}}
""", "p.yaml:11: rules[0].target.deployment: unknown key 'pod_lable' (allowed: from, workload_label, pod_label)"),
])
def test_targets_that_could_name_the_wrong_workload_or_none_are_refused(rule: str, needle: str) -> None:
    text = policy_text("  - name: r\n" + rule)
    assert refused(text).startswith(needle), refused(text)


def test_example_policy_loads_and_is_bounded() -> None:
    from pathlib import Path

    import yaml

    from triscope.remediation.policy import load_policy

    path = Path(__file__).resolve().parents[2] / "deploy" / "policy.example.yaml"
    pol = load_policy(path)
    s = pol.settings
    assert s.namespaces and s.nodes_bounded and s.max_actions_per_hour <= 30 and s.max_in_flight <= 4
    assert s.breaker.max_targets <= 10 and s.workload_ttl_s == 600
    for r in pol.rules:
        assert r.max_actions <= 6 and r.per_s <= 3600 and r.cooldown_s >= 600, r.name
        for name, f in r.target.items():
            assert f.default is None, f"{r.name}: target.{name} has a default"
        if r.action in ("rolling_restart", "reschedule"):
            assert r.workload_field == "deployment" and r.target["namespace"].label == "namespace", r.name
        if r.action == "reschedule":
            assert r.target["node"].label == "node"
    doc = yaml.safe_load(path.read_text())
    assert not [r["name"] for r in doc["rules"] for v in (r.get("target") or {}).values()
                if isinstance(v, dict) and "default" in v]
    assert "llm-server" not in path.read_text()
