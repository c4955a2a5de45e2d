"""The actions: rolling restart, dependency fallback (and its revert), rescheduling, command.

Each action re-checks the live state it depends on right before acting (a paused or degraded
Deployment, a ConfigMap already in fallback, no schedulable node to move to) and, in dry-run,
does every read and none of the writes, so a dry-run decision says what would have happened.
Kubernetes is reached only through :class:`triscope.remediation.kube.KubeAdapter`.

An engine killed while an action runs re-runs it when it starts again (the decision is left
``in_progress``), so every Kubernetes action is idempotent per decision: the restart writes the
``restartedAt`` value fixed when the decision was taken (already there: nothing is written), the
fallback recognises its own write by the decision id it annotates the ConfigMap with (and the
previous value it recorded there), cordon and eviction are idempotent by nature.  The ``command``
action is not re-run (see ``triscope.remediation.engine``).

Off Kubernetes, ``dependency_fallback`` with ``params.file`` writes a per-workload knobs file
instead of a ConfigMap key: ``triscope.remediation.filefallback`` (switch and revert).
"""

from __future__ import annotations

import json
import logging
import re
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import AfterValidator, BeforeValidator, Field, model_validator

from triscope.core.configfile import ConfigModel, problem, show
from triscope.core.durations import Duration
from triscope.remediation import kube as k
from triscope.remediation import metrics
from triscope.store import audit

if TYPE_CHECKING:
    from triscope.store.api import Store
    from triscope.store.reader import StoreReader

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------------- parameters
# Each action's ``params`` as the policy writes them (``triscope.remediation.policy`` validates a
# rule's params with its action's model; the engine hands the actions ``model_dump()``, a dict).
_KUBE_NAME = re.compile(r"^[a-z0-9]([a-z0-9_.-]{0,126}[a-z0-9])?$")
_CONFIGMAP_KEY = re.compile(r"^[-._a-zA-Z0-9]{1,253}$")


def _kube_name(value: str) -> str:
    if not _KUBE_NAME.match(value):
        raise ValueError(f"{show(value)} is not a valid Kubernetes name")
    return value


KubeName = Annotated[str, AfterValidator(_kube_name)]
"""A Kubernetes object name as a policy writes it (namespace, Deployment, ConfigMap, node)."""

PER_WORKLOAD = "{deployment}"
"""In a ConfigMap fallback's ``configmap`` or ``key``: the name of the workload the trigger names."""


def per_workload(template: str, target: dict[str, str]) -> str:
    """``template`` with ``{deployment}`` replaced by the target's deployment."""
    return template.replace(PER_WORKLOAD, target.get("deployment", ""))


def _kube_name_template(value: str) -> str:
    if not _KUBE_NAME.match(value.replace(PER_WORKLOAD, "x")):
        raise ValueError(f"{show(value)} is not a valid Kubernetes name (with {PER_WORKLOAD} for the workload's)")
    return value
"""A Kubernetes object name as a policy writes it (namespace, Deployment, ConfigMap, node)."""


def _configmap_key(value: str) -> str:
    if not _CONFIGMAP_KEY.match(value.replace(PER_WORKLOAD, "x")):
        raise ValueError(f"{show(value)} is not a valid ConfigMap key")
    return value


def _text(value: Any) -> Any:
    """A number written where text belongs (``value: 1``) as text; anything else as it is."""
    return str(value) if isinstance(value, int | float) and not isinstance(value, bool) else value


def _positive(seconds: float) -> float:
    if seconds <= 0:
        raise ValueError("must be longer than 0s")
    return seconds


def _argv(value: Any) -> list[str]:
    if not isinstance(value, list) or not value or not all(
            isinstance(a, str | int | float) and not isinstance(a, bool) for a in value):
        raise ValueError("must be a non-empty list of arguments (fixed in the policy, no shell), "
                         f"not {show(value)}")
    return [str(a) for a in value]


class RollingRestartParams(ConfigModel):
    """``rolling_restart``: follow the rollout (``follow``) for at most ``timeout``."""

    timeout: Duration = 300.0
    follow: bool = True


class DependencyFallbackParams(ConfigModel):
    """``dependency_fallback``: set ``key`` of ConfigMap ``configmap`` to ``value``; revert after
    ``hold`` clear, or ``ttl`` at the latest."""

    configmap: Annotated[str, AfterValidator(_kube_name_template)]
    key: Annotated[str, AfterValidator(_configmap_key)]
    value: Annotated[str, BeforeValidator(_text)] = "fallback"
    ttl: Annotated[Duration, AfterValidator(_positive)] = 1800.0
    hold: Duration = 300.0


