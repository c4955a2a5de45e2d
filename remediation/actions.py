"""The actions: rolling restart, dependency fallback (and its revert), rescheduling, command.

Each action re-checks the live state it depends on right before acting (a paused or degraded
Deployment, a ConfigMap already in fallback, no schedulable node to move to) and, in dry-run,
does every read and none of the writes, so a dry-run decision says what would have happened.
Kubernetes is reached only through :class:`remediation.kube.KubeAdapter`.
"""

from __future__ import annotations

import logging
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from remediation import kube as k
from store import audit

log = logging.getLogger(__name__)

FALLBACK_UNTIL = "triscope.io/fallback-expires-at"
FALLBACK_RULE = "triscope.io/fallback-rule"
FALLBACK_SINCE = "triscope.io/fallback-since"
CORDON_OWNER = "triscope"  # value of the triscope.io/cordoned-by annotation (any triscope replica may undo it)


@dataclass
class ActionResult:
    outcome: str                      # acted | dry_run | failed | suppressed
    reason: str = ""
    response: dict[str, Any] = field(default_factory=dict)
    rail: str | None = None           # for suppressed: which rail (live_state)
    issued_ts: float | None = None


@dataclass
class ActionContext:
    rule_name: str
    action: str
    params: dict[str, Any]
    target: dict[str, str]
    target_key: str
    dry_run: bool
    kube: k.KubeAdapter | None
    store: Any
    engine_id: str
    trigger_key: str = ""
    episode: str = ""
    on_issued: Callable[[float], None] = lambda ts: None
    stop: threading.Event = field(default_factory=threading.Event)

    def need_kube(self) -> k.KubeAdapter:
        if self.kube is None:
            raise k.NotConfigured("no Kubernetes API configured (settings.kubernetes.mode is none)")
        return self.kube


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# rolling restart ---------------------------------------------------------------------------------
def rolling_restart(ctx: ActionContext) -> ActionResult:
    ns, name = ctx.target["namespace"], ctx.target["deployment"]
    if ctx.dry_run and ctx.kube is None:
        return ActionResult("dry_run", f"would restart deployment {ns}/{name} (live state not checked: no "
                            "Kubernetes API configured)", {"would": "rollout restart", "checked": False})
    kube = ctx.need_kube()
    if ctx.dry_run:
        dep = kube.get_deployment(ns, name)
        h = kube.deployment_health(dep)
        if h["paused"]:
            return ActionResult("suppressed", f"deployment {ns}/{name} is paused", {"health": h}, rail="live_state")
        if h["available"] < h["desired"]:
            return ActionResult("suppressed", f"deployment {ns}/{name} already degraded "
                                f"({h['available']}/{h['desired']} available)", {"health": h}, rail="live_state")
        return ActionResult("dry_run", f"would restart deployment {ns}/{name}", {"would": "rollout restart", "health": h})
    try:
        out = kube.restart_deployment(ns, name)
    except (k.PausedDeployment, k.DegradedDeployment) as e:
        return ActionResult("suppressed", str(e), e.answer(), rail="live_state")
    issued = time.time()
    ctx.on_issued(issued)
    resp: dict[str, Any] = {"patch": out}
    if not ctx.params.get("follow", True):
        return ActionResult("acted", f"restarted deployment {ns}/{name}", resp, issued_ts=issued)
    try:
        resp["rollout"] = kube.rollout_status(ns, name, generation=out.get("generation"),
                                              timeout=float(ctx.params.get("timeout", 300.0)), stop=ctx.stop.is_set)
    except k.RolloutTimeout as e:
        resp["rollout"] = e.body
        return ActionResult("failed", str(e), resp, issued_ts=issued)
    return ActionResult("acted", f"restarted deployment {ns}/{name}; rollout complete", resp, issued_ts=issued)


