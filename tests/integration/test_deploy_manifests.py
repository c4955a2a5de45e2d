"""Kubernetes manifests under deploy/kustomize, validated offline.

Every overlay is rendered with kustomize (``kubectl kustomize``), and every object is checked
against the OpenAPI schema of a current Kubernetes release that the ``kubernetes-validate``
package ships (strict: unknown fields are errors), and against the oldest release we support.
ServiceMonitor / PrometheusRule are checked against the Prometheus Operator CRD schemas kept in
deploy/schemas, the HA store's ``postgresql`` against the Zalando postgres-operator's (with the API
server's structural pruning emulated: undeclared fields are errors).
Then the security and wiring properties the docs promise are asserted one by one.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
KUSTOMIZE = REPO / "deploy" / "kustomize"
SCHEMAS = REPO / "deploy" / "schemas"
OVERLAYS = ["overlays/nvidia", "overlays/ascend"]
HA_PG = "ha-postgres"
ALL_ROOTS = ["base", "targets", "secrets-example", *OVERLAYS, HA_PG]
K8S_LATEST = "1.37.0"   # the newest release kubernetes-validate ships
K8S_OLDEST = "1.31.0"   # oldest release we claim (recursiveReadOnly is beta there, GA in 1.33)
CRD_SCHEMAS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "servicemonitor.v1.schema.yaml",
    ("monitoring.coreos.com/v1", "PrometheusRule"): "prometheusrule.v1.schema.yaml",
    ("acid.zalan.do/v1", "postgresql"): "postgresql.v1.schema.yaml",
}


def find_kubectl() -> str | None:
    """kubectl with kustomize v5: the one 'make test' unpacks into .tools/bin, else the one on PATH."""
    for cand in (str(REPO / ".tools" / "bin" / "kubectl"), shutil.which("kubectl")):
        if cand and Path(cand).exists():
            out = subprocess.run([cand, "version", "--client"], capture_output=True, text=True, timeout=30)
            if "Kustomize Version: v5" in out.stdout or "Kustomize Version: v6" in out.stdout:
                return cand
    return None


def kustomize(root: str) -> list[dict[str, Any]]:
    kubectl = find_kubectl()
    if kubectl is None:
        pytest.fail("kubectl with kustomize v5 is needed to render deploy/kustomize: 'make test' puts one in "
                    ".tools/bin (scripts/setup-system.sh)")
    out = subprocess.run([kubectl, "kustomize", str(KUSTOMIZE / root)], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, f"kustomize {root} failed: {out.stderr}"
    return [d for d in yaml.safe_load_all(out.stdout) if d]


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict[str, Any]]]:
    return {root: kustomize(root) for root in ALL_ROOTS}


def by_kind(objs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objs if o["kind"] == kind]


def one(objs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind}/{name}, found {len(found)}"
    return found[0]


def pod_specs(objs: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    for o in objs:
        spec = o.get("spec", {})
        if o["kind"] in ("Deployment", "DaemonSet", "StatefulSet", "Job"):
            yield f"{o['kind']}/{o['metadata']['name']}", spec["template"]["spec"]
        elif o["kind"] == "CronJob":
            yield f"CronJob/{o['metadata']['name']}", spec["jobTemplate"]["spec"]["template"]["spec"]


# ---------------------------------------------------------------------------------------------
# schema validation


def _undeclared_fields(obj: Any, schema: dict[str, Any], path: str = "") -> list[str]:
    """Fields the structural schema does not declare (the API server would prune them)."""
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return []
    bad: list[str] = []
    if isinstance(obj, dict) and schema.get("type") == "object":
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        for key, value in obj.items():
            if props is not None and key in props:
                bad += _undeclared_fields(value, props[key], f"{path}.{key}")
            elif isinstance(extra, dict):
                bad += _undeclared_fields(value, extra, f"{path}.{key}")
            elif props is not None and not (path == "" and key == "metadata"):
                bad.append(f"{path}.{key}")
    elif isinstance(obj, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(obj):
            bad += _undeclared_fields(item, schema["items"], f"{path}[{i}]")
    return bad


def validate_crd_object(obj: dict[str, Any]) -> None:
    schema = yaml.safe_load((SCHEMAS / CRD_SCHEMAS[(obj["apiVersion"], obj["kind"])]).read_text())
    jsonschema.Draft7Validator(schema).validate(obj)
    undeclared = _undeclared_fields(obj, schema)
    if undeclared:
        raise jsonschema.ValidationError(f"fields not in the CRD schema: {undeclared}")
    kubernetes_validate.validate({"apiVersion": "v1", "kind": "ConfigMap", "metadata": obj["metadata"]},
                                 K8S_LATEST, strict=True)


def validate_object(obj: dict[str, Any], version: str) -> None:
    if (obj["apiVersion"], obj["kind"]) in CRD_SCHEMAS:
        validate_crd_object(obj)
    else:
        kubernetes_validate.validate(obj, version, strict=True)


@pytest.mark.parametrize("root", ALL_ROOTS)
@pytest.mark.parametrize("version", [K8S_LATEST, K8S_OLDEST])
def test_every_rendered_object_matches_its_schema(rendered: dict[str, list[dict[str, Any]]], root: str,
                                                  version: str) -> None:
    objs = rendered[root]
    assert objs, f"{root} rendered nothing"
    for obj in objs:
        try:
            validate_object(obj, version)
        except (jsonschema.ValidationError, kubernetes_validate.ValidationError) as e:
            pytest.fail(f"{root}: {obj['kind']}/{obj['metadata']['name']} invalid for {version}: {e.message} "
                        f"at {list(e.absolute_path)}")


def test_every_manifest_file_is_rendered_somewhere(rendered: dict[str, list[dict[str, Any]]]) -> None:
    # a YAML file in base/ that no kustomization lists would silently never be applied
    listed = set()
    for kfile in KUSTOMIZE.rglob("kustomization.yaml"):
        k = yaml.safe_load(kfile.read_text())
        for entry in k.get("resources", []) + [p["path"] for p in k.get("patches", []) if "path" in p]:
            listed.add((kfile.parent / entry).resolve())
    for f in KUSTOMIZE.rglob("*.yaml"):
        if f.name != "kustomization.yaml":
            assert f.resolve() in listed, f"{f.relative_to(REPO)} is not listed in any kustomization.yaml"


def test_schema_validation_rejects_mistakes(rendered: dict[str, list[dict[str, Any]]]) -> None:
    # the validators must be able to fail: a typo in a core kind, a wrong type, and a typo in a CRD
    ds = one(rendered["overlays/nvidia"], "DaemonSet", "triscope-agent")
    typo = yaml.safe_load(yaml.safe_dump(ds))
    typo["spec"]["template"]["spec"]["hostPid"] = True
    with pytest.raises(kubernetes_validate.ValidationError):
        validate_object(typo, K8S_LATEST)
    wrong_type = yaml.safe_load(yaml.safe_dump(ds))
    wrong_type["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = "9464"
    with pytest.raises(kubernetes_validate.ValidationError):
        validate_object(wrong_type, K8S_LATEST)
    sm = one(rendered["base"], "ServiceMonitor", "triscope-agent")
    bad_sm = yaml.safe_load(yaml.safe_dump(sm))
    bad_sm["spec"]["endpoints"][0]["scrapeInterval"] = "15s"   # the field is "interval"
    with pytest.raises(jsonschema.ValidationError, match="scrapeInterval"):
        validate_object(bad_sm, K8S_LATEST)
    bad_rule = yaml.safe_load(yaml.safe_dump(one(rendered["base"], "PrometheusRule", "triscope")))
    bad_rule["spec"]["groups"][0]["rules"][0]["for"] = "5 minutes"
    with pytest.raises(jsonschema.ValidationError):
        validate_object(bad_rule, K8S_LATEST)


# ---------------------------------------------------------------------------------------------
# the agent DaemonSet: host access, explained and limited


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_agent_is_unprivileged_with_only_the_needed_capabilities(rendered: dict[str, list[dict[str, Any]]],
                                                                 overlay: str) -> None:
    ds = one(rendered[overlay], "DaemonSet", "triscope-agent")
    spec = ds["spec"]["template"]["spec"]
    assert spec["hostPID"] is True and spec["hostNetwork"] is True
    assert spec["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert spec["automountServiceAccountToken"] is False
    (c,) = spec["containers"]
    sc = c["securityContext"]
    assert sc["privileged"] is False
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert set(sc["capabilities"]["add"]) == {"BPF", "PERFMON"}
    assert spec["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    vols = {v["name"]: v for v in spec["volumes"]}
    for path, host in [("/sys", "/sys"), ("/sys/kernel/tracing", "/sys/kernel/tracing"),
                       ("/host/lib/modules", "/lib/modules"), ("/host/usr/src", "/usr/src")]:
        assert mounts[path].get("readOnly") is True, f"{path} must be read-only"
        assert vols[mounts[path]["name"]]["hostPath"]["path"] == host
    # every hostPath but the spool is mounted read-only: the agent writes nothing else to the node
    writable = [m["name"] for m in c["volumeMounts"] if "hostPath" in vols[m["name"]] and not m.get("readOnly")]
    assert writable == ["spool"], f"writable hostPaths: {writable}"
    args = " ".join(c["args"])
    assert "--no-migrate" in args and "--listen=$(HOST_IP):9464" in args and "--node=$(NODE_NAME)" in args
    # the spool outlives the pod (a rolling update during a PostgreSQL outage keeps the buffered
    # ticks for the next pod), in a directory of its own, bounded by the agent itself
    assert vols["spool"]["hostPath"] == {"path": SPOOL_DIR, "type": "DirectoryOrCreate"}
    assert mounts[SPOOL_DIR]["name"] == "spool"
    assert f"--spool={SPOOL_DIR}" in c["args"] and f"--spool-max-mb={SPOOL_MAX_MB}" in c["args"]


# measured agent footprint (docs/ebpf.md, "Footprint on the GPU node"; bench/RESULTS.md "ebpf footprint")
SPOOL_DIR = "/var/lib/triscope/spool"
SPOOL_MAX_MB = 64
H200_RSS_MB = 84.8            # all collectors, NVML loaded, one H200
H200_CPU_PERCENT = 0.38       # of a core, 1 s tick, /metrics scraped 1/s
NVML_MS_PER_GPU = 1.07        # tick cost per GPU (bench/RESULTS.md "nvml")
BCC_COMPILE_PEAK_MB = 135     # the compile child at start, while the parent runs


def test_agent_resources_follow_the_measured_figures(rendered: dict[str, list[dict[str, Any]]]) -> None:
    # the figures the sizing uses are the ones the measurement documents carry
    ebpf_doc = (REPO / "docs" / "ebpf.md").read_text()
    assert f"| agent RSS | {H200_RSS_MB} MB;" in ebpf_doc
    assert f"**{H200_CPU_PERCENT} %** of a core" in ebpf_doc
    assert f"| nvml | tick cost per GPU (H200 recording, 1 GPU) | {NVML_MS_PER_GPU} ms |" in \
        (REPO / "bench" / "RESULTS.md").read_text()
    mib = 1e6 / 2**20
    for overlay in OVERLAYS:
        (c,) = one(rendered[overlay], "DaemonSet", "triscope-agent")["spec"]["template"]["spec"]["containers"]
        res = c["resources"]
        req, lim = _mebibytes(res["requests"]["memory"]), _mebibytes(res["limits"]["memory"])
        # request: the measured working set plus a margin (20-60 %)
        assert 1.2 * H200_RSS_MB * mib <= req <= 1.6 * H200_RSS_MB * mib, req
        # limit: the agent and the BCC compile child at once, with at least 30 % headroom
        assert lim >= 1.3 * (H200_RSS_MB + BCC_COMPILE_PEAK_MB) * mib, lim
        assert lim <= 512
        # CPU request: from the measured fraction, covering an 8-GPU node's NVML queries, not 10x over it
        cpu = _millicores(res["requests"]["cpu"])
        eight_gpus = (H200_CPU_PERCENT + 7 * NVML_MS_PER_GPU / 10) * 10     # % of a core -> millicores
        assert eight_gpus <= cpu <= 3 * eight_gpus, (cpu, eight_gpus)
        assert "cpu" not in res.get("limits", {}), "a CPU limit would throttle ticks"
    # the manifest's comments and the deploy guide cite the same figures and values
    ds_text = (KUSTOMIZE / "base" / "agent-daemonset.yaml").read_text()
    deploy_doc = (REPO / "docs" / "deploy.md").read_text()
    for fig in (f"{H200_RSS_MB} MB", f"{H200_CPU_PERCENT} %", f"{NVML_MS_PER_GPU} ms", f"{BCC_COMPILE_PEAK_MB} MB"):
        assert fig in ds_text and fig in deploy_doc, fig
    base = one(rendered["base"], "DaemonSet", "triscope-agent")["spec"]["template"]["spec"]["containers"][0]
    r = base["resources"]
    row = f"| `requests` | cpu {r['requests']['cpu']}, memory {r['requests']['memory']} |"
    assert row in deploy_doc, row
    assert f"| `limits` | memory {r['limits']['memory']}, no CPU limit |" in deploy_doc


def _millicores(q: str) -> float:
    return float(q[:-1]) if q.endswith("m") else float(q) * 1000


def test_nvidia_overlay_gives_nvml_through_the_runtime_not_privileged(
        rendered: dict[str, list[dict[str, Any]]]) -> None:
    spec = one(rendered["overlays/nvidia"], "DaemonSet", "triscope-agent")["spec"]["template"]["spec"]
    assert spec["runtimeClassName"] == "nvidia"
    assert spec["nodeSelector"] == {"kubernetes.io/os": "linux", "nvidia.com/gpu.present": "true"}
    env = {e["name"]: e.get("value") for e in spec["containers"][0]["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all" and env["NVIDIA_DRIVER_CAPABILITIES"] == "utility"
    assert "nvidia.com/gpu" not in str(spec["containers"][0]["resources"]), "must not take a GPU from workloads"


def test_ascend_overlay_mounts_the_driver_read_only(rendered: dict[str, list[dict[str, Any]]]) -> None:
    spec = one(rendered["overlays/ascend"], "DaemonSet", "triscope-agent")["spec"]["template"]["spec"]
    assert spec["runtimeClassName"] == "ascend"
    c = spec["containers"][0]
    assert "--npu-smi=/usr/local/sbin/npu-smi" in c["args"] and "--no-nvml" in c["args"]
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    assert mounts["/usr/local/Ascend/driver"]["readOnly"] is True
    assert mounts["/usr/local/sbin/npu-smi"]["readOnly"] is True
    assert set(c["securityContext"]["capabilities"]["add"]) == {"BPF", "PERFMON"}


def _mebibytes(q: str) -> float:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(Mi|Gi|Ki)", q)
    assert m, f"memory quantity {q!r} not in Ki/Mi/Gi"
    return float(m.group(1)) * {"Ki": 1 / 1024, "Mi": 1, "Gi": 1024}[m.group(2)]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_container_is_bounded_and_hardened(rendered: dict[str, list[dict[str, Any]]], overlay: str) -> None:
    seen = set()
    for name, spec in pod_specs(rendered[overlay]):
        seen.add(name)
        for c in spec["containers"] + spec.get("initContainers", []):
            res = c.get("resources", {})
            assert "memory" in res.get("requests", {}) and "memory" in res.get("limits", {}), name
            assert "cpu" in res.get("requests", {}), name
            sc = c.get("securityContext", {})
            assert sc.get("privileged", False) is False, f"{name} is privileged"
            assert sc.get("allowPrivilegeEscalation") is False, name
            assert sc.get("readOnlyRootFilesystem") is True, name
            assert sc.get("capabilities", {}).get("drop") == ["ALL"], name
        if name != "DaemonSet/triscope-agent":
            # everything but the agent meets Pod Security "restricted"
            assert spec["securityContext"]["runAsNonRoot"] is True, name
            assert spec["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault", name
            assert not spec.get("hostPID") and not spec.get("hostNetwork"), name
            assert not any("hostPath" in v for v in spec.get("volumes", [])), name
            assert all("add" not in c["securityContext"]["capabilities"] for c in spec["containers"]), name
    assert {"DaemonSet/triscope-agent", "Deployment/triscope-engine", "Deployment/triscope-dashboard",
            "Job/triscope-db-upgrade", "CronJob/triscope-db-maintenance"} <= seen


# ---------------------------------------------------------------------------------------------
# RBAC: only the verbs the engine's actions use

EXPECTED_RULES = {
    "triscope-engine-workloads": {("apps", "deployments"): {"get", "patch"},
                                  ("apps", "replicasets"): {"get"},   # a pod's owner: Pod -> ReplicaSet -> Deployment
                                  ("", "pods"): {"get", "list"},
                                  ("", "pods/eviction"): {"create"},
                                  ("", "configmaps"): {"get", "create", "update"},
                                  ("", "events"): {"create"}},
    "triscope-engine-nodes": {("", "nodes"): {"get", "list", "update"},
                              ("", "nodes/status"): {"patch"},          # the AcceleratorCoordinationDegraded condition
                              ("resource.k8s.io", "resourceslices"): {"list"},
                              ("resource.k8s.io", "devicetaintrules"): {"get", "list", "create", "delete"}},
    "triscope-engine-leader": {("coordination.k8s.io", "leases"): {"create", "get", "update"},
                               ("", "events"): {"create"}},
}


def _rules(role: dict[str, Any]) -> dict[tuple[str, str], set[str]]:
    out: dict[tuple[str, str], set[str]] = {}
    for r in role["rules"]:
        for g in r["apiGroups"]:
            for res in r["resources"]:
                out.setdefault((g, res), set()).update(r["verbs"])
    return out


def test_rbac_grants_exactly_the_verbs_the_actions_use(rendered: dict[str, list[dict[str, Any]]]) -> None:
    objs = rendered["overlays/nvidia"]
    roles = {r["metadata"]["name"]: r for r in by_kind(objs, "ClusterRole") + by_kind(objs, "Role")}
    assert set(roles) == set(EXPECTED_RULES)
    for name, expected in EXPECTED_RULES.items():
        assert _rules(roles[name]) == expected, name
        for r in roles[name]["rules"]:
            assert "*" not in r["verbs"] and "*" not in r["resources"] and "*" not in r["apiGroups"]
            # delete: only the engine's own DeviceTaintRules (a GPU released once healthy)
            assert "delete" not in r["verbs"] or r["resources"] == ["devicetaintrules"], r
            assert "secrets" not in r["resources"]
    # get/update on leases limited to the one Lease the engine elects with
    lease_rules = [r for r in roles["triscope-engine-leader"]["rules"] if "leases" in r["resources"]]
    assert all(r.get("resourceNames") == ["triscope-remediation"] for r in lease_rules if "create" not in r["verbs"])
    engine = one(objs, "Deployment", "triscope-engine")
    assert "lease: triscope-remediation" in _source_comment("engine-deployment.yaml")
    assert engine["metadata"]["namespace"] == "triscope"
    # bindings: nodes cluster-wide, workloads only in the namespaces listed in targets/
    crb = one(objs, "ClusterRoleBinding", "triscope-engine-nodes")
    assert crb["roleRef"]["name"] == "triscope-engine-nodes"
    workload_bindings = [b for b in by_kind(objs, "RoleBinding") if b["roleRef"]["name"] == "triscope-engine-workloads"]
    assert [b["metadata"]["namespace"] for b in workload_bindings] == ["inference"]
    for b in by_kind(objs, "RoleBinding") + by_kind(objs, "ClusterRoleBinding"):
        assert b["subjects"] == [{"kind": "ServiceAccount", "name": "triscope-engine", "namespace": "triscope"}]
    assert not any(b["roleRef"]["name"] == "triscope-engine-workloads" for b in by_kind(objs, "ClusterRoleBinding"))


def test_the_engine_names_the_shipped_grants_when_refused(rendered: dict[str, list[dict[str, Any]]]) -> None:
    """remediation/kube/rbac.py's SHIPPED_GRANTS (what a 403's log line says the manifests grant) is the rendered RBAC."""
    from triscope.remediation.kube.rbac import SHIPPED_GRANTS

    objs = rendered["overlays/nvidia"]
    roles = {r["metadata"]["name"]: r for r in by_kind(objs, "ClusterRole") + by_kind(objs, "Role")}
    rendered_grants = {(g, res, v, name) for name, role in roles.items() for r in role["rules"]
                       for g in r["apiGroups"] for res in r["resources"] for v in r["verbs"]}
    table = {(g, res, v, where.split(",")[0].split(" (")[0].split()[1])
             for (g, res), grants in SHIPPED_GRANTS.items() for verbs, where in grants for v in verbs}
    assert table == rendered_grants


def test_the_rbac_the_test_server_enforces_is_what_kustomize_renders(
        rendered: dict[str, list[dict[str, Any]]]) -> None:
    """tests/kube_rbac.py reads the YAML files itself (no kubectl needed by the remediation tests): the
    same roles, rules, bindings, subjects and namespaces as ``kubectl kustomize``."""
    from kube_rbac import RBAC_KINDS, shipped_rbac_objects

    def key(o: dict[str, Any]) -> tuple[str, str, str, str]:
        body = {k: o.get(k) for k in ("rules", "roleRef", "subjects")}
        return o["kind"], o["metadata"]["name"], o["metadata"].get("namespace", ""), json.dumps(body, sort_keys=True)

    kustomized = sorted(key(o) for root in ("base", "targets") for o in rendered[root] if o["kind"] in RBAC_KINDS)
    assert sorted(key(o) for o in shipped_rbac_objects()) == kustomized


def test_agent_service_account_has_no_api_access(rendered: dict[str, list[dict[str, Any]]]) -> None:
    """The agent reads the kubelet's pod-resources socket and /var/log/pods on its node, never the API server:
    its ServiceAccount is bound to nothing and no token is mounted."""
    for overlay in OVERLAYS:
        objs = rendered[overlay]
        sa = one(objs, "ServiceAccount", "triscope-agent")
        assert sa["automountServiceAccountToken"] is False
        spec = one(objs, "DaemonSet", "triscope-agent")["spec"]["template"]["spec"]
        assert spec["serviceAccountName"] == "triscope-agent" and spec["automountServiceAccountToken"] is False
        for b in by_kind(objs, "RoleBinding") + by_kind(objs, "ClusterRoleBinding"):
            assert not any(s.get("name") == "triscope-agent" or s.get("kind") == "Group"
                           for s in b.get("subjects", [])), b["metadata"]["name"]
        # no token by another route: no projected serviceAccountToken, no Secret but the web config's
        # (the /metrics TLS certificate and basic-auth file)
        for v in spec["volumes"]:
            sources = (v.get("projected") or {}).get("sources", [])
            assert not any("serviceAccountToken" in src for src in sources), v["name"]
            secrets = [src["secret"]["name"] for src in sources if "secret" in src]
            secrets += [v["secret"]["secretName"]] if v.get("secret") else []
            assert set(secrets) <= {"triscope-agent-web", "triscope-agent-tls"}, (v["name"], secrets)


def test_engine_is_leader_elected_and_highly_available(rendered: dict[str, list[dict[str, Any]]]) -> None:
    objs = rendered["overlays/nvidia"]
    dep = one(objs, "Deployment", "triscope-engine")
    assert dep["spec"]["replicas"] >= 2
    pdb = one(objs, "PodDisruptionBudget", "triscope-engine")
    assert pdb["spec"]["minAvailable"] == 1
    c = dep["spec"]["template"]["spec"]["containers"][0]
    assert "--dry-run" in c["args"] and "--token-file=/var/run/secrets/triscope-webhook/token" in c["args"]
    assert c["readinessProbe"]["httpGet"]["path"] == "/healthz"
    # the policy switches leader election on: the manifest documents the settings it needs
    doc = _source_comment("engine-deployment.yaml")
    assert "leader_election: {enabled: true, namespace: triscope, lease: triscope-remediation}" in doc
    assert "mode: in-cluster" in doc


def _source_comment(name: str) -> str:
    return "\n".join(line for line in (KUSTOMIZE / "base" / name).read_text().splitlines() if line.startswith("#"))


# ---------------------------------------------------------------------------------------------
# wiring: Services, Secrets, NetworkPolicy, ServiceMonitor


def test_services_select_pods_and_name_real_ports(rendered: dict[str, list[dict[str, Any]]]) -> None:
    objs = rendered["overlays/nvidia"]
    templates = {name: spec for name, spec in pod_specs(objs)}
    pods = [(o["spec"]["template"]["metadata"]["labels"], templates[f"{o['kind']}/{o['metadata']['name']}"])
            for o in objs if o["kind"] in ("Deployment", "DaemonSet")]
    for svc in by_kind(objs, "Service"):
        sel = svc["spec"]["selector"]
        matched = [spec for labels, spec in pods if all(labels.get(k) == v for k, v in sel.items())]
        assert matched, f"Service {svc['metadata']['name']} selects no pod"
        port_names = {p["name"] for spec in matched for c in spec["containers"] for p in c.get("ports", [])}
        for p in svc["spec"]["ports"]:
            assert p["targetPort"] in port_names, f"{svc['metadata']['name']}: no container port {p['targetPort']}"
    for sm in by_kind(objs, "ServiceMonitor"):
        sel = sm["spec"]["selector"]["matchLabels"]
        svcs = [s for s in by_kind(objs, "Service") if all(s["metadata"]["labels"].get(k) == v for k, v in sel.items())]
        assert svcs, f"ServiceMonitor {sm['metadata']['name']} selects no Service"
        svc_ports = {p["name"] for s in svcs for p in s["spec"]["ports"]}
        assert all(e["port"] in svc_ports for e in sm["spec"]["endpoints"])
    agent_sm = one(objs, "ServiceMonitor", "triscope-agent")
    relabel = agent_sm["spec"]["endpoints"][0]["relabelings"][0]
    assert relabel["sourceLabels"] == ["__meta_kubernetes_pod_node_name"] and relabel["targetLabel"] == "node"
    # the agent's workload labels reach Prometheus as they are, and node-wide series carry no pod
    # or namespace of the agent's own (docs/workloads.md)
    ep = agent_sm["spec"]["endpoints"][0]
    assert ep.get("honorLabels") is True
    drops = [r for r in ep["relabelings"] if r.get("action") == "labeldrop"]
    assert drops and all(re.fullmatch(drops[0]["regex"], n) for n in ("namespace", "pod", "container"))


def _secret_keys_read(spec: dict[str, Any]) -> set[tuple[str, str]]:
    """(secret, key) of every secret a pod spec reads: its containers' env, its secret and projected volumes."""
    out: set[tuple[str, str]] = set()
    for c in spec["containers"]:
        for e in c.get("env", []):
            ref = e.get("valueFrom", {}).get("secretKeyRef")
            if ref:
                out.add((ref["name"], ref["key"]))
    for v in spec.get("volumes", []):
        if "secret" in v:
            for item in v["secret"].get("items", []):
                out.add((v["secret"]["secretName"], item["key"]))
        for src in v.get("projected", {}).get("sources", []):
            for item in src.get("secret", {}).get("items", []):
                out.add((src["secret"]["name"], item["key"]))
    return out


