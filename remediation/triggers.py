"""Triggers: Alertmanager alerts matched to rules, and rules' conditions on stored data, as trigger events.

Whether a stored-data condition holds is ``triscope.remediation.conditions``; the names a rule acts on
are resolved from an event's labels by ``triscope.remediation.target_resolution``.

A condition that holds is one *episode*; its key (rule, node, the series it holds on, start of the
run of points that hold) is the durable dedupe key, so one episode acts once however often it is
evaluated.  ``metric`` and ``mismatch`` conditions hold per series: per-accelerator data gives one
episode per (node, accelerator, workload), never one per node, and its workload labels (the series'
own, else its accelerator's verdict's) are what the rule's target is resolved from.  ``xid``: an
``xid`` event with one of the codes in the last ``within`` seconds; each event fires once.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import cast

from pydantic import BaseModel, ConfigDict

from triscope.core.vocabulary import accelerator_name
from triscope.remediation.conditions import (
    VerdictReader,
    accelerator_conditions,
    best_of,
    evaluate_condition,
    fmt_labels,
    xid_workload,
)
from triscope.remediation.policy import Rule
from triscope.remediation.trigger_forms import Trigger
from triscope.remediation.webhook import WebhookAlert
from triscope.store.reader import NodeInfo, StoreReader


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


# alerts ------------------------------------------------------------------------------------------
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


# stored-data events ------------------------------------------------------------------------------
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


def episode_scope(series: Mapping[str, str]) -> str:
    """What one stored-data episode is about within its node: the accelerator and the workload (readable),
    and a short hash of the series' whole label set (one episode per series)."""
    acc = accelerator_name(series) or ""
    wl = series.get("workload") or (f"{series.get('namespace', '')}/{series['pod']}" if series.get("pod") else "")
    plain: dict[str, str] = dict(series)
    digest = hashlib.sha1(json.dumps(plain, sort_keys=True).encode()).hexdigest()[:10]
    return ":".join(p for p in (acc, wl[:160], digest) if p)


def _xid_events(store: StoreReader, rule: Rule, node: str, labels: dict[str, str], now: float,
                stale_s: float, verdicts: VerdictReader) -> list[TriggerEvent]:
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
        wl = xid_workload(store, node, gpu, ev.ts, stale_s, verdicts) if gpu else {}
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
                   episodes: dict[tuple[str, str], float], holding: set[str],
                   verdicts: VerdictReader) -> list[TriggerEvent]:
    t = rule.trigger
    out = []
    for cond in accelerator_conditions(store, t, node, now, stale_s, verdicts=verdicts):
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
                       episodes: dict[tuple[str, str], float],
                       verdicts: VerdictReader | None = None) -> list[TriggerEvent]:
    """Trigger events for one stored-data rule over every matching node.

    ``metric`` and ``mismatch``: one event per series that holds, so one per (node, accelerator,
    workload) for per-accelerator data, never one for a node's accelerators together; ``xid``: one
    per event; ``slo``: one per node.  Each event's labels are the node's stored labels, the
    workload labels and the series' labels, and ``node``: what its target is resolved from.
    ``verdicts``: the evaluation's reader of the verdict history, shared by every rule (else one for
    this rule): the history is read once for the fleet, not once per node.
    """
    t = rule.trigger
    verdicts = verdicts or VerdictReader(store)
    out: list[TriggerEvent] = []
    holding: set[str] = set()
    for n in store.nodes():
        labels = node_labels(n)
        if not node_matches(t, n.name, labels):
            continue
        if t.kind == "xid":
            out += _xid_events(store, rule, n.name, labels, now, stale_s, verdicts)
        elif t.kind == "slo":
            ev = _slo_event(store, rule, n.name, labels, now, stale_s, episodes, holding)
            out += [ev] if ev is not None else []
        else:
            out += _series_events(store, rule, n.name, labels, now, stale_s, episodes, holding, verdicts)
    for key in [kk for kk in episodes if kk[0] == rule.name and kk[1] not in holding]:
        del episodes[key]
    return out


def recheck(store: StoreReader, ev: TriggerEvent, now: float, stale_s: float) -> tuple[bool, str]:
    """Re-check a stored-data trigger right before acting: is the condition still true (for its series)?"""
    if ev.kind in ("metric", "mismatch") and ev.node:
        conds = accelerator_conditions(store, ev.rule.trigger, ev.node, now, stale_s, only=ev.series or None)
        if ev.series:
            conds = [c for c in conds if c.series == ev.series]
        cond = best_of(conds, f"no data for the series {fmt_labels(ev.series)} on {ev.node}")
        return cond.holds, cond.detail
    if ev.kind == "slo" and ev.node:
        cond = evaluate_condition(store, ev.rule.trigger, ev.node, now, stale_s)
        return cond.holds, cond.detail
    return True, ""
