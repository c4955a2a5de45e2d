"""Least privilege, proven: the engine's actions against the test API server enforcing the shipped RBAC.

The Kubernetes test server authorises every request with kube-apiserver's RBAC rules
(``tests/kube_rbac.py``) over the ClusterRoles, Roles and bindings of ``deploy/kustomize`` (base +
targets), the engine authenticated as its ServiceAccount. Every action the engine takes (rolling
restart with the owner lookup Pod -> ReplicaSet -> Deployment, dependency fallback created and
reverted, reschedule: node read, candidate list, cordon, pods on the node, preferred affinity,
eviction; one GPU isolated with a DRA DeviceTaintRule, live and dry-run, and released once healthy;
the AcceleratorCoordinationDegraded node condition; Kubernetes Events on Deployments, ConfigMaps and
Nodes; leader election) succeeds with
exactly the shipped permissions, and taking any single verb out of any shipped rule makes the
engine's own path meet a 403 for that verb and resource: nothing shipped is unused. A refusal is
one log line naming the verb, resource, namespace, ServiceAccount, the shipped grant and the fix.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest
from kube_rbac import AGENT_USER, ENGINE_USER, Rbac, shipped_rbac
from kube_server import KubeTestServer, policy_text, webhook_payload

from triscope.core.samples import Sample, Tick
from triscope.remediation.engine import Engine
from triscope.remediation.kube.adapter import KubeAdapter
from triscope.remediation.kube.errors import Forbidden
from triscope.remediation.kube.rbac import RBAC_FILE
from triscope.remediation.kube.views import RESTARTED_AT
from triscope.remediation.leader import LeaderElector
from triscope.remediation.policy import parse_policy
from triscope.store import audit

ENGINE_TOKEN = "engine-token"
AGENT_TOKEN = "agent-token"
SETTINGS = ("  namespaces: [inference, default]\n  evaluate_interval: 1s\n  max_in_flight: 4\n"
            "  breaker: {window: 15m, max_targets: 50, max_percent: 100, min_population: 1000}\n"
            "  node_names: [node-*]\n"
            "  kubernetes: {mode: none, events: true, events_namespace: triscope}\n")
RULES = """  - name: restart
    trigger: {alert: Restart}
    action: rolling_restart
    target: {namespace: {label: namespace}, deployment: {from: workload}}
    params: {timeout: 10s}
    limits: {cooldown: 0s}
  - name: fallback
    trigger: {alert: Fallback}
    action: dependency_fallback
    target: {namespace: {label: namespace}}
    params: {configmap: inference-deps, key: mode, value: fallback, ttl: 1h, hold: 1h}
    limits: {cooldown: 0s}
  - name: move
    trigger: {alert: GpuBroken}
    action: reschedule
    target: {node: {label: node}, namespace: inference, deployment: llm}
    params: {eviction_timeout: 5s, weights: {compute: 1, link: 0, storage: 0}}
    limits: {cooldown: 0s}
  - name: isolate
    trigger: {mismatch: staging-bound, for: 60s}
    action: isolate_accelerator
    target: {node: {label: node}}
    params: {untaint_after: 120s}
    limits: {cooldown: 0s}
  - name: isolate-dry
    dry_run: true
    trigger: {mismatch: staging-bound, for: 60s}
    action: isolate_accelerator
    target: {node: {label: node}}
    params: {untaint_after: 120s}
    limits: {cooldown: 0s}
  - name: host-command
    dry_run: true
    trigger: {alert: HostBroken}
    action: command
    target: {node: {label: node}}
    params: {argv: ["true"], timeout: 5s}
    limits: {cooldown: 0s}
