"""The actions: what each shares (its context and result, the node checks), rolling restart, dependency
fallback (and its revert) and command; ``reschedule.py``, ``isolate.py`` and ``filefallback.py`` hold the
others, ``params.py`` their params models and ``dispatch.py`` which one a decision runs.

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
on this module; the engine picks the one a rule's params name (``triscope.remediation.dispatch``).

Each action receives an ``ActionContext`` typed by its params model (``ActionContext[RollingRestartParams]``):
the policy's validated model itself, with its defaults, never a dict.  Kubernetes answers come back
typed from ``triscope.remediation.kube.views``; what an action found and did is its ``ActionResult``'s
``response``, the audit row's JSON.
"""

from __future__ import annotations

import json
import logging
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Generic, TypeVar

from triscope.core.configfile import ConfigModel
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
from triscope.remediation.kube.views import ConfigMap, Node
from triscope.remediation.params import (
    CommandParams,
    DependencyFallbackParams,
    RollingRestartParams,
    fill_argv,
)
from triscope.remediation.settings import Settings
from triscope.remediation.targets import Target, per_workload
from triscope.store import audit

if TYPE_CHECKING:
    from triscope.store.api import Store

log = logging.getLogger(__name__)

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


def decided_at(ctx: ActionContext[P]) -> float:
    return ctx.decided_ts if ctx.decided_ts is not None else time.time()


def node_allowed(ctx: ActionContext[P], node: str) -> ActionResult | None:
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
    stamp = ctx.restarted_at or restart_stamp(decided_at(ctx))
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
    now = decided_at(ctx)
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


# nodes: what reschedule and isolate_accelerator check before they cordon, drain or taint one ------------
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


def checked_node(ctx: ActionContext[P], kube: KubeAdapter, name: str) -> Node | ActionResult:
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


def evict_all(kube: KubeAdapter, pods: list[tuple[str, str]], timeout: float,
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
