"""Triggers: Alertmanager alerts matched to rules, and conditions evaluated on stored data.

Stored-data conditions read through the store's read interface only (``StoreReader``):

* ``metric``: every point of a series of the metric (counters as per-second rates) satisfies
  ``op threshold`` for at least ``for``; the newest point must be fresh.
* ``mismatch``: an accelerator's verdict has been state S (naming one workload) for at least ``for``
  and is still published: read from the verdict history (``verdict_runs``, the record root cause
  and the pages read; consecutive runs of one state and workload are one stretch), or, on a store
  whose history holds nothing for the node (written before the history existed), from the
  per-accelerator ``triscope_mismatch_state{state=S, gpu|npu, ...}`` series.  The node's roll-up
  never triggers.
* ``slo``: the SLO's burn-rate status (from ``triscope.analysis.slo`` when it is installed) is ``page``
  (or ``ticket``, which ``page`` also satisfies).
* ``xid``: an ``xid`` event with one of the codes in the last ``within`` seconds; each event fires once.

A condition that holds is one *episode*; its key (rule, node, the series it holds on, start of the
run of points that hold) is the durable dedupe key, so one episode acts once however often it is
evaluated.  ``metric`` and ``mismatch`` conditions hold per series: per-accelerator data gives one
episode per (node, accelerator, workload), never one per node, and its workload labels (the series'
own, else its accelerator's verdict's) are what the rule's target is resolved from.  An accelerator
whose verdict is ``idle`` or ``demand-limited`` never triggers.  Which state an accelerator is in,
and which workload its verdict names (a metric trigger's quiet check, an XID's workload), is read
from the verdict history too, with the same fallback.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import cast

from pydantic import BaseModel, ConfigDict

from triscope.analysis.slo import SLOSpec, load_slo_file
from triscope.analysis.slo import evaluate as evaluate_slo
from triscope.core.vocabulary import (
    ACCELERATOR_LABELS,
    QUIET_STATES,
    WORKLOAD_LABELS,
    WorkloadKey,
    accelerator_labels,
    accelerator_name,
)
from triscope.remediation import filefallback
from triscope.remediation.filefallback import KnobsFileParams
from triscope.remediation.params import TARGET_PLACEHOLDERS, CommandParams, DependencyFallbackParams
from triscope.remediation.policy import OPS, Matcher, Rule, Trigger
from triscope.remediation.targets import per_workload
from triscope.remediation.webhook import WebhookAlert
from triscope.remediation.workloads import Owner, ResolveError, WorkloadResolver, target_owner
from triscope.store.reader import NodeInfo, SeriesData, StoreReader, VerdictRun
from triscope.store.verdicts import MAX_GAP_S

log = logging.getLogger(__name__)

MISMATCH_METRIC = "triscope_mismatch_state"
_K8S_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
AcceleratorKey = tuple[tuple[str, str], ...]      # (("gpu", "0"),): what accelerator_of answers


@dataclass
class TriggerEvent:
    """One trigger instance handed to the engine."""

    rule: Rule
    kind: str                      # alert | metric | mismatch | slo | xid
    key: str                       # durable dedupe key
    description: str
    labels: dict[str, str]         # what targets are resolved from (alert labels / node labels + node)
    node: str | None
    started_at: float              # when the alert / condition started (stale-trigger check after a breaker reset)
    received_ts: float
    firing: bool = True
    details: dict[str, object] = field(default_factory=dict)   # JSON: what the trigger saw (kept in the inbox)
    episode: str = ""              # rule+alert fingerprint / rule+node: what a fallback revert watches
    series: dict[str, str] = field(default_factory=dict)       # metric / mismatch: the series it holds on (recheck)


class StoredEvent(BaseModel):
    """What the inbox keeps of a trigger event (the rule, key and kind are columns of their own)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    description: str = ""
    labels: dict[str, str] = {}
    node: str | None = None
    started_at: float | None = None
    received_ts: float | None = None
    firing: bool = True
    details: dict[str, object] = {}
    episode: str = ""
    series: dict[str, str] = {}


def event_to_dict(ev: TriggerEvent) -> dict[str, object]:
    """The inbox's JSON of a trigger event."""
    stored = StoredEvent(description=ev.description, labels=ev.labels, node=ev.node, started_at=ev.started_at,
                         received_ts=ev.received_ts, firing=ev.firing, details=ev.details, episode=ev.episode,
                         series=ev.series)
    # pydantic's JSON form of a model is typed dict[str, Any]: it is JSON, an object
    return cast("dict[str, object]", stored.model_dump(mode="json"))


