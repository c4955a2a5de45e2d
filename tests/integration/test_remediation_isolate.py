"""One GPU out of service through a DRA DeviceTaintRule, against the Kubernetes test server.

The server speaks ``resource.k8s.io`` as the published OpenAPI shapes it (every ResourceSlice and
DeviceTaintRule validated with kubernetes-validate's 1.37 / 1.36 schemas, strict) and enforces the
shipped RBAC (the engine's ServiceAccount).  Two nodes publish devices of the same names (``gpu-0``,
``gpu-1``) in their own pools, as NVIDIA's DRA driver does (pool = node name): the rule must select
the one device of the one node.  The GPU's identity is what the agent stores from NVML
(``triscope_gpu_info``: UUID, PCI bus id); the verdicts as the agent writes them.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from kube_rbac import ENGINE_USER, Rbac, shipped_rbac_objects
from kube_server import KubeTestServer, policy_text

from triscope.core.samples import EventRecord, Sample, Tick
from triscope.remediation import dra
from triscope.remediation.engine import Engine
from triscope.remediation.kube.adapter import KubeAdapter
from triscope.remediation.kube.views import CORDONED_BY
from triscope.remediation.policy import parse_policy
from triscope.store import audit

TOKEN = "engine-token"
DRIVER = "gpu.nvidia.com"
SETTINGS = ("  namespaces: [inference]\n  evaluate_interval: 1s\n  node_names: [node-*]\n"
            "  breaker: {window: 15m, max_targets: 50, max_percent: 100, min_population: 1000}\n"
            "  kubernetes: {mode: none, events: true, events_namespace: triscope}\n")
ISOLATE = """  - name: isolate
    trigger: {mismatch: staging-bound, for: 60s}
    action: isolate_accelerator
    target: {node: {label: node}}
    params: {eviction_timeout: 10s, untaint_after: 120s%s}
    limits: {cooldown: 0s}
"""
UUIDS = {("node-a", "0"): "GPU-aaaa0000-0000-0000-0000-000000000000",
         ("node-a", "1"): "GPU-aaaa1111-1111-1111-1111-111111111111",
         ("node-b", "0"): "GPU-bbbb0000-0000-0000-0000-000000000000",
         ("node-b", "1"): "GPU-bbbb1111-1111-1111-1111-111111111111"}
BUS = {"0": "00000000:17:00.0", "1": "00000000:2A:00.0"}     # NVML's form; the slice has sysfs's


def _server(release: str = "1.37", slices: bool = True) -> KubeTestServer:
    srv = KubeTestServer(users={TOKEN: ENGINE_USER}, rbac=Rbac(shipped_rbac_objects()), kubernetes=release).start()
    for node in ("node-a", "node-b"):
        srv.add_node(node)
        if slices and release != "1.33":
            srv.add_resource_slice(node, DRIVER, node, [
                {"name": f"gpu-{i}", "attributes": {
                    "type": {"string": "gpu"}, "uuid": {"string": UUIDS[(node, str(i))]},
                    "productName": {"string": "NVIDIA H200"},
                    "resource.kubernetes.io/pciBusID": {"string": BUS[str(i)].lower()[4:]}}}
                for i in (0, 1)])
    srv.add_deployment("inference", "web", replicas=1, nodes=["node-a"])     # holds node-a's gpu-0
    srv.add_deployment("inference", "llm", replicas=1, nodes=["node-a"])     # holds node-a's gpu-1
    srv.add_deployment("inference", "other", replicas=1, nodes=["node-b"])   # holds node-b's gpu-1
    for dep, node, dev in (("web", "node-a", "gpu-0"), ("llm", "node-a", "gpu-1"), ("other", "node-b", "gpu-1")):
        srv.allocate("inference", srv.pods_of("inference", dep)[0]["metadata"]["name"], DRIVER, node, dev)
    return srv


@pytest.fixture
def srv() -> Iterator[KubeTestServer]:
    s = _server()
    try:
        yield s
    finally:
        s.stop()


def pod(srv: KubeTestServer, dep: str) -> str:
    return str(srv.pods_of("inference", dep)[0]["metadata"]["name"])


def write_verdicts(store: Any, srv: KubeTestServer, now: float, gpu1: str = "staging-bound", seconds: float = 90.0,
                   *, identity: bool = True, pods: tuple[str, str] | None = None) -> None:
    """node-a: GPU 0 (web) demand-limited, GPU 1 (llm) in ``gpu1``; the GPUs' NVML identity."""
    web, llm = pods or (pod(srv, "web"), pod(srv, "llm"))
    ticks = []
    for i in range(int(seconds / 5) + 1):
        samples = [Sample("triscope_mismatch_state", 1.0, {"gpu": "0", "state": "demand-limited", "namespace": "inference",
                                                            "pod": web, "workload": "Deployment/web"}),
                   Sample("triscope_mismatch_state", 1.0, {"gpu": "1", "state": gpu1, "namespace": "inference",
                                                            "pod": llm, "workload": "Deployment/llm"})]
        if identity:
            samples += [Sample("triscope_gpu_info", 1.0, {"gpu": g, "name": "NVIDIA H200", "uuid": UUIDS[("node-a", g)],
                                                          "bus_id": BUS[g], "gpm": "1"}) for g in ("0", "1")]
        ticks.append(Tick(now - seconds + i * 5, samples))
    store.write_ticks("node-a", ticks, rollup=False)


