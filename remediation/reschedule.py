"""``reschedule``: move a workload off a node: cordon it, steer the Deployment to the cheapest node
that may take its pods (``node_cost``: compute, link and storage load, weighted), and evict its pods
there through the Eviction API (PodDisruptionBudgets respected)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, TypedDict

from triscope.remediation.actions import (
    CORDON_OWNER,
    ActionContext,
    ActionResult,
    P,
    checked_node,
    evict_all,
    node_allowed,
)
from triscope.remediation.kube.adapter import KubeAdapter
from triscope.remediation.kube.views import Deployment, Node
from triscope.remediation.params import RescheduleParams, RescheduleWeights

if TYPE_CHECKING:
    from triscope.store.reader import StoreReader


class NodeCost(TypedDict):
    node: str
    cost: float
    parts: dict[str, float]
    missing: list[str]


def _mean(xs: list[float]) -> float | None:
    xs = [x for x in xs if x == x]
    return sum(xs) / len(xs) if xs else None


def _link_load(store: StoreReader, node: str, capacity: float, now: float) -> float | None:
    """PCIe bytes/s over the link capacity (else TCP retransmit pressure); None without data."""
    if capacity > 0:
        rates = 0.0
        for m in ("triscope_gpu_pcie_rx_bytes_total", "triscope_gpu_pcie_tx_bytes_total"):
            for sd in store.query(m, node=node, start=now - 120, end=now, max_points=60):
                rates += _mean(sd.values) or 0.0
        return min(1.0, rates / capacity)
    rt = store.query("triscope_tcp_retransmits_total", node=node, start=now - 120, end=now, max_points=60)
    vals = [v for sd in rt for v in sd.values]
    return min(1.0, (_mean(vals) or 0.0) / 100.0) if vals else None


def node_cost(store: StoreReader, node: str, weights: RescheduleWeights, now: float | None = None) -> NodeCost:
    """Joint cost of a candidate node: compute load, link load and storage I/O (0..1 each, weighted).

    compute: mean accelerator utilisation (GPM SM activity, else NVML, else NPU AICore, else CPU busy);
    link: PCIe bytes/s over the link capacity (else TCP retransmit pressure); storage: I/O pressure
    (PSI ``some`` avg10).  A part with no data counts as 0.5 and is named in ``missing``.
    """
    now = time.time() if now is None else now
    latest: dict[str, list[float]] = {}
    for lv in store.latest(node, prefix="triscope_", since=now - 600):
        latest.setdefault(lv.info.metric, []).append(lv.value)
        if lv.info.metric == "triscope_pressure_ratio":
            latest.setdefault(f"pressure:{lv.info.labels.get('resource')}:{lv.info.labels.get('kind')}", []).append(lv.value)
    compute = None
    for m in ("triscope_gpu_sm_active_ratio", "triscope_gpu_utilization_ratio", "triscope_npu_aicore_utilization_ratio",
              "triscope_cpu_busy_ratio"):
        compute = _mean(latest.get(m, []))
        if compute is not None:
            break
    link = _link_load(store, node, sum(latest.get("triscope_pcie_link_capacity_bytes_per_second", [])), now)
    parts = {"compute": compute, "link": link, "storage": _mean(latest.get("pressure:io:some", []))}
    missing = [kk for kk, v in parts.items() if v is None]
    vals = {kk: (0.5 if v is None else max(0.0, min(1.0, float(v)))) for kk, v in parts.items()}
    w = {"compute": weights.compute, "link": weights.link, "storage": weights.storage}
    cost = sum(w[kk] * vals[kk] for kk in vals) / (sum(w.values()) or 1.0)
    return {"node": node, "cost": round(cost, 4), "parts": {kk: round(v, 4) for kk, v in vals.items()},
            "missing": missing}


def _candidate_refusal(ctx: ActionContext[P], node: Node, dep: Deployment) -> str:
    """Why ``node`` cannot take the workload's pods ('' when it can)."""
    if node.unschedulable:
        return "cordoned"
    if not node.ready:
        return "not Ready"
    if node.control_plane:
        return "control plane"
    untolerated = node.untolerated(dep.tolerations)
    if untolerated:
        return "taints not tolerated: " + ", ".join(untolerated)
    if any(node.labels.get(a) != b for a, b in dep.node_selector.items()):
        return "does not match the pod template's nodeSelector"
    s = ctx.settings
    if s is not None and not (s.node_name_allowed(node.name) and s.node_labels_allowed(node.labels)):
        return "outside the node allow-list"
    return ""