def event_from_dict(rule: Rule, key: str, kind: str, d: Mapping[str, object]) -> TriggerEvent:
    """The trigger event an inbox entry holds, for ``rule`` of the current policy."""
    e = StoredEvent.model_validate(d)
    received = e.received_ts or time.time()
    return TriggerEvent(rule=rule, kind=kind, key=key, description=e.description, labels=dict(e.labels), node=e.node,
                        started_at=e.started_at or received, received_ts=received, firing=e.firing,
                        details=dict(e.details), episode=e.episode, series=dict(e.series))


def resolve_target(rule: Rule, labels: Mapping[str, str]) -> tuple[dict[str, str], str]:
    """Target names from the rule's literals and the trigger's labels; an error message when invalid.

    A ``{from: workload}`` field is left out: :func:`resolve_rule_target` resolves it.
    """
    out: dict[str, str] = {}
    for fld, spec in rule.target.items():
        if spec.from_workload:
            continue
        if spec.literal is not None:
            v: str | None = spec.literal
        else:
            v = labels.get(spec.label or "") or spec.default
            if not v:
                return out, f"target {fld}: label {spec.label!r} is missing and there is no default"
        if v is None or len(v) > 253 or not _K8S_NAME.match(v):
            return out, f"target {fld}: {v!r} is not a valid Kubernetes name"
        out[fld] = v
    return out, ""


@dataclass
class TargetResolution:
    """A rule's target for one trigger: the names, or why there are none."""

    target: dict[str, str]
    error: str = ""
    rail: str = "target"          # the rail that suppresses an error (``namespace``: outside the allow-list)
    transient: bool = False       # the error may go away (the API did not answer): a failed decision, not a rail
    owner: Owner | None = None    # the workload a ``{from: workload}`` field resolved to
    workload: dict[str, str] | None = None   # the workload a knobs file was named from (off Kubernetes)


def _knobs_file_target(rule: Rule, params: KnobsFileParams, labels: Mapping[str, str]) -> TargetResolution:
    spec = rule.target["workload"]
    target, err = filefallback.resolve(params, labels, spec.workload_label)
    if err:
        return TargetResolution(target, f"target workload: {err}")
    wl = {"workload": target["workload"], "name": target["name"], "namespace": target.get("namespace", ""),
          "pod": labels.get("pod") or "", "via": "label"}
    return TargetResolution(target, workload=wl)


def resolve_rule_target(rule: Rule, labels: Mapping[str, str], resolver: WorkloadResolver | None, *,
                        namespaces: tuple[str, ...] = (), now: float | None = None) -> TargetResolution:
    """:func:`resolve_target`, then the ``{from: workload}`` field: the trigger's ``workload`` label or its
    ``pod`` resolved through ownerReferences (``triscope.remediation.workloads``).  Pods are looked up
    only in namespaces of the allow-list ``namespaces`` (outside it the namespace rail answers).

    A knobs-file fallback (``rule.knobs_file``) is named by the ``workload`` label alone
    (``triscope.remediation.filefallback``): no pod lookup, no namespace needed."""
    if isinstance(rule.params, KnobsFileParams):
        return _knobs_file_target(rule, rule.params, labels)
    target, err = resolve_target(rule, labels)
    if err:
        return TargetResolution(target, err)
    if rule.action == "isolate_accelerator":
        acc = accelerator_name(labels)
        if not acc:
            return TargetResolution(target, "the trigger names no accelerator (no gpu or npu label): nothing to isolate")
        target["accelerator"] = acc
        target["state"] = labels.get("state") or rule.trigger.state or rule.trigger.kind
    if isinstance(rule.params, CommandParams):
        for name in rule.params.uses:
            if name in TARGET_PLACEHOLDERS:
                continue    # a target field: resolved above (or below, {from: workload})
            v = labels.get(name) or ""
            if not v:
                return TargetResolution(target, f"the argv's {{{name}}}: the trigger has no {name!r} label")
            if v.startswith("-") or len(v) > 253 or not _K8S_NAME.match(v):
                return TargetResolution(target, f"the argv's {{{name}}}: {v!r} is not a valid Kubernetes name")
            target[name] = v
    fld = rule.workload_field
    if fld is None:
        return TargetResolution(target)
    ns = target.get("namespace", "")
    if namespaces and ns not in namespaces:
        return TargetResolution(target, f"namespace {ns!r} is not in the allow-list {list(namespaces)} (its workload "
                                "was not looked up)", rail="namespace")
    try:
        owner = target_owner(rule.target[fld], labels, ns, resolver, kind="Deployment", now=now)
    except ResolveError as e:
        return TargetResolution(target, f"target {fld}: {e.reason}", transient=e.transient)
    if len(owner.name) > 253 or not _K8S_NAME.match(owner.name):
        return TargetResolution(target, f"target {fld}: {owner.name!r} is not a valid Kubernetes name")
    target[fld] = owner.name
    return TargetResolution(target, owner=owner)