class RescheduleWeights(ConfigModel):
    """Weights of the node cost's parts (``node_cost``)."""

    compute: Annotated[float, Field(ge=0.0, le=1000.0)] = 1.0
    link: Annotated[float, Field(ge=0.0, le=1000.0)] = 1.0
    storage: Annotated[float, Field(ge=0.0, le=1000.0)] = 1.0

    @model_validator(mode="after")
    def _one_positive(self) -> RescheduleWeights:
        if not (self.compute or self.link or self.storage):
            raise problem("at least one weight must be positive")
        return self


class RescheduleParams(ConfigModel):
    """``reschedule``: candidate choice (``weights``, ``affinity_weight``), eviction, cordon."""

    weights: RescheduleWeights = RescheduleWeights()
    eviction_timeout: Duration = 120.0
    affinity_weight: Annotated[int, Field(ge=1, le=100)] = 100
    cordon: bool = True


class IsolateAcceleratorParams(ConfigModel):
    """``isolate_accelerator``: take the one accelerator the trigger names out of service — evict the
    pods that hold it (``evict``, PodDisruptionBudgets respected for ``eviction_timeout``) and mark it
    tainted on its node; untainted once its verdict has been healthy for ``untaint_after``."""

    eviction_timeout: Duration = 120.0
    untaint_after: Annotated[Duration, AfterValidator(_positive)] = 600.0
    evict: bool = True


class CommandParams(ConfigModel):
    """``command``: the argv fixed in the policy (no shell), killed after ``timeout``."""

    argv: Annotated[list[str], BeforeValidator(_argv)]
    timeout: Duration = 30.0


ACTION_PARAMS: dict[str, type[ConfigModel]] = {
    "rolling_restart": RollingRestartParams,
    "dependency_fallback": DependencyFallbackParams,
    "reschedule": RescheduleParams,
    "isolate_accelerator": IsolateAcceleratorParams,
    "command": CommandParams,
}
"""Each action's params model."""

