"""The verdict where Kubernetes users look: Events on the pod and the node when a verdict would page.

Against the Kubernetes test server enforcing the shipped RBAC (tests/kube_rbac.py), the engine's
service-account token; the Events are read back with the official ``kubernetes`` client, as
``kubectl get events`` lists them.  The verdicts are written to the store as the agent writes them
(``triscope_mismatch_state`` ticks become the verdict history; ``accelerator_state`` events carry the
verdict's reasons)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kube_rbac import ENGINE_USER, Rbac, shipped_rbac_objects
from kube_server import KubeTestServer, policy_text

from triscope.core.samples import EventRecord, Sample, Tick
from triscope.remediation.engine import Engine
from triscope.remediation.kube.adapter import KubeAdapter
from triscope.remediation.policy import parse_policy
from triscope.remediation.verdict_events import BURST, PAGE_AFTER_S, VerdictEvents

TOKEN = "engine-token"
VIEWER = "viewer-token"       # an SRE reading Events (kubectl get events): a ClusterRole of this test's
VIEWER_RBAC = [
    {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "event-viewer"},
     "rules": [{"apiGroups": [""], "resources": ["events"], "verbs": ["list"]}]},
    {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": "event-viewer"},
     "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "event-viewer"},
     "subjects": [{"kind": "User", "name": "sre"}]}]
SETTINGS = ("  namespaces: [inference]\n  evaluate_interval: 1s\n"
            "  kubernetes: {mode: none, events: true, events_namespace: triscope}\n")
RULE = """  - name: noop
    trigger: {alert: Never}
    action: command
    params: {argv: ["true"]}