def target_key(rule: Rule, target: Mapping[str, str]) -> tuple[str, str]:
    """(key for cooldowns and the breaker, human description)."""
    a, p = rule.action, rule.params
    if a == "rolling_restart":
        return f"deployment/{target['namespace']}/{target['deployment']}", f"deployment {target['namespace']}/{target['deployment']}"
    if isinstance(p, KnobsFileParams):
        return filefallback.target_key(target)
    if isinstance(p, DependencyFallbackParams):
        cm, key = per_workload(p.configmap, target), per_workload(p.key, target)
        return f"configmap/{target['namespace']}/{cm}/{key}", f"configmap {target['namespace']}/{cm} key {key}"
    if a == "isolate_accelerator":
        return (f"accelerator/{target['node']}/{target['accelerator']}",
                f"{target['accelerator']} on node {target['node']}")
    if a == "reschedule":
        return (f"node/{target['node']}/deployment/{target['namespace']}/{target['deployment']}",
                f"deployment {target['namespace']}/{target['deployment']} off node {target['node']}")
    where = target.get("node", "local")
    program = p.argv[0] if isinstance(p, CommandParams) else a
    carried = [f"{n}={target[n]}" for n in (p.uses if isinstance(p, CommandParams) else []) if n != "node" and n in target]
    if carried:   # one cooldown per target the argv carries
        return (f"command/{where}/{rule.name}/{','.join(carried)}",
                f"command {program} for {' '.join(carried)} on {where}")
    return f"command/{where}/{rule.name}", f"command {program} for {where}"


def alert_fingerprint(labels: Mapping[str, str]) -> str:
    plain: dict[str, str] = dict(labels)
    return hashlib.sha256(json.dumps(plain, sort_keys=True).encode()).hexdigest()[:16]


def match_alert(rule: Rule, labels: Mapping[str, str]) -> bool:
    t = rule.trigger
    return t.kind == "alert" and labels.get("alertname") == t.alert and all(m.matches(labels) for m in t.matchers)


def alert_events(rules: tuple[Rule, ...], alert: WebhookAlert, common_labels: Mapping[str, str],
                 received_ts: float) -> list[TriggerEvent]:
    """The trigger events one (validated) Alertmanager alert produces: one per matching rule."""
    labels = {**common_labels, **alert.labels}
    fp = alert.fingerprint or alert_fingerprint(alert.labels)
    starts = alert.startsAt.text
    out = []
    for rule in rules:
        if not match_alert(rule, labels):
            continue
        out.append(TriggerEvent(
            rule=rule, kind="alert", key=f"alert:{rule.name}:{fp}:{starts}:{alert.status}",
            description=f"alert {labels.get('alertname')} {alert.status} (fingerprint {fp}, since {starts})",
            labels=labels, node=labels.get("node"), started_at=alert.startsAt.ts, received_ts=received_ts,
            firing=alert.status == "firing",
            details={"fingerprint": fp, "startsAt": starts, "endsAt": alert.endsAt, "generatorURL": alert.generatorURL},
            episode=f"alert:{rule.name}:{fp}"))
    return out


# stored-data conditions --------------------------------------------------------------------------
@dataclass
class Condition:
    holds: bool
    started_at: float | None = None
    value: float | None = None
    detail: str = ""
    series: dict[str, str] = field(default_factory=dict)
    workload: dict[str, str] = field(default_factory=dict)   # the accelerator's workload labels (own or its verdict's)


@dataclass(frozen=True)
class Verdict:
    """An accelerator's current state on a node (its verdict history's newest stretch, else its newest
    ``triscope_mismatch_state`` point at 1)."""

    state: str
    labels: dict[str, str]
    ts: float