FALLBACK_UNTIL = "triscope.io/fallback-expires-at"
FALLBACK_RULE = "triscope.io/fallback-rule"
FALLBACK_SINCE = "triscope.io/fallback-since"
FALLBACK_DECISION = "triscope.io/fallback-decision"   # the audit id of the decision that switched it
FALLBACK_PREVIOUS = "triscope.io/fallback-previous"   # JSON of the key's value before the switch (null: absent)
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
    store: Store
    engine_id: str
    trigger_key: str = ""
    episode: str = ""
    on_issued: Callable[[float], None] = lambda ts: None
    stop: threading.Event = field(default_factory=threading.Event)
    decision_id: int | None = None    # the audit row of the decision this action carries out
    decided_ts: float | None = None   # when it was decided: the restart stamp and fallback times derive from it
    resumed: bool = False             # re-run after the engine stopped while it was in progress
    settings: Any = None              # the policy's Settings (node allow-list)

    def need_kube(self) -> k.KubeAdapter:
        if self.kube is None:
            raise k.NotConfigured("no Kubernetes API configured (settings.kubernetes.mode is none)")
        return self.kube


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def restart_stamp(decided_ts: float) -> str:
    """The ``restartedAt`` value of a decision (RFC 3339, microseconds): fixed when it is decided."""
    return datetime.fromtimestamp(decided_ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _decided(ctx: ActionContext) -> float:
    return ctx.decided_ts if ctx.decided_ts is not None else time.time()


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
    stamp = str(ctx.params.get("restartedAt") or restart_stamp(_decided(ctx)))
    try:
        out = kube.restart_deployment(ns, name, stamp=stamp)
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
    if ctx.params.get("file"):
        from triscope.remediation import filefallback  # it builds on this module's types

        return filefallback.switch(ctx)
    ns = ctx.target["namespace"]
    p = ctx.params
    cm, key, value = per_workload(p["configmap"], ctx.target), per_workload(p["key"], ctx.target), p["value"]
    now = _decided(ctx)
    expires = now + float(p["ttl"])
    existing = audit.active_fallbacks(ctx.store, ctx.target_key)
    if not ctx.dry_run:   # a dry-run fallback changed nothing: it does not stand in a live one's way
        existing = [fb for fb in existing if not fb.dry_run]
    if existing:
        fb = existing[0]
        if ctx.resumed and fb.rule == ctx.rule_name and abs(fb.switched_at - now) < 1e-3:
            return ActionResult("acted", f"{ns}/{cm}:{key}={value!r} was set by this decision before the engine "
                                "restarted", {"fallback_id": fb.id, "resumed": True}, issued_ts=time.time())
        return ActionResult("suppressed", f"fallback {ns}/{cm}:{key} already active since {_iso(fb.switched_at)}",
                            {"fallback_id": fb.id}, rail="live_state")
    previous: str | None = None
    ours = False
    resp: dict[str, Any] = {"configmap": f"{ns}/{cm}", "key": key, "value": value, "expires_at": _iso(expires)}
    if ctx.kube is not None:
        ann: dict[str, str] = {}
        try:
            cur = ctx.kube.get_configmap(ns, cm)
            previous = (cur.get("data") or {}).get(key)
            ann = (cur.get("metadata") or {}).get("annotations") or {}
        except k.NotFound:
            previous = None
        if previous == value:
            if ctx.decision_id is not None and ann.get(FALLBACK_DECISION) == str(ctx.decision_id):
                # this decision's own write, from before the engine restarted: what it replaced is annotated
                ours = True
                try:
                    previous = json.loads(ann.get(FALLBACK_PREVIOUS) or "{}").get(key)
                except (ValueError, AttributeError):
                    previous = None
            else:
                return ActionResult("suppressed", f"{ns}/{cm}:{key} is already {value!r} (set by someone else)",
                                    resp, rail="live_state")
    elif not ctx.dry_run:
        ctx.need_kube()
    if ctx.dry_run:
        outcome, reason = "dry_run", f"would set {ns}/{cm}:{key}={value!r} for {p['ttl']:g}s"
    elif ours:
        ctx.on_issued(time.time())
        resp["resumed"] = True
        outcome, reason = "acted", f"set {ns}/{cm}:{key}={value!r} until {_iso(expires)} (before the engine restarted)"
    else:
        assert ctx.kube is not None
        annotations: dict[str, str | None] = {FALLBACK_UNTIL: _iso(expires), FALLBACK_RULE: ctx.rule_name,
                                              FALLBACK_SINCE: _iso(now)}
        if ctx.decision_id is not None:
            annotations[FALLBACK_DECISION] = str(ctx.decision_id)
        out = ctx.kube.set_configmap_keys(ns, cm, {key: value}, annotations, previous_annotation=FALLBACK_PREVIOUS)
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
                                  {FALLBACK_UNTIL: None, FALLBACK_RULE: None, FALLBACK_SINCE: None,
                                   FALLBACK_DECISION: None, FALLBACK_PREVIOUS: None}, create=False)
    resp["resourceVersion"] = out["resourceVersion"]
    return ActionResult("acted", f"reverted {fb.namespace}/{fb.configmap}:{fb.key} ({reason})", resp,
                        issued_ts=time.time())


def revert_due_fallbacks(store: Store, kube: k.KubeAdapter | None, now: float, engine_id: str,
                         event_rules: set[str]) -> int:
    """Revert each active fallback whose trigger has been clear for its hold period, or whose TTL ran out.

    Every revert is audited; a Kubernetes Event on the ConfigMap is posted for fallbacks of
    ``event_rules``.  Returns how many were reverted.
    """
    from triscope.remediation import filefallback  # it builds on this module's types

    done = 0
    for fb in audit.active_fallbacks(store):
        on_file = filefallback.is_file_row(fb)
        if now >= fb.expires_at:
            why = f"time-to-live ran out ({fb.expires_at - fb.switched_at:g}s)"
        elif fb.clear_since is not None and now - fb.clear_since >= fb.hold_s:
            why = f"trigger clear for {now - fb.clear_since:.0f}s (hold {fb.hold_s:g}s)"
        else:
            continue
        what = f"knobs file {fb.configmap}" if on_file else f"configmap {fb.namespace}/{fb.configmap} key {fb.key}"
        try:
            res = filefallback.revert(fb, why) if on_file else revert_fallback(fb, kube, why)
        except k.KubeError as e:
            res = ActionResult("failed", f"revert of {fb.namespace}/{fb.configmap}:{fb.key} failed: {e}",
                               {"error": e.answer(), "fallback_id": fb.id})
        except OSError as e:
            res = ActionResult("failed", f"revert of {fb.configmap} failed: {e.strerror or e}",
                               {"error": str(e), "fallback_id": fb.id})
        if res.outcome in ("acted", "dry_run"):
            audit.update_fallback(store, fb.id, state="reverted", reverted_at=now, revert_reason=why)
            done += 1
        audit_id = audit.record_decision(
            store, ts=time.time(), engine_id=engine_id, rule=fb.rule, trigger_kind="revert",
            trigger=f"revert: {why}", trigger_key=f"revert:{fb.id}", action="dependency_fallback",
            target=what, target_key=fb.target_key, node=None,
            namespace=fb.namespace, outcome=res.outcome, reason=res.reason, dry_run=fb.dry_run,
            params={"revert": True, "restore": fb.previous_value}, response=res.response, issued_ts=res.issued_ts,
            finished_ts=time.time())
        metrics.ACTIONS_TOTAL.labels("dependency_fallback", res.outcome).inc()
        log.info("remediation revert %s: %s", res.outcome, res.reason)
        if fb.rule in event_rules and kube is not None and not on_file:
            try:
                kube.post_event(fb.namespace, {"kind": "ConfigMap", "apiVersion": "v1", "namespace": fb.namespace,
                                               "name": fb.configmap},
                                reason="RemediationReverted" if res.outcome != "failed" else "RemediationFailed",
                                message=f"{fb.rule}: {res.reason} (audit {audit_id})")
            except k.KubeError as e:
                log.info("remediation: cannot post the Kubernetes Event: %s", e)
    return done


