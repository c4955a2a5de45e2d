"""What the shipped RBAC grants the engine (``deploy/kustomize``): the table a refused call (403) is
explained from (``errors.forbidden_explained``)."""

from __future__ import annotations

RBAC_FILE = "deploy/kustomize/base/engine-rbac.yaml"
WORKLOADS = "ClusterRole triscope-engine-workloads, bound per namespace by deploy/kustomize/targets"
NODES = "ClusterRole triscope-engine-nodes, bound cluster-wide"
LEADER = "Role triscope-engine-leader in the engine's namespace"
# (apiGroup, resource) -> [(verbs, where)]: the engine's RBAC as shipped (tests/integration/test_deploy_manifests.py
# checks this table against the rendered manifests, so it cannot drift from them)
SHIPPED_GRANTS: dict[tuple[str, str], list[tuple[tuple[str, ...], str]]] = {
    ("apps", "deployments"): [(("get", "patch"), WORKLOADS)],
    ("apps", "replicasets"): [(("get",), WORKLOADS)],
    ("", "pods"): [(("get", "list"), WORKLOADS)],
    ("", "pods/eviction"): [(("create",), WORKLOADS)],
    ("", "configmaps"): [(("get", "create", "update"), WORKLOADS)],
    ("", "events"): [(("create",), WORKLOADS), (("create",), LEADER)],
    ("", "nodes"): [(("get", "list", "update"), NODES)],
    ("", "nodes/status"): [(("patch",), NODES)],
    ("resource.k8s.io", "resourceslices"): [(("list",), NODES)],
    ("resource.k8s.io", "devicetaintrules"): [(("get", "list", "create", "delete"), NODES)],
    ("coordination.k8s.io", "leases"): [(("create",), LEADER),
                                        (("get", "update"), LEADER + " (the Lease triscope-remediation only)")],
}