@dataclass(frozen=True)
class Stretch:
    """One accelerator's newest verdict in the history: consecutive runs of one state naming one
    workload, from the first one's start to the last one's end."""

    accelerator: str              # gpu=0
    state: str
    workload: WorkloadKey
    start: float
    end: float

    @property
    def labels(self) -> dict[str, str]:
        """The labels its ``triscope_mismatch_state`` series carries: state, accelerator, workload."""
        wl = {a: v for a, v in zip(WORKLOAD_LABELS, self.workload, strict=True) if v}
        return {"state": self.state, **accelerator_labels(self.accelerator), **wl}


def node_labels(n: NodeInfo) -> dict[str, str]:
    """A node's stored labels as text, and its name as ``node``."""
    labels = {str(k): str(v) for k, v in cast("Mapping[str, object]", n.labels).items()}
    labels["node"] = n.name
    return labels


def node_matches(trigger: Trigger, node: str, labels: Mapping[str, str]) -> bool:
    lab = dict(labels)
    lab.setdefault("node", node)
    return all(m.matches(lab) for m in trigger.nodes)


def workload_matches(trigger: Trigger, workload: Mapping[str, str]) -> bool:
    """``workloads: [L=V, ...]`` of a metric / mismatch trigger against a condition's workload labels
    (a label the series lacks is the empty string, as in Prometheus)."""
    return all(m.matches(workload) for m in trigger.workloads)


def _run_start(ts: list[float], vals: list[float], op: str, thr: float) -> tuple[float | None, float | None]:
    """Start of the trailing run of points satisfying ``op thr`` (None when the newest point does not).
    A silence longer than ``MAX_GAP_S`` between two points ends the run: no data is no time in it."""
    f = OPS[op]
    start = None
    for t, v in zip(reversed(ts), reversed(vals), strict=True):
        if v != v or not f(v, thr) or (start is not None and start - t > MAX_GAP_S):  # NaN never satisfies
            break
        start = t
    return start, (vals[-1] if vals else None)


def accelerator_of(labels: Mapping[str, str]) -> AcceleratorKey:
    """The accelerator a series is about (``(("gpu", "0"),)``, ``(("npu", "1"), ("chip", "0"))``); () for a node series."""
    return tuple((a, labels[a]) for a in ACCELERATOR_LABELS if labels.get(a))


def workload_labels(labels: Mapping[str, str]) -> dict[str, str]:
    """The workload labels of a series ({} when it names no pod or workload)."""
    if not (labels.get("pod") or labels.get("workload")):
        return {}
    return {a: labels.get(a) or "" for a in WORKLOAD_LABELS}


# the verdict history -----------------------------------------------------------------------------
def _run_order(r: VerdictRun) -> tuple[float, float]:
    return r.start, r.end


def stretches(store: StoreReader, node: str, since: float, now: float) -> dict[str, Stretch] | None:
    """Each accelerator's newest verdict on ``node`` from the verdict history, up to ``now``; None when the
    history holds nothing for the node since ``since`` (a store written before it existed: read the
    series instead)."""
    runs = [r for r in store.verdict_runs(node, since, now) if r.start <= now]
    if not runs:
        return None
    by_acc: dict[str, list[VerdictRun]] = {}
    for r in runs:
        if r.accelerator:       # "": the node's roll-up, which never triggers
            by_acc.setdefault(r.accelerator, []).append(r)
    out: dict[str, Stretch] = {}
    for acc, rs in by_acc.items():
        rs.sort(key=_run_order)
        last = rs[-1]
        start = last.start
        for r in reversed(rs[:-1]):
            # an earlier run of the same verdict continues the stretch only across a gap the history
            # itself would have joined: a silence (the agent down) is no time in the state
            if r.state != last.state or r.workload != last.workload or start - r.end > MAX_GAP_S:
                break
            start = r.start
        out[acc] = Stretch(acc, last.state, last.workload, start, min(last.end, now))
    return out


def accelerator_verdicts(store: StoreReader, node: str, now: float, stale_s: float) -> dict[AcceleratorKey, Verdict]:
    """Each accelerator's current verdict on ``node``: its newest stretch in the verdict history, still
    published (within ``stale_s``); without history, its newest fresh state series at 1."""
    found = stretches(store, node, now - stale_s, now)
    if found is None:
        return _series_verdicts(store, node, now, stale_s)
    return {accelerator_of(st.labels): Verdict(st.state, st.labels, st.end) for st in found.values()
            if now - st.end <= stale_s}


