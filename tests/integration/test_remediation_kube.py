"""The Kubernetes adapter's verbs and error types against the test server (official client, real HTTP)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kube_server import KubeTestServer, open_store, policy_text, webhook_payload

from triscope.remediation.engine import Engine
from triscope.remediation.kube.adapter import SMP, KubeAdapter
from triscope.remediation.kube.errors import (
    AlreadyExists,
    Conflict,
    DegradedDeployment,
    NotConfigured,
    NotFound,
    PausedDeployment,
    Unauthorized,
)
from triscope.remediation.policy import parse_policy
from triscope.store import audit


@pytest.fixture
def srv() -> Iterator[KubeTestServer]:
    s = KubeTestServer(token="t0ken", rollout_delay=0.05).start()
    s.add_node("node-a")
    s.add_deployment("inference", "web", replicas=2)
    yield s
    s.stop()


@pytest.fixture
def kube(srv: KubeTestServer) -> KubeAdapter:
    return KubeAdapter.connect(url=srv.url, token="t0ken")


def test_restart_retries_when_the_deployment_changes_under_it(srv: KubeTestServer, kube: KubeAdapter) -> None:
    orig = srv._patch
    state = {"n": 0}

    def racing_patch(res: str, ns: str, name: str, ctype: str, body: Any):  # type: ignore[no-untyped-def]
        state["n"] += 1
        if state["n"] == 1:  # someone scales the deployment between our read and our patch
            dep = srv.get("deployments", ns, name)
            srv.put("deployments", dep)
        return orig(res, ns, name, ctype, body)

    srv._patch = racing_patch  # type: ignore[method-assign]
    out = kube.restart_deployment("inference", "web")
    assert out["restartedAt"] and state["n"] == 2
    patches = srv.calls("PATCH", "/deployments/web")
    assert all(p.body["metadata"]["resourceVersion"] for p in patches)


def test_steering_to_a_node_retries_when_the_deployment_changes_under_it(srv: KubeTestServer,
                                                                         kube: KubeAdapter) -> None:
    """A reschedule cordons, then steers the Deployment: a status or scale update between its read and
    its patch (409) is read again, not a failed decision that leaves the node cordoned."""
    orig = srv._patch
    state = {"n": 0}

    def racing_patch(res: str, ns: str, name: str, ctype: str, body: Any):  # type: ignore[no-untyped-def]
        state["n"] += 1
        if state["n"] == 1:
            srv.put("deployments", srv.get("deployments", ns, name))   # someone else's write
        return orig(res, ns, name, ctype, body)

    srv._patch = racing_patch  # type: ignore[method-assign]
    out = kube.set_preferred_node("inference", "web", "node-a")
    assert out["preferred_node"] == "node-a" and state["n"] == 2
    aff = srv.get("deployments", "inference", "web")["spec"]["template"]["spec"]["affinity"]
    [term] = aff["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["preference"]["matchExpressions"][0]["values"] == ["node-a"]


@pytest.mark.parametrize("races", [1, 99])
def test_every_read_modify_write_retries_on_conflict_then_gives_up(srv: KubeTestServer, kube: KubeAdapter,
                                                                  races: int) -> None:
    """Cordon, uncordon and ConfigMap keys go through the one conflict-retry helper: someone
    writing the object between our read and our write (409) makes the verb read it again; one who keeps
    doing so makes it give up after 5 tries (8 for a ConfigMap), naming the object, having written nothing."""
    orig = srv._replace
    left = {"n": races}

    def racing_replace(res: str, ns: str, name: str, body: Any):  # type: ignore[no-untyped-def]
        if left["n"] > 0:
            left["n"] -= 1
            srv.put(res, srv.get(res, ns, name))   # someone else's write: a new resourceVersion
        return orig(res, ns, name, body)

    srv._replace = racing_replace  # type: ignore[method-assign]
    srv.put("configmaps", {"metadata": {"name": "deps", "namespace": "inference"}, "data": {"mode": "normal"}})
    verbs = [("node-a", 5, lambda: kube.cordon("node-a", by="triscope")),
             ("deps", 8, lambda: kube.set_configmap_keys("inference", "deps", {"mode": "x"}))]
    for name, tries, verb in verbs:
        left["n"] = races
        before = len(srv.calls("PUT"))
        if races == 1:
            verb()
            assert len(srv.calls("PUT")) - before == 2             # the lost race, then the write
            continue
        with pytest.raises(Conflict, match=rf"{name} \(.*\) kept changing \(409 {tries} times\)"):
            verb()
        assert len(srv.calls("PUT")) - before == tries
    if races > 1:
        assert not srv.get("nodes", "", "node-a")["spec"].get("unschedulable")
        assert srv.get("configmaps", "inference", "deps")["data"] == {"mode": "normal"}
    else:
        assert srv.get("nodes", "", "node-a")["spec"]["unschedulable"] is True
        assert kube.uncordon("node-a", by="triscope")["result"] == "uncordoned"


def test_rfc3339_one_parser_one_formatter() -> None:
    """What Kubernetes and Alertmanager write (nanoseconds, Z or an offset) and what the engine writes
    (whole seconds; microseconds for a MicroTime or a restart stamp) read back to the same instant."""
    from triscope.core.timeparse import TimeParseError, format_rfc3339, parse_rfc3339

    ts = parse_rfc3339("2026-11-29T18:00:00.123456789Z")
    assert ts == parse_rfc3339("2026-11-29T19:00:00.123456+01:00") == 1795975200.123456
    assert format_rfc3339(ts) == "2026-11-29T18:00:00Z" and format_rfc3339(ts, micro=True) == "2026-11-29T18:00:00.123456Z"
    assert parse_rfc3339(KubeAdapter.micro_time()) == pytest.approx(time.time(), abs=5)
    for bad in ("", "yesterday", "2026-11-29T18:00:00"):          # no zone: not RFC 3339
        with pytest.raises(TimeParseError):
            parse_rfc3339(bad)


def test_patch_content_types_are_honoured(srv: KubeTestServer, kube: KubeAdapter) -> None:
    # a JSON object sent as json-patch is a 400, as on a real API server (the official client itself
    # switches object bodies to strategic merge, so this is sent raw)
    import http.client
    import json

    host, port = srv.httpd.server_address[:2]
    c = http.client.HTTPConnection(str(host), int(port), timeout=5)
    c.request("PATCH", "/apis/apps/v1/namespaces/inference/deployments/web", body=json.dumps({"metadata": {}}),
              headers={"Content-Type": "application/json-patch+json", "Authorization": "Bearer t0ken"})
    r = c.getresponse()
    status = json.loads(r.read())
    assert r.status == 400 and status["kind"] == "Status" and status["reason"] == "BadRequest"
    ops = [{"op": "add", "path": "/metadata/labels/b", "value": "c"}]
    out = kube._call(kube.apps.patch_namespaced_deployment, "web", "inference", ops,
                     _content_type="application/json-patch+json")
    assert out["metadata"]["labels"]["b"] == "c"
    # strategic merge: containers merge by name, null deletes a key
    kube._call(kube.apps.patch_namespaced_deployment, "web", "inference",
               {"metadata": {"labels": {"b": None}},
                "spec": {"template": {"spec": {"containers": [{"name": "sidecar", "image": "s:1"}]}}}},
               _content_type=SMP)
    dep = srv.get("deployments", "inference", "web")
    assert "b" not in dep["metadata"]["labels"]
    assert [c["name"] for c in dep["spec"]["template"]["spec"]["containers"]] == ["app", "sidecar"]


def test_error_types(srv: KubeTestServer, kube: KubeAdapter) -> None:
    with pytest.raises(NotFound):
        kube.get_deployment("inference", "nope")
    with pytest.raises(Unauthorized):
        KubeAdapter.connect(url=srv.url, token="wrong").get_node("node-a")
    srv.add_deployment("inference", "paused", paused=True)
    with pytest.raises(PausedDeployment):
        kube.restart_deployment("inference", "paused")
    srv.add_deployment("inference", "half", replicas=4, available=2)
    with pytest.raises(DegradedDeployment):
        kube.restart_deployment("inference", "half")
    kube.create_lease("default", "l", {"holderIdentity": "x"})
    with pytest.raises(AlreadyExists):
        kube.create_lease("default", "l", {})
    lease = kube.get_lease("default", "l")
    kube.replace_lease("default", "l", lease)
    with pytest.raises(Conflict):
        kube.replace_lease("default", "l", lease)  # stale resourceVersion
    with pytest.raises(NotConfigured):
        KubeAdapter.connect(kubeconfig="/nonexistent/kubeconfig")


def test_unreachable_api_is_a_failed_decision(tmp_path: Path, srv: KubeTestServer) -> None:
    st = open_store(f"sqlite:///{tmp_path / 't.db'}")
    rules = """  - name: r
    trigger: {alert: A}
    action: rolling_restart
    target: {namespace: inference, deployment: web}