def post_decision_event(kube: k.KubeAdapter, events_namespace: str, action: str, params: dict[str, Any],
                        fields: dict[str, str], outcome: str, message: str) -> None:
    """A Kubernetes Event about a decision, on the Deployment, the Node or the ConfigMap it concerns."""
    if "file" in fields:
        return  # a knobs file off Kubernetes: no object to post it on
    if "deployment" in fields:
        ns = fields["namespace"]
        involved = {"kind": "Deployment", "apiVersion": "apps/v1", "namespace": ns, "name": fields["deployment"]}
    elif "node" in fields:
        ns = events_namespace
        involved = {"kind": "Node", "apiVersion": "v1", "name": fields["node"]}
    elif "namespace" in fields and action == "dependency_fallback":
        ns = fields["namespace"]
        involved = {"kind": "ConfigMap", "apiVersion": "v1", "namespace": ns,
                    "name": per_workload(params["configmap"], fields)}
    else:
        return
    reason = {"acted": "RemediationActed", "dry_run": "RemediationDryRun", "suppressed": "RemediationSuppressed",
              "failed": "RemediationFailed"}.get(outcome, "Remediation")
    try:
        kube.post_event(ns, involved, reason=reason, message=message,
                        type_="Warning" if outcome in ("failed", "acted") else "Normal")
    except k.KubeError as e:
        log.info("remediation: cannot post the Kubernetes Event: %s", e)


# rescheduling ------------------------------------------------------------------------------------
def _mean(xs: list[float]) -> float | None:
    xs = [x for x in xs if x == x]
    return sum(xs) / len(xs) if xs else None


def node_cost(store: StoreReader, node: str, weights: dict[str, float], now: float | None = None) -> dict[str, Any]:
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


def _node_refusal(ctx: ActionContext, node: dict[str, Any]) -> str:
    """Why ``node`` may not be cordoned or drained by this engine ('' when it may)."""
    name = node.get("metadata", {}).get("name", "?")
    s = ctx.settings
    if k.is_control_plane(node):
        return f"node {name} is a control-plane node: triscope never cordons or drains it"
    if s is not None and not s.node_name_allowed(name):
        return f"node {name} is not in the node allow-list ({s.describe_nodes()})"
    if s is not None and not s.node_labels_allowed(k.node_labels(node)):
        return f"node {name} does not carry the labels of settings.node_selector ({s.describe_nodes()})"
    return ""


def _checked_node(ctx: ActionContext, kube: k.KubeAdapter, name: str) -> dict[str, Any] | ActionResult:
    """The node an action is about to touch, or the ``suppressed`` result saying why it may not
    (gone, a control-plane node, outside the node allow-list)."""
    try:
        node = kube.get_node(name)
    except k.NotFound:
        return ActionResult("suppressed", f"there is no node {name}", {"node": name}, rail="node")
    refusal = _node_refusal(ctx, node)
    if refusal:
        return ActionResult("suppressed", refusal, {"node": name}, rail="node")
    return node