def _candidates(ctx: ActionContext[RescheduleParams], kube: KubeAdapter, bad: str,
                dep: Deployment) -> tuple[list[NodeCost], dict[str, str]]:
    """The nodes the workload may move to, cheapest first, and why each other one may not (50 at most)."""
    candidates: list[NodeCost] = []
    excluded: dict[str, str] = {}
    for n in kube.list_nodes():
        if n.name == bad:
            continue
        why = _candidate_refusal(ctx, n, dep)
        if why:
            if len(excluded) < 50:
                excluded[n.name] = why
            continue
        candidates.append(node_cost(ctx.store, n.name, ctx.params.weights))
    candidates.sort(key=lambda c: (c["cost"], c["node"]))
    return candidates, excluded


def reschedule(ctx: ActionContext[RescheduleParams]) -> ActionResult:
    bad, ns, dep_name = ctx.names["node"], ctx.names["namespace"], ctx.names["deployment"]
    outside = node_allowed(ctx, bad)
    if outside is not None:
        return outside
    if ctx.dry_run and ctx.kube is None:
        return ActionResult("dry_run", f"would move {ns}/{dep_name} off {bad} (live state not checked: no Kubernetes "
                            "API configured)", {"checked": False})
    kube = ctx.need_kube()
    node = checked_node(ctx, kube, bad)
    if isinstance(node, ActionResult):
        return node
    dep = kube.get_deployment(ns, dep_name)
    selector = ",".join(f"{a}={b}" for a, b in sorted(dep.match_labels.items()))
    pods = kube.pod_names(ns, label_selector=selector, node=bad) if dep.match_labels else []
    if not pods:
        if ctx.resumed and node.unschedulable and node.cordoned_by == CORDON_OWNER:
            return ActionResult("acted", f"{bad} is cordoned by triscope and no pods of {ns}/{dep_name} are left on it: "
                                "done before the engine restarted", {"node": bad, "resumed": True},
                                issued_ts=time.time())
        return ActionResult("suppressed", f"no pods of {ns}/{dep_name} run on node {bad}: not cordoning or draining a "
                            "node the workload does not run on", {"node": bad, "selector": selector}, rail="node")
    candidates, excluded = _candidates(ctx, kube, bad, dep)
    resp: dict[str, object] = {"node": bad, "pods": pods, "candidates": candidates, "excluded": excluded,
                               "chosen": candidates[0]["node"] if candidates else None}
    if not candidates:
        return ActionResult("failed", f"no schedulable candidate node to move {ns}/{dep_name} to", resp)
    best = candidates[0]["node"]
    if ctx.dry_run:
        return ActionResult("dry_run", f"would cordon {bad}, prefer {best} (cost {candidates[0]['cost']}) and evict "
                            f"{len(pods)} pod(s) of {ns}/{dep_name}", resp)
    if ctx.params.cordon:
        cordon = kube.cordon(bad, by=CORDON_OWNER)
        if cordon["result"] == "cordoned_by_other":
            cordon["note"] = f"already cordoned by {node.cordoned_by or 'someone else'}; left as is"
        resp["cordon"] = cordon
    ctx.on_issued(time.time())
    resp["affinity"] = kube.set_preferred_node(ns, dep_name, best, weight=ctx.params.affinity_weight)
    blocked = evict_all(kube, [(ns, pod) for pod in pods], ctx.params.eviction_timeout, resp)
    if blocked is not None:
        return ActionResult("failed", str(blocked), resp, issued_ts=time.time())
    return ActionResult("acted", f"cordoned {bad}, preferred {best}, evicted {len(pods)} pod(s) of {ns}/{dep_name}",
                        resp, issued_ts=time.time())