# dependency fallback -----------------------------------------------------------------------------
def dependency_fallback(ctx: ActionContext) -> ActionResult:
    ns = ctx.target["namespace"]
    p = ctx.params
    cm, key, value = p["configmap"], p["key"], p["value"]
    now = time.time()
    expires = now + float(p["ttl"])
    existing = audit.active_fallbacks(ctx.store, ctx.target_key)
    if existing:
        return ActionResult("suppressed", f"fallback {ns}/{cm}:{key} already active since {_iso(existing[0].switched_at)}",
                            {"fallback_id": existing[0].id}, rail="live_state")
    previous: str | None = None
    resp: dict[str, Any] = {"configmap": f"{ns}/{cm}", "key": key, "value": value, "expires_at": _iso(expires)}
    if ctx.kube is not None:
        try:
            cur = ctx.kube.get_configmap(ns, cm)
            previous = (cur.get("data") or {}).get(key)
        except k.NotFound:
            previous = None
        if previous == value:
            return ActionResult("suppressed", f"{ns}/{cm}:{key} is already {value!r} (set by someone else)",
                                resp, rail="live_state")
    elif not ctx.dry_run:
        ctx.need_kube()
    if ctx.dry_run:
        outcome, reason = "dry_run", f"would set {ns}/{cm}:{key}={value!r} for {p['ttl']:g}s"
    else:
        assert ctx.kube is not None
        out = ctx.kube.set_configmap_keys(ns, cm, {key: value}, {FALLBACK_UNTIL: _iso(expires),
                                                                 FALLBACK_RULE: ctx.rule_name,
                                                                 FALLBACK_SINCE: _iso(now)})
        previous = out["previous"].get(key)
        ctx.on_issued(time.time())
        resp["resourceVersion"] = out["resourceVersion"]
        outcome, reason = "acted", f"set {ns}/{cm}:{key}={value!r} until {_iso(expires)}"
    resp["previous"] = previous
    fid = audit.add_fallback(ctx.store, rule=ctx.rule_name, target_key=ctx.target_key, namespace=ns, configmap=cm,
                             key=key, value=value, previous_value=previous, trigger_key=ctx.episode or ctx.trigger_key,
                             dry_run=ctx.dry_run, switched_at=now, expires_at=expires, hold_s=float(p["hold"]),
                             clear_since=None, state="active", reverted_at=None, revert_reason="")
    resp["fallback_id"] = fid
    return ActionResult(outcome, reason, resp, issued_ts=time.time())


def revert_fallback(fb: audit.FallbackRow, kube: k.KubeAdapter | None, reason: str) -> ActionResult:
    """Put the dependency back: restore the key's previous value (or remove it) and the annotations."""
    resp: dict[str, Any] = {"configmap": f"{fb.namespace}/{fb.configmap}", "key": fb.key,
                            "restored": fb.previous_value, "fallback_id": fb.id, "why": reason}
    if fb.dry_run:
        return ActionResult("dry_run", f"would revert {fb.namespace}/{fb.configmap}:{fb.key} ({reason})", resp)
    if kube is None:
        raise k.NotConfigured("no Kubernetes API configured: cannot revert the fallback")
    try:
        cur = kube.get_configmap(fb.namespace, fb.configmap)
    except k.NotFound:
        return ActionResult("acted", f"{fb.namespace}/{fb.configmap} is gone: nothing to revert", resp)
    if (cur.get("data") or {}).get(fb.key) != fb.value:
        resp["found"] = (cur.get("data") or {}).get(fb.key)
        return ActionResult("acted", f"{fb.namespace}/{fb.configmap}:{fb.key} was changed by someone else: left as is",
                            resp)
    out = kube.set_configmap_keys(fb.namespace, fb.configmap, {fb.key: fb.previous_value},
                                  {FALLBACK_UNTIL: None, FALLBACK_RULE: None, FALLBACK_SINCE: None}, create=False)
    resp["resourceVersion"] = out["resourceVersion"]
    return ActionResult("acted", f"reverted {fb.namespace}/{fb.configmap}:{fb.key} ({reason})", resp,
                        issued_ts=time.time())


# rescheduling ------------------------------------------------------------------------------------
def _mean(xs: list[float]) -> float | None:
    xs = [x for x in xs if x == x]
    return sum(xs) / len(xs) if xs else None


def node_cost(store: Any, node: str, weights: dict[str, float], now: float | None = None) -> dict[str, Any]:
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
    link = None
    cap = sum(latest.get("triscope_pcie_link_capacity_bytes_per_second", []))
    if cap > 0:
        rates = 0.0
        for m in ("triscope_gpu_pcie_rx_bytes_total", "triscope_gpu_pcie_tx_bytes_total"):
            for sd in store.query(m, node=node, start=now - 120, end=now, max_points=60):
                v = _mean(sd.values)
                rates += v or 0.0
        link = min(1.0, rates / cap)
    else:
        rt = store.query("triscope_tcp_retransmits_total", node=node, start=now - 120, end=now, max_points=60)
        vals = [v for sd in rt for v in sd.values]
        if vals:
            link = min(1.0, (_mean(vals) or 0.0) / 100.0)
    storage = _mean(latest.get("pressure:io:some", []))
    parts = {"compute": compute, "link": link, "storage": storage}
    missing = [kk for kk, v in parts.items() if v is None]
    vals2 = {kk: (0.5 if v is None else max(0.0, min(1.0, float(v)))) for kk, v in parts.items()}
    wsum = sum(weights.values()) or 1.0
    cost = sum(weights[kk] * vals2[kk] for kk in vals2) / wsum
    return {"node": node, "cost": round(cost, 4), "parts": {kk: round(v, 4) for kk, v in vals2.items()},
            "missing": missing}


def _node_ready(node: dict[str, Any]) -> bool:
    for c in node.get("status", {}).get("conditions", []) or []:
        if c.get("type") == "Ready":
            return c.get("status") == "True"
    return True