def healthy(store: Any, now: float, seconds: float = 200.0) -> None:
    store.write_ticks("node-a", [Tick(now + 5 + i * 5, [Sample("triscope_mismatch_state", 1.0, {
        "gpu": "1", "state": "idle"})]) for i in range(int(seconds / 5))], rollup=False)


def engine(store: Any, srv: KubeTestServer, params: str = "", *, dry_run: bool = False) -> Engine:
    kube = KubeAdapter.connect(url=srv.url, token=TOKEN)
    return Engine(store, parse_policy(policy_text(ISOLATE % params, SETTINGS), "p.yaml"), kube=kube, dry_run=dry_run)


def decide(eng: Engine, now: float) -> audit.AuditRow:
    assert eng.evaluate_triggers(now) == 1
    assert eng.drain(30)
    return audit.audit_log(eng.store, limit=1)[0]


def rules(srv: KubeTestServer) -> list[dict[str, Any]]:
    return srv.list("devicetaintrules")


def events(srv: KubeTestServer) -> list[tuple[str, str]]:
    return [(e["reason"], e["message"]) for e in srv.list("events", "triscope")]


def test_the_rule_taints_gpu_1_of_node_a_only_and_is_deleted_once_healthy(store: Any, srv: KubeTestServer) -> None:
    now = time.time()
    write_verdicts(store, srv, now)
    web, llm, other = pod(srv, "web"), pod(srv, "llm"), pod(srv, "other")
    eng = engine(store, srv)
    try:
        row = decide(eng, now)
        assert row.outcome == "acted", row.reason
        (rule,) = rules(srv)
        # exactly node-a's gpu-1: driver, pool and device all set (node-b publishes a gpu-1 too)
        assert rule["spec"]["deviceSelector"] == {"driver": DRIVER, "pool": "node-a", "device": "gpu-1"}
        assert rule["spec"]["taint"]["effect"] == "NoExecute" and rule["spec"]["taint"]["key"] == dra.TAINT_KEY
        assert rule["metadata"]["name"] == dra.rule_name("node-a", dra.DraDevice(DRIVER, "node-a", "gpu-1"))
        assert rule["metadata"]["labels"] == {dra.MANAGED_BY: dra.MANAGER, dra.COMPONENT_LABEL: dra.COMPONENT}
        iso = dra.TaintRule.of(rule).isolation
        assert (iso["node"], iso["accelerator"], iso["state"], iso["rule"], iso["uuid"]) == (
            "node-a", "gpu=1", "staging-bound", "isolate", UUIDS[("node-a", "1")])
        assert iso["decision"] == row.id
        # Kubernetes (the eviction controller) evicted the pod holding it; the others run on
        assert llm not in {p["metadata"]["name"] for p in srv.list("pods", "inference")}
        assert {web, other} <= {p["metadata"]["name"] for p in srv.list("pods", "inference")}
        assert srv.calls("POST", "/eviction") == []            # NoExecute: not the engine's evictions
        node = srv.get("nodes", "", "node-a")
        assert not node["spec"].get("unschedulable")            # a GPU-sized fault: the node is not cordoned
        assert "triscope.io/device-taints" not in node["metadata"]["annotations"]   # nothing claims isolation there
        assert row.reason.startswith(f"tainted gpu=1 on node-a ({DRIVER}/node-a/gpu-1): created DeviceTaintRule "
                                     f"{rule['metadata']['name']} (NoExecute, v1)"), row.reason
        assert [r for r, m in events(srv) if m.endswith(": " + row.reason)] == ["RemediationActed"]
        # healthy for less than untaint_after: the rule stays; then it goes, and the node says so
        healthy(store, now)
        assert eng.untaint_accelerators(now + 100) == 0
        assert eng.untaint_accelerators(now + 150) == 1
        assert rules(srv) == []
        assert any(r == "AcceleratorUntainted" and rule["metadata"]["name"] in m for r, m in events(srv))
        assert srv.forbidden() == []                            # within the shipped RBAC
        dra_calls = {(r.verb, r.resource) for r in srv.requests if "resource.k8s.io" in r.path and r.resource}
        assert dra_calls == {("list", "resourceslices"), ("create", "devicetaintrules"),
                             ("list", "devicetaintrules"), ("delete", "devicetaintrules")}, dra_calls
        assert [r.query.get("fieldSelector") for r in srv.calls("GET", "/resourceslices")] == [["spec.nodeName=node-a"]]
    finally:
        eng.close()