def test_every_secret_key_the_workloads_read_is_created_by_the_example(
        rendered: dict[str, list[dict[str, Any]]]) -> None:
    secrets = {s["metadata"]["name"]: set(s["data"]) for s in by_kind(rendered["secrets-example"], "Secret")}
    assert all(s["metadata"]["namespace"] == "triscope" for s in by_kind(rendered["secrets-example"], "Secret"))
    wanted: set[tuple[str, str]] = set()
    for overlay in OVERLAYS:
        for _, spec in pod_specs(rendered[overlay]):
            wanted |= _secret_keys_read(spec)
        for sm in by_kind(rendered[overlay], "ServiceMonitor"):
            for ep in sm["spec"]["endpoints"]:
                for ref in ep.get("basicAuth", {}).values():
                    wanted.add((ref["name"], ref["key"]))
    assert ("triscope-webhook", "token") in wanted and ("triscope-db", "agent-url") in wanted
    assert ("triscope-agent-web", "web-config.yml") in wanted and ("triscope-agent-scrape", "password") in wanted
    for name, key in wanted:
        if name in MADE_ELSEWHERE:   # a private key: never in the repository (docs/deploy.md says how)
            assert name in (REPO / "docs" / "deploy.md").read_text()
            continue
        assert key in secrets.get(name, set()), f"secret {name} key {key} is read but not created"