def _series_verdicts(store: StoreReader, node: str, now: float, stale_s: float) -> dict[AcceleratorKey, Verdict]:
    out: dict[AcceleratorKey, Verdict] = {}
    for lv in store.latest(node, metric=MISMATCH_METRIC, since=now - stale_s):
        acc = accelerator_of(lv.info.labels)
        if not acc or lv.value < 0.5 or lv.ts > now + 1.0:
            continue
        cur = out.get(acc)
        if cur is None or lv.ts > cur.ts:
            out[acc] = Verdict(lv.info.labels.get("state", ""), dict(lv.info.labels), lv.ts)
    return out


def _stretch_condition(st: Stretch, node: str, for_s: float, now: float, stale_s: float) -> Condition:
    labels = st.labels
    what = f"{MISMATCH_METRIC}{_fmt(labels)}"
    if now - st.end > stale_s:
        return Condition(False, value=1.0, series=labels, detail=f"{what} on {node}: last published {now - st.end:.0f}s ago")
    held = st.end - st.start
    if held + 1e-6 >= for_s:
        return Condition(True, started_at=st.start, value=1.0, series=labels,
                         detail=f"{what}=1 >= 0.5 for {held:.0f}s on {node}")
    return Condition(False, value=1.0, series=labels,
                     detail=f"{what}=1 >= 0.5 only for {held:.0f}s (needs {for_s:g}s) on {node}")


def verdict_conditions(store: StoreReader, state: str, node: str, for_s: float, now: float, stale_s: float,
                       only: Mapping[str, str] | None = None) -> list[Condition] | None:
    """One condition per accelerator of ``node`` whose newest verdict is ``state`` (and whose labels
    include ``only``), from the verdict history; None without history (then the series answer)."""
    lookback = max(2.0 * for_s, for_s + 120.0, stale_s * 2)
    out: list[Condition] = []
    for _attempt in range(2):
        found = stretches(store, node, now - lookback, now)
        if found is None:
            return None
        out = [_stretch_condition(st, node, for_s, now, stale_s) for st in found.values() if st.state == state]
        out = [c for c in out if all(c.series.get(a) == v for a, v in (only or {}).items())]
        if not any(c.holds and c.started_at is not None and c.started_at <= now - lookback for c in out):
            break
        lookback *= 4  # a stretch reaches the window's start: look further back for an earlier run of it
    return out


def xid_workload(store: StoreReader, node: str, gpu: str, ts: float, stale_s: float) -> dict[str, str]:
    """The workload labels of GPU ``gpu``'s verdict at ``ts`` (its newest verdict up to it), {} when none is stored."""
    runs = store.verdict_runs(node, ts - max(stale_s, 60.0), ts + 5.0)
    if not runs:
        return _xid_series_workload(store, node, gpu, ts, stale_s)
    mine = [r for r in runs if r.accelerator == f"gpu={gpu}" and r.start <= ts + 5.0]
    if not mine:
        return {}
    best = sorted(mine, key=_run_order)[-1]
    return workload_labels(dict(zip(WORKLOAD_LABELS, best.workload, strict=True)))


def _xid_series_workload(store: StoreReader, node: str, gpu: str, ts: float, stale_s: float) -> dict[str, str]:
    best: tuple[float, dict[str, str]] | None = None
    for sd in store.query(MISMATCH_METRIC, node=node, labels={"gpu": gpu}, start=ts - max(stale_s, 60.0), end=ts + 5.0,
                          max_points=None):
        for t, v in zip(reversed(sd.ts), reversed(sd.values), strict=True):
            if v >= 0.5:
                if best is None or t > best[0]:
                    best = (t, dict(sd.info.labels))
                break
    return workload_labels(best[1]) if best else {}


# series ------------------------------------------------------------------------------------------
def _series_condition(sd: SeriesData, metric: str, node: str, op: str, thr: float, for_s: float, now: float,
                      stale_s: float) -> Condition:
    labels = dict(sd.info.labels)
    if now - sd.ts[-1] > stale_s:
        return Condition(False, detail=f"{metric} on {node}: newest point is {now - sd.ts[-1]:.0f}s old", series=labels)
    start, last = _run_start(sd.ts, sd.values, op, thr)
    if start is None or last is None:
        return Condition(False, value=last, detail=f"{metric}={last:g} on {node}: not {op} {thr:g}", series=labels)
    held = sd.ts[-1] - start
    if held + 1e-6 >= for_s:
        return Condition(True, started_at=start, value=last, series=labels,
                         detail=f"{metric}{_fmt(labels)}={last:g} {op} {thr:g} for {held:.0f}s on {node}")
    return Condition(False, value=last, series=labels,
                     detail=f"{metric}={last:g} {op} {thr:g} only for {held:.0f}s (needs {for_s:g}s) on {node}")


