"""The rule engine: triggers in, safety rails, actions out, every decision audited.

Pipeline for one trigger (an Alertmanager alert matched to a rule, or a stored-data condition):

1. ``not_firing``  — only firing alerts act (a resolved one starts a fallback's hold period instead)
2. ``leader``      — only the replica holding the Lease acts
3. ``target``      — the target resolves from the alert's / node's labels into valid names
4. ``duplicate``   — the delivery key was already handled (durable, in the store)
5. ``stale``       — the trigger started before the last circuit-breaker reset: not replayed
6. ``breaker``     — the circuit breaker is open (or this action would open it)
7. ``namespace``   — the target namespace is not on the allow-list
8. ``cooldown``    — the target was acted on less than ``cooldown`` ago (kept in the store)
9. ``rate_limit``  — the rule already took ``max_actions`` in ``per`` (counted in the audit log)
10. ``hourly_cap`` — the global cap on actions per hour
11. ``in_flight``  — the global cap on actions running at once
12. ``recheck``    — the stored-data condition no longer holds / the alert has resolved since
13. ``live_state`` — the action's own re-check of the live object (paused, degraded, already set)

Decisions run one at a time (a lock), actions run concurrently on a worker pool.  Each decision
goes to the audit table, to a ``remediation`` event on the node's timeline, to a Kubernetes Event
(when an API is configured) and to ``triscope_remediation_actions_total{action,outcome}``.
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from remediation import actions as act
from remediation import kube as k
from remediation import metrics
from remediation.leader import LeaderElector
from remediation.policy import Policy, Rule, load_policy
from remediation.triggers import TriggerEvent, alert_events, recheck, stored_data_events
from store import audit
from triscope.samples import EventRecord

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_POLICY = REPO_ROOT / "deploy" / "policy.example.yaml"
_K8S_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
QUIET_RAILS = ("duplicate", "leader", "not_firing")  # audited only: a timeline / Kubernetes Event each would flood


@dataclass(frozen=True)
class Decision:
    outcome: str
    rail: str | None = None
    reason: str = ""
    audit_id: int | None = None


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


class DecisionWindow:
    """Recent counted decisions (acted, dry-run, failed, in progress), rebuilt from the audit log.

    The audit log in the store is the durable record that rate limits, the hourly cap and the
    breaker window are counted from; this keeps the same counts in memory so a decision does not
    re-scan the log (the scans grew with the log: O(n) per decision).  It is rebuilt from the store
    when the engine starts and whenever this replica becomes the leader.
    """

    def __init__(self, horizon_s: float) -> None:
        self.horizon_s = horizon_s
        self.all: list[float] = []
        self.by_rule: dict[str, list[float]] = {}
        self.targets: dict[str, float] = {}
        self.nodes: dict[str, float] = {}

    def load(self, store: Any, now: float) -> None:
        self.__init__(self.horizon_s)  # type: ignore[misc]
        rows = audit.audit_log(store, since=now - self.horizon_s, outcome=audit.COUNTED, limit=10_000_000,
                               newest_first=False)
        for r in rows:
            self.add(r.rule, r.target_key, r.node, r.ts)

    def add(self, rule: str, target_key: str, node: str | None, ts: float) -> None:
        self.all.append(ts)
        self.by_rule.setdefault(rule, []).append(ts)
        if target_key:
            self.targets[target_key] = max(ts, self.targets.get(target_key, 0.0))
        if node:
            self.nodes[node] = max(ts, self.nodes.get(node, 0.0))

    @staticmethod
    def _count(xs: list[float], since: float) -> int:
        import bisect

        return len(xs) - bisect.bisect_left(xs, since)

    def count(self, since: float, rule: str | None = None) -> int:
        return self._count(self.all if rule is None else self.by_rule.get(rule, []), since)

    def hit(self, since: float) -> tuple[set[str], set[str]]:
        return ({t for t, ts in self.targets.items() if ts >= since}, {n for n, ts in self.nodes.items() if ts >= since})

    def trim(self, now: float) -> None:
        import bisect

        cut = now - self.horizon_s
        for xs in [self.all, *self.by_rule.values()]:
            i = bisect.bisect_left(xs, cut)
            if i:
                del xs[:i]
        for d in (self.targets, self.nodes):
            for key in [kk for kk, ts in d.items() if ts < cut]:
                del d[key]


class Engine:
    """Policies + store + (optional) Kubernetes adapter.  ``submit`` / ``submit_alerts`` feed it."""

    def __init__(self, store: Any, policy: Policy, *, kube: k.KubeAdapter | None = None, dry_run: bool = False,
                 leader: LeaderElector | None = None) -> None:
        self.store = store
        self.policy = policy
        self.settings = policy.settings
        self.dry_run = bool(dry_run or policy.settings.dry_run)
        self.kube = kube
        self.leader = leader
        self.engine_id = policy.settings.engine_id
        self._decide = threading.Lock()
        self._state = threading.Lock()
        self._in_flight = 0
        self._pending = 0
        self._idle = threading.Condition(self._state)
        self._pool = ThreadPoolExecutor(max_workers=policy.settings.workers, thread_name_prefix="remediation")
        self._side = ThreadPoolExecutor(max_workers=2, thread_name_prefix="remediation-events")
        self._seen: dict[str, float] = {}          # stored-data keys already submitted (avoid re-queueing)
        self._resolved: dict[str, float] = {}      # alert episode -> when a resolved notification came
        self._episodes: dict[tuple[str, str], float] = {}
        self._stop = threading.Event()
        self.stale_s = max(60.0, 4 * policy.settings.evaluate_interval_s)
        self.alert_rules = tuple(r for r in policy.rules if r.trigger.kind == "alert")
        self.data_rules = tuple(r for r in policy.rules if r.trigger.kind != "alert")
        metrics.LEADER.set(1 if leader is None else 0)
        self.window = DecisionWindow(max([3600.0, policy.settings.breaker.window_s] + [r.per_s for r in policy.rules]))
        self.window.load(store, time.time())
        self._has_fallbacks = any(r.action == "dependency_fallback" for r in policy.rules) or bool(
            audit.active_fallbacks(store))
        self._nodes_cache: tuple[float, int] = (0.0, 0)

    # intake ------------------------------------------------------------------------------------------
    def submit(self, ev: TriggerEvent) -> Future[Decision]:
        with self._state:
            self._pending += 1
        fut = self._pool.submit(self._handle_counted, ev)
        return fut

    def _handle_counted(self, ev: TriggerEvent) -> Decision:
        try:
            return self.handle(ev)
        except Exception as e:  # never lose a worker; the failure is audited
            log.exception("remediation: rule %s failed", ev.rule.name)
            return self._record(ev, None, "failed", None, f"internal error: {type(e).__name__}: {e}", {})
        finally:
            with self._state:
                self._pending -= 1
                self._idle.notify_all()

    def submit_alerts(self, payload: dict[str, Any], received_ts: float | None = None) -> tuple[int, int]:
        """Queue every (alert, matching rule) of a validated Alertmanager v4 payload; (alerts, matched)."""
        received = time.time() if received_ts is None else received_ts
        common = {str(a): str(b) for a, b in (payload.get("commonLabels") or {}).items()}
        matched = 0
        for alert in payload["alerts"]:
            for ev in alert_events(self.alert_rules, alert, common, received):
                matched += 1
                if ev.firing:
                    self._note_firing(ev)
                else:
                    self._note_resolved(ev)  # in arrival order, before any later firing of the same alert
                self.submit(ev)
        return len(payload["alerts"]), matched

    def drain(self, timeout: float = 30.0) -> bool:
        """Wait until every submitted trigger is decided and its action finished (tests, shutdown)."""
        deadline = time.monotonic() + timeout
        with self._state:
            while self._pending > 0:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(left)
        return True

    # the decision ------------------------------------------------------------------------------------
    def handle(self, ev: TriggerEvent) -> Decision:
        rule = ev.rule
        if not ev.firing:
            return self._record(ev, None, "suppressed", "not_firing", "alert resolved: only firing alerts act", {})
        if self.leader is not None and not self.leader.is_leader:
            return self._record(ev, None, "suppressed", "leader", f"not the leader (lease "
                                f"{self.leader.namespace}/{self.leader.name})", {})
        target, err = resolve_target(rule, ev.labels)
        if err:
            if not audit.claim_delivery(self.store, ev.key, ev.received_ts):
                return self._record(ev, None, "suppressed", "duplicate", "delivery already handled", {})
            return self._record(ev, None, "suppressed", "target", err, {})
        tkey, tdesc = target_key(rule, target)
        tinfo: dict[str, Any] = {"target": tdesc, "target_key": tkey, "namespace": target.get("namespace"),
                 "node": target.get("node") or ev.node, "target_fields": target}
        if not audit.claim_delivery(self.store, ev.key, ev.received_ts):
            return self._record(ev, tinfo, "suppressed", "duplicate", "delivery already handled", {})
        dry = self.dry_run or rule.dry_run
        with self._decide:
            now = time.time()
            rail, reason = self._rails(ev, rule, tinfo, now)
            if rail:
                return self._record(ev, tinfo, "suppressed", rail, reason, {})
            audit_id = audit.reserve_action(
                self.store, tkey, ts=now, engine_id=self.engine_id, rule=rule.name, trigger_kind=ev.kind,
                trigger=ev.description, trigger_key=ev.key, action=rule.action, target=tdesc,
                node=tinfo["node"], namespace=tinfo["namespace"], outcome=audit.IN_PROGRESS, dry_run=dry,
                params={**rule.params, "target": target}, received_ts=ev.received_ts)
            self.window.add(rule.name, tkey, tinfo.get("node") or None, now)
            with self._state:
                self._in_flight += 1
                metrics.IN_FLIGHT.set(self._in_flight)
        issued: list[float] = []
        ctx = act.ActionContext(rule_name=rule.name, action=rule.action, params=rule.params, target=target,
                                target_key=tkey, dry_run=dry, kube=self.kube, store=self.store,
                                engine_id=self.engine_id, trigger_key=ev.key, episode=ev.episode,
                                on_issued=issued.append, stop=self._stop)
        try:
            result = act.RUNNERS[rule.action](ctx)
        except k.KubeError as e:
            result = act.ActionResult("failed", str(e), {"error": e.answer()})
        except Exception as e:
            log.exception("remediation action %s failed", rule.action)
            result = act.ActionResult("failed", f"{type(e).__name__}: {e}", {})
        finally:
            with self._state:
                self._in_flight -= 1
                metrics.IN_FLIGHT.set(self._in_flight)
        issued_ts = issued[0] if issued else result.issued_ts
        if result.outcome == "dry_run" and issued_ts is None:
            issued_ts = time.time()
        return self._record(ev, tinfo, result.outcome, result.rail, result.reason, result.response,
                            audit_id=audit_id, issued_ts=issued_ts, dry=dry)

    def _rails(self, ev: TriggerEvent, rule: Rule, tinfo: dict[str, Any], now: float) -> tuple[str | None, str]:
        s = self.settings
        br = audit.breaker_state(self.store)
        if br.is_open:
            metrics.BREAKER_OPEN.set(1)
            return "breaker", f"circuit breaker open since {time.strftime('%H:%M:%S', time.gmtime(br.opened_at or now))}Z: " \
                              f"{br.reason} (reset with 'triscope remediate reset-breaker')"
        metrics.BREAKER_OPEN.set(0)
        if br.reset_at is not None and ev.started_at < br.reset_at:
            return "stale", "trigger started before the last circuit-breaker reset: not replayed"
        ns = tinfo.get("namespace")
        if rule.action != "command" and ns not in s.namespaces:
            return "namespace", f"namespace {ns!r} is not in the allow-list {list(s.namespaces)}"
        if rule.action == "command" and ns and s.namespaces and ns not in s.namespaces:
            return "namespace", f"namespace {ns!r} is not in the allow-list {list(s.namespaces)}"
        last = audit.last_action(self.store, tinfo["target_key"])
        if last is not None and now - last < rule.cooldown_s:
            return "cooldown", f"{tinfo['target']} was acted on {now - last:.0f}s ago (cooldown {rule.cooldown_s:g}s)"
        n = self.window.count(now - rule.per_s, rule.name)
        if n >= rule.max_actions:
            return "rate_limit", f"rule {rule.name} took {n} actions in the last {rule.per_s:g}s (max {rule.max_actions})"
        n = self.window.count(now - 3600.0)
        if n >= s.max_actions_per_hour:
            return "hourly_cap", f"{n} actions in the last hour (cap {s.max_actions_per_hour})"
        with self._state:
            if self._in_flight >= s.max_in_flight:
                return "in_flight", f"{self._in_flight} actions in flight (cap {s.max_in_flight})"
        trip = self._breaker_trips(tinfo, now)
        if trip:
            audit.open_breaker(self.store, trip, now)
            metrics.BREAKER_OPEN.set(1)
            log.warning("remediation circuit breaker opened: %s", trip)
            return "breaker", f"circuit breaker opened: {trip}"
        if ev.kind == "alert":
            resolved = self._resolved.get(ev.episode)
            if resolved is not None and resolved >= ev.received_ts:
                return "recheck", "the alert resolved before the action could start"
        else:
            ok, detail = recheck(self.store, ev, now, self.stale_s)
            if not ok:
                return "recheck", f"condition no longer holds: {detail}"
        return None, ""

    def _breaker_trips(self, tinfo: dict[str, Any], now: float) -> str:
        b = self.settings.breaker
        targets, nodes = self.window.hit(now - b.window_s)
        targets = targets | {tinfo["target_key"]}
        if tinfo.get("node"):
            nodes = nodes | {tinfo["node"]}
        if len(targets) > b.max_targets:
            return f"{len(targets)} targets in {b.window_s:g}s (max {b.max_targets})"
        if len(nodes) > b.max_targets:
            return f"{len(nodes)} nodes in {b.window_s:g}s (max {b.max_targets})"
        if now - self._nodes_cache[0] > 10.0:
            self._nodes_cache = (now, len(self.store.nodes()))
        known = self._nodes_cache[1]
        if known >= b.min_population and nodes and 100.0 * len(nodes) / known > b.max_percent:
            return f"{len(nodes)} of {known} nodes ({100.0 * len(nodes) / known:.0f}%) in {b.window_s:g}s " \
                   f"(max {b.max_percent:g}%)"
        return ""

    # recording ---------------------------------------------------------------------------------------
    def _record(self, ev: TriggerEvent, tinfo: dict[str, Any] | None, outcome: str, rail: str | None, reason: str,
                response: dict[str, Any], *, audit_id: int | None = None, issued_ts: float | None = None,
                dry: bool | None = None) -> Decision:
        rule = ev.rule
        tinfo = tinfo or {}
        dry = (self.dry_run or rule.dry_run) if dry is None else dry
        now = time.time()
        if audit_id is None:
            audit_id = audit.record_decision(
                self.store, ts=now, engine_id=self.engine_id, rule=rule.name, trigger_kind=ev.kind,
                trigger=ev.description, trigger_key=ev.key, action=rule.action, target=tinfo.get("target", ""),
                target_key=tinfo.get("target_key", ""), node=tinfo.get("node") or ev.node,
                namespace=tinfo.get("namespace"), outcome=outcome, rail=rail, reason=reason, dry_run=dry,
                params=rule.params, response=response, received_ts=ev.received_ts, issued_ts=issued_ts,
                finished_ts=now)
        else:
            audit.update_decision(self.store, audit_id, outcome=outcome, rail=rail, reason=reason,
                                  response=_jsonable(response), issued_ts=issued_ts, finished_ts=now)
        metrics.ACTIONS_TOTAL.labels(rule.action, outcome).inc()
        level = logging.INFO if outcome in ("acted", "dry_run") else logging.DEBUG if rail in QUIET_RAILS else logging.INFO
        log.log(level, "remediation %s: rule=%s action=%s target=%s%s %s", outcome, rule.name, rule.action,
                tinfo.get("target", "-"), f" rail={rail}" if rail else "", reason)
        if rail not in QUIET_RAILS:
            self._side.submit(self._emit_events, ev, tinfo, outcome, rail, reason, audit_id, dry)
        return Decision(outcome, rail, reason, audit_id)

    def _emit_events(self, ev: TriggerEvent, tinfo: dict[str, Any], outcome: str, rail: str | None, reason: str,
                     audit_id: int, dry: bool) -> None:
        rule = ev.rule
        node = tinfo.get("node") or ev.node
        sev = {"failed": "error", "acted": "warning"}.get(outcome, "info")
        msg = f"{rule.name}: {outcome}{f' ({rail})' if rail else ''} {rule.action} {tinfo.get('target', '')}: {reason}"
        if node:
            try:
                self.store.add_events(node, [EventRecord(
                    kind="remediation", message=msg[:2000], severity=sev,  # type: ignore[arg-type]
                    details={"audit_id": audit_id, "rule": rule.name, "action": rule.action, "outcome": outcome,
                             "rail": rail, "target": tinfo.get("target", ""), "dry_run": dry, "trigger": ev.description,
                             "trigger_kind": ev.kind})])
            except Exception as e:
                log.warning("remediation: cannot record the timeline event: %s", e)
        ks = self.settings.kubernetes
        if self.kube is None or not ks.events:
            return
        fields = tinfo.get("target_fields") or {}
        if "deployment" in fields:
            ns = fields["namespace"]
            involved = {"kind": "Deployment", "apiVersion": "apps/v1", "namespace": ns, "name": fields["deployment"]}
        elif "node" in fields:
            ns = ks.events_namespace
            involved = {"kind": "Node", "apiVersion": "v1", "name": fields["node"]}
        elif "namespace" in fields and rule.action == "dependency_fallback":
            ns = fields["namespace"]
            involved = {"kind": "ConfigMap", "apiVersion": "v1", "namespace": ns, "name": rule.params["configmap"]}
        else:
            return
        reason_word = {"acted": "RemediationActed", "dry_run": "RemediationDryRun", "suppressed": "RemediationSuppressed",
                       "failed": "RemediationFailed"}.get(outcome, "Remediation")
        try:
            self.kube.post_event(ns, involved, reason=reason_word, message=msg,
                                 type_="Warning" if outcome in ("failed", "acted") else "Normal")
        except k.KubeError as e:
            log.info("remediation: cannot post the Kubernetes Event: %s", e)

    # alert episodes ----------------------------------------------------------------------------------
    def _note_firing(self, ev: TriggerEvent) -> None:
        self._resolved.pop(ev.episode, None)
        if not self._has_fallbacks:
            return
        for fb in audit.active_fallbacks(self.store):
            if fb.trigger_key == ev.episode and fb.clear_since is not None:
                audit.update_fallback(self.store, fb.id, clear_since=None)

    def _note_resolved(self, ev: TriggerEvent) -> None:
        self._resolved[ev.episode] = ev.received_ts
        if not self._has_fallbacks:
            return
        for fb in audit.active_fallbacks(self.store):
            if fb.trigger_key == ev.episode and fb.clear_since is None:
                audit.update_fallback(self.store, fb.id, clear_since=ev.received_ts)

    # scheduled jobs ----------------------------------------------------------------------------------
    def evaluate_triggers(self, now: float | None = None) -> int:
        """Evaluate every stored-data rule; queue new episodes; mark fallbacks whose condition cleared."""
        now = time.time() if now is None else now
        submitted = 0
        if self.leader is not None and not self.leader.is_leader:
            return 0  # the leader evaluates; a follower that became leader starts from fresh episodes
        for rule in self.data_rules:
            try:
                events, clear = stored_data_events(self.store, rule, now, self.stale_s, self._episodes)
            except Exception as e:
                log.warning("remediation: evaluating rule %s failed: %s", rule.name, e)
                continue
            holding = {ev.episode for ev in events}
            clear_eps = {f"{rule.trigger.kind}:{rule.name}:{n}" for n in clear}
            for fb in audit.active_fallbacks(self.store):
                if fb.rule != rule.name:
                    continue
                if fb.trigger_key in clear_eps and fb.clear_since is None:
                    audit.update_fallback(self.store, fb.id, clear_since=now)
                elif fb.trigger_key in holding and fb.clear_since is not None:
                    audit.update_fallback(self.store, fb.id, clear_since=None)
            for ev in events:
                if ev.key in self._seen:
                    continue
                self._seen[ev.key] = now
                self.submit(ev)
                submitted += 1
        cutoff = now - self.settings.dedupe_retention_s
        for key in [kk for kk, ts in self._seen.items() if ts < cutoff]:
            del self._seen[key]
        return submitted

    def revert_fallbacks(self, now: float | None = None) -> int:
        """Revert each active fallback whose trigger has been clear for its hold period, or whose TTL ran out."""
        now = time.time() if now is None else now
        if self.leader is not None and not self.leader.is_leader:
            return 0
        done = 0
        for fb in audit.active_fallbacks(self.store):
            if now >= fb.expires_at:
                why = f"time-to-live ran out ({fb.expires_at - fb.switched_at:g}s)"
            elif fb.clear_since is not None and now - fb.clear_since >= fb.hold_s:
                why = f"trigger clear for {now - fb.clear_since:.0f}s (hold {fb.hold_s:g}s)"
            else:
                continue
            try:
                res = act.revert_fallback(fb, self.kube, why)
            except k.KubeError as e:
                res = act.ActionResult("failed", f"revert of {fb.namespace}/{fb.configmap}:{fb.key} failed: {e}",
                                       {"error": e.answer(), "fallback_id": fb.id})
            if res.outcome in ("acted", "dry_run"):
                audit.update_fallback(self.store, fb.id, state="reverted", reverted_at=now, revert_reason=why)
                done += 1
            try:
                rule = self.policy.rule(fb.rule)
            except KeyError:
                rule = None
            node = None
            audit_id = audit.record_decision(
                self.store, ts=time.time(), engine_id=self.engine_id, rule=fb.rule, trigger_kind="revert",
                trigger=f"revert: {why}", trigger_key=f"revert:{fb.id}", action="dependency_fallback",
                target=f"configmap {fb.namespace}/{fb.configmap} key {fb.key}", target_key=fb.target_key, node=node,
                namespace=fb.namespace, outcome=res.outcome, reason=res.reason, dry_run=fb.dry_run,
                params={"revert": True, "restore": fb.previous_value}, response=res.response, issued_ts=res.issued_ts,
                finished_ts=time.time())
            metrics.ACTIONS_TOTAL.labels("dependency_fallback", res.outcome).inc()
            log.info("remediation revert %s: %s", res.outcome, res.reason)
            if rule is not None and self.kube is not None and self.settings.kubernetes.events:
                with contextlib.suppress(k.KubeError):
                    self.kube.post_event(fb.namespace, {"kind": "ConfigMap", "apiVersion": "v1", "namespace": fb.namespace,
                                                        "name": fb.configmap},
                                         reason="RemediationReverted" if res.outcome != "failed" else "RemediationFailed",
                                         message=f"{fb.rule}: {res.reason} (audit {audit_id})")
        return done

    def prune(self) -> int:
        with self._decide:
            now = time.time()
            self.window.trim(now)
            for ep in [e for e, ts in self._resolved.items() if ts < now - self.settings.dedupe_retention_s]:
                del self._resolved[ep]
        return audit.prune(self.store, time.time() - self.settings.dedupe_retention_s)

    def leader_step(self) -> None:
        if self.leader is not None:
            was = self.leader.is_leader
            now_leader = self.leader.step()
            if now_leader and not was:  # another replica may have acted meanwhile: recount from the store
                with self._decide:
                    self.window.load(self.store, time.time())
            metrics.LEADER.set(1 if now_leader else 0)

    # lifecycle ---------------------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        br = audit.breaker_state(self.store)
        with self._state:
            in_flight, pending = self._in_flight, self._pending
        return {"engine_id": self.engine_id, "dry_run": self.dry_run, "leader": self.leader is None or self.leader.is_leader,
                "breaker": br.state, "in_flight": in_flight, "pending": pending, "rules": len(self.policy.rules),
                "kubernetes": self.kube.describe if self.kube else None}

    def close(self, wait: float = 10.0) -> None:
        self._stop.set()
        self.drain(wait)
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._side.shutdown(wait=True)
        if self.leader is not None:
            self.leader.release()


def _jsonable(v: Any) -> Any:
    import json

    return json.loads(json.dumps(v, default=str))


# construction -------------------------------------------------------------------------------------
def build_scheduler(engine: Engine) -> Any:
    """The engine's APScheduler: every job with an id, ``max_instances=1``, ``coalesce=True``.

    Built here and started by the caller (never at import time, never inside a web worker).
    """
    from datetime import UTC, datetime

    from apscheduler.schedulers.background import BackgroundScheduler

    s = engine.settings
    sched = BackgroundScheduler(timezone=UTC, job_defaults={"max_instances": 1, "coalesce": True,
                                                            "misfire_grace_time": max(5, int(s.evaluate_interval_s))})
    now = datetime.now(UTC)
    if engine.leader is not None:
        sched.add_job(engine.leader_step, "interval", seconds=s.leader_election.renew_every_s, id="leader-election",
                      name="acquire or renew the leader Lease", next_run_time=now)
    if engine.data_rules:
        sched.add_job(engine.evaluate_triggers, "interval", seconds=s.evaluate_interval_s, id="evaluate-triggers",
                      name="evaluate stored-data triggers", next_run_time=now)
    sched.add_job(engine.revert_fallbacks, "interval", seconds=s.evaluate_interval_s, id="fallback-reverts",
                  name="revert dependency fallbacks", next_run_time=now)
    sched.add_job(engine.prune, "interval", seconds=3600, id="prune-deliveries", name="forget old deliveries")
    return sched


def kube_from_settings(policy: Policy) -> k.KubeAdapter | None:
    ks = policy.settings.kubernetes
    if ks.mode == "none":
        return None
    token = None
    if ks.token_file:
        try:
            token = Path(ks.token_file).read_text().strip()
        except OSError as e:
            raise k.NotConfigured(f"cannot read the Kubernetes token file {ks.token_file}: {e}") from None
    return k.KubeAdapter.connect(url=ks.url if ks.mode == "url" else None, token=token,
                                 kubeconfig=ks.kubeconfig if ks.mode == "kubeconfig" else None, context=ks.context,
                                 in_cluster=ks.mode == "in-cluster", verify_ssl=ks.verify_ssl, ca_file=ks.ca_file)


class EngineHandle:
    """A running engine: scheduler + optional webhook.  ``stop()`` shuts everything down."""

    def __init__(self, engine: Engine, scheduler: Any, server: Any | None, owns_store: bool) -> None:
        self.engine, self.scheduler, self.server = engine, scheduler, server
        self._owns_store = owns_store

    @property
    def url(self) -> str | None:
        if self.server is None:
            return None
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
        with contextlib.suppress(Exception):  # not running
            self.scheduler.shutdown(wait=True)
        self.engine.close()
        if self.engine.kube is not None:
            self.engine.kube.close()
        if self._owns_store:
            self.engine.store.close()


def start(store: Any, policy: Policy, *, listen: tuple[str, int] | None = None, dry_run: bool = False,
          token: str | None = None, kube: k.KubeAdapter | None = None, owns_store: bool = False,
          max_body: int = 1 << 20) -> EngineHandle:
    """Build and start an engine: leader election, scheduler jobs and (with ``listen``) the webhook."""
    from remediation.webhook import serve

    if kube is None:
        kube = kube_from_settings(policy)
    le = policy.settings.leader_election
    leader = None
    if le.enabled:
        if kube is None:
            raise k.NotConfigured("leader election needs a Kubernetes API")
        leader = LeaderElector(kube, le.namespace, le.lease, policy.settings.engine_id, le.lease_duration_s)
    engine = Engine(store, policy, kube=kube, dry_run=dry_run, leader=leader)
    if leader is not None:
        engine.leader_step()
    sched = build_scheduler(engine)
    sched.start()
    server = serve(engine, listen[0], listen[1], token=token, max_body=max_body) if listen else None
    return EngineHandle(engine, sched, server, owns_store)


def start_embedded(store_url: str, policy_path: str | Path | None = None,
                   listen: str | tuple[str, int] | None = None, dry_run: bool = True,
                   token: str | None = None) -> EngineHandle:
    """The engine inside ``triscope run``: dry-run, the example policy by default.

    ``listen`` (``HOST:PORT`` or ``(host, port)``) also serves the webhook; it needs ``token`` (or
    ``TRISCOPE_WEBHOOK_TOKEN``), except on a loopback address where it runs without auth.
    Returns a handle with ``.stop()``.
    """
    import os

    from store import Store

    policy = load_policy(policy_path or DEFAULT_POLICY)
    st = Store.open(store_url)
    st.require_schema()
    addr = None
    if listen:
        if isinstance(listen, str):
            host, _, port = listen.rpartition(":")
            addr = (host or "127.0.0.1", int(port))
        else:
            addr = (listen[0], int(listen[1]))
        token = token or os.environ.get("TRISCOPE_WEBHOOK_TOKEN") or None
        if token is None and addr[0] not in ("127.0.0.1", "localhost", "::1"):
            st.close()
            raise ValueError("the webhook needs a bearer token when it listens beyond loopback")
        if token is None:
            log.warning("remediation webhook on %s:%d runs without a bearer token (loopback, dry-run demo); "
                        "set TRISCOPE_WEBHOOK_TOKEN to require one", addr[0], addr[1])
    try:
        return start(st, policy, listen=addr, dry_run=dry_run, token=token, owns_store=True)
    except Exception:
        st.close()
        raise