MADE_ELSEWHERE = {"triscope-agent-tls", "triscope-dashboard-tls"}   # kubernetes.io/tls: cert-manager or kubectl create secret


def test_network_policy_denies_by_default_and_opens_only_triscope_ports(
        rendered: dict[str, list[dict[str, Any]]]) -> None:
    pols = {p["metadata"]["name"]: p for p in by_kind(rendered["base"], "NetworkPolicy")}
    deny = pols["triscope-default-deny"]["spec"]
    assert deny["podSelector"] == {} and set(deny["policyTypes"]) == {"Ingress", "Egress"}
    assert "ingress" not in deny and "egress" not in deny
    ingress_ports = {p["port"] for pol in pols.values() for rule in pol["spec"].get("ingress", [])
                     for p in rule.get("ports", [])}
    assert ingress_ports == {9095, 8050}
    for pol in pols.values():
        for rule in pol["spec"].get("ingress", []):
            assert rule.get("from"), f"{pol['metadata']['name']}: ingress open to everyone"


# ---------------------------------------------------------------------------------------------
# the commands the containers run exist, with the flags the manifests pass


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_container_commands_parse_with_the_real_cli(rendered: dict[str, list[dict[str, Any]]], overlay: str) -> None:
    from triscope.cli import build_parser

    parser = build_parser()
    checked = set()
    for name, spec in pod_specs(rendered[overlay]):
        for c in spec["containers"]:
            argv = [re.sub(r"\$\((\w+)\)", "x", a) for a in c.get("args", [])]
            if c.get("command") == ["gunicorn"]:
                module, attr = argv[-1].split(":")
                assert (REPO / (module.replace(".", "/") + ".py")).is_file(), argv[-1]
                assert f"\n{attr} = " in (REPO / (module.replace(".", "/") + ".py")).read_text()
                checked.add(f"{name}: gunicorn {argv[-1]}")
                continue
            assert argv and argv[0] == "triscope", f"{name}: unexpected command {argv[:2]}"
            try:
                ns = parser.parse_args(argv[1:])
            except SystemExit:
                pytest.fail(f"{name}: 'triscope {' '.join(argv[1:])}' is refused by the CLI")
            assert callable(getattr(ns, "func", None)), name
            checked.add(f"{name}: triscope {argv[1]}")
    assert len(checked) == 5, checked


