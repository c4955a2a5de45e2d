"""Triggers: Alertmanager alerts matched to rules, and conditions evaluated on stored data.

Stored-data conditions read through the store API only (``store.query``, ``store.events``):

* ``metric``: every point of a series of the metric (counters as per-second rates) satisfies
  ``op threshold`` for at least ``for``; the newest point must be fresh.
* ``mismatch``: ``triscope_mismatch_state{state=S}`` is 1 for at least ``for``.
* ``slo``: the SLO's burn-rate status (from ``triscope.analysis.slo`` when it is installed) is ``page``
  (or ``ticket``, which ``page`` also satisfies).
* ``xid``: an ``xid`` event with one of the codes in the last ``within`` seconds; each event fires once.

A condition that holds is one *episode*; its key (rule, node, start of the run of points that hold)
is the durable dedupe key, so one episode acts once however often it is evaluated.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from triscope.remediation.policy import OPS, Matcher, Rule, Trigger
from triscope.store.reader import StoreReader

log = logging.getLogger(__name__)

MISMATCH_METRIC = "triscope_mismatch_state"
_K8S_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")


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
    details: dict[str, Any] = field(default_factory=dict)
    episode: str = ""              # rule+alert fingerprint / rule+node: what a fallback revert watches


def event_to_dict(ev: TriggerEvent) -> dict[str, Any]:
    """What the inbox keeps of a trigger event (the rule, key and kind are columns of their own)."""
    return {"description": ev.description, "labels": dict(ev.labels), "node": ev.node, "started_at": ev.started_at,
            "received_ts": ev.received_ts, "firing": ev.firing, "details": json.loads(json.dumps(ev.details, default=str)),
            "episode": ev.episode}


def event_from_dict(rule: Rule, key: str, kind: str, d: dict[str, Any]) -> TriggerEvent:
    """The trigger event an inbox entry holds, for ``rule`` of the current policy."""
    received = float(d.get("received_ts") or time.time())
    return TriggerEvent(rule=rule, kind=kind, key=key, description=str(d.get("description") or ""),
                        labels={str(a): str(b) for a, b in (d.get("labels") or {}).items()}, node=d.get("node"),
                        started_at=float(d.get("started_at") or received), received_ts=received,
                        firing=bool(d.get("firing", True)), details=dict(d.get("details") or {}),
                        episode=str(d.get("episode") or ""))


def resolve_target(rule: Rule, labels: dict[str, str]) -> tuple[dict[str, str], str]:
    """Target names from the rule's literals and the trigger's labels; an error message when invalid."""
    out: dict[str, str] = {}
    for fld, spec in rule.target.items():
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


def target_key(rule: Rule, target: dict[str, str]) -> tuple[str, str]:
    """(key for cooldowns and the breaker, human description)."""
    a = rule.action
    if a == "rolling_restart":
        return f"deployment/{target['namespace']}/{target['deployment']}", f"deployment {target['namespace']}/{target['deployment']}"
    if a == "dependency_fallback":
        p = rule.params
        return (f"configmap/{target['namespace']}/{p['configmap']}/{p['key']}",
                f"configmap {target['namespace']}/{p['configmap']} key {p['key']}")
    if a == "reschedule":
        return (f"node/{target['node']}/deployment/{target['namespace']}/{target['deployment']}",
                f"deployment {target['namespace']}/{target['deployment']} off node {target['node']}")
    where = target.get("node", "local")
    return f"command/{where}/{rule.name}", f"command {rule.params['argv'][0]} for {where}"


def parse_rfc3339(value: str) -> float | None:
    if not isinstance(value, str) or not value:
        return None
    v = value.strip().replace("Z", "+00:00")
    # Alertmanager sends nanoseconds; Python parses at most microseconds
    if "." in v:
        head, _, rest = v.partition(".")
        frac = rest[: len(rest) - len(rest.lstrip("0123456789"))]
        tz = rest[len(frac):]
        v = f"{head}.{frac[:6]}{tz}"
    try:
        dt = datetime.fromisoformat(v)
    except ValueError:
        return None
    if dt.tzinfo is None:
        return None
    return dt.timestamp()


def alert_fingerprint(labels: dict[str, str]) -> str:
    return hashlib.sha256(json.dumps(labels, sort_keys=True).encode()).hexdigest()[:16]


def match_alert(rule: Rule, labels: dict[str, str]) -> bool:
    t = rule.trigger
    return t.kind == "alert" and labels.get("alertname") == t.alert and all(m.matches(labels) for m in t.matchers)


def alert_events(rules: tuple[Rule, ...], alert: dict[str, Any], common_labels: dict[str, str],
                 received_ts: float) -> list[TriggerEvent]:
    """The trigger events one (validated) Alertmanager alert produces: one per matching rule."""
    labels = {**common_labels, **alert["labels"]}
    fp = alert.get("fingerprint") or alert_fingerprint(alert["labels"])
    starts = alert.get("startsAt", "")
    started = parse_rfc3339(starts) or received_ts
    firing = alert["status"] == "firing"
    out = []
    for rule in rules:
        if not match_alert(rule, labels):
            continue
        out.append(TriggerEvent(
            rule=rule, kind="alert", key=f"alert:{rule.name}:{fp}:{starts}:{alert['status']}",
            description=f"alert {labels.get('alertname')} {alert['status']} (fingerprint {fp}, since {starts})",
            labels=labels, node=labels.get("node"), started_at=started, received_ts=received_ts, firing=firing,
            details={"fingerprint": fp, "startsAt": starts, "endsAt": alert.get("endsAt", ""),
                     "generatorURL": alert.get("generatorURL", "")},
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


def node_matches(trigger: Trigger, node: str, labels: dict[str, Any]) -> bool:
    lab = {str(k): str(v) for k, v in labels.items()}
    lab.setdefault("node", node)
    return all(m.matches(lab) for m in trigger.nodes)


def _run_start(ts: list[float], vals: list[float], op: str, thr: float) -> tuple[float | None, float | None]:
    """Start of the trailing run of points satisfying ``op thr`` (None when the newest point does not)."""
    f = OPS[op]
    start = None
    for t, v in zip(reversed(ts), reversed(vals), strict=True):
        if v != v or not f(v, thr):  # NaN never satisfies
            break
        start = t
    return start, (vals[-1] if vals else None)


def eval_series_condition(store: StoreReader, metric: str, node: str, labels: dict[str, str], op: str, thr: float,
                          for_s: float, now: float, stale_s: float) -> Condition:
    """Does any series of ``metric`` on ``node`` satisfy ``op thr`` for at least ``for_s`` up to now?"""
    lookback = max(2.0 * for_s, for_s + 120.0, stale_s * 2)
    best: Condition = Condition(False, detail=f"no data for {metric} on {node}")
    for _attempt in range(2):
        data = store.query(metric, node=node, labels=labels or None, start=now - lookback, end=now, max_points=None)
        extend = False
        for sd in data:
            if not sd.ts:
                continue
            if now - sd.ts[-1] > stale_s:
                if not best.holds:
                    best = Condition(False, detail=f"{metric} on {node}: newest point is {now - sd.ts[-1]:.0f}s old")
                continue
            start, last = _run_start(sd.ts, sd.values, op, thr)
            if start is None:
                if not best.holds:
                    best = Condition(False, value=last, detail=f"{metric}={last:g} on {node}: not {op} {thr:g}")
                continue
            held = sd.ts[-1] - start
            if held + 1e-6 >= for_s:
                if start <= sd.ts[0] and sd.ts[0] > now - lookback * 4:
                    extend = True
                if not best.holds or start < (best.started_at or start):
                    best = Condition(True, started_at=start, value=last, series=dict(sd.info.labels),
                                     detail=f"{metric}{_fmt(sd.info.labels)}={last:g} {op} {thr:g} for {held:.0f}s on {node}")
            elif not best.holds:
                best = Condition(False, value=last, detail=f"{metric}={last:g} {op} {thr:g} only for {held:.0f}s "
                                 f"(needs {for_s:g}s) on {node}")
        if not (best.holds and extend):
            break
        lookback *= 4  # the run covers the whole window: look further back for its real start
    return best


def _fmt(labels: dict[str, str]) -> str:
    return "{" + ",".join(f"{k}={v}" for k, v in sorted(labels.items())) + "}" if labels else ""


_SLO_CACHE: dict[str, tuple[float, dict[str, Any]]] = {}


def _slo_specs(path: str) -> dict[str, Any]:
    import os

    from triscope.analysis.slo import load_slo_file

    mtime = os.stat(path).st_mtime
    hit = _SLO_CACHE.get(path)
    if hit is None or hit[0] != mtime:
        specs = {s.id: s for s in load_slo_file(path)}
        specs.update({s.name: s for s in list(specs.values())})
        hit = (mtime, specs)
        _SLO_CACHE[path] = hit
    return hit[1]


def _slo_status(store: StoreReader, trigger: Trigger, node: str, now: float) -> tuple[str | None, str]:
    """The SLO's multi-window burn-rate status on ``node`` from ``triscope.analysis.slo`` (page / ticket / ok / no data)."""
    try:
        from triscope.analysis import slo as slo_mod
    except ImportError:
        return None, "triscope.analysis.slo is not installed: SLO triggers cannot be evaluated"
    try:
        spec = _slo_specs(trigger.slo_file).get(trigger.slo)
        if spec is None:
            return None, f"no SLO {trigger.slo!r} in {trigger.slo_file}"
        st = slo_mod.evaluate(store, spec, now, node=node)
    except Exception as e:  # a broken spec file, no data...
        return None, f"SLO {trigger.slo}: {type(e).__name__}: {e}"
    burns = {k: (None if w.burn_rate is None else round(w.burn_rate, 2)) for k, w in st.windows.items()}
    return st.status, f"SLO {spec.id} on {node}: {st.status} (burn rates {burns})"


