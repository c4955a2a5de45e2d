"""The actions: rolling restart, dependency fallback (and its revert), rescheduling, command.

Each action re-checks the live state it depends on right before acting (a paused or degraded
Deployment, a ConfigMap already in fallback, no schedulable node to move to) and, in dry-run,
does every read and none of the writes, so a dry-run decision says what would have happened (one
exception, ``isolate_accelerator``: its DeviceTaintRule with ``effect: None``, which nothing acts on).
Kubernetes is reached only through :class:`triscope.remediation.kube.adapter.KubeAdapter`.

An engine killed while an action runs re-runs it when it starts again (the decision is left
``in_progress``), so every Kubernetes action is idempotent per decision: the restart writes the
``restartedAt`` value fixed when the decision was taken (already there: nothing is written), the
fallback recognises its own write by the decision id it annotates the ConfigMap with (and the
previous value it recorded there), cordon and eviction are idempotent by nature.  The ``command``
action is not re-run (see ``triscope.remediation.engine``).

Off Kubernetes, ``dependency_fallback`` with ``params.file`` writes a per-workload knobs file
instead of a ConfigMap key: ``triscope.remediation.filefallback`` (switch and revert), which builds
on this module; the engine picks the one a rule's params name.

Each action receives an ``ActionContext`` typed by its params model (``ActionContext[RollingRestartParams]``):
the policy's validated model itself, with its defaults, never a dict.  Kubernetes answers come back
typed from ``triscope.remediation.kube.views``; what an action found and did is its ``ActionResult``'s
``response``, the audit row's JSON.
"""

from __future__ import annotations

import json
import logging
import re
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Generic, Literal, TypedDict, TypeVar

from pydantic import AfterValidator, BeforeValidator, Field, model_validator

from triscope.core.configfile import ConfigModel, problem, show
from triscope.core.durations import Duration
from triscope.core.timeparse import format_rfc3339
from triscope.remediation.kube.adapter import KubeAdapter
from triscope.remediation.kube.errors import (
    DegradedDeployment,
    EvictionBlocked,
    KubeError,
    NotConfigured,
    NotFound,
    PausedDeployment,
    RolloutTimeout,
)
from triscope.remediation.kube.views import ConfigMap, Deployment, Node
from triscope.remediation.settings import Settings
from triscope.remediation.targets import PER_WORKLOAD, KubeName, Target, kube_name_pattern, per_workload
from triscope.store import audit

if TYPE_CHECKING:
    from triscope.store.api import Store
    from triscope.store.reader import StoreReader

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------------- parameters
# Each action's ``params`` as the policy writes them (``triscope.remediation.policy`` validates a
# rule's params with its action's model; the action receives that model in its ``ActionContext``).
_CONFIGMAP_KEY = re.compile(r"^[-._a-zA-Z0-9]{1,253}$")


def _kube_name_template(value: str) -> str:
    if not kube_name_pattern().match(value.replace(PER_WORKLOAD, "x")):
        raise ValueError(f"{show(value)} is not a valid Kubernetes name (with {PER_WORKLOAD} for the workload's)")
    return value


def _configmap_key(value: str) -> str:
    if not _CONFIGMAP_KEY.match(value.replace(PER_WORKLOAD, "x")):
        raise ValueError(f"{show(value)} is not a valid ConfigMap key")
    return value