"""
    down = KubeAdapter.connect(url=f"http://127.0.0.1:{_closed_port()}")
    down.timeout = (0.5, 1.0)
    eng = Engine(st, parse_policy(policy_text(rules)), kube=down)
    no_api = Engine(st, parse_policy(policy_text(rules.replace("name: r", "name: r2").replace("deployment: web", "deployment: api"))), kube=None)
    eng.submit_alerts(webhook_payload([{"labels": {"alertname": "A"}, "fingerprint": "f1"}]))
    no_api.submit_alerts(webhook_payload([{"labels": {"alertname": "A"}, "fingerprint": "f2"}]))
    assert eng.drain(30) and no_api.drain(30)
    eng.close()
    no_api.close()
    rows = {r.rule: r for r in audit.audit_log(st)}
    assert rows["r"].outcome == "failed" and "unreachable" in rows["r"].reason
    assert rows["r2"].outcome == "failed" and "no Kubernetes API configured" in rows["r2"].reason
    st.close()


def test_suppressed_decisions_are_kubernetes_events_too(tmp_path: Path, srv: KubeTestServer, kube: KubeAdapter) -> None:
    st = open_store(f"sqlite:///{tmp_path / 't.db'}")
    srv.add_deployment("inference", "paused", paused=True)
    eng = Engine(st, parse_policy(policy_text("""  - name: r
    trigger: {alert: A}
    action: rolling_restart
    target: {namespace: inference, deployment: paused}
""")), kube=kube)
    eng.submit_alerts(webhook_payload([{"labels": {"alertname": "A"}}]))
    assert eng.drain()
    eng.close()
    deadline = time.time() + 5
    while time.time() < deadline and not srv.list("events", "inference"):
        time.sleep(0.05)
    ev = srv.list("events", "inference")[0]
    assert ev["reason"] == "RemediationSuppressed" and ev["type"] == "Normal"
    assert ev["involvedObject"] == {"kind": "Deployment", "apiVersion": "apps/v1", "namespace": "inference",
                                    "name": "paused"}
    assert "live_state" in ev["message"] and "paused" in ev["message"]
    st.close()


def _closed_port() -> int:
    from conftest import free_port

    return free_port()