"""
SHIPPED = shipped_rbac()


def server(rbac: Rbac) -> KubeTestServer:
    srv = KubeTestServer(rollout_delay=0.05, users={ENGINE_TOKEN: ENGINE_USER, AGENT_TOKEN: AGENT_USER},
                         rbac=rbac).start()
    for n in ("node-a", "node-b"):
        srv.add_node(n)
    srv.add_deployment("inference", "web", replicas=2, nodes=["node-b"])
    srv.add_deployment("inference", "llm", replicas=1, nodes=["node-a"])
    srv.add_deployment("default", "x", replicas=1, nodes=["node-b"])
    srv.add_resource_slice("node-a", "gpu.nvidia.com", "node-a", [
        {"name": f"gpu-{i}", "attributes": {"uuid": {"string": f"GPU-{i}"}}} for i in (0, 1)])
    return srv


def isolate_gpu_1(store: Any, srv: KubeTestServer, eng: Engine, llm: str) -> None:
    """GPU 1 of node-a staging-bound for 11 minutes: isolated (live and dry-run), the node's condition
    set, then the GPU healthy and its DeviceTaintRule released."""
    now = time.time()
    store.write_ticks("node-a", [Tick(now - 700 + i * 5, [
        Sample("triscope_mismatch_state", 1.0, {"gpu": "1", "state": "staging-bound", "namespace": "inference",
                                                 "pod": llm, "workload": "Deployment/llm"}),
        Sample("triscope_gpu_info", 1.0, {"gpu": "1", "uuid": "GPU-1", "bus_id": "0000:2a:00.0"})])
        for i in range(141)], rollup=False)
    eng.evaluate_triggers(now)
    assert eng.drain(30)
    eng.announce_verdicts(now)
    store.write_ticks("node-a", [Tick(now + 5 + i * 5, [Sample("triscope_mismatch_state", 1.0, {
        "gpu": "1", "state": "idle"})]) for i in range(40)], rollup=False)
    eng.untaint_accelerators(now + 150)


def run_every_action(store: Any, srv: KubeTestServer) -> dict[str, Any]:
    """What the engine does in a cluster, once each; returns the audit outcomes by rule and the leader's answers."""
    kube = KubeAdapter.connect(url=srv.url, token=ENGINE_TOKEN)
    kube.timeout = (2.0, 5.0)
    leader = LeaderElector(kube, "triscope", "triscope-remediation", "engine-a")
    won = [leader.step(), leader.step()]           # create the Lease, then renew it (get + update)
    eng = Engine(store, parse_policy(policy_text(RULES, SETTINGS), "t.yaml"), kube=kube)
    web_pod = srv.pods_of("inference", "web")[0]["metadata"]["name"]
    llm_pod = srv.pods_of("inference", "llm")[0]["metadata"]["name"]
    try:
        for labels in ({"alertname": "Restart", "namespace": "inference", "pod": web_pod},
                       {"alertname": "Fallback", "namespace": "inference"},
                       {"alertname": "GpuBroken", "node": "node-a"},
                       {"alertname": "HostBroken", "node": "node-a"}):
            eng.submit_alerts(webhook_payload([{"labels": labels, "fingerprint": f"fp-{labels['alertname']}"}]))
            assert eng.drain(30)
        isolate_gpu_1(store, srv, eng, llm_pod)
        reverted = eng.revert_fallbacks(now=time.time() + 7200)    # the TTL ran out: get + update
    finally:
        eng.close()
    leader.release()
    kube.close()
    outcomes = {r.rule: (r.outcome, r.reason) for r in audit.audit_log(store) if r.trigger_kind != "revert"}
    reverts = [(r.outcome, r.reason) for r in audit.audit_log(store) if r.trigger_kind == "revert"]
    return {"outcomes": outcomes, "reverts": reverts, "reverted": reverted, "leader": won}