def reschedule(ctx: ActionContext) -> ActionResult:
    bad, ns, dep_name = ctx.target["node"], ctx.target["namespace"], ctx.target["deployment"]
    p = ctx.params
    if ctx.dry_run and ctx.kube is None:
        return ActionResult("dry_run", f"would move {ns}/{dep_name} off {bad} (live state not checked: no Kubernetes "
                            "API configured)", {"checked": False})
    kube = ctx.need_kube()
    node = kube.get_node(bad)
    dep = kube.get_deployment(ns, dep_name)
    sel = dep.get("spec", {}).get("selector", {}).get("matchLabels", {}) or {}
    selector = ",".join(f"{a}={b}" for a, b in sorted(sel.items()))
    pods = [pp["metadata"]["name"] for pp in kube.list_pods(ns, label_selector=selector, node=bad)]
    ann = node.get("metadata", {}).get("annotations") or {}
    if not pods and (node.get("spec", {}).get("unschedulable")):
        return ActionResult("suppressed", f"no pods of {ns}/{dep_name} on {bad} and it is already cordoned",
                            {"node": bad}, rail="live_state")
    candidates = []
    for n in kube.list_nodes():
        name = n["metadata"]["name"]
        if name == bad or n.get("spec", {}).get("unschedulable") or not _node_ready(n):
            continue
        candidates.append(node_cost(ctx.store, name, p["weights"]))
    candidates.sort(key=lambda c: (c["cost"], c["node"]))
    resp: dict[str, Any] = {"node": bad, "pods": pods, "candidates": candidates,
                            "chosen": candidates[0]["node"] if candidates else None}
    if not candidates:
        return ActionResult("failed", f"no schedulable candidate node to move {ns}/{dep_name} to", resp)
    best = candidates[0]["node"]
    if ctx.dry_run:
        return ActionResult("dry_run", f"would cordon {bad}, prefer {best} (cost {candidates[0]['cost']}) and evict "
                            f"{len(pods)} pod(s) of {ns}/{dep_name}", resp)
    if p.get("cordon", True):
        resp["cordon"] = kube.cordon(bad, by=CORDON_OWNER)
        if resp["cordon"]["result"] == "cordoned_by_other":
            resp["cordon"]["note"] = f"already cordoned by {ann.get(k.CORDONED_BY) or 'someone else'}; left as is"
    ctx.on_issued(time.time())
    resp["affinity"] = kube.set_preferred_node(ns, dep_name, best, weight=int(p.get("affinity_weight", 100)))
    evictions = []
    deadline = time.monotonic() + float(p.get("eviction_timeout", 120.0))
    for pod in pods:
        left = max(0.5, deadline - time.monotonic())
        try:
            evictions.append(kube.evict(ns, pod, timeout=left))
        except k.EvictionBlocked as e:
            evictions.append({"pod": pod, "evicted": False, "error": str(e)})
            resp["evictions"] = evictions
            return ActionResult("failed", str(e), resp, issued_ts=time.time())
    resp["evictions"] = evictions
    return ActionResult("acted", f"cordoned {bad}, preferred {best}, evicted {len(pods)} pod(s) of {ns}/{dep_name}",
                        resp, issued_ts=time.time())


# command -----------------------------------------------------------------------------------------
def command(ctx: ActionContext) -> ActionResult:
    argv = list(ctx.params["argv"])
    timeout = float(ctx.params.get("timeout", 30.0))
    if ctx.dry_run:
        return ActionResult("dry_run", f"would run {argv!r} (timeout {timeout:g}s)", {"argv": argv})
    issued = time.time()
    ctx.on_issued(issued)
    try:
        proc = subprocess.run(argv, shell=False, stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout,
                              check=False)
    except subprocess.TimeoutExpired as e:
        return ActionResult("failed", f"{argv[0]} timed out after {timeout:g}s",
                            {"argv": argv, "timeout": timeout, "stdout": (e.stdout or b"")[-2000:].decode(errors="replace")},
                            issued_ts=issued)
    except OSError as e:
        return ActionResult("failed", f"cannot run {argv[0]}: {e}", {"argv": argv}, issued_ts=issued)
    resp = {"argv": argv, "rc": proc.returncode, "stdout": proc.stdout[-2000:].decode(errors="replace"),
            "stderr": proc.stderr[-2000:].decode(errors="replace")}
    if proc.returncode != 0:
        return ActionResult("failed", f"{argv[0]} exited with {proc.returncode}", resp, issued_ts=issued)
    return ActionResult("acted", f"ran {argv[0]} (exit 0)", resp, issued_ts=issued)


RUNNERS: dict[str, Callable[[ActionContext], ActionResult]] = {
    "rolling_restart": rolling_restart, "dependency_fallback": dependency_fallback,
    "reschedule": reschedule, "command": command,
}