def test_a_restarted_engine_adopts_its_rule_on_409_and_removes_it(store: Any, srv: KubeTestServer) -> None:
    now = time.time()
    names = (pod(srv, "web"), pod(srv, "llm"))
    write_verdicts(store, srv, now, pods=names)
    first = engine(store, srv)
    try:
        assert decide(first, now).outcome == "acted"
    finally:
        first.close()
    (rule,) = rules(srv)
    # a new engine (restarted: nothing in memory) decides again for a later episode of the same GPU
    store.write_ticks("node-a", [Tick(now + 5, [Sample("triscope_mismatch_state", 1.0, {"gpu": "1", "state": "idle"})])],
                      rollup=False)
    later = now + 200
    write_verdicts(store, srv, later, pods=names)
    second = engine(store, srv)
    try:
        row = decide(second, later)
        assert row.outcome == "acted", row.reason
        assert "found (and adopted) the engine's own DeviceTaintRule" in row.reason, row.reason
        assert [r["metadata"]["uid"] for r in rules(srv)] == [rule["metadata"]["uid"]]   # the same object
        assert [c.code for c in srv.calls("POST", "/devicetaintrules")][-1] == 409
        healthy(store, later)
        assert second.untaint_accelerators(later + 150) == 1
        assert rules(srv) == []
        assert srv.forbidden() == []
    finally:
        second.close()


def test_a_rule_of_that_name_someone_else_owns_is_left_alone(store: Any, srv: KubeTestServer) -> None:
    now = time.time()
    write_verdicts(store, srv, now)
    name = dra.rule_name("node-a", dra.DraDevice(DRIVER, "node-a", "gpu-1"))
    srv.put("devicetaintrules", {"metadata": {"name": name}, "spec": {
        "deviceSelector": {"driver": DRIVER, "pool": "node-a", "device": "gpu-1"},
        "taint": {"key": "example.com/maintenance", "effect": "NoSchedule"}}})
    eng = engine(store, srv)
    try:
        row = decide(eng, now)
        assert (row.outcome, row.rail) == ("suppressed", "live_state"), row.reason
        assert "is not the engine's" in row.reason
        healthy(store, now)
        assert eng.untaint_accelerators(now + 150) == 0          # never deletes a rule it does not own
        assert [r["spec"]["taint"]["key"] for r in rules(srv)] == ["example.com/maintenance"]
    finally:
        eng.close()