def test_every_action_succeeds_with_exactly_the_shipped_rbac(store: Any) -> None:
    srv = server(SHIPPED)
    try:
        out = run_every_action(store, srv)
        assert srv.forbidden() == [], [(r.method, r.path) for r in srv.forbidden()]
        assert {rule: o for rule, (o, _) in out["outcomes"].items()} == {
            "restart": "acted", "fallback": "acted", "move": "acted", "host-command": "dry_run", "isolate": "acted",
            "isolate-dry": "dry_run"}, out["outcomes"]
        assert out["reverted"] == 1 and out["reverts"][0][0] == "acted", out["reverts"]
        assert out["leader"] == [True, True]
        assert len(SHIPPED.atoms()) == 23     # the count docs/deploy.md and docs/remediation.md give
        # every call the engine made, as the authorizer saw it: nothing beyond the shipped rules
        seen = {(r.verb, r.resource) for r in srv.requests if r.verb and r.resource}   # not discovery
        assert seen == {("get", "leases"), ("create", "leases"), ("update", "leases"),
                        ("get", "pods"), ("get", "replicasets"), ("get", "deployments"), ("patch", "deployments"),
                        ("get", "configmaps"), ("create", "configmaps"), ("update", "configmaps"),
                        ("get", "nodes"), ("list", "nodes"), ("update", "nodes"), ("list", "pods"),
                        ("create", "pods/eviction"), ("create", "events"), ("patch", "nodes/status"),
                        ("list", "resourceslices"), ("get", "devicetaintrules"), ("create", "devicetaintrules"),
                        ("list", "devicetaintrules"), ("delete", "devicetaintrules")}, seen
        # the effects are there: restarted, fallback reverted, node cordoned by triscope, pod evicted
        assert srv.get("deployments", "inference", "web")["spec"]["template"]["metadata"]["annotations"][RESTARTED_AT]
        assert srv.get("configmaps", "inference", "inference-deps")["data"] == {}
        assert srv.get("nodes", "", "node-a")["spec"]["unschedulable"] is True
        # the verdict's Warning on the pod it names (isolate_gpu_1's 11 minutes would page)
        assert {e["involvedObject"]["kind"] for e in srv.list("events", "inference")} == {"Deployment", "ConfigMap",
                                                                                          "Pod"}
        assert {e["involvedObject"]["kind"] for e in srv.list("events", "triscope")} == {"Node"}
        assert srv.get("leases", "triscope", "triscope-remediation")["spec"].get("holderIdentity") is None  # released
        assert srv.list("devicetaintrules") == []                      # isolated, then released once healthy
        conds = {c["type"]: c["status"] for c in srv.get("nodes", "", "node-a")["status"]["conditions"]}
        assert conds["AcceleratorCoordinationDegraded"] == "True"
    finally:
        srv.stop()


@pytest.mark.parametrize("atom", SHIPPED.atoms(), ids=lambda a: f"{a[1]}:{a[3] or 'core'}/{a[4]}:{a[5]}")
def test_each_shipped_permission_is_needed(store: Any, atom: tuple[str, str, int, str, str, str],
                                           caplog: pytest.LogCaptureFixture) -> None:
    """Take one verb on one resource out of one shipped rule: the engine meets a 403 for exactly it."""
    kind, name, _, group, resource, verb = atom
    srv = server(SHIPPED.without(*atom))
    caplog.set_level(logging.INFO)
    try:
        run_every_action(store, srv)
        refused = {(r.verb, r.resource) for r in srv.forbidden()}
        assert (verb, resource) in refused, f"{kind}/{name} {verb} {resource} is shipped but never needed: {refused}"
        assert refused == {(verb, resource)}, refused
        gr = f"{resource}.{group}" if group else resource
        lines = [r for r in caplog.records if r.levelno == logging.ERROR and "Kubernetes refused" in r.getMessage()]
        assert lines and all(r.exc_info is None and "\n" not in r.getMessage() for r in lines)
        mine = [r.getMessage() for r in lines if r.getMessage().startswith(f"remediation: Kubernetes refused {verb} on {gr} ")]
        assert mine, [r.getMessage() for r in lines]
        # the advice names the role that grants it where it was refused, and never widens the engine's
        # rights: in its own namespace it is the leader Role, not a binding of the workloads' role
        if name == "triscope-engine-leader":
            assert all("triscope-engine-leader" in m and "RoleBinding of triscope-engine-workloads" not in m
                       for m in mine), mine
        elif name == "triscope-engine-workloads":
            assert all("RoleBinding of triscope-engine-workloads in namespace" in m for m in mine), mine
        else:
            assert all(f"re-apply {RBAC_FILE}" in m for m in mine), mine
    finally:
        srv.stop()


