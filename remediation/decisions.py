"""The engine's decisions: triggers in, safety rails, actions out, every decision audited.

Pipeline for one trigger (an Alertmanager alert matched to a rule, or a stored-data condition):

1. ``not_firing``  — only firing alerts act (a resolved one starts a fallback's hold period instead)
2. ``leader``      — only the replica holding the Lease acts
3. ``target``      — the target resolves from the alert's / stored series' labels into valid names; a
                     ``{from: workload}`` Deployment from the ``workload`` label or the ``pod`` resolved
                     through ownerReferences (``triscope.remediation.workloads``), a knobs file from the
                     ``workload`` label (``triscope.remediation.filefallback``); no default target
4. ``duplicate``   — the delivery key was already handled (durable, in the store; a dry-run decision's
                     claim is dry-run's own: it stops dry-run decisions only)
5. ``stale``       — the trigger started before the last circuit-breaker reset: not replayed
6. ``breaker``     — the circuit breaker is open (or this action would open it)
7. ``namespace``   — the target namespace is not on the allow-list
8. ``node``        — a node target outside the node allow-list (names / labels), a control-plane node,
                     or a node the workload has no pods on (the last two checked by the action)
9. ``cooldown``    — the target was acted on less than ``cooldown`` ago (kept in the store; dry-run's
                     stamps, like its claims and its counts below, stop dry-run decisions only)
10. ``rate_limit`` — the rule already took ``max_actions`` in ``per`` (counted in the audit log)
11. ``hourly_cap`` — the global cap on actions per hour
12. ``in_flight``  — the global cap on actions running at once
13. ``recheck``    — the stored-data condition no longer holds / the alert has resolved since
                     (5 to 13: ``triscope.remediation.rails``)
14. ``live_state`` — the action's own re-check of the live object (paused, degraded, already set)

Decisions run one at a time (a lock), actions run concurrently on a worker pool.  Each decision
goes to the audit table, to a ``remediation`` event on the node's timeline, to a Kubernetes Event
(when an API is configured) and to ``triscope_remediation_actions_total{action,outcome}``.

Exactly once, also across ``kill -9``: an accepted trigger is committed to the store's inbox
before ``submit_alerts`` returns (so before the webhook's 202); its decision claims the delivery
key, writes the audit row (``in_progress`` for an action) and removes the inbox entry in one
transaction.  On start, and on becoming the leader, :meth:`Engine.resume` (``triscope.remediation.engine``) decides what is left in
the inbox and re-runs the actions left ``in_progress``; the actions are idempotent per decision
(``triscope.remediation.actions``), and a ``command`` is not re-run but recorded ``failed``.

Typed from the webhook to the PATCH and the audit row: ``submit_alerts`` takes the validated
``WebhookPayload`` (``startsAt`` read once, there), a decision's resolved target is a frozen
``Target`` (``triscope.remediation.targets``), each action gets its own params model in an
``ActionContext``, and the audit row is the table's own dataclass (``triscope.store.audit.AuditRow``).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as futures_wait
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, cast

from sqlalchemy.exc import OperationalError

from triscope.core.samples import EventRecord
from triscope.remediation import actions as act
from triscope.remediation import metrics
from triscope.remediation.dispatch import run_action
from triscope.remediation.kube.adapter import KubeAdapter
from triscope.remediation.kube.errors import KubeError
from triscope.remediation.leader import LeaderElector
from triscope.remediation.policy import ActionParams, Policy
from triscope.remediation.rails import Rails
from triscope.remediation.target_resolution import TargetResolution, resolve_rule_target, target_key
from triscope.remediation.targets import Target
from triscope.remediation.triggers import TriggerEvent, alert_events, event_to_dict
from triscope.remediation.webhook import WebhookPayload
from triscope.remediation.workloads import WorkloadResolver
from triscope.store import audit
from triscope.store.audit import DecisionWindow
from triscope.store.db import error_line

if TYPE_CHECKING:
    from triscope.store.api import Store

log = logging.getLogger("triscope.remediation.engine")

QUIET_RAILS = ("duplicate", "leader", "not_firing")  # audited only: a timeline / Kubernetes Event each would flood
Severity = Literal["info", "warning", "error", "critical"]
_SEVERITY: dict[str, Severity] = {"failed": "error", "acted": "warning"}


@dataclass(frozen=True)
class Decision:
    outcome: str
    rail: str | None = None
    reason: str = ""
    audit_id: int | None = None


class IntakeError(RuntimeError):
    """Accepted triggers could not be stored (the store is unreachable or failing): nothing was queued.

    The webhook answers 503 with ``Retry-After`` so that Alertmanager sends the notification again.
    """


def _jsonable(v: object) -> dict[str, object]:
    """``v`` (a JSON object, possibly with values JSON does not know) as the store's JSON keeps it."""
    return cast("dict[str, object]", json.loads(json.dumps(v, default=str)))


