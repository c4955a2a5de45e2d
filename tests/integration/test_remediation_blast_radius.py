"""Node targets are bounded: an alert's ``node`` label cannot make the engine cordon or drain any node.

Against the Kubernetes test server (real REST protocol, official client): the node allow-list
(names and labels), a node the workload has no pods on, a control-plane node, and candidate
selection that skips control-plane nodes and nodes whose taints the workload does not tolerate.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from kube_server import BASE_SETTINGS, KubeTestServer, policy_text, webhook_payload

from triscope.core.samples import Sample, Tick
from triscope.remediation.engine import Engine
from triscope.remediation.kube.adapter import KubeAdapter
from triscope.remediation.kube.views import Node, Taint, Toleration
from triscope.remediation.policy import parse_policy
from triscope.store import audit

MOVE = """  - name: move
    trigger: {alert: GpuBroken}
    action: reschedule
    target: {node: {label: node}, namespace: inference, deployment: llm}
    params: {eviction_timeout: 5s, weights: {compute: 1, link: 0, storage: 0}}
    limits: {cooldown: 0s}
"""
NAMES = BASE_SETTINGS + "  node_names: [node-*]\n"


@pytest.fixture
def srv() -> Iterator[KubeTestServer]:
    s = KubeTestServer(rollout_delay=0.05).start()
    yield s
    s.stop()


def fire(store: Any, srv: KubeTestServer, node: str, settings: str = NAMES, dry_run: bool = False) -> audit.AuditRow:
    eng = Engine(store, parse_policy(policy_text(MOVE, settings), "t.yaml"), kube=KubeAdapter.connect(url=srv.url),
                 dry_run=dry_run)
    try:
        eng.submit_alerts(webhook_payload([{"labels": {"alertname": "GpuBroken", "node": node},
                                          "fingerprint": f"fp-{node}-{time.time_ns()}"}]))
        assert eng.drain(30)
    finally:
        eng.close()
    return audit.audit_log(store, limit=1)[0]


def writes(srv: KubeTestServer) -> list[tuple[str, str]]:
    """Every write that reached the API server except Kubernetes Events."""
    return [(r.method, r.path) for r in srv.requests if r.method in ("PUT", "PATCH", "POST", "DELETE")
            and "/events" not in r.path]


def test_node_without_the_workloads_pods_is_not_touched(store: Any, srv: KubeTestServer) -> None:
    for n in ("node-a", "node-b", "node-c"):
        srv.add_node(n)
    srv.add_deployment("inference", "llm", replicas=2, nodes=["node-b"])
    row = fire(store, srv, "node-a")  # the alert names a node the Deployment does not run on
    assert (row.outcome, row.rail) == ("suppressed", "node"), row.reason
    assert "no pods of inference/llm run on node node-a" in row.reason
    assert writes(srv) == []  # no cordon, no affinity patch, no eviction
    assert not srv.get("nodes", "", "node-a")["spec"].get("unschedulable")
    # the pods were looked up on that node through the field selector, as kubectl does
    lists = [r for r in srv.calls("GET", "/api/v1/namespaces/inference/pods") if "fieldSelector" in r.query]
    assert lists and lists[0].query["fieldSelector"] == ["spec.nodeName=node-a"]


def test_control_plane_node_is_never_cordoned(store: Any, srv: KubeTestServer) -> None:
    srv.add_node("node-cp", control_plane=True)  # inside the name allow-list: the role decides
    srv.add_node("node-b")
    tolerate_cp = [{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists", "effect": "NoSchedule"}]
    srv.add_deployment("inference", "llm", replicas=2, nodes=["node-cp"], tolerations=tolerate_cp)
    row = fire(store, srv, "node-cp")
    assert (row.outcome, row.rail) == ("suppressed", "node") and "control-plane node" in row.reason, row.reason
    assert writes(srv) == []
    assert not srv.get("nodes", "", "node-cp")["spec"].get("unschedulable")


def test_node_outside_the_allow_list(store: Any, srv: KubeTestServer) -> None:
    for n in ("node-a", "db-1"):
        srv.add_node(n, labels={"pool": "gpu"} if n == "node-a" else {})
    srv.add_deployment("inference", "llm", replicas=2, nodes=["db-1"])
    # by name: refused by the engine's rail before any API call about the node
    row = fire(store, srv, "db-1")
    assert (row.outcome, row.rail) == ("suppressed", "node") and "not in the node allow-list" in row.reason
    assert not srv.calls(path_contains="/nodes")
    # by label: the Node is read, it lacks the selector's label
    row = fire(store, srv, "db-1", settings=BASE_SETTINGS + "  node_selector: {pool: gpu}\n")
    assert (row.outcome, row.rail) == ("suppressed", "node"), row.reason
    assert "does not carry the labels of settings.node_selector" in row.reason
    # a dry-run engine reports the same refusal (a dry run says what a live engine would do)
    row = fire(store, srv, "db-1", settings=BASE_SETTINGS + "  node_selector: {pool: gpu}\n", dry_run=True)
    assert (row.outcome, row.rail, row.dry_run) == ("suppressed", "node", True)
    assert writes(srv) == []


def test_candidates_skip_control_plane_and_untolerated_taints(store: Any, srv: KubeTestServer) -> None:
    srv.add_node("node-a")                                                      # the bad node
    srv.add_node("node-cp", control_plane=True)                                 # idle, but the control plane
    srv.add_node("node-t", taints=[{"key": "gpu", "value": "broken", "effect": "NoSchedule"}])  # idle, not tolerated
    srv.add_node("node-x", taints=[{"key": "drain", "effect": "NoExecute"}])    # idle, not tolerated
    srv.add_node("node-tol", taints=[{"key": "dedicated", "value": "llm", "effect": "NoSchedule"}])  # tolerated
    srv.add_node("node-busy")
    srv.add_node("node-soft", taints=[{"key": "spot", "effect": "PreferNoSchedule"}])  # soft taint: a candidate
    srv.add_deployment("inference", "llm", replicas=2, nodes=["node-a"],
                       tolerations=[{"key": "dedicated", "operator": "Equal", "value": "llm", "effect": "NoSchedule"}])
    now = time.time()
    for node, busy in (("node-cp", 0.0), ("node-t", 0.0), ("node-x", 0.0), ("node-tol", 0.2), ("node-busy", 0.9),
                       ("node-soft", 0.6)):
        store.write_ticks(node, [Tick(now - 1, [Sample("triscope_gpu_utilization_ratio", busy, {"gpu": "0"})])])
    row = fire(store, srv, "node-a")
    assert row.outcome == "acted", row.reason
    assert row.response["chosen"] == "node-tol"
    assert [c["node"] for c in row.response["candidates"]] == ["node-tol", "node-soft", "node-busy"]
    excluded = row.response["excluded"]
    assert excluded["node-cp"] == "control plane"
    assert excluded["node-t"] == "taints not tolerated: gpu=broken:NoSchedule"
    assert excluded["node-x"] == "taints not tolerated: drain:NoExecute"
    aff = srv.get("deployments", "inference", "llm")["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]
    assert aff["preferredDuringSchedulingIgnoredDuringExecution"][0]["preference"]["matchExpressions"][0]["values"] == \
        ["node-tol"]
    assert srv.get("nodes", "", "node-a")["spec"]["unschedulable"] is True
    assert not srv.get("nodes", "", "node-cp")["spec"].get("unschedulable")
    # the replacement pods landed where the scheduler may put them: never on the control plane or node-t/node-x
    deadline = time.time() + 5
    while time.time() < deadline and len(srv.list("pods", "inference")) < 2:
        time.sleep(0.05)
    placed = {p["spec"]["nodeName"] for p in srv.list("pods", "inference")}
    assert placed and placed <= {"node-tol", "node-busy", "node-soft"}, placed


def tolerates(tolerations: list[dict[str, Any]], taint: dict[str, Any]) -> bool:
    """Does one of ``tolerations`` tolerate ``taint`` (the rules of the Kubernetes scheduler)?"""
    t = Taint.of(taint)
    return any(Toleration.of(tol).tolerates(t) for tol in tolerations or [])


def is_control_plane(node: dict[str, Any]) -> bool:
    """A control-plane node (a Node's JSON): see ``Node.control_plane``."""
    return Node.of(node).control_plane


def test_tolerations_follow_the_scheduler_rules() -> None:
    taint = {"key": "dedicated", "value": "llm", "effect": "NoSchedule"}
    assert tolerates([{"key": "dedicated", "operator": "Equal", "value": "llm"}], taint)
    assert tolerates([{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}], taint)
    assert tolerates([{"operator": "Exists"}], taint)  # tolerates everything
    assert not tolerates([{"key": "dedicated", "value": "web"}], taint)
    assert not tolerates([{"key": "dedicated", "operator": "Exists", "effect": "NoExecute"}], taint)
    assert not tolerates([{"operator": "Equal"}], taint)  # an empty key only works with Exists
    assert is_control_plane({"metadata": {"labels": {"node-role.kubernetes.io/master": ""}}})
    assert is_control_plane({"metadata": {}, "spec": {"taints": [
        {"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"}]}})
    assert not is_control_plane({"metadata": {"labels": {"node-role.kubernetes.io/worker": ""}}})