def test_a_namespace_without_a_rolebinding_is_refused_with_one_clear_line(
        store: Any, caplog: pytest.LogCaptureFixture) -> None:
    srv = server(SHIPPED)
    caplog.set_level(logging.INFO)
    rules = """  - name: restart-default
    trigger: {alert: R}
    action: rolling_restart
    target: {namespace: default, deployment: x}
    limits: {cooldown: 0s}
"""
    eng = Engine(store, parse_policy(policy_text(rules, SETTINGS), "t.yaml"),
                 kube=KubeAdapter.connect(url=srv.url, token=ENGINE_TOKEN))
    try:
        eng.submit_alerts(webhook_payload([{"labels": {"alertname": "R"}}]))
        assert eng.drain(30)
    finally:
        eng.close()
        srv.stop()
    # the read of the Deployment, then the Kubernetes Event about the failed decision, both in default
    assert [(r.method, r.path) for r in srv.forbidden()] == [
        ("GET", "/apis/apps/v1/namespaces/default/deployments/x"), ("POST", "/api/v1/namespaces/default/events")]
    row = audit.audit_log(store, limit=1)[0]
    assert row.outcome == "failed"
    want = ("Kubernetes refused get on deployments.apps in namespace default for "
            "system:serviceaccount:triscope:triscope-engine: the shipped RBAC (deploy/kustomize/base/engine-rbac.yaml) "
            "grants get, patch on deployments.apps (ClusterRole triscope-engine-workloads, bound per namespace by "
            "deploy/kustomize/targets); add a RoleBinding of triscope-engine-workloads in namespace default")
    assert row.reason.startswith(want), row.reason
    lines = [r.getMessage() for r in caplog.records if "Kubernetes refused" in r.getMessage()
             and r.name.endswith("remediation.kube")]
    assert len(lines) == 2 and lines[0] == f"remediation: {row.reason}", lines
    assert lines[1].startswith("remediation: Kubernetes refused create on events in namespace default for "
                               "system:serviceaccount:triscope:triscope-engine: the shipped RBAC "
                               "(deploy/kustomize/base/engine-rbac.yaml) grants create on events (ClusterRole "
                               "triscope-engine-workloads, bound per namespace by deploy/kustomize/targets) and "
                               "create on events (Role triscope-engine-leader in the engine's namespace); add a "
                               "RoleBinding of triscope-engine-workloads in namespace default"), lines[1]
    assert not any(r.exc_info for r in caplog.records)
    assert srv.get("deployments", "default", "x")["metadata"]["generation"] == 1   # untouched


def test_the_forbidden_status_is_kube_apiservers(store: Any) -> None:
    """The body of a 403, byte for byte the shape kube-apiserver answers, through the official client."""
    import json

    from kubernetes.client.exceptions import ApiException

    srv = server(SHIPPED)
    kube = KubeAdapter.connect(url=srv.url, token=ENGINE_TOKEN)
    try:
        def refused(fn: Any, *args: Any) -> dict[str, Any]:
            with pytest.raises(ApiException) as ei:
                fn(*args, _request_timeout=5)
            assert ei.value.status == 403
            return dict(json.loads(ei.value.body))

        body = refused(kube.apps.patch_namespaced_deployment, "x", "default", {"metadata": {}})
        assert body == {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                        "message": 'deployments.apps "x" is forbidden: User "system:serviceaccount:triscope:'
                                   'triscope-engine" cannot patch resource "deployments" in API group "apps" in the '
                                   'namespace "default"',
                        "reason": "Forbidden", "details": {"name": "x", "group": "apps", "kind": "deployments"},
                        "code": 403}
        body = refused(kube.core.list_pod_for_all_namespaces)   # pods are granted per namespace only
        assert body["message"] == ('pods is forbidden: User "system:serviceaccount:triscope:triscope-engine" cannot '
                                   'list resource "pods" in API group "" at the cluster scope')
        assert body["details"] == {"kind": "pods"}
        body = refused(kube.core.delete_namespaced_pod, srv.pods_of("inference", "web")[0]["metadata"]["name"],
                       "inference")
        assert 'cannot delete resource "pods" in API group "" in the namespace "inference"' in body["message"]
        body = refused(kube.core.read_namespaced_secret, "s", "inference")
        assert body["message"].startswith('secrets "s" is forbidden: ')
        # the leader Lease is granted by name: another Lease in the same namespace is not
        body = refused(kube.coord.read_namespaced_lease, "other", "triscope")
        assert 'cannot get resource "leases" in API group "coordination.k8s.io" in the namespace "triscope"' \
            in body["message"]
        # the agent's ServiceAccount has no binding at all
        agent = KubeAdapter.connect(url=srv.url, token=AGENT_TOKEN)
        with pytest.raises(Forbidden) as fe:
            agent.list_nodes()
        assert str(fe.value).startswith("Kubernetes refused list on nodes at the cluster scope for "
                                        "system:serviceaccount:triscope:triscope-agent")
        agent.close()
    finally:
        kube.close()
        srv.stop()