def test_kubernetes_1_36_gets_its_rule_in_v1beta2(store: Any) -> None:
    srv = _server("1.36")
    now = time.time()
    write_verdicts(store, srv, now)
    eng = engine(store, srv)
    try:
        row = decide(eng, now)
        assert row.outcome == "acted" and "(NoExecute, v1beta2)" in row.reason, row.reason
        assert [r.path for r in srv.calls("POST", "/devicetaintrules")] == [
            "/apis/resource.k8s.io/v1beta2/devicetaintrules"]
        assert srv.calls(None, "/resource.k8s.io/v1/devicetaintrules") == []
        assert srv.forbidden() == []
    finally:
        eng.close()
        srv.stop()


def test_dry_run_creates_an_effect_none_rule_whose_status_says_what_noexecute_would_evict(
        store: Any, srv: KubeTestServer) -> None:
    now = time.time()
    write_verdicts(store, srv, now)
    llm = pod(srv, "llm")
    eng = engine(store, srv, dry_run=True)
    try:
        row = decide(eng, now)
        assert row.outcome == "dry_run", row.reason
        (rule,) = rules(srv)
        assert rule["spec"]["taint"]["effect"] == "None"
        assert rule["spec"]["deviceSelector"] == {"driver": DRIVER, "pool": "node-a", "device": "gpu-1"}
        assert llm in {p["metadata"]["name"] for p in srv.list("pods", "inference")}      # nothing evicted
        assert "would taint gpu=1 on node-a" in row.reason and "with NoExecute" in row.reason
        assert f"its status: 1 pods would be evicted with effect NoExecute: inference/{llm}" in row.reason, row.reason
        assert f"the agent saw 1 pod(s) holding it: inference/{llm}" in row.reason
        # a dry-run engine releases its own dry-run rule once the GPU is healthy
        healthy(store, now)
        assert eng.untaint_accelerators(now + 150) == 1 and rules(srv) == []
        assert srv.forbidden() == []
    finally:
        eng.close()


def test_a_live_decision_replaces_an_earlier_dry_run_rule(store: Any, srv: KubeTestServer) -> None:
    now = time.time()
    write_verdicts(store, srv, now)
    dry = engine(store, srv, dry_run=True)
    try:
        assert decide(dry, now).outcome == "dry_run"
    finally:
        dry.close()
    live = engine(store, srv)
    try:
        row = decide(live, now)
        assert row.outcome == "acted" and "replaced the engine's earlier rule" in row.reason, row.reason
        assert [r["spec"]["taint"]["effect"] for r in rules(srv)] == ["NoExecute"]
    finally:
        live.close()


def test_eviction_api_keeps_the_engine_s_evictions_and_their_pdbs(store: Any, srv: KubeTestServer) -> None:
    now = time.time()
    write_verdicts(store, srv, now)
    llm, web = pod(srv, "llm"), pod(srv, "web")
    eng = engine(store, srv, ", eviction: eviction_api")
    try:
        row = decide(eng, now)
        assert row.outcome == "acted", row.reason
        assert [r["spec"]["taint"]["effect"] for r in rules(srv)] == ["NoSchedule"]
        assert [r.path.split("/pods/")[1].split("/")[0] for r in srv.calls("POST", "/eviction")] == [llm]
        assert web in {p["metadata"]["name"] for p in srv.list("pods", "inference")}
        assert "through the Eviction API" in row.reason
    finally:
        eng.close()


@pytest.mark.parametrize("release,slices", [("1.33", False), ("1.37", False)],
                         ids=["no-resource-api", "device-plugin-node"])