def _text(value: object) -> object:
    """A number written where text belongs (``value: 1``) as text; anything else as it is."""
    return str(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else value


def _positive(seconds: float) -> float:
    if seconds <= 0:
        raise ValueError("must be longer than 0s")
    return seconds


def _argv(value: object) -> list[str]:
    if not isinstance(value, list) or not value or not all(
            isinstance(a, (str, int, float)) and not isinstance(a, bool) for a in value):
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
    """``isolate_accelerator``: take the one accelerator the trigger names out of service with a DRA
    ``DeviceTaintRule`` on the device its driver publishes (``triscope.remediation.isolate``):
    ``NoSchedule``, or ``NoExecute`` when ``evict`` (Kubernetes evicts the pods whose claims hold it;
    ``eviction: eviction_api`` keeps ``NoSchedule`` and evicts them through the Eviction API,
    PodDisruptionBudgets respected for ``eviction_timeout``); the rule is deleted once the verdict has been
    healthy for ``untaint_after``.  Where no ResourceSlice publishes the GPU, ``without_dra`` says what
    to do instead: ``refuse`` (nothing) or ``cordon`` the node as ``reschedule`` does."""

    eviction_timeout: Duration = 120.0
    untaint_after: Annotated[Duration, AfterValidator(_positive)] = 600.0
    evict: bool = True
    eviction: Literal["noexecute", "eviction_api"] = "noexecute"
    without_dra: Literal["refuse", "cordon"] = "refuse"


PLACEHOLDERS = ("node", "namespace", "deployment", "pod", "gpu", "npu", "chip")
"""What a ``command``'s argv may carry from the trigger, as ``{NAME}`` inside a word: ``node``, ``namespace``
and ``deployment`` are the rule's target fields (resolved as for every action); ``pod``, ``gpu``, ``npu``
and ``chip`` the trigger's own labels (a verdict's: the pod and accelerator it names)."""
TARGET_PLACEHOLDERS = ("node", "namespace", "deployment")
_PLACEHOLDER = re.compile(r"\{([a-z_]+)\}")


def placeholders(word: str) -> list[str]:
    """The ``{NAME}`` placeholders of one argv word, in order."""
    return [m[1] for m in _PLACEHOLDER.finditer(word)]


def fill_argv(argv: list[str], values: Mapping[str, str]) -> list[str]:
    """Each ``{NAME}`` replaced by its value; every value a Kubernetes name with no leading ``-``, so it
    stays inside its own argv word and cannot become an option.  ``ValueError`` otherwise."""
    out = []
    for word in argv:
        def one(m: re.Match[str]) -> str:
            v = values.get(m[1], "")
            if not v or v.startswith("-") or len(v) > 253 or not kube_name_pattern().match(v):
                raise ValueError(f"{{{m[1]}}} is {v!r}: not a Kubernetes name")
            return v
        out.append(_PLACEHOLDER.sub(one, word))
    return out


class CommandParams(ConfigModel):
    """``command``: the argv fixed in the policy (no shell), killed after ``timeout``.  ``{node}``,
    ``{namespace}``, ``{deployment}``, ``{pod}``, ``{gpu}``, ``{npu}``, ``{chip}`` in a word carry the
    trigger's target (each value checked as a Kubernetes name, no leading ``-``, one argv word);
    ``literal_targets: true`` lets a verdict trigger run an argv whose targets are fixed in the policy
    (said in the audit row and the Event)."""

    argv: Annotated[list[str], BeforeValidator(_argv)]
    timeout: Duration = 30.0
    literal_targets: bool = False

    @model_validator(mode="after")
    def _known_placeholders(self) -> CommandParams:
        if placeholders(self.argv[0]):
            raise problem("the program is fixed in the policy: no placeholder in argv[0]", "argv", 0)
        for i, word in enumerate(self.argv):
            for name in placeholders(word):
                if name not in PLACEHOLDERS:
                    raise problem(f"unknown placeholder {{{name}}} (known: "
                                  + ", ".join(f"{{{p}}}" for p in PLACEHOLDERS) + ")", "argv", i)
        return self

    @property
    def uses(self) -> list[str]:
        """The placeholders the argv carries, each once, in order."""
        seen: dict[str, None] = {}
        for w in self.argv:
            for p in placeholders(w):
                seen.setdefault(p, None)
        return list(seen)


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
    response: dict[str, object] = field(default_factory=dict)
    rail: str | None = None           # for suppressed: which rail (live_state)
    issued_ts: float | None = None


P = TypeVar("P", bound=ConfigModel)
Q = TypeVar("Q", bound=ConfigModel)


def _nothing(ts: float) -> None:
    """``on_issued`` when nobody listens."""


@dataclass(frozen=True)
class ActionContext(Generic[P]):
    """What an action gets: its rule's validated ``params`` (the action's own model), the decision's
    resolved ``target``, the APIs, and when the decision was taken."""

    rule_name: str
    params: P
    target: Target
    dry_run: bool
    kube: KubeAdapter | None
    store: Store
    engine_id: str
    trigger_key: str = ""
    episode: str = ""
    on_issued: Callable[[float], None] = _nothing
    stop: threading.Event = field(default_factory=threading.Event)
    decision_id: int | None = None    # the audit row of the decision this action carries out
    decided_ts: float | None = None   # when it was decided: the restart stamp and fallback times derive from it
    resumed: bool = False             # re-run after the engine stopped while it was in progress
    settings: Settings | None = None  # the policy's settings (namespace and node allow-lists)
    restarted_at: str = ""            # rolling_restart: the stamp fixed when the decision was taken

    def using(self, params: Q) -> ActionContext[Q]:
        """This context with ``params`` (the engine builds one context, then gives each action its model)."""
        return ActionContext(self.rule_name, params, self.target, self.dry_run, self.kube, self.store, self.engine_id,
                             self.trigger_key, self.episode, self.on_issued, self.stop, self.decision_id,
                             self.decided_ts, self.resumed, self.settings, self.restarted_at)

    @property
    def names(self) -> Mapping[str, str]:
        """The target's names (``namespace``, ``deployment``, ``node``...)."""
        return self.target.fields

    def need_kube(self) -> KubeAdapter:
        if self.kube is None:
            raise NotConfigured("no Kubernetes API configured (settings.kubernetes.mode is none)")
        return self.kube


def restart_stamp(decided_ts: float) -> str:
    """The ``restartedAt`` value of a decision (RFC 3339, microseconds): fixed when it is decided."""
    return format_rfc3339(decided_ts, micro=True)


def _decided(ctx: ActionContext[P]) -> float:
    return ctx.decided_ts if ctx.decided_ts is not None else time.time()


def _node_allowed(ctx: ActionContext[P], node: str) -> ActionResult | None:
    """The ``suppressed`` result when ``node`` is outside the node allow-list (None when it is inside)."""
    s = ctx.settings
    if s is not None and not s.node_name_allowed(node):
        return ActionResult("suppressed", f"node {node} is not in the node allow-list ({s.describe_nodes()})",
                            {"node": node}, rail="node")
    return None


# rolling restart ---------------------------------------------------------------------------------
def rolling_restart(ctx: ActionContext[RollingRestartParams]) -> ActionResult:
    ns, name = ctx.names["namespace"], ctx.names["deployment"]
    if ctx.dry_run and ctx.kube is None:
        return ActionResult("dry_run", f"would restart deployment {ns}/{name} (live state not checked: no "
                            "Kubernetes API configured)", {"would": "rollout restart", "checked": False})
    kube = ctx.need_kube()
    if ctx.dry_run:
        h = kube.get_deployment(ns, name).health
        if h["paused"]:
            return ActionResult("suppressed", f"deployment {ns}/{name} is paused", {"health": h}, rail="live_state")
        if h["available"] < h["desired"]:
            return ActionResult("suppressed", f"deployment {ns}/{name} already degraded "
                                f"({h['available']}/{h['desired']} available)", {"health": h}, rail="live_state")
        return ActionResult("dry_run", f"would restart deployment {ns}/{name}", {"would": "rollout restart", "health": h})
    stamp = ctx.restarted_at or restart_stamp(_decided(ctx))
    try:
        out = kube.restart_deployment(ns, name, stamp=stamp)
    except (PausedDeployment, DegradedDeployment) as e:
        return ActionResult("suppressed", str(e), dict(e.answer()), rail="live_state")
    issued = time.time()
    ctx.on_issued(issued)
    resp: dict[str, object] = {"patch": out}
    if not ctx.params.follow:
        return ActionResult("acted", f"restarted deployment {ns}/{name}", resp, issued_ts=issued)
    try:
        resp["rollout"] = kube.rollout_status(ns, name, generation=out["generation"], timeout=ctx.params.timeout,
                                              stop=ctx.stop.is_set)
    except RolloutTimeout as e:
        resp["rollout"] = e.rollout
        return ActionResult("failed", str(e), resp, issued_ts=issued)
    return ActionResult("acted", f"restarted deployment {ns}/{name}; rollout complete", resp, issued_ts=issued)


# dependency fallback -----------------------------------------------------------------------------
def _fallback_names(params: DependencyFallbackParams, names: Mapping[str, str]) -> tuple[str, str, str]:
    """(namespace, ConfigMap, key) a ConfigMap fallback writes, ``{deployment}`` filled in."""
    return names["namespace"], per_workload(params.configmap, names), per_workload(params.key, names)


def _previous_write(ctx: ActionContext[DependencyFallbackParams], cm: ConfigMap | None,
                    key: str) -> tuple[str | None, bool, str]:
    """(the key's value before the switch, whether the value there is this decision's own write, why
    not to switch: '' to go ahead) from the ConfigMap as read (None: there is none)."""
    previous = None if cm is None else cm.data.get(key)
    if previous != ctx.params.value:
        return previous, False, ""
    ann = {} if cm is None else cm.annotations
    if ctx.decision_id is None or ann.get(FALLBACK_DECISION) != str(ctx.decision_id):
        return previous, False, "set by someone else"
    # this decision's own write, from before the engine restarted: what it replaced is annotated
    try:
        recorded: object = json.loads(ann.get(FALLBACK_PREVIOUS) or "{}")
    except ValueError:
        recorded = {}
    before = recorded.get(key) if isinstance(recorded, dict) else None
    return (before if isinstance(before, str) else None), True, ""


def dependency_fallback(ctx: ActionContext[DependencyFallbackParams]) -> ActionResult:
    """Set the key of the ConfigMap (the knobs-file form is ``filefallback.switch``)."""
    p = ctx.params
    ns, cm, key = _fallback_names(p, ctx.names)
    now = _decided(ctx)
    expires = now + p.ttl
    existing = audit.active_fallbacks(ctx.store, ctx.target.key)
    if not ctx.dry_run:   # a dry-run fallback changed nothing: it does not stand in a live one's way
        existing = [fb for fb in existing if not fb.dry_run]
    if existing:
        fb = existing[0]
        if ctx.resumed and fb.rule == ctx.rule_name and abs(fb.switched_at - now) < 1e-3:
            return ActionResult("acted", f"{ns}/{cm}:{key}={p.value!r} was set by this decision before the engine "
                                "restarted", {"fallback_id": fb.id, "resumed": True}, issued_ts=time.time())
        return ActionResult("suppressed", f"fallback {ns}/{cm}:{key} already active since "
                            f"{format_rfc3339(fb.switched_at)}", {"fallback_id": fb.id}, rail="live_state")
    resp: dict[str, object] = {"configmap": f"{ns}/{cm}", "key": key, "value": p.value,
                               "expires_at": format_rfc3339(expires)}
    previous: str | None = None
    ours = False
    if ctx.kube is not None:
        try:
            current: ConfigMap | None = ctx.kube.get_configmap(ns, cm)
        except NotFound:
            current = None
        previous, ours, refusal = _previous_write(ctx, current, key)
        if refusal:
            return ActionResult("suppressed", f"{ns}/{cm}:{key} is already {p.value!r} ({refusal})", resp,
                                rail="live_state")
    elif not ctx.dry_run:
        ctx.need_kube()
    if ctx.dry_run:
        outcome, reason = "dry_run", f"would set {ns}/{cm}:{key}={p.value!r} for {p.ttl:g}s"
    elif ours:
        ctx.on_issued(time.time())
        resp["resumed"] = True
        outcome, reason = "acted", (f"set {ns}/{cm}:{key}={p.value!r} until {format_rfc3339(expires)} (before the "
                                    "engine restarted)")
    else:
        previous, resp["resourceVersion"] = _switch_configmap(ctx, ns, cm, key, now, expires)
        ctx.on_issued(time.time())
        outcome, reason = "acted", f"set {ns}/{cm}:{key}={p.value!r} until {format_rfc3339(expires)}"
    resp["previous"] = previous
    resp["fallback_id"] = audit.add_fallback(ctx.store, audit.FallbackRow(
        rule=ctx.rule_name, target_key=ctx.target.key, namespace=ns, configmap=cm, key=key, value=p.value,
        previous_value=previous, trigger_key=ctx.episode or ctx.trigger_key, dry_run=ctx.dry_run, switched_at=now,
        expires_at=expires, hold_s=p.hold))
    return ActionResult(outcome, reason, resp, issued_ts=time.time())


def _switch_configmap(ctx: ActionContext[DependencyFallbackParams], ns: str, cm: str, key: str, now: float,
                      expires: float) -> tuple[str | None, str]:
    """Write the fallback value, annotated with the decision; (the value it replaced, resourceVersion)."""
    annotations: dict[str, str | None] = {FALLBACK_UNTIL: format_rfc3339(expires), FALLBACK_RULE: ctx.rule_name,
                                          FALLBACK_SINCE: format_rfc3339(now)}
    if ctx.decision_id is not None:
        annotations[FALLBACK_DECISION] = str(ctx.decision_id)
    out = ctx.need_kube().set_configmap_keys(ns, cm, {key: ctx.params.value}, annotations,
                                             previous_annotation=FALLBACK_PREVIOUS)
    return out["previous"].get(key), out["resourceVersion"]


def revert_fallback(fb: audit.FallbackRow, kube: KubeAdapter | None, reason: str) -> ActionResult:
    """Put the dependency back: restore the key's previous value (or remove it) and the annotations."""
    resp: dict[str, object] = {"configmap": f"{fb.namespace}/{fb.configmap}", "key": fb.key,
                               "restored": fb.previous_value, "fallback_id": fb.id, "why": reason}
    if fb.dry_run:
        return ActionResult("dry_run", f"would revert {fb.namespace}/{fb.configmap}:{fb.key} ({reason})", resp)
    if kube is None:
        raise NotConfigured("no Kubernetes API configured: cannot revert the fallback")
    try:
        cur = kube.get_configmap(fb.namespace, fb.configmap)
    except NotFound:
        return ActionResult("acted", f"{fb.namespace}/{fb.configmap} is gone: nothing to revert", resp)
    if cur.data.get(fb.key) != fb.value:
        resp["found"] = cur.data.get(fb.key)
        return ActionResult("acted", f"{fb.namespace}/{fb.configmap}:{fb.key} was changed by someone else: left as is",
                            resp)
    out = kube.set_configmap_keys(fb.namespace, fb.configmap, {fb.key: fb.previous_value},
                                  {FALLBACK_UNTIL: None, FALLBACK_RULE: None, FALLBACK_SINCE: None,
                                   FALLBACK_DECISION: None, FALLBACK_PREVIOUS: None}, create=False)
    resp["resourceVersion"] = out["resourceVersion"]
    return ActionResult("acted", f"reverted {fb.namespace}/{fb.configmap}:{fb.key} ({reason})", resp,
                        issued_ts=time.time())


def post_decision_event(kube: KubeAdapter, events_namespace: str, params: ConfigModel, fields: Mapping[str, str],
                        outcome: str, message: str) -> None:
    """A Kubernetes Event about a decision, on the Deployment, the Node or the ConfigMap it concerns."""
    if "file" in fields:
        return  # a knobs file off Kubernetes: no object to post it on
    if "deployment" in fields:
        ns = fields["namespace"]
        involved = {"kind": "Deployment", "apiVersion": "apps/v1", "namespace": ns, "name": fields["deployment"]}
    elif "node" in fields:
        ns = events_namespace
        involved = {"kind": "Node", "apiVersion": "v1", "name": fields["node"]}
    elif "namespace" in fields and isinstance(params, DependencyFallbackParams):
        ns = fields["namespace"]
        involved = {"kind": "ConfigMap", "apiVersion": "v1", "namespace": ns,
                    "name": per_workload(params.configmap, fields)}
    else:
        return
    reason = {"acted": "RemediationActed", "dry_run": "RemediationDryRun", "suppressed": "RemediationSuppressed",
              "failed": "RemediationFailed"}.get(outcome, "Remediation")
    try:
        kube.post_event(ns, involved, reason=reason, message=message,
                        type_="Warning" if outcome in ("failed", "acted") else "Normal")
    except KubeError as e:
        log.info("remediation: cannot post the Kubernetes Event: %s", e)


# rescheduling ------------------------------------------------------------------------------------
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


def _node_refusal(ctx: ActionContext[P], node: Node) -> str:
    """Why ``node`` may not be cordoned or drained by this engine ('' when it may)."""
    s = ctx.settings
    if node.control_plane:
        return f"node {node.name} is a control-plane node: triscope never cordons or drains it"
    if s is not None and not s.node_name_allowed(node.name):
        return f"node {node.name} is not in the node allow-list ({s.describe_nodes()})"
    if s is not None and not s.node_labels_allowed(node.labels):
        return f"node {node.name} does not carry the labels of settings.node_selector ({s.describe_nodes()})"
    return ""


def _checked_node(ctx: ActionContext[P], kube: KubeAdapter, name: str) -> Node | ActionResult:
    """The node an action is about to touch, or the ``suppressed`` result saying why it may not
    (gone, a control-plane node, outside the node allow-list)."""
    try:
        node = kube.get_node(name)
    except NotFound:
        return ActionResult("suppressed", f"there is no node {name}", {"node": name}, rail="node")
    refusal = _node_refusal(ctx, node)
    if refusal:
        return ActionResult("suppressed", refusal, {"node": name}, rail="node")
    return node


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


def _evict_all(kube: KubeAdapter, pods: list[tuple[str, str]], timeout: float,
               resp: dict[str, object]) -> EvictionBlocked | None:
    """Evict ``pods`` ((namespace, name)) within ``timeout`` in all; ``resp["evictions"]`` says how each went;
    the first eviction a disruption budget kept blocking, if one did (the rest are not tried)."""
    evictions: list[dict[str, object]] = []
    resp["evictions"] = evictions
    deadline = time.monotonic() + timeout
    for ns, pod in pods:
        try:
            evictions.append({"namespace": ns, **kube.evict(ns, pod, timeout=max(0.5, deadline - time.monotonic()))})
        except EvictionBlocked as e:
            evictions.append({"namespace": ns, "pod": pod, "evicted": False, "error": str(e)})
            return e
    return None


def reschedule(ctx: ActionContext[RescheduleParams]) -> ActionResult:
    bad, ns, dep_name = ctx.names["node"], ctx.names["namespace"], ctx.names["deployment"]
    outside = _node_allowed(ctx, bad)
    if outside is not None:
        return outside
    if ctx.dry_run and ctx.kube is None:
        return ActionResult("dry_run", f"would move {ns}/{dep_name} off {bad} (live state not checked: no Kubernetes "
                            "API configured)", {"checked": False})
    kube = ctx.need_kube()
    node = _checked_node(ctx, kube, bad)
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
    blocked = _evict_all(kube, [(ns, pod) for pod in pods], ctx.params.eviction_timeout, resp)
    if blocked is not None:
        return ActionResult("failed", str(blocked), resp, issued_ts=time.time())
    return ActionResult("acted", f"cordoned {bad}, preferred {best}, evicted {len(pods)} pod(s) of {ns}/{dep_name}",
                        resp, issued_ts=time.time())


# one accelerator out of service: triscope.remediation.isolate (DRA DeviceTaintRules) ---------------
def isolate_accelerator(ctx: ActionContext[IsolateAcceleratorParams]) -> ActionResult:
    """``triscope.remediation.isolate.isolate_accelerator`` (imported here lazily: it builds on this module)."""
    from triscope.remediation import isolate

    return isolate.isolate_accelerator(ctx)


# command -----------------------------------------------------------------------------------------
def command(ctx: ActionContext[CommandParams]) -> ActionResult:
    try:
        argv = fill_argv(list(ctx.params.argv), ctx.names)
    except ValueError as e:
        return ActionResult("suppressed", f"not running {ctx.params.argv[0]}: {e}", {"argv": ctx.params.argv},
                            rail="target")
    timeout = ctx.params.timeout
    literal = " (literal_targets: the argv's targets are fixed in the policy, not taken from the trigger)" \
        if ctx.params.literal_targets else ""
    if ctx.dry_run:
        return ActionResult("dry_run", f"would run {argv!r} (timeout {timeout:g}s){literal}",
                            {"argv": argv, "literal_targets": ctx.params.literal_targets})
    issued = time.time()
    ctx.on_issued(issued)
    try:
        proc = subprocess.run(argv, shell=False, stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout,
                              check=False)
    except subprocess.TimeoutExpired as e:
        out = e.stdout if isinstance(e.stdout, bytes) else b""
        return ActionResult("failed", f"{argv[0]} timed out after {timeout:g}s",
                            {"argv": argv, "timeout": timeout, "stdout": out[-2000:].decode(errors="replace")},
                            issued_ts=issued)
    except OSError as e:
        return ActionResult("failed", f"cannot run {argv[0]}: {e}", {"argv": argv}, issued_ts=issued)
    resp: dict[str, object] = {"argv": argv, "rc": proc.returncode, "stdout": proc.stdout[-2000:].decode(errors="replace"),
                               "stderr": proc.stderr[-2000:].decode(errors="replace")}
    resp["literal_targets"] = ctx.params.literal_targets
    if proc.returncode != 0:
        return ActionResult("failed", f"{argv[0]} exited with {proc.returncode}{literal}", resp, issued_ts=issued)
    return ActionResult("acted", f"ran {argv[0]} (exit 0){literal}", resp, issued_ts=issued)


class Runners(TypedDict):
    """Each action's function (a test may put another in its place)."""

    rolling_restart: Callable[[ActionContext[RollingRestartParams]], ActionResult]
    dependency_fallback: Callable[[ActionContext[DependencyFallbackParams]], ActionResult]
    reschedule: Callable[[ActionContext[RescheduleParams]], ActionResult]
    isolate_accelerator: Callable[[ActionContext[IsolateAcceleratorParams]], ActionResult]
    command: Callable[[ActionContext[CommandParams]], ActionResult]


RUNNERS: Runners = {
    "rolling_restart": rolling_restart, "dependency_fallback": dependency_fallback,
    "reschedule": reschedule, "isolate_accelerator": isolate_accelerator, "command": command,
}


__all__ = ["ACTION_PARAMS", "KubeName", "ActionContext", "ActionResult", "CommandParams", "DependencyFallbackParams",
           "IsolateAcceleratorParams", "RescheduleParams", "RescheduleWeights", "RollingRestartParams", "Runners",
           "RUNNERS", "post_decision_event", "restart_stamp", "revert_fallback"]