"""
T0 = 1_800_000_000.0
REASON = "inference/llm-0 throttled in 97 % of its CPU periods (>= 25 %): held at its CPU limit"


@pytest.fixture
def srv() -> Iterator[KubeTestServer]:
    s = KubeTestServer(users={TOKEN: ENGINE_USER, VIEWER: "sre"},
                       rbac=Rbac(shipped_rbac_objects() + VIEWER_RBAC)).start()
    s.add_node("node-a")
    try:
        yield s
    finally:
        s.stop()


def _verdicts(store: Any, start: float, seconds: float, gpu1: str, step: float = 5.0) -> None:
    """Two GPUs of node-a: GPU 0 (pod web-0) demand-limited, GPU 1 (pod llm-0) in ``gpu1``."""
    ticks = []
    for i in range(int(seconds / step) + 1):
        ts = start + i * step
        ticks.append(Tick(ts, [
            Sample("triscope_mismatch_state", 1.0, {"gpu": "0", "state": "demand-limited", "namespace": "inference",
                                                     "pod": "web-0", "workload": "Deployment/web"}),
            Sample("triscope_mismatch_state", 1.0, {"gpu": "1", "state": gpu1, "namespace": "inference",
                                                     "pod": "llm-0", "workload": "Deployment/llm"})]))
    store.write_ticks("node-a", ticks, rollup=False)


def _engine(store: Any, srv: KubeTestServer) -> Engine:
    kube = KubeAdapter.connect(url=srv.url, token=TOKEN)
    return Engine(store, parse_policy(policy_text(RULE, SETTINGS), "p.yaml"), kube=kube)


def _kubectl_events(srv: KubeTestServer, namespace: str) -> list[Any]:
    """The Events of ``namespace`` as the official client lists them (``kubectl get events``)."""
    from kubernetes import client

    cfg = client.Configuration()
    cfg.host = srv.url
    cfg.api_key = {"authorization": f"Bearer {VIEWER}"}
    with client.ApiClient(cfg) as api:
        return list(client.CoreV1Api(api).list_namespaced_event(namespace).items)


def test_a_paging_verdict_is_an_event_on_its_pod_and_node_and_its_end_too(store: Any, srv: KubeTestServer) -> None:
    # GPU 1 staging-bound (the alert's for: 10 m), its reasons as the tracker published them
    _verdicts(store, T0, 300.0, "staging-bound")
    store.add_events("node-a", [EventRecord("accelerator_state", "gpu=1 demand-limited -> staging-bound", "warning",
                                            {"from": "demand-limited", "to": "staging-bound", "score": 0.9,
                                             "labels": {"gpu": "1", "namespace": "inference", "pod": "llm-0",
                                                        "workload": "Deployment/llm"},
                                             "reasons": [REASON, "link quiet"]}, T0 + 2)])
    eng = _engine(store, srv)
    try:
        assert eng.announce_verdicts(T0 + 301) == 0            # 5 minutes: would not page yet
        _verdicts(store, T0 + 305, 355.0, "staging-bound")     # 11 minutes in all
        assert eng.announce_verdicts(T0 + 661) == 2            # the pod and the node
        assert eng.announce_verdicts(T0 + 665) == 0            # announced once
        pods = _kubectl_events(srv, "inference")
        nodes = _kubectl_events(srv, "triscope")
        assert [(e.involved_object.kind, e.involved_object.name, e.reason, e.type) for e in pods] == [
            ("Pod", "llm-0", "StagingBound", "Warning")]       # GPU 0's pod: nothing
        assert pods[0].message == f"gpu 1: {REASON}"
        assert pods[0].source.component == "triscope-verdict"
        assert [(e.involved_object.kind, e.involved_object.name, e.reason) for e in nodes] == [
            ("Node", "node-a", "StagingBound")]
        # the accelerator recovers: one Normal Event on each, how long it held and what it is now
        _verdicts(store, T0 + 665, 60.0, "demand-limited")
        assert eng.announce_verdicts(T0 + 726) == 2
        rec = [e for e in _kubectl_events(srv, "inference") if e.reason == "AcceleratorRecovered"]
        assert len(rec) == 1 and rec[0].type == "Normal"
        assert re.fullmatch(r"gpu 1: staging-bound for 11m0\ds ended; now demand-limited", rec[0].message), rec[0].message
        assert srv.forbidden() == []                           # the shipped RBAC holds exactly this
        # Events, and the node's AcceleratorCoordinationDegraded condition (read, then patched)
        assert {(r.user, r.verb, r.resource) for r in srv.requests if r.resource and r.user == ENGINE_USER} == {
            (ENGINE_USER, "create", "events"), (ENGINE_USER, "get", "nodes"), (ENGINE_USER, "patch", "nodes/status")}
    finally:
        eng.close()


def test_a_verdict_without_a_pod_in_the_allowed_namespaces_is_said_on_the_node_only(store: Any,
                                                                                   srv: KubeTestServer) -> None:
    ticks = [Tick(T0 + i * 5, [Sample("triscope_mismatch_state", 1.0, {
        "gpu": "0", "state": "network-bound", "namespace": "other", "pod": "x-0", "workload": "Deployment/x"})])
             for i in range(70)]
    store.write_ticks("node-a", ticks, rollup=False)
    eng = _engine(store, srv)
    try:
        assert eng.announce_verdicts(T0 + 346) == 1
        assert _kubectl_events(srv, "other") == []             # outside settings.namespaces: not bound there
        (ev,) = _kubectl_events(srv, "triscope")
        assert ev.reason == "NetworkBound" and ev.message.startswith("gpu 0: network-bound for 5m")
        assert srv.forbidden() == []
    finally:
        eng.close()


class _Recorder:
    """A KubeAdapter's post_event, counted (the rate limiter's arithmetic needs no server)."""

    def __init__(self) -> None:
        self.posted: list[tuple[str, str, str]] = []

    def post_event(self, namespace: str, involved: dict[str, str], *, reason: str, message: str, type_: str = "Normal",
                   component: str = "") -> dict[str, Any]:
        self.posted.append((involved["kind"], reason, message))
        return {}


def test_a_flapping_verdict_is_deduplicated_and_rate_limited_like_kubelet_events(store: Any) -> None:
    rec = _Recorder()
    ve = VerdictEvents(store, rec, namespaces=("inference",), events_namespace="triscope",  # type: ignore[arg-type]
                       page_after={"staging-bound": 10.0})
    t = T0
    # 40 short staging episodes on GPU 1 (15 s each, 15 s of demand-limited between): each would page
    for _ in range(40):
        _verdicts(store, t, 15.0, "staging-bound")
        ve.evaluate(t + 15.5)
        _verdicts(store, t + 45, 15.0, "demand-limited")      # a gap past the run's stale bound ends it
        ve.evaluate(t + 125)
        t += 200
    pod_warn = [p for p in rec.posted if p[1] == "StagingBound" and p[0] == "Pod"]
    # the same message again within 10 minutes is not posted again: 40 episodes over 8000 s, one a 600 s
    assert 12 <= len(pod_warn) <= 15, len(pod_warn)
    # distinct messages on one object: the burst, then one per refill period
    rec2 = _Recorder()
    ve2 = VerdictEvents(store, rec2, namespaces=("inference",), events_namespace="triscope")  # type: ignore[arg-type]
    pod = {"kind": "Pod", "apiVersion": "v1", "namespace": "inference", "name": "llm-0"}
    got = sum(ve2._post("inference", pod, "StagingBound", f"gpu 1: message {i}", "Warning", T0) for i in range(40))
    assert got == BURST
    assert ve2._post("inference", pod, "StagingBound", "gpu 1: later", "Warning", T0 + 299) == 0
    assert ve2._post("inference", pod, "StagingBound", "gpu 1: later", "Warning", T0 + 301) == 1
    other = {**pod, "name": "web-0"}                          # another object has its own bucket
    assert ve2._post("inference", other, "StagingBound", "gpu 0: x", "Warning", T0 + 1) == 1


def test_page_after_is_the_shipped_alerts_for() -> None:
    """The Events say 'would page' with the same durations as the shipped alerts."""
    import yaml

    from triscope.core.durations import parse_duration

    doc = yaml.safe_load((Path(__file__).resolve().parents[2] / "deploy" / "kustomize" / "base"
                          / "prometheusrule.yaml").read_text())
    fors = {r["alert"]: parse_duration(r.get("for", 0)) for g in doc["spec"]["groups"] for r in g["rules"]
            if "alert" in r}
    assert {"io-saturated": fors["TriscopeIOSaturated"], "staging-bound": fors["TriscopeStagingBound"],
                            "network-bound": fors["TriscopeNetworkBound"]} == PAGE_AFTER_S


# One accelerator out of service (tests/integration/test_remediation_isolate.py has the DRA rule itself) ------
ISOLATE = """  - name: isolate
    trigger: {mismatch: staging-bound, for: 60s}
    action: isolate_accelerator
    target: {node: {label: node}}
    params: {eviction_timeout: 10s, untaint_after: 120s}
"""


def test_isolate_accelerator_needs_a_trigger_that_names_one() -> None:
    from triscope.remediation.policy import PolicyError

    with pytest.raises(PolicyError, match="isolate_accelerator acts on the one accelerator a trigger names"):
        parse_policy(policy_text(ISOLATE.replace("{mismatch: staging-bound, for: 60s}", "{alert: GpuSlow}"),
                                 SETTINGS + "  node_names: [node-*]\n"), "p.yaml")
    with pytest.raises(PolicyError, match="node allow-list"):
        parse_policy(policy_text(ISOLATE, SETTINGS), "p.yaml")