def _params_json(params: ActionParams) -> dict[str, object]:
    # pydantic's JSON form of a model is typed dict[str, Any]: it is a JSON object
    return cast("dict[str, object]", params.model_dump(mode="json"))


def _accelerator(labels: dict[str, str]) -> dict[str, str]:
    """The accelerator labels of a trigger (what a workload was found on), for the audit row."""
    return {a: labels[a] for a in ("gpu", "npu", "chip") if labels.get(a)}


class Decisions:
    """Policies + store + (optional) Kubernetes adapter: each trigger decided once, through the rails, its
    action run and audited.  ``submit`` / ``submit_alerts`` feed it; ``Engine`` runs it.

    The engine's state: the decision lock, what is queued, pending, in flight and running here."""

    def __init__(self, store: Store, policy: Policy, *, kube: KubeAdapter | None = None, dry_run: bool = False,
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
        self._queued: dict[str, int] = {}          # inbox keys queued or being decided in this process
        self._running: set[int] = set()            # audit ids whose action runs in this process
        self._idle = threading.Condition(self._state)
        self._pool = ThreadPoolExecutor(max_workers=policy.settings.workers, thread_name_prefix="remediation")
        self._side = ThreadPoolExecutor(max_workers=2, thread_name_prefix="remediation-events")
        self._side_pending: set[Future[None]] = set()   # timeline and Kubernetes Events not yet posted
        self._resolved: dict[str, float] = {}      # alert episode -> when a resolved notification came
        self._stop = threading.Event()
        self.stale_s = max(60.0, 4 * policy.settings.evaluate_interval_s)
        self.alert_rules = tuple(r for r in policy.rules if r.trigger.kind == "alert")
        self.data_rules = tuple(r for r in policy.rules if r.trigger.kind != "alert")
        self.resumed: tuple[int, int] = (0, 0)     # (actions re-run, inbox triggers decided) by the last resume
        metrics.LEADER.set(1 if leader is None else 0)
        self.window = DecisionWindow(max([3600.0, policy.settings.breaker.window_s] + [r.per_s for r in policy.rules]))
        self.window.load(store, time.time())
        self._has_fallbacks = any(r.action == "dependency_fallback" for r in policy.rules) or bool(
            audit.active_fallbacks(store))
        self.workloads = WorkloadResolver(store, kube, ttl_s=policy.settings.workload_ttl_s)
        self.rails = Rails(self.settings, store, self.window, self.stale_s, self._resolved, self._in_flight_now)

    def _in_flight_now(self) -> int:
        with self._state:
            return self._in_flight

    @property
    def leader_now(self) -> bool:
        """Whether this replica may act: it holds the Lease, or runs without leader election."""
        return self.leader is None or self.leader.is_leader

    # intake ------------------------------------------------------------------------------------------
    def _mark(self, events: list[TriggerEvent], delta: int) -> None:
        with self._state:
            for ev in events:
                n = self._queued.get(ev.key, 0) + delta
                if n > 0:
                    self._queued[ev.key] = n
                else:
                    self._queued.pop(ev.key, None)
            self._pending += delta * len(events)
            if delta < 0:
                self._idle.notify_all()

    def _accept(self, events: list[TriggerEvent]) -> None:
        """Make ``events`` durable in the inbox (one transaction) and count them as pending here."""
        self._mark(events, +1)  # before the commit: a concurrent resume must not queue them a second time
        try:
            audit.accept_triggers(self.store, [audit.InboxRow(key=ev.key, ts=ev.received_ts, rule=ev.rule.name,
                                                              kind=ev.kind, event=event_to_dict(ev)) for ev in events])
        except Exception as e:  # noqa: BLE001 - whatever kept them from the inbox, the sender must hear 503 and retry
            self._mark(events, -1)
            first = (str(e).strip().splitlines() or [""])[0]
            raise IntakeError(f"cannot store the accepted triggers: {type(e).__name__}: {first}") from None

    def submit(self, ev: TriggerEvent) -> Future[Decision] | None:
        """Accept one trigger: durable in the store's inbox when this returns (``IntakeError`` if not), then queued."""
        self._accept([ev])
        return self._queue(ev)

    def _queue(self, ev: TriggerEvent) -> Future[Decision] | None:
        """Hand an accepted (already counted) trigger to the workers; after ``close`` it waits in the inbox."""
        try:
            return self._pool.submit(self._handle_counted, ev)
        except RuntimeError:  # the pool is shut down: the next start decides it
            self._mark([ev], -1)
            return None

    def _handle_counted(self, ev: TriggerEvent) -> Decision:
        try:
            return self.handle(ev)
        except Exception as e:  # never lose a worker; the failure is audited when the store takes it
            # a database error (the store failing over) in one line; anything else with its traceback
            log.error("remediation: rule %s failed: %s", ev.rule.name, error_line(e), exc_info=not isinstance(e, OperationalError))
            reason = f"internal error: {type(e).__name__}: {e}"
            try:
                if audit.is_claimed(self.store, ev.key, dry_run=self.dry_run or ev.rule.dry_run):
                    return Decision("failed", None, reason)  # decided: an in_progress action is re-run on restart
                if isinstance(e, OperationalError):
                    # the store failed under the decision (a failover, a dropped connection), not the rule:
                    # undecided, the trigger stays in the inbox and the periodic resume decides it again
                    # (concluding it "failed" would drop an alert for a database blip)
                    log.warning("remediation: %s stays in the inbox, decided again by the resume: %s",
                                ev.key, error_line(e))
                    return Decision("failed", None, reason)
                return self._conclude(ev, None, "failed", None, reason, {})
            except Exception:  # noqa: BLE001 - concluding failed too: the trigger stays in the inbox for the resume
                log.warning("remediation: %s stays in the inbox (the store failed): %s", ev.key, reason)
                return Decision("failed", None, reason)
        finally:
            self._mark([ev], -1)

    def submit_alerts(self, payload: WebhookPayload, received_ts: float | None = None) -> tuple[int, int]:
        """Accept every (alert, matching rule) of a validated Alertmanager v4 payload; (alerts, matched).

        When this returns, the matched triggers are committed to the store's inbox, so an engine killed
        right after the webhook's 202 decides them when it starts again.  Raises ``IntakeError`` when
        the store cannot take them (nothing is queued; the webhook should answer 503 so Alertmanager
        retries).
        """
        received = time.time() if received_ts is None else received_ts
        common = payload.commonLabels or {}
        events = [ev for alert in payload.alerts for ev in alert_events(self.alert_rules, alert, common, received)]
        if events:
            self._accept(events)
        for ev in events:
            try:
                if ev.firing:
                    self._note_firing(ev)
                else:
                    self._note_resolved(ev)  # in arrival order, before any later firing of the same alert
            except Exception as e:  # noqa: BLE001 - fallback bookkeeping; the trigger itself is safe in the inbox
                log.warning("remediation: cannot note the %s alert %s: %s", "firing" if ev.firing else "resolved",
                            ev.episode, e)
            self._queue(ev)
        return len(payload.alerts), len(events)

    def drain(self, timeout: float = 30.0) -> bool:
        """Wait until every submitted trigger is decided, its action finished and its events (the
        timeline's, Kubernetes') posted (tests, shutdown)."""
        deadline = time.monotonic() + timeout
        with self._state:
            while self._pending > 0:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(left)
            side = list(self._side_pending)
        _done, not_done = futures_wait(side, timeout=max(0.0, deadline - time.monotonic()))
        return not not_done

    # the decision ------------------------------------------------------------------------------------
    def _target(self, ev: TriggerEvent, res: TargetResolution) -> Target:
        """The decision's target, from the rule's resolution of the trigger's labels."""
        key, description = target_key(ev.rule, res.target)
        workload = None
        if res.owner is not None:
            workload = {**res.owner.as_dict(), **_accelerator(ev.labels)}
        elif res.workload is not None:   # a knobs file, named by the workload label
            workload = {**res.workload, **_accelerator(ev.labels)}
        return Target(key=key, description=description, fields=res.target, node=res.target.get("node") or ev.node,
                      workload=workload)

    def handle(self, ev: TriggerEvent) -> Decision:
        rule = ev.rule
        if not ev.firing:
            return self._conclude(ev, None, "suppressed", "not_firing", "alert resolved: only firing alerts act", {})
        if self.leader is not None and not self.leader.is_leader:
            # not claimed: the trigger stays in the inbox, and the leader decides it
            return self._record(ev, None, "suppressed", "leader", f"not the leader (lease "
                                f"{self.leader.namespace}/{self.leader.name})", {})
        res = resolve_rule_target(rule, ev.labels, self.workloads,
                                  namespaces=self.settings.namespaces if rule.action != "command" else ())
        if res.error:
            # audit.decide claims the key: an already claimed one is recorded a duplicate by _conclude
            outcome = "failed" if res.transient else "suppressed"
            where = Target("", "", {"namespace": res.target.get("namespace", "")}) if res.rail == "namespace" else None
            return self._conclude(ev, where, outcome, None if res.transient else res.rail, res.error, {})
        target = self._target(ev, res)
        # a dry-run decision changed nothing: its claim (and cooldown, counts) stop dry-run decisions only
        dry = self.dry_run or rule.dry_run
        with self._decide:
            now = time.time()
            # One read of the claim, the breaker and the target's cooldown per decision, under the decision lock.
            # Safe for exactly once: audit.decide below claims the key in the same transaction as the audit row
            # (a claim made after this read makes it return None: a duplicate, nothing acts), and the breaker
            # and cooldown stamps an engine writes are written by audit.decide, under this lock, so no decision
            # of this engine can change them between this read and the write; the leader is the only engine
            # deciding, and an operator's breaker reset in between only lets the next decision through.
            seen = audit.decision_state(self.store, ev.key, target.key, dry_run=dry)
            if seen.claimed:
                return self._duplicate(ev, target)
            rail = self.rails.first(ev, rule, target, now, dry, seen)
            if rail is not None:
                return self._conclude(ev, target, "suppressed", rail.name, rail.reason, {}, open_breaker=rail.trip)
            stamp = act.restart_stamp(now) if rule.action == "rolling_restart" else ""
            audit_id = audit.decide(self.store, ev.key, self._values(
                ev, target, audit.IN_PROGRESS, None, "", {}, dry, ts=now,
                params=self._recorded_params(ev, target, stamp)), stamp_cooldown=True)
            if audit_id is None:
                return self._duplicate(ev, target)
            self.window.add(rule.name, target.key, target.node or None, now, dry_run=dry)
            with self._state:
                self._in_flight += 1
                self._running.add(audit_id)
                metrics.IN_FLIGHT.set(self._in_flight)
        return self._run_action(ev, target, dry, audit_id, now, rule.params, stamp)

    def _recorded_params(self, ev: TriggerEvent, target: Target, stamp: str) -> dict[str, object]:
        """The audit row's ``params`` of a decision that goes ahead: the rule's params and what re-running it
        after a crash needs (the target, the episode, the restart stamp fixed now)."""
        params: dict[str, object] = {**_params_json(ev.rule.params), "target": dict(target.fields),
                                     "episode": ev.episode}
        if target.workload:
            params["workload"] = dict(target.workload)
        if stamp:
            params["restartedAt"] = stamp  # the same value however often it is re-run
        return params

    def _run_action(self, ev: TriggerEvent, target: Target, dry: bool, audit_id: int, decided_ts: float,
                    params: ActionParams, restarted_at: str = "", resumed: bool = False) -> Decision:
        """Carry out a decision that went ahead (``in_progress`` in the audit log); in-flight counted by the caller."""
        rule = ev.rule
        issued: list[float] = []
        ctx = act.ActionContext(rule.name, params, target, dry, self.kube, self.store, self.engine_id,
                                trigger_key=ev.key, episode=ev.episode, on_issued=issued.append, stop=self._stop,
                                decision_id=audit_id, decided_ts=decided_ts, resumed=resumed, settings=self.settings,
                                restarted_at=restarted_at)
        try:
            result = run_action(ctx)
        except KubeError as e:
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
        reason = f"{result.reason} (re-run after the engine restarted)" if resumed else result.reason
        try:
            return self._record(ev, target, result.outcome, result.rail, reason, result.response,
                                audit_id=audit_id, issued_ts=issued_ts, dry=dry)
        finally:
            # if storing the outcome fails (a failover), the periodic resume re-runs the idempotent action
            with self._state:
                self._running.discard(audit_id)

    # recording ---------------------------------------------------------------------------------------
    def _values(self, ev: TriggerEvent, target: Target | None, outcome: str, rail: str | None, reason: str,
                response: dict[str, object], dry: bool, *, ts: float | None = None,
                params: dict[str, object] | None = None, issued_ts: float | None = None) -> audit.AuditRow:
        """The audit row of a decision."""
        rule = ev.rule
        now = time.time() if ts is None else ts
        if params is None:
            params = _params_json(rule.params)
            if target is not None and target.workload:
                params["workload"] = dict(target.workload)
        return audit.AuditRow(
            ts=now, engine_id=self.engine_id, rule=rule.name, trigger_kind=ev.kind, trigger=ev.description,
            trigger_key=ev.key, action=rule.action, target=target.description if target else "",
            target_key=target.key if target else "", node=(target.node if target else None) or ev.node,
            namespace=target.namespace if target else None, outcome=outcome, rail=rail, reason=reason, dry_run=dry,
            params=_jsonable(params), response=_jsonable(response), received_ts=ev.received_ts, issued_ts=issued_ts,
            finished_ts=None if outcome == audit.IN_PROGRESS else now)

    def _conclude(self, ev: TriggerEvent, target: Target | None, outcome: str, rail: str | None, reason: str,
                  response: dict[str, object], *, open_breaker: str | None = None) -> Decision:
        """A final decision that acts on nothing: claim + audit row (+ breaker) + inbox entry gone, one transaction."""
        dry = self.dry_run or ev.rule.dry_run
        audit_id = audit.decide(self.store, ev.key, self._values(ev, target, outcome, rail, reason, response, dry),
                                open_breaker_reason=open_breaker)
        if audit_id is None:
            return self._duplicate(ev, target)
        if open_breaker:
            metrics.BREAKER_OPEN.set(1)
            log.warning("remediation circuit breaker opened: %s", open_breaker)
        return self._after(ev, target, outcome, rail, reason, audit_id, dry)

    def _duplicate(self, ev: TriggerEvent, target: Target | None) -> Decision:
        dry = self.dry_run or ev.rule.dry_run
        reason = "delivery already handled"
        audit_id = audit.record_duplicate(self.store, ev.key, self._values(ev, target, "suppressed", "duplicate",
                                                                           reason, {}, dry))
        return self._after(ev, target, "suppressed", "duplicate", reason, audit_id, dry)

    def _record(self, ev: TriggerEvent, target: Target | None, outcome: str, rail: str | None, reason: str,
                response: dict[str, object], *, audit_id: int | None = None, issued_ts: float | None = None,
                dry: bool | None = None) -> Decision:
        """A new audit row that claims nothing (``leader``), or the final state of an ``in_progress`` one."""
        dry = (self.dry_run or ev.rule.dry_run) if dry is None else dry
        if audit_id is None:
            audit_id = audit.record_decision(self.store, self._values(ev, target, outcome, rail, reason, response, dry,
                                                                      issued_ts=issued_ts))
        else:
            audit.update_decision(self.store, audit_id, outcome=outcome, rail=rail, reason=reason,
                                  response=_jsonable(response), issued_ts=issued_ts, finished_ts=time.time())
        return self._after(ev, target, outcome, rail, reason, audit_id, dry)

    def _after(self, ev: TriggerEvent, target: Target | None, outcome: str, rail: str | None, reason: str,
               audit_id: int, dry: bool) -> Decision:
        rule = ev.rule
        metrics.ACTIONS_TOTAL.labels(rule.action, outcome).inc()
        level = logging.INFO if outcome in ("acted", "dry_run") else logging.DEBUG if rail in QUIET_RAILS else logging.INFO
        log.log(level, "remediation %s: rule=%s action=%s target=%s%s %s", outcome, rule.name, rule.action,
                target.description if target else "-", f" rail={rail}" if rail else "", reason)
        if rail not in QUIET_RAILS:
            fut = self._side.submit(self._emit_events, ev, target, outcome, rail, reason, audit_id, dry)
            with self._state:
                self._side_pending.add(fut)
            fut.add_done_callback(self._side_posted)
        return Decision(outcome, rail, reason, audit_id)

    def _side_posted(self, fut: Future[None]) -> None:
        with self._state:
            self._side_pending.discard(fut)

    def _emit_events(self, ev: TriggerEvent, target: Target | None, outcome: str, rail: str | None, reason: str,
                     audit_id: int, dry: bool) -> None:
        rule = ev.rule
        node = (target.node if target else None) or ev.node
        what = target.description if target else ""
        msg = f"{rule.name}: {outcome}{f' ({rail})' if rail else ''} {rule.action} {what}: {reason}"
        if node:
            details: dict[str, object] = {
                "audit_id": audit_id, "rule": rule.name, "action": rule.action, "outcome": outcome, "rail": rail,
                "target": what, "dry_run": dry, "trigger": ev.description, "trigger_kind": ev.kind}
            try:
                self.store.add_events(node, [EventRecord(kind="remediation", message=msg[:2000],
                                                         severity=_SEVERITY.get(outcome, "info"), details=details)])
            except Exception as e:  # noqa: BLE001 - the audit row is written; the timeline copy is best effort
                log.warning("remediation: cannot record the timeline event: %s", e)
        if self.kube is not None and self.settings.kubernetes.events:
            act.post_decision_event(self.kube, self.settings.kubernetes.events_namespace, rule.params,
                                    target.fields if target else {}, outcome, msg)

    # alert episodes ----------------------------------------------------------------------------------
    def _note_firing(self, ev: TriggerEvent) -> None:
        self._resolved.pop(ev.episode, None)
        if not self._has_fallbacks:
            return
        for fb in audit.active_fallbacks(self.store):
            if fb.trigger_key == ev.episode and fb.clear_since is not None:
                audit.set_fallback_clear(self.store, fb.id, None)

    def _note_resolved(self, ev: TriggerEvent) -> None:
        self._resolved[ev.episode] = ev.received_ts
        if not self._has_fallbacks:
            return
        for fb in audit.active_fallbacks(self.store):
            if fb.trigger_key == ev.episode and fb.clear_since is None:
                audit.set_fallback_clear(self.store, fb.id, ev.received_ts)