def evaluate_condition(store: StoreReader, trigger: Trigger, node: str, now: float, stale_s: float) -> Condition:
    if trigger.kind == "metric":
        return eval_series_condition(store, trigger.metric, node, dict(trigger.labels), trigger.op, trigger.threshold,
                                     trigger.for_s, now, stale_s)
    if trigger.kind == "mismatch":
        return eval_series_condition(store, MISMATCH_METRIC, node, {"state": trigger.state}, ">=", 0.5,
                                     trigger.for_s, now, stale_s)
    if trigger.kind == "slo":
        status, detail = _slo_status(store, trigger, node, now)
        holds = status == "page" or (trigger.slo_status == "ticket" and status == "ticket")
        return Condition(holds, started_at=now if holds else None, detail=detail)
    raise ValueError(f"not a stored-data condition: {trigger.kind}")


def stored_data_events(store: StoreReader, rule: Rule, now: float, stale_s: float,
                       episodes: dict[tuple[str, str], float]) -> tuple[list[TriggerEvent], set[str]]:
    """Trigger events for one stored-data rule over every matching node; also the nodes where it is clear."""
    t = rule.trigger
    out: list[TriggerEvent] = []
    clear: set[str] = set()
    for n in store.nodes():
        if not node_matches(t, n.name, n.labels):
            continue
        labels = {str(k): str(v) for k, v in (n.labels or {}).items()}
        labels["node"] = n.name
        if t.kind == "xid":
            codes = set(t.xid_codes)
            seen = False
            for ev in store.events(node=n.name, start=now - t.within_s, end=now, kinds=["xid"], limit=1000):
                try:
                    code = int(ev.details.get("xid", -1))
                except (TypeError, ValueError):
                    continue
                if code not in codes:
                    continue
                seen = True
                out.append(TriggerEvent(
                    rule=rule, kind="xid", key=f"xid:{rule.name}:{n.name}:{ev.id}",
                    description=f"XID {code} on {n.name} gpu {ev.details.get('gpu', '?')}: {ev.message}",
                    labels={**labels, **{k: str(v) for k, v in ev.details.items() if k in ("gpu", "xid")}},
                    node=n.name, started_at=ev.ts, received_ts=now, details={"event_id": ev.id, "xid": code},
                    episode=f"xid:{rule.name}:{n.name}"))
            if not seen:
                clear.add(n.name)
            continue
        cond = evaluate_condition(store, t, n.name, now, stale_s)
        ep_key = (rule.name, n.name)
        if not cond.holds:
            episodes.pop(ep_key, None)
            clear.add(n.name)
            continue
        start = episodes.setdefault(ep_key, cond.started_at or now)
        if t.kind == "slo" and now - start < t.for_s:
            continue  # the SLO status must hold for `for` (the engine's own observation of it)
        out.append(TriggerEvent(
            rule=rule, kind=t.kind, key=f"{t.kind}:{rule.name}:{n.name}:{start:.0f}",
            description=f"{t.describe()}: {cond.detail}", labels={**labels, **cond.series, "node": n.name},
            node=n.name, started_at=start, received_ts=now, details={"value": cond.value},
            episode=f"{t.kind}:{rule.name}:{n.name}"))
    return out, clear


def recheck(store: StoreReader, ev: TriggerEvent, now: float, stale_s: float) -> tuple[bool, str]:
    """Re-check a stored-data trigger right before acting: is the condition still true?"""
    if ev.kind in ("metric", "mismatch", "slo") and ev.node:
        cond = evaluate_condition(store, ev.rule.trigger, ev.node, now, stale_s)
        return cond.holds, cond.detail
    return True, ""


__all__ = ["Condition", "Matcher", "TriggerEvent", "alert_events", "evaluate_condition", "event_from_dict",
           "event_to_dict", "match_alert", "parse_rfc3339", "recheck", "resolve_target", "stored_data_events",
           "target_key", "time"]