def test_a_binding_to_a_missing_role_says_so_as_the_real_server_does(store: Any) -> None:
    objs = [o for o in SHIPPED.objects if not (o["kind"] == "ClusterRole"
                                                and o["metadata"]["name"] == "triscope-engine-nodes")]
    srv = server(Rbac(objs))
    kube = KubeAdapter.connect(url=srv.url, token=ENGINE_TOKEN)
    try:
        with pytest.raises(Forbidden) as fe:
            kube.get_node("node-a")
        assert fe.value.body["message"].endswith(
            'at the cluster scope: RBAC: clusterrole.rbac.authorization.k8s.io "triscope-engine-nodes" not found')
        assert (fe.value.verb, fe.value.resource, fe.value.namespace) == ("get", "nodes", "")
        assert "re-apply deploy/kustomize/base/engine-rbac.yaml" in str(fe.value)
    finally:
        kube.close()
        srv.stop()


def test_existing_callers_without_rbac_are_unchanged() -> None:
    """A server given no RBAC objects authorises nothing: the other tests' servers keep working."""
    srv = KubeTestServer().start()
    try:
        srv.add_node("n")
        assert KubeAdapter.connect(url=srv.url).get_node("n").name == "n"
        assert not srv.forbidden()
    finally:
        srv.stop()


def test_a_refusal_repeated_by_the_leader_loop_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    lease_get = next(a for a in SHIPPED.atoms() if a[4] == "leases" and a[5] == "get")
    srv = server(SHIPPED.without(*lease_get))
    caplog.set_level(logging.INFO)
    kube = KubeAdapter.connect(url=srv.url, token=ENGINE_TOKEN)
    try:
        leader = LeaderElector(kube, "triscope", "triscope-remediation", "engine-a")
        assert [leader.step() for _ in range(3)] == [False, False, False]
        assert "Kubernetes refused get on leases.coordination.k8s.io in namespace triscope" in leader.last_error
    finally:
        kube.close()
        srv.stop()
    lines = [r for r in caplog.records if r.name.endswith("remediation.kube") and r.levelno == logging.ERROR]
    assert len(lines) == 1, [r.getMessage() for r in lines]
    assert "re-apply deploy/kustomize/base/engine-rbac.yaml" in lines[0].getMessage()


@pytest.mark.parametrize("resource", ["pods", "replicasets"])
def test_an_owner_lookup_refused_names_the_missing_grant_in_the_decision(store: Any, resource: str) -> None:
    atom = next(a for a in SHIPPED.atoms() if a[4] == resource and a[5] == "get")
    srv = server(SHIPPED.without(*atom))
    web_pod = srv.pods_of("inference", "web")[0]["metadata"]["name"]
    eng = Engine(store, parse_policy(policy_text(RULES, SETTINGS), "t.yaml"),
                 kube=KubeAdapter.connect(url=srv.url, token=ENGINE_TOKEN))
    try:
        eng.submit_alerts(webhook_payload([{"labels": {"alertname": "Restart", "namespace": "inference", "pod": web_pod}}]))
        assert eng.drain(30)
    finally:
        eng.close()
        srv.stop()
    row = audit.audit_log(store, limit=1)[0]
    assert row.outcome in ("suppressed", "failed"), row
    gr = "replicasets.apps" if resource == "replicasets" else "pods"
    assert (f"not allowed to read pod inference/{web_pod} or its ReplicaSet: Kubernetes refused get on {gr} in "
            "namespace inference for system:serviceaccount:triscope:triscope-engine") in row.reason, row.reason
    assert not [r for r in srv.requests if r.method in ("PATCH", "PUT") and "/deployments/" in r.path]


# the authorizer itself: kube-apiserver's request attributes and RBAC rules -------------------------
def _attrs(method: str, path: str, query: str = "") -> Any:
    from urllib.parse import parse_qs

    from kube_rbac import request_attributes
    from kube_server import _PATH

    return request_attributes(method, path, parse_qs(query), _PATH.match(path))