# ---------------------------------------------------------------------------------------------
# workload attribution: the kubelet's pod-resources socket and the pod log tree, read-only, and nothing more


BASE_HOST_PATHS = {"/sys", "/sys/kernel/tracing", "/lib/modules", "/usr/src", SPOOL_DIR}
ATTRIBUTION_HOST_PATHS = {"/var/lib/kubelet/pod-resources": "/var/lib/kubelet/pod-resources",
                          "/var/log/pods": "/var/log/pods"}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_agent_reads_pod_resources_and_pod_names_read_only(rendered: dict[str, list[dict[str, Any]]],
                                                           overlay: str) -> None:
    spec = one(rendered[overlay], "DaemonSet", "triscope-agent")["spec"]["template"]["spec"]
    assert spec["hostPID"] is True, "NVML / npu-smi list root-namespace PIDs: attribution needs hostPID"
    (c,) = spec["containers"]
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    vols = {v["name"]: v for v in spec["volumes"]}
    for path, host in ATTRIBUTION_HOST_PATHS.items():
        assert path in mounts, f"{overlay}: {path} not mounted"
        assert mounts[path].get("readOnly") is True, f"{overlay}: {path} must be read-only"
        hp = vols[mounts[path]["name"]]["hostPath"]
        assert hp == {"path": host, "type": "Directory"}, hp
    # the socket's directory, not the socket: a restarted kubelet's new socket is seen
    assert not any(m["mountPath"].endswith(".sock") for m in c["volumeMounts"])
    # nothing more from the host than before, plus these two (and the Ascend driver on Ascend nodes)
    host_paths = {v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    extra = {"/usr/local/Ascend/driver", "/usr/local/sbin/npu-smi"} if overlay == "overlays/ascend" else set()
    assert host_paths == BASE_HOST_PATHS | set(ATTRIBUTION_HOST_PATHS.values()) | extra, host_paths
    # the agent gets the socket's path by default: the CLI's default is the kubelet's
    args = " ".join(c["args"])
    assert "--no-workloads" not in args
    if "--pod-resources-socket" in args:
        assert "--pod-resources-socket=/var/lib/kubelet/pod-resources/kubelet.sock" in args


# ---------------------------------------------------------------------------------------------
# the agent's port: hostNetwork, so TLS and basic auth on /metrics (docs/deploy.md)


def _agent(objs: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    spec = one(objs, "DaemonSet", "triscope-agent")["spec"]["template"]["spec"]
    return spec, next(c for c in spec["containers"] if c["name"] == "agent")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_agent_metrics_need_tls_and_basic_auth(rendered: dict[str, list[dict[str, Any]]], overlay: str,
                                               tmp_path: Path) -> None:
    from tls_support import make_certs

    from triscope.web.config import load

    objs = rendered[overlay]
    spec, agent = _agent(objs)
    assert spec["hostNetwork"] is True
    assert "--web.config.file=/etc/triscope/web/web-config.yml" in agent["args"]
    mount = next(m for m in agent["volumeMounts"] if m["mountPath"] == "/etc/triscope/web")
    assert mount["readOnly"] is True
    vol = next(v for v in spec["volumes"] if v["name"] == mount["name"])
    sources = {src["secret"]["name"]: {i["key"]: i["path"] for i in src["secret"]["items"]}
               for src in vol["projected"]["sources"]}
    assert sources == {"triscope-agent-web": {"web-config.yml": "web-config.yml"},
                       "triscope-agent-tls": {"tls.crt": "tls.crt", "tls.key": "tls.key"}}
    # no probe asks for /metrics without credentials (it would get 401)
    for probe in ("livenessProbe", "readinessProbe"):
        assert "httpGet" not in agent[probe], probe
    # the dashboard's gunicorn serves TLS from its own Secret
    dash = one(objs, "Deployment", "triscope-dashboard")["spec"]["template"]["spec"]
    args = dash["containers"][0]["args"]
    assert "--certfile=/etc/triscope/tls/tls.crt" in args and "--keyfile=/etc/triscope/tls/tls.key" in args
    assert any(v.get("secret", {}).get("secretName") == "triscope-dashboard-tls" for v in dash["volumes"])
    # Prometheus scrapes with https, the CA of the agent's certificate and the scrape password
    ep = one(objs, "ServiceMonitor", "triscope-agent")["spec"]["endpoints"][0]
    assert ep["scheme"] == "https" and ep["tlsConfig"]["serverName"] == "triscope-agent"
    assert ep["tlsConfig"]["ca"]["secret"] == {"name": "triscope-agent-tls", "key": "ca.crt"}
    assert ep["basicAuth"]["password"] == {"name": "triscope-agent-scrape", "key": "password"}
    # the example Secret's web config loads next to a certificate pair, and its hash is the scrape password's
    import base64

    secrets = {s["metadata"]["name"]: s["data"] for s in by_kind(rendered["secrets-example"], "Secret")}
    certs = make_certs(tmp_path / "certs")
    folder = tmp_path / "web"
    folder.mkdir()
    (folder / "tls.crt").write_bytes(certs.cert.read_bytes())
    (folder / "tls.key").write_bytes(certs.key.read_bytes())
    (folder / "web-config.yml").write_bytes(base64.b64decode(secrets["triscope-agent-web"]["web-config.yml"]))
    web = load(folder / "web-config.yml")
    scrape = {k: base64.b64decode(v).decode() for k, v in secrets["triscope-agent-scrape"].items()}
    header = "Basic " + base64.b64encode(f"{scrape['username']}:{scrape['password']}".encode()).decode()
    assert web.scheme == "https" and web.auth is not None and web.auth.check(header)


def test_agent_liveness_probe_passes_on_a_live_tls_server_only(rendered: dict[str, list[dict[str, Any]]],
                                                              tmp_path: Path) -> None:
    """Run the probe's own command (as the kubelet would, with HOST_IP) against the real /metrics
    server with TLS and basic auth, and against a port where nothing listens."""
    import os
    import sys

    from conftest import free_port
    from tls_support import bcrypt_hash, make_certs

    from triscope.agent.exporter import make_sources, serve
    from triscope.web.config import load

    _, agent = _agent(rendered["base"])
    cmd = agent["livenessProbe"]["exec"]["command"]
    assert cmd[0] == "python3" and "9464" in cmd[-1]
    certs = make_certs(tmp_path / "certs")
    cfg = tmp_path / "web.yml"
    cfg.write_text(f"tls_server_config:\n  cert_file: {certs.cert}\n  key_file: {certs.key}\n"
                   f"basic_auth_users:\n  prometheus: '{bcrypt_hash('pw')}'\n")
    port = free_port()
    probe = [sys.executable, *cmd[1:-1], cmd[-1].replace("9464", str(port))]
    env = {**os.environ, "HOST_IP": "127.0.0.1"}
    assert subprocess.run(probe, env=env, capture_output=True, timeout=20).returncode != 0   # nothing listens
    process, tick = make_sources()
    server, _ = serve(process, "127.0.0.1", port, tick, web=load(cfg))
    try:
        r = subprocess.run(probe, env=env, capture_output=True, text=True, timeout=20)
        assert r.returncode == 0, r.stderr
    finally:
        server.shutdown()


# ---------------------------------------------------------------------------------------------
# the HA store: a Zalando postgres-operator cluster (docs/scaling.md, high availability)


WRITER_KEYS = ("owner-url", "agent-url", "engine-url")


def _pg_cluster(rendered: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    (pg,) = by_kind(rendered[HA_PG], "postgresql")
    return pg


def _db_urls(rendered: dict[str, list[dict[str, Any]]]) -> dict[str, str]:
    import base64

    secret = one(rendered["secrets-example"], "Secret", "triscope-db")
    return {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}


def test_ha_store_is_three_instances_in_strict_synchronous_mode(rendered: dict[str, list[dict[str, Any]]]) -> None:
    pg = _pg_cluster(rendered)
    meta, spec = pg["metadata"], pg["spec"]
    assert (pg["apiVersion"], meta["namespace"]) == ("acid.zalan.do/v1", "triscope-db")
    assert meta["name"].startswith(spec["teamId"] + "-"), "the operator wants the cluster named <teamId>-..."
    assert spec["numberOfInstances"] == 3
    assert spec["postgresql"]["version"] == "15"          # what tests/ha_cluster.py runs
    patroni = spec["patroni"]
    assert patroni["synchronous_mode"] is True and patroni["synchronous_mode_strict"] is True
    assert patroni.get("synchronous_node_count", 1) == 1
    assert spec["postgresql"]["parameters"]["synchronous_commit"] == "on"
    # the roles the URLs log in as, and the database they name, are the operator's to create
    assert spec["databases"] == {"triscope": "triscope_owner"}
    assert set(spec["users"]) == {"triscope_owner", "triscope_agent", "triscope_engine", "triscope_reader"}
    res = spec["resources"]
    assert res["requests"]["cpu"] and res["requests"]["memory"] == res["limits"]["memory"]
    assert "cpu" not in res["limits"], "a CPU limit would throttle the leader, and every commit with it"
    # the operator makes the primary PodDisruptionBudget itself (postgres-<cluster>-pdb); a second one
    # over the same pods would make the eviction API refuse every eviction of them
    assert not by_kind(rendered[HA_PG], "PodDisruptionBudget")
    ns = one(rendered[HA_PG], "Namespace", "triscope-db")
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "baseline"


def test_triscope_urls_name_the_operators_services(rendered: dict[str, list[dict[str, Any]]]) -> None:
    """Writers on the leader's Service with target_session_attrs=read-write, the dashboard on the
    replicas' Service first with prefer-standby; every URL in the form the store accepts."""
    from sqlalchemy.engine import make_url

    from triscope.store.db import normalise_url

    pg = _pg_cluster(rendered)
    cluster, ns = pg["metadata"]["name"], pg["metadata"]["namespace"]
    leader, replicas = f"{cluster}.{ns}.svc:5432", f"{cluster}-repl.{ns}.svc:5432"
    urls = _db_urls(rendered)
    assert set(urls) == {*WRITER_KEYS, "dashboard-url"}
    for key, url in urls.items():
        u = make_url(normalise_url(url))
        assert u.drivername == "postgresql+psycopg", key
        assert u.username in pg["spec"]["users"], (key, u.username)
        assert u.database in pg["spec"]["databases"], (key, u.database)
        hosts = u.query.get("host") or f"{u.host}:{u.port}"
        hosts = (hosts,) if isinstance(hosts, str) else tuple(hosts)
        if key in WRITER_KEYS:
            assert hosts == (leader,), (key, hosts)
            assert u.query["target_session_attrs"] == "read-write", key
        else:
            assert hosts == (replicas, leader), hosts
            assert u.query["target_session_attrs"] == "prefer-standby"
    assert make_url(normalise_url(urls["dashboard-url"])).username == "triscope_reader"


def test_ha_store_schema_validation_rejects_mistakes(rendered: dict[str, list[dict[str, Any]]]) -> None:
    pg = _pg_cluster(rendered)
    validate_object(pg, K8S_LATEST)
    typo = yaml.safe_load(yaml.safe_dump(pg))
    typo["spec"]["patroni"]["synchronous_mode_stict"] = True
    with pytest.raises(jsonschema.ValidationError, match="synchronous_mode_stict"):
        validate_object(typo, K8S_LATEST)
    for path, value in ((("numberOfInstances",), "3"), (("postgresql", "version"), "13"),
                        (("patroni", "synchronous_mode"), "true"), (("resources", "limits", "memory"), "4 GB")):
        bad = yaml.safe_load(yaml.safe_dump(pg))
        node = bad["spec"]
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
        with pytest.raises(jsonschema.ValidationError):
            validate_object(bad, K8S_LATEST)
    missing = yaml.safe_load(yaml.safe_dump(pg))
    del missing["spec"]["volume"]
    with pytest.raises(jsonschema.ValidationError, match="volume"):
        validate_object(missing, K8S_LATEST)


def test_ha_store_docs_say_how_to_apply_it() -> None:
    scaling = (REPO / "docs" / "scaling.md").read_text()
    deploy = (REPO / "docs" / "deploy.md").read_text()
    for doc in (scaling, deploy):
        assert "kubectl apply -k deploy/kustomize/ha-postgres" in doc
    assert "postgres-triscope-pg-pdb" in scaling and "pdb_master_label_selector" in scaling
    readme = (SCHEMAS / "README.md").read_text()
    assert "postgresql.v1.schema.yaml" in readme and "postgres-operator" in readme