@pytest.mark.parametrize("choice", ["refuse", "cordon"])
def test_where_no_resourceslice_publishes_the_gpu_the_policy_chooses_and_says_so(
        store: Any, release: str, slices: bool, choice: str) -> None:
    srv = _server(release, slices=slices)
    now = time.time()
    write_verdicts(store, srv, now)
    llm = pod(srv, "llm")
    eng = engine(store, srv, f", without_dra: {choice}, eviction: eviction_api")
    try:
        row = decide(eng, now)
        node = srv.get("nodes", "", "node-a")
        if release != "1.33":
            assert rules(srv) == []
        assert "triscope.io/device-taints" not in node["metadata"]["annotations"]   # no claim of isolation
        msgs = [m for r, m in events(srv) if r.startswith("Remediation")]
        assert len(msgs) == 1 and msgs[0].endswith(": " + row.reason), msgs   # the Event says it in the same words
        if choice == "refuse":
            assert (row.outcome, row.rail) == ("suppressed", "live_state"), row.reason
            assert row.reason.startswith("refused to isolate gpu=1 on node-a: "), row.reason
            assert "the policy says without_dra: refuse: nothing was done (no taint, no cordon, no eviction)" in row.reason
            assert not node["spec"].get("unschedulable")
            assert llm in {p["metadata"]["name"] for p in srv.list("pods", "inference")}
        else:
            assert row.outcome == "acted", row.reason
            assert row.reason.startswith("cordoned node node-a instead of isolating gpu=1 (without_dra: cordon, a "
                                         "node-level action"), row.reason
            assert node["spec"]["unschedulable"] is True
            assert node["metadata"]["annotations"][CORDONED_BY] == "triscope"
            assert [r.path.split("/pods/")[1].split("/")[0] for r in srv.calls("POST", "/eviction")] == [llm]
        why = ("this cluster serves no ResourceSlices" if release == "1.33"
               else "no ResourceSlice publishes gpu=1 of node-a: no ResourceSlice publishes a device of this node")
        assert why in row.reason, row.reason
        assert srv.forbidden() == []
    finally:
        eng.close()
        srv.stop()


def test_no_identity_stored_is_said_and_nothing_is_guessed(store: Any, srv: KubeTestServer) -> None:
    now = time.time()
    write_verdicts(store, srv, now, identity=False)
    eng = engine(store, srv)
    try:
        row = decide(eng, now)
        assert (row.outcome, row.rail) == ("suppressed", "live_state")
        assert "the agent stored no UUID or PCI bus id for gpu=1 of node-a (triscope_gpu_info)" in row.reason
        assert rules(srv) == []
    finally:
        eng.close()


def test_the_bus_id_finds_the_device_when_the_driver_publishes_no_uuid(store: Any) -> None:
    srv = KubeTestServer(kubernetes="1.37").start()
    try:
        srv.add_node("node-a")
        srv.add_resource_slice("node-a", "gpu.example.com", "pool-x", [
            {"name": "dev-7", "attributes": {"resource.kubernetes.io/pciBusID": {"string": "0000:2a:00.0"}}},
            {"name": "dev-8", "attributes": {"resource.kubernetes.io/pciBusID": {"string": "0000:17:00.0"}}}])
        kube = KubeAdapter.connect(url=srv.url)
        devs = dra.devices(kube.resource_slices("node-a"), "node-a")
        dev, why = dra.find_device(devs, uuid="GPU-nobody", bus_id="00000000:2A:00.0")
        assert dev is not None and dev.describe() == "gpu.example.com/pool-x/dev-7", why
    finally:
        srv.stop()


def test_a_pool_s_older_generation_is_ignored() -> None:
    def sl(gen: int, uuid: str) -> dict[str, Any]:
        return {"spec": {"driver": DRIVER, "nodeName": "n", "pool": {"name": "n", "generation": gen,
                                                                       "resourceSliceCount": 1},
                         "devices": [{"name": f"gpu-{gen}", "attributes": {"uuid": {"string": uuid}}}]}}

    devs = dra.devices([sl(1, "GPU-x"), sl(2, "GPU-y")], "n")
    assert [d.name for d in devs] == ["gpu-2"]
    assert dra.find_device(devs, uuid="GPU-x")[0] is None


def test_the_engine_refuses_a_selector_without_driver_pool_and_device() -> None:
    iso: dra.Isolation = {"state": "staging-bound"}
    for dev in (dra.DraDevice("", "p", "d"), dra.DraDevice("x.io", "", "d"), dra.DraDevice("x.io", "p", ""),
                dra.DraDevice("", "", "")):
        with pytest.raises(dra.IncompleteSelector, match="an empty or partial selector taints every matching device"):
            dra.rule_body("triscope-x", dev, "NoSchedule", iso, "v1")
    body = dra.rule_body("triscope-x", dra.DraDevice("x.io", "p", "d"), "NoSchedule", iso, "v1")
    assert body["spec"]["deviceSelector"] == {"driver": "x.io", "pool": "p", "device": "d"}