@pytest.mark.parametrize("method,path,query,verb,resource,ns,name", [
    ("GET", "/api/v1/namespaces/a/pods", "", "list", "pods", "a", ""),
    ("GET", "/api/v1/namespaces/a/pods", "watch=true", "watch", "pods", "a", ""),
    ("GET", "/api/v1/namespaces/a/pods/p", "", "get", "pods", "a", "p"),
    ("GET", "/api/v1/pods", "", "list", "pods", "", ""),
    ("POST", "/api/v1/namespaces/a/pods/p/eviction", "", "create", "pods/eviction", "a", "p"),
    ("PUT", "/api/v1/nodes/n", "", "update", "nodes", "", "n"),
    ("PATCH", "/apis/apps/v1/namespaces/a/deployments/d", "", "patch", "deployments", "a", "d"),
    ("DELETE", "/api/v1/namespaces/a/configmaps/c", "", "delete", "configmaps", "a", "c"),
    ("DELETE", "/api/v1/namespaces/a/configmaps", "", "deletecollection", "configmaps", "a", ""),
    ("POST", "/apis/coordination.k8s.io/v1/namespaces/a/leases", "", "create", "leases", "a", ""),
])
def test_request_attributes_are_kube_apiservers(method: str, path: str, query: str, verb: str, resource: str,
                                                 ns: str, name: str) -> None:
    a = _attrs(method, path, query)
    assert (a.verb, a.combined_resource, a.namespace, a.name) == (verb, resource, ns, name)


def test_rbac_rules_scopes_and_subjects() -> None:
    def role(kind: str, name: str, rules: list[dict[str, Any]], ns: str | None = None) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": name, **({"namespace": ns} if ns else {})}
        return {"kind": kind, "metadata": meta, "rules": rules}

    def binding(kind: str, name: str, ref_kind: str, ref: str, subjects: list[dict[str, Any]],
                ns: str | None = None) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": name, **({"namespace": ns} if ns else {})}
        return {"kind": kind, "metadata": meta, "roleRef": {"kind": ref_kind, "name": ref}, "subjects": subjects}

    sa = [{"kind": "ServiceAccount", "name": "e", "namespace": "t"}]
    rbac = Rbac([
        role("ClusterRole", "read", [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]},
                                     {"apiGroups": [""], "resources": ["*/status"], "verbs": ["get"]}]),
        role("Role", "one-lease", [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                                    "resourceNames": ["l"], "verbs": ["get", "create", "list"]}], ns="t"),
        role("ClusterRole", "nodes", [{"apiGroups": ["*"], "resources": ["nodes"], "verbs": ["*"]}]),
        binding("RoleBinding", "b1", "ClusterRole", "read", sa, ns="a"),
        binding("RoleBinding", "b2", "Role", "one-lease", sa, ns="t"),
        binding("RoleBinding", "b3", "Role", "one-lease", sa, ns="x"),          # a Role of t cannot be bound in x
        binding("ClusterRoleBinding", "b4", "ClusterRole", "nodes", [{"kind": "Group", "name": "system:serviceaccounts:t"}]),
    ])
    user = "system:serviceaccount:t:e"

    def ok(method: str, path: str, who: str = user) -> bool:
        return rbac.authorize(who, _attrs(method, path))[0]

    assert ok("GET", "/api/v1/namespaces/a/pods/p")
    assert not ok("GET", "/api/v1/namespaces/b/pods/p")          # a RoleBinding grants in its namespace only
    assert not ok("GET", "/api/v1/pods")                          # ... and never at the cluster scope
    assert not ok("GET", "/api/v1/namespaces/a/pods")             # get is not list
    assert ok("GET", "/apis/coordination.k8s.io/v1/namespaces/t/leases/l")
    assert not ok("GET", "/apis/coordination.k8s.io/v1/namespaces/t/leases/m")      # resourceNames
    assert not ok("POST", "/apis/coordination.k8s.io/v1/namespaces/t/leases")       # create has no name
    assert not ok("GET", "/apis/coordination.k8s.io/v1/namespaces/t/leases")        # nor has list
    assert not ok("GET", "/apis/coordination.k8s.io/v1/namespaces/x/leases/l")      # Role t not found in x
    assert rbac.authorize(user, _attrs("GET", "/apis/coordination.k8s.io/v1/namespaces/x/leases/l"))[1] == \
        'RBAC: role.rbac.authorization.k8s.io "one-lease" not found'
    assert ok("PUT", "/api/v1/nodes/n") and ok("DELETE", "/api/v1/nodes")           # group subject, wildcards
    assert not ok("PUT", "/api/v1/nodes/n", "system:serviceaccount:other:e")
    assert ok("GET", "/api/v1/namespaces/a/pods/p/status")       # "*/status" matches any resource's status
    assert ok("GET", "/version") and not ok("GET", "/metrics")    # discovery only, as the bootstrap roles