def series_conditions(store: StoreReader, metric: str, node: str, labels: Mapping[str, str], op: str, thr: float,
                      for_s: float, now: float, stale_s: float) -> list[Condition]:
    """One condition per series of ``metric`` on ``node`` (whose labels include ``labels``): does it
    satisfy ``op thr`` for at least ``for_s`` up to now?"""
    lookback = max(2.0 * for_s, for_s + 120.0, stale_s * 2)
    out: list[Condition] = []
    for _attempt in range(2):
        data = store.query(metric, node=node, labels=labels or None, start=now - lookback, end=now, max_points=None)
        out, extend = [], False
        for sd in data:
            if not sd.ts:
                continue
            c = _series_condition(sd, metric, node, op, thr, for_s, now, stale_s)
            if c.holds and c.started_at is not None and c.started_at <= sd.ts[0]:
                extend = True
            out.append(c)
        if not extend:
            break
        lookback *= 4  # a run covers the whole window: look further back for its real start
    return out


def eval_series_condition(store: StoreReader, metric: str, node: str, labels: Mapping[str, str], op: str, thr: float,
                          for_s: float, now: float, stale_s: float) -> Condition:
    """Does any series of ``metric`` on ``node`` satisfy ``op thr`` for at least ``for_s`` up to now?"""
    return _best(series_conditions(store, metric, node, labels, op, thr, for_s, now, stale_s),
                 f"no data for {metric} on {node}")


def _started(c: Condition) -> float:
    return c.started_at or 0.0


def _best(conds: list[Condition], none: str) -> Condition:
    """The holding condition that started first, else the first one that does not hold."""
    holding = sorted((c for c in conds if c.holds), key=_started)
    if holding:
        return holding[0]
    return conds[0] if conds else Condition(False, detail=none)


def _fmt(labels: Mapping[str, str]) -> str:
    return "{" + ",".join(f"{k}={v}" for k, v in sorted(labels.items())) + "}" if labels else ""


def _acc_text(acc: AcceleratorKey) -> str:
    return " ".join(f"{a} {v}" for a, v in acc)


def _mismatch_conditions(store: StoreReader, trigger: Trigger, node: str, now: float, stale_s: float,
                         only: Mapping[str, str] | None) -> list[Condition]:
    conds = verdict_conditions(store, trigger.state, node, trigger.for_s, now, stale_s, only)
    if conds is None:   # no verdict history for the node: its state series
        want = {"state": trigger.state, **(only or {})}
        conds = [c for c in series_conditions(store, MISMATCH_METRIC, node, want, ">=", 0.5, trigger.for_s, now,
                                              stale_s) if accelerator_of(c.series)]
    for c in conds:
        c.workload = workload_labels(c.series)
    return conds


def accelerator_conditions(store: StoreReader, trigger: Trigger, node: str, now: float, stale_s: float,
                           only: Mapping[str, str] | None = None) -> list[Condition]:
    """The ``metric`` / ``mismatch`` condition of each series on ``node``, with the workload it is about.

    ``mismatch``: each accelerator whose verdict is the state (the node's roll-up, which has no
    accelerator labels, never triggers); the workload is the one the verdict names.  ``metric``: every
    series of the metric; the workload is the series' own labels, else its accelerator's verdict's.
    A series of an accelerator whose verdict is ``idle`` or ``demand-limited`` does not hold: such an
    accelerator is not held back by anything.  ``only``: just the series with these labels (a recheck).
    """
    if trigger.kind == "mismatch":
        return _mismatch_conditions(store, trigger, node, now, stale_s, only)
    want = {**dict(trigger.labels), **(only or {})}
    conds = series_conditions(store, trigger.metric, node, want, trigger.op, trigger.threshold, trigger.for_s, now,
                              stale_s)
    verdicts: dict[AcceleratorKey, Verdict] | None = None
    for c in conds:
        acc = accelerator_of(c.series)
        own = workload_labels(c.series)
        if not acc:
            c.workload = own
            continue
        if verdicts is None:
            verdicts = accelerator_verdicts(store, node, now, stale_s)
        v = verdicts.get(acc)
        if v is not None and v.state in QUIET_STATES and c.holds:
            c.holds = False
            c.detail = f"{c.detail}; but {_acc_text(acc)} is {v.state}: an accelerator that is {v.state} never triggers"
        c.workload = own or (workload_labels(v.labels) if v is not None else {})
    return conds