def test_the_test_server_validates_dra_objects_with_the_published_schema() -> None:
    """Raw HTTP (the official client's own models would refuse the unknown field before sending it)."""
    import json
    import urllib.error
    import urllib.request

    srv = KubeTestServer().start()

    def post(body: dict[str, Any], version: str = "v1") -> tuple[int, dict[str, Any]]:
        req = urllib.request.Request(f"{srv.url}/apis/resource.k8s.io/{version}/devicetaintrules",
                                     data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=5) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    try:
        good = dra.rule_body("triscope-x", dra.DraDevice("x.io", "p", "d"), "NoSchedule", {"state": "s"}, "v1")
        code, out = post({**good, "spec": {**good["spec"], "deviceSelector": {"driver": "x.io", "deviceName": "d"}}})
        assert (code, out["reason"]) == (422, "Invalid") and "deviceName" in out["message"], out
        code, out = post({**good, "spec": {**good["spec"], "taint": {**good["spec"]["taint"],
                                                                     "effect": "PreferNoSchedule"}}})
        assert code == 422 and "spec.taint.effect: Unsupported value" in out["message"], out
        code, out = post({**good, "metadata": {**good["metadata"], "name": "Not_A_Name"}})
        assert code == 422 and "metadata.name" in out["message"], out
        assert post(good)[0] == 201
        assert post(good)[0] == 409
        with pytest.raises(Exception, match="exactly one of"):   # a slice with no nodeName / nodeSelector / allNodes
            srv.add_resource_slice("", "x.io", "p", [{"name": "d"}])
    finally:
        srv.stop()


# the verdict as a node condition ----------------------------------------------------------------------
def test_the_node_condition_says_staging_bound_then_false_again(store: Any, srv: KubeTestServer) -> None:
    from triscope.remediation.node_condition import CONDITION

    t0 = time.time() - 900
    names = (pod(srv, "web"), pod(srv, "llm"))
    write_verdicts(store, srv, t0 + 300, seconds=300.0, identity=False, pods=names)   # GPU 1 staging-bound 5 min
    store.add_events("node-a", [EventRecord("accelerator_state", "gpu=1 demand-limited -> staging-bound", "warning",
                                            {"from": "demand-limited", "to": "staging-bound", "score": 0.9,
                                             "labels": {"gpu": "1"},
                                             "reasons": ["llm-0 throttled in 97 % of its CPU periods", "link quiet"]},
                                            t0 + 2)])
    eng = engine(store, srv)
    try:
        eng.announce_verdicts(t0 + 301)          # 5 minutes: would not page yet
        cond = {c["type"]: c for c in srv.get("nodes", "", "node-a")["status"]["conditions"]}
        assert cond[CONDITION]["status"] == "False" and cond[CONDITION]["reason"] == "AcceleratorsHealthy"
        assert cond["Ready"]["status"] == "True"                       # the kubelet's conditions untouched
        write_verdicts(store, srv, t0 + 700, seconds=395.0, identity=False, pods=names)   # 11+ minutes in all
        eng.announce_verdicts(t0 + 702)
        cond = {c["type"]: c for c in srv.get("nodes", "", "node-a")["status"]["conditions"]}
        c = cond[CONDITION]
        assert (c["status"], c["reason"]) == ("True", "StagingBound"), c
        assert c["message"].startswith("gpu 1 staging-bound since ") and c["message"].endswith(
            ": llm-0 throttled in 97 % of its CPU periods <- link quiet"), c["message"]
        assert c["lastTransitionTime"] and c["lastHeartbeatTime"]
        patches = len(srv.calls("PATCH", "/nodes/node-a/status"))
        eng.announce_verdicts(t0 + 703)                               # unchanged: no write
        assert len(srv.calls("PATCH", "/nodes/node-a/status")) == patches
        # every accelerator healthy again: False, kept (not removed)
        healthy(store, t0 + 702, 60.0)
        eng.announce_verdicts(t0 + 702 + 130)
        c = {x["type"]: x for x in srv.get("nodes", "", "node-a")["status"]["conditions"]}[CONDITION]
        assert (c["status"], c["reason"]) == ("False", "AcceleratorsHealthy")
        assert srv.forbidden() == []
        assert {(r.verb, r.resource) for r in srv.requests if r.resource.startswith("nodes")} >= {("patch", "nodes/status")}
    finally:
        eng.close()