def _candidate_refusal(ctx: ActionContext, node: dict[str, Any], pod_spec: dict[str, Any]) -> str:
    """Why ``node`` cannot take the workload's pods ('' when it can)."""
    if node.get("spec", {}).get("unschedulable"):
        return "cordoned"
    if not _node_ready(node):
        return "not Ready"
    if k.is_control_plane(node):
        return "control plane"
    untolerated = k.untolerated_taints(node, list(pod_spec.get("tolerations") or []))
    if untolerated:
        return "taints not tolerated: " + ", ".join(untolerated)
    labels = k.node_labels(node)
    if any(labels.get(a) != b for a, b in (pod_spec.get("nodeSelector") or {}).items()):
        return "does not match the pod template's nodeSelector"
    s = ctx.settings
    if s is not None and not (s.node_name_allowed(node["metadata"]["name"]) and s.node_labels_allowed(labels)):
        return "outside the node allow-list"
    return ""


def reschedule(ctx: ActionContext) -> ActionResult:
    bad, ns, dep_name = ctx.target["node"], ctx.target["namespace"], ctx.target["deployment"]
    p = ctx.params
    if ctx.settings is not None and not ctx.settings.node_name_allowed(bad):
        return ActionResult("suppressed", f"node {bad} is not in the node allow-list ({ctx.settings.describe_nodes()})",
                            {"node": bad}, rail="node")
    if ctx.dry_run and ctx.kube is None:
        return ActionResult("dry_run", f"would move {ns}/{dep_name} off {bad} (live state not checked: no Kubernetes "
                            "API configured)", {"checked": False})
    kube = ctx.need_kube()
    node = _checked_node(ctx, kube, bad)
    if isinstance(node, ActionResult):
        return node
    dep = kube.get_deployment(ns, dep_name)
    pod_spec = dep.get("spec", {}).get("template", {}).get("spec", {}) or {}
    sel = dep.get("spec", {}).get("selector", {}).get("matchLabels", {}) or {}
    selector = ",".join(f"{a}={b}" for a, b in sorted(sel.items()))
    pods = [pp["metadata"]["name"] for pp in kube.list_pods(ns, label_selector=selector, node=bad)] if sel else []
    ann = node.get("metadata", {}).get("annotations") or {}
    if not pods:
        if ctx.resumed and node.get("spec", {}).get("unschedulable") and ann.get(k.CORDONED_BY) == CORDON_OWNER:
            return ActionResult("acted", f"{bad} is cordoned by triscope and no pods of {ns}/{dep_name} are left on it: "
                                "done before the engine restarted", {"node": bad, "resumed": True},
                                issued_ts=time.time())
        return ActionResult("suppressed", f"no pods of {ns}/{dep_name} run on node {bad}: not cordoning or draining a "
                            "node the workload does not run on", {"node": bad, "selector": selector}, rail="node")
    candidates = []
    excluded: dict[str, str] = {}
    for n in kube.list_nodes():
        name = n["metadata"]["name"]
        if name == bad:
            continue
        why = _candidate_refusal(ctx, n, pod_spec)
        if why:
            if len(excluded) < 50:
                excluded[name] = why
            continue
        candidates.append(node_cost(ctx.store, name, p["weights"]))
    candidates.sort(key=lambda c: (c["cost"], c["node"]))
    resp: dict[str, Any] = {"node": bad, "pods": pods, "candidates": candidates, "excluded": excluded,
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


# one accelerator out of service ------------------------------------------------------------------
def pods_on_accelerator(store: StoreReader, node: str, accelerator: str, now: float,
                        stale_s: float = 120.0) -> list[tuple[str, str]]:
    """(namespace, pod) of every pod the agent attributed to ``accelerator`` of ``node`` (from the kubelet's
    pod-resources, on its per-accelerator verdict series) within the last ``stale_s``."""
    from triscope.core.vocabulary import accelerator_labels

    out: set[tuple[str, str]] = set()
    acc = accelerator_labels(accelerator)
    for sd in store.query("triscope_mismatch_state", node=node, labels=acc, start=now - stale_s, end=now + 5.0,
                          max_points=None):
        lab = sd.info.labels
        if all(lab.get(a) == v for a, v in acc.items()) and lab.get("pod") and lab.get("namespace") and sd.ts:
            out.add((str(lab["namespace"]), str(lab["pod"])))
    return sorted(out)


def isolate_accelerator(ctx: ActionContext) -> ActionResult:
    node_name, acc = ctx.target["node"], ctx.target["accelerator"]
    p = ctx.params
    if ctx.settings is not None and not ctx.settings.node_name_allowed(node_name):
        return ActionResult("suppressed", f"node {node_name} is not in the node allow-list "
                            f"({ctx.settings.describe_nodes()})", {"node": node_name}, rail="node")
    now = _decided(ctx)
    allowed = tuple(getattr(ctx.settings, "namespaces", ()) or ())
    holders = pods_on_accelerator(ctx.store, node_name, acc, now)
    pods = [(ns, pod) for ns, pod in holders if not allowed or ns in allowed] if p.get("evict", True) else []
    resp: dict[str, Any] = {"node": node_name, "accelerator": acc, "pods": [f"{ns}/{pod}" for ns, pod in pods],
                            "outside_allow_list": [f"{ns}/{pod}" for ns, pod in holders
                                                   if allowed and ns not in allowed]}
    what = f"{acc} on {node_name}"
    if ctx.dry_run and ctx.kube is None:
        return ActionResult("dry_run", f"would taint {what} and evict {len(pods)} pod(s) holding it (live state not "
                            "checked: no Kubernetes API configured)", {**resp, "checked": False})
    kube = ctx.need_kube()
    checked = _checked_node(ctx, kube, node_name)
    if isinstance(checked, ActionResult):
        return checked
    if ctx.dry_run:
        return ActionResult("dry_run", f"would taint {what} and evict {len(pods)} pod(s) holding it: "
                            + (", ".join(resp["pods"]) or "none"), resp)
    taint = {"effect": "NoSchedule", "state": ctx.target.get("state", ""), "since": _iso(now), "since_ts": now,
             "rule": ctx.rule_name, "untaint_after": float(p.get("untaint_after", 600.0)), "by": CORDON_OWNER}
    resp["taint"] = kube.set_device_taint(node_name, acc, taint)
    ctx.on_issued(time.time())
    evictions = []
    deadline = time.monotonic() + float(p.get("eviction_timeout", 120.0))
    for ns, pod in pods:
        try:
            evictions.append({"namespace": ns, **kube.evict(ns, pod, timeout=max(0.5, deadline - time.monotonic()))})
        except k.EvictionBlocked as e:
            evictions.append({"namespace": ns, "pod": pod, "evicted": False, "error": str(e)})
            resp["evictions"] = evictions
            return ActionResult("failed", str(e), resp, issued_ts=time.time())
    resp["evictions"] = evictions
    return ActionResult("acted", f"tainted {what}, evicted {len(pods)} pod(s) holding it"
                        + (f" ({', '.join(resp['pods'])})" if pods else "") + "; the node's other accelerators and "
                        "their pods untouched", resp, issued_ts=time.time())


def untaint_healthy_accelerators(store: StoreReader, kube: k.KubeAdapter, now: float, stale_s: float,
                                 events_namespace: str | None) -> list[dict[str, Any]]:
    """Remove each device taint triscope set whose accelerator's verdict has been healthy (no I/O state)
    for its ``untaint_after`` and is still published; an Event on the node for each."""
    from triscope.core.vocabulary import IO_STATES

    out = []
    for node in kube.list_nodes():
        name = node["metadata"]["name"]
        for acc, entry in kube.device_taints(node).items():
            if entry.get("by") != CORDON_OWNER:
                continue
            after = float(entry.get("untaint_after") or 600.0)
            since = float(entry.get("since_ts") or 0.0)
            if now - since < after:
                continue
            runs = [r for r in store.verdict_runs(name, now - after, now) if r.accelerator == acc]
            bad = [r for r in runs if r.state in IO_STATES and r.end >= now - after]
            published = any(r.end >= now - stale_s for r in runs)
            if bad or not published:
                continue
            res = kube.set_device_taint(name, acc, None)
            state = runs[-1].state if runs else "?"
            msg = f"{acc}: verdict healthy ({state}) for {after:g}s: untainted"
            log.info("remediation: node %s %s", name, msg)
            if events_namespace is not None:
                try:
                    kube.post_event(events_namespace, {"kind": "Node", "apiVersion": "v1", "name": name},
                                    reason="AcceleratorUntainted", message=msg)
                except k.KubeError as e:
                    log.warning("remediation: Event for the untaint of %s on %s: %s", acc, name, e)
            out.append({**res, "message": msg})
    return out


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
    "reschedule": reschedule, "isolate_accelerator": isolate_accelerator, "command": command,
}