_SLO_CACHE: dict[str, tuple[float, dict[str, SLOSpec]]] = {}


def _slo_specs(path: str) -> dict[str, SLOSpec]:
    mtime = os.stat(path).st_mtime
    hit = _SLO_CACHE.get(path)
    if hit is None or hit[0] != mtime:
        specs = {s.id: s for s in load_slo_file(path)}
        specs.update({s.name: s for s in list(specs.values())})
        hit = (mtime, specs)
        _SLO_CACHE[path] = hit
    return hit[1]


def _slo_status(store: StoreReader, trigger: Trigger, node: str, now: float) -> tuple[str | None, str]:
    """The SLO's multi-window burn-rate status on ``node`` from ``triscope.analysis.slo`` (page / ticket / ok /
    no data / not enough data yet: only page and ticket hold)."""
    try:
        spec = _slo_specs(trigger.slo_file).get(trigger.slo)
        if spec is None:
            return None, f"no SLO {trigger.slo!r} in {trigger.slo_file}"
        st = evaluate_slo(store, spec, now, node=node)
    except Exception as e:  # noqa: BLE001 - a broken spec file, no data...: the condition does not hold, says why
        return None, f"SLO {trigger.slo}: {type(e).__name__}: {e}"
    # a window short of data has no burn rate and decides no alert (so no page / ticket status)
    burns: dict[str, str | float] = {k: (w.state if w.burn_rate is None else round(w.burn_rate, 2))
                                     for k, w in st.windows.items()}
    return st.status, f"SLO {spec.id} on {node}: {st.status} (burn rates {burns})"


def evaluate_condition(store: StoreReader, trigger: Trigger, node: str, now: float, stale_s: float) -> Condition:
    """The condition on ``node`` as a whole (any series holding; for ``mismatch`` and ``metric`` see
    :func:`accelerator_conditions` for one per series)."""
    if trigger.kind in ("metric", "mismatch"):
        what = trigger.metric if trigger.kind == "metric" else f"{MISMATCH_METRIC}{{state={trigger.state}}}"
        return _best(accelerator_conditions(store, trigger, node, now, stale_s), f"no data for {what} on {node}")
    if trigger.kind == "slo":
        status, detail = _slo_status(store, trigger, node, now)
        holds = status == "page" or (trigger.slo_status == "ticket" and status == "ticket")
        return Condition(holds, started_at=now if holds else None, detail=detail)
    raise ValueError(f"not a stored-data condition: {trigger.kind}")


def episode_scope(series: Mapping[str, str]) -> str:
    """What one stored-data episode is about within its node: the accelerator and the workload (readable),
    and a short hash of the series' whole label set (one episode per series)."""
    acc = ",".join(f"{a}={v}" for a, v in accelerator_of(series))
    wl = series.get("workload") or (f"{series.get('namespace', '')}/{series['pod']}" if series.get("pod") else "")
    plain: dict[str, str] = dict(series)
    digest = hashlib.sha1(json.dumps(plain, sort_keys=True).encode()).hexdigest()[:10]
    return ":".join(p for p in (acc, wl[:160], digest) if p)


def _xid_events(store: StoreReader, rule: Rule, node: str, labels: dict[str, str], now: float,
                stale_s: float) -> list[TriggerEvent]:
    """One event per XID event of the rule's codes on ``node`` within its ``within``."""
    t = rule.trigger
    out = []
    for ev in store.events(node=node, start=now - t.within_s, end=now, kinds=["xid"], limit=1000):
        details = cast("Mapping[str, object]", ev.details)
        code = details.get("xid", -1)
        if not isinstance(code, int | str) or not str(code).lstrip("-").isdigit() or int(code) not in t.xid_codes:
            continue
        xid = int(code)
        gpu = str(details.get("gpu", ""))
        wl = xid_workload(store, node, gpu, ev.ts, stale_s) if gpu else {}
        own = {k: str(v) for k, v in details.items() if k in ("gpu", "xid")}
        out.append(TriggerEvent(
            rule=rule, kind="xid", key=f"xid:{rule.name}:{node}:{ev.id}",
            description=f"XID {xid} on {node} gpu {gpu or '?'}: {ev.message}", labels={**labels, **wl, **own},
            node=node, started_at=ev.ts, received_ts=now, details={"event_id": ev.id, "xid": xid},
            episode=f"xid:{rule.name}:{node}"))
    return out


def _slo_event(store: StoreReader, rule: Rule, node: str, labels: dict[str, str], now: float, stale_s: float,
               episodes: dict[tuple[str, str], float], holding: set[str]) -> TriggerEvent | None:
    t = rule.trigger
    cond = evaluate_condition(store, t, node, now, stale_s)
    ep = f"slo:{rule.name}:{node}"
    if not cond.holds:
        return None
    holding.add(ep)
    start = episodes.setdefault((rule.name, ep), cond.started_at or now)
    if now - start < t.for_s:
        return None  # the SLO status must hold for `for` (the engine's own observation of it)
    return TriggerEvent(rule=rule, kind=t.kind, key=f"{ep}:{start:.0f}", description=f"{t.describe()}: {cond.detail}",
                        labels=labels, node=node, started_at=start, received_ts=now, details={"value": cond.value},
                        episode=ep)


def _series_events(store: StoreReader, rule: Rule, node: str, labels: dict[str, str], now: float, stale_s: float,
                   episodes: dict[tuple[str, str], float], holding: set[str]) -> list[TriggerEvent]:
    t = rule.trigger
    out = []
    for cond in accelerator_conditions(store, t, node, now, stale_s):
        if not cond.holds or not workload_matches(t, cond.workload):
            continue
        ep = f"{t.kind}:{rule.name}:{node}:{episode_scope(cond.series)}"
        holding.add(ep)
        start = episodes.setdefault((rule.name, ep), cond.started_at or now)
        out.append(TriggerEvent(
            rule=rule, kind=t.kind, key=f"{ep}:{start:.0f}", description=f"{t.describe()}: {cond.detail}",
            labels={**labels, **cond.workload, **cond.series, "node": node}, node=node, started_at=start,
            received_ts=now, details={"value": cond.value, "workload": cond.workload}, episode=ep,
            series=cond.series))
    return out


def stored_data_events(store: StoreReader, rule: Rule, now: float, stale_s: float,
                       episodes: dict[tuple[str, str], float]) -> list[TriggerEvent]:
    """Trigger events for one stored-data rule over every matching node.

    ``metric`` and ``mismatch``: one event per series that holds, so one per (node, accelerator,
    workload) for per-accelerator data, never one for a node's accelerators together; ``xid``: one
    per event; ``slo``: one per node.  Each event's labels are the node's stored labels, the
    workload labels and the series' labels, and ``node``: what its target is resolved from.
    """
    t = rule.trigger
    out: list[TriggerEvent] = []
    holding: set[str] = set()
    for n in store.nodes():
        labels = node_labels(n)
        if not node_matches(t, n.name, labels):
            continue
        if t.kind == "xid":
            out += _xid_events(store, rule, n.name, labels, now, stale_s)
        elif t.kind == "slo":
            ev = _slo_event(store, rule, n.name, labels, now, stale_s, episodes, holding)
            out += [ev] if ev is not None else []
        else:
            out += _series_events(store, rule, n.name, labels, now, stale_s, episodes, holding)
    for key in [kk for kk in episodes if kk[0] == rule.name and kk[1] not in holding]:
        del episodes[key]
    return out


def recheck(store: StoreReader, ev: TriggerEvent, now: float, stale_s: float) -> tuple[bool, str]:
    """Re-check a stored-data trigger right before acting: is the condition still true (for its series)?"""
    if ev.kind in ("metric", "mismatch") and ev.node:
        conds = accelerator_conditions(store, ev.rule.trigger, ev.node, now, stale_s, only=ev.series or None)
        if ev.series:
            conds = [c for c in conds if c.series == ev.series]
        cond = _best(conds, f"no data for the series {_fmt(ev.series)} on {ev.node}")
        return cond.holds, cond.detail
    if ev.kind == "slo" and ev.node:
        cond = evaluate_condition(store, ev.rule.trigger, ev.node, now, stale_s)
        return cond.holds, cond.detail
    return True, ""


__all__ = ["Condition", "Matcher", "StoredEvent", "Stretch", "TargetResolution", "TriggerEvent", "Verdict",
           "accelerator_conditions", "accelerator_of", "accelerator_verdicts", "alert_events", "episode_scope",
           "evaluate_condition", "event_from_dict", "event_to_dict", "match_alert", "recheck", "resolve_rule_target",
           "resolve_target", "stored_data_events", "stretches", "target_key", "verdict_conditions", "workload_labels",
           "xid_workload"]
