"""The rule engine: triggers in, safety rails, actions out, every decision audited.

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
14. ``live_state`` — the action's own re-check of the live object (paused, degraded, already set)

Decisions run one at a time (a lock), actions run concurrently on a worker pool.  Each decision
goes to the audit table, to a ``remediation`` event on the node's timeline, to a Kubernetes Event
(when an API is configured) and to ``triscope_remediation_actions_total{action,outcome}``.

Exactly once, also across ``kill -9``: an accepted trigger is committed to the store's inbox
before ``submit_alerts`` returns (so before the webhook's 202); its decision claims the delivery
key, writes the audit row (``in_progress`` for an action) and removes the inbox entry in one
transaction.  On start, and on becoming the leader, :meth:`Engine.resume` decides what is left in
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

from pydantic import ValidationError
from sqlalchemy.exc import OperationalError

from triscope import defaults
from triscope.core.samples import EventRecord, parse_label_key
from triscope.remediation import actions as act
from triscope.remediation import isolate, metrics
from triscope.remediation.conditions import MISMATCH_METRIC
from triscope.remediation.dispatch import run_action
from triscope.remediation.fallbacks import revert_due_fallbacks
from triscope.remediation.kube.adapter import KubeAdapter
from triscope.remediation.kube.errors import KubeError
from triscope.remediation.leader import LeaderElector
from triscope.remediation.node_condition import NodeConditions
from triscope.remediation.policy import NODE_ACTIONS, ActionParams, Policy, Rule
from triscope.remediation.target_resolution import (
    TargetResolution,
    resolve_rule_target,
    resolve_target,
    target_key,
)
from triscope.remediation.targets import Target
from triscope.remediation.triggers import (
    TriggerEvent,
    alert_events,
    event_from_dict,
    event_to_dict,
    recheck,
    stored_data_events,
)
from triscope.remediation.verdict_events import VerdictEvents
from triscope.remediation.webhook import WebhookPayload
from triscope.remediation.workloads import WorkloadResolver, pods_in_series
from triscope.store import audit
from triscope.store import workloads as wstore
from triscope.store.audit import DecisionWindow
from triscope.store.db import error_line

if TYPE_CHECKING:
    from triscope.store.api import Store

log = logging.getLogger(__name__)

DEFAULT_POLICY = defaults.POLICY   # deploy/policy.example.yaml, shipped as package data
WORKLOAD_INFO_METRIC = "triscope_accelerator_workload_info"   # the agent's attribution series (docs/workloads.md)
QUIET_RAILS = ("duplicate", "leader", "not_firing")  # audited only: a timeline / Kubernetes Event each would flood
Severity = Literal["info", "warning", "error", "critical"]
_SEVERITY: dict[str, Severity] = {"failed": "error", "acted": "warning"}


@dataclass(frozen=True)
class Decision:
    outcome: str
    rail: str | None = None
    reason: str = ""
    audit_id: int | None = None


@dataclass(frozen=True)
class Rail:
    """A rail that stops a decision: its name, why, and the breaker's reason when the decision opens it."""

    name: str
    reason: str
    trip: str | None = None


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


def _text_map(value: object) -> dict[str, str]:
    return {str(a): str(b) for a, b in value.items()} if isinstance(value, dict) else {}


def _accelerator(labels: dict[str, str]) -> dict[str, str]:
    """The accelerator labels of a trigger (what a workload was found on), for the audit row."""
    return {a: labels[a] for a in ("gpu", "npu", "chip") if labels.get(a)}


class Engine:
    """Policies + store + (optional) Kubernetes adapter.  ``submit`` / ``submit_alerts`` feed it."""

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
        self._seen: dict[str, float] = {}          # stored-data keys already submitted (avoid re-queueing)
        self._resolved: dict[str, float] = {}      # alert episode -> when a resolved notification came
        self._episodes: dict[tuple[str, str], float] = {}
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
        self._nodes_cache: tuple[float, int] = (0.0, 0)
        self.workloads = WorkloadResolver(store, kube, ttl_s=policy.settings.workload_ttl_s)
        ks = policy.settings.kubernetes
        self.verdict_events = VerdictEvents(store, kube, namespaces=policy.settings.namespaces,
                                            events_namespace=ks.events_namespace, stale_s=self.stale_s) \
            if kube is not None and ks.events and ks.verdict_events else None
        self.node_conditions = NodeConditions(store, kube, stale_s=self.stale_s) \
            if kube is not None and ks.node_condition else None

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
            rail = self._rails(ev, rule, target, now, dry, seen)
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

    def _rails(self, ev: TriggerEvent, rule: Rule, target: Target, now: float, dry: bool,
               seen: audit.DecisionState) -> Rail | None:
        """The first rail that stops the trigger, or None.

        An acting decision (``dry`` False) counts acting decisions only (cooldown stamps, rate limits, the
        hourly cap, the breaker window); a dry-run decision counts dry-run decisions too."""
        br = seen.breaker
        metrics.BREAKER_OPEN.set(1 if br.is_open else 0)
        if br.is_open:
            return Rail("breaker", f"circuit breaker open since "
                        f"{time.strftime('%H:%M:%S', time.gmtime(br.opened_at or now))}Z: {br.reason} (reset with "
                        "'triscope remediate reset-breaker')")
        if br.reset_at is not None and ev.started_at < br.reset_at:
            return Rail("stale", "trigger started before the last circuit-breaker reset: not replayed")
        return (self._scope_rail(rule, target) or self._count_rail(rule, target, now, dry, seen.last_action)
                or self._breaker_rail(target, now, br.reset_at, dry) or self._recheck_rail(ev, now))

    def _scope_rail(self, rule: Rule, target: Target) -> Rail | None:
        """The namespace and node allow-lists."""
        s = self.settings
        ns = target.namespace
        # no namespaced object: bound only when it names one (isolate_accelerator evicts pods of allowed namespaces only)
        on_host = rule.action in ("command", "isolate_accelerator") or rule.knobs_file
        if (not on_host and ns not in s.namespaces) or (on_host and ns and s.namespaces and ns not in s.namespaces):
            return Rail("namespace", f"namespace {ns!r} is not in the allow-list {list(s.namespaces)}")
        if rule.action in NODE_ACTIONS:
            node = target.name("node")
            if not s.nodes_bounded or not s.node_name_allowed(node):
                return Rail("node", f"node {node!r} is not in the node allow-list ({s.describe_nodes()})")
        return None

    def _count_rail(self, rule: Rule, target: Target, now: float, dry: bool, last: float | None) -> Rail | None:
        """The cooldown, the rule's rate limit, the hourly cap and the in-flight cap."""
        s = self.settings
        if last is not None and now - last < rule.cooldown_s:
            return Rail("cooldown", f"{target.description} was acted on {now - last:.0f}s ago (cooldown "
                        f"{rule.cooldown_s:g}s)")
        n = self.window.count(now - rule.per_s, rule.name, dry_run=dry)
        if n >= rule.max_actions:
            return Rail("rate_limit", f"rule {rule.name} took {n} actions in the last {rule.per_s:g}s (max "
                        f"{rule.max_actions})")
        n = self.window.count(now - 3600.0, dry_run=dry)
        if n >= s.max_actions_per_hour:
            return Rail("hourly_cap", f"{n} actions in the last hour (cap {s.max_actions_per_hour})")
        with self._state:
            if self._in_flight >= s.max_in_flight:
                return Rail("in_flight", f"{self._in_flight} actions in flight (cap {s.max_in_flight})")
        return None

    def _breaker_rail(self, target: Target, now: float, reset_at: float | None, dry: bool) -> Rail | None:
        trip = self._breaker_trips(target, now, reset_at, dry)
        if not trip:
            return None
        if dry:   # the breaker is shared with acting engines: a dry-run only says it would trip
            return Rail("breaker", f"circuit breaker would open: {trip}")
        return Rail("breaker", f"circuit breaker opened: {trip}", trip)

    def _recheck_rail(self, ev: TriggerEvent, now: float) -> Rail | None:
        """The alert resolved, or the stored-data condition no longer holds."""
        if ev.kind == "alert":
            resolved = self._resolved.get(ev.episode)
            if resolved is not None and resolved >= ev.received_ts:
                return Rail("recheck", "the alert resolved before the action could start")
            return None
        ok, detail = recheck(self.store, ev, now, self.stale_s)
        return None if ok else Rail("recheck", f"condition no longer holds: {detail}")

    def _breaker_trips(self, target: Target, now: float, reset_at: float | None = None, dry: bool = False) -> str:
        """Would this action open the breaker?  Counts the window back to its start or the last reset,
        whichever is later: a reset starts a fresh window (in every engine sharing the store).  An acting
        decision counts the targets of acting decisions only, a dry-run one those of dry-run decisions too."""
        b = self.settings.breaker
        since = now - b.window_s if reset_at is None else max(now - b.window_s, reset_at)
        targets, nodes = self.window.hit(since, dry_run=dry)
        targets = targets | {target.key}
        if target.node:
            nodes = nodes | {target.node}
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

    # after a crash, or on becoming the leader ---------------------------------------------------------
    def resume(self, *, actions: bool = True, older_than: float | None = None) -> tuple[int, int]:
        """Re-run the actions left ``in_progress`` (``actions``) and decide the triggers left in the inbox.

        Called when the engine starts and when it becomes the leader; the scheduler also picks up inbox
        entries older than ``older_than`` seconds (a decision whose store write failed).  Returns
        (actions re-run, inbox triggers queued).
        """
        if self.leader is not None and not self.leader.is_leader:
            return 0, 0
        before = None if older_than is None else time.time() - older_than
        rerun = self._resume_actions(before) if actions else 0
        queued = 0
        for entry in audit.inbox(self.store, before=before):
            try:
                rule: Rule | None = self.policy.rule(entry.rule)
            except KeyError:
                rule = None
            if rule is None or rule.trigger.kind != entry.kind:
                self._drop_entry(entry, rule)
                continue
            ev = event_from_dict(rule, entry.key, entry.kind, entry.event)
            with self._state:
                if self._queued.get(ev.key):
                    continue
            self._mark([ev], +1)
            queued += self._queue(ev) is not None
        if rerun or queued:
            log.info("remediation: resumed %d action(s) left in progress and %d undecided trigger(s)", rerun, queued)
        self.resumed = (rerun, queued)
        return rerun, queued

    def _resume_actions(self, before: float | None) -> int:
        with self._decide:  # a decision between its in_progress row and _running is not taken for a crashed one
            rows = audit.in_progress(self.store)
            with self._state:
                rows = [r for r in rows if r.id not in self._running and (before is None or r.ts < before)]
                self._running.update(r.id for r in rows)
                self._pending += len(rows)
        for row in rows:
            self._pool.submit(self._resume_counted, row)
        return len(rows)

    def _drop_entry(self, entry: audit.InboxRow, rule: Rule | None) -> None:
        """An inbox entry whose rule left the policy (or changed kind) while it waited: decided, suppressed."""
        now = time.time()
        audit.decide(self.store, entry.key, audit.AuditRow(
            ts=now, engine_id=self.engine_id, rule=entry.rule, trigger_kind=entry.kind,
            trigger=str(entry.event.get("description") or ""), trigger_key=entry.key,
            action=rule.action if rule else "", outcome="suppressed", rail="recheck",
            reason=f"rule {entry.rule!r} is no longer in the policy (changed while the trigger waited)",
            dry_run=self.dry_run or bool(rule and rule.dry_run), received_ts=entry.ts, finished_ts=now))

    def _resume_counted(self, row: audit.AuditRow) -> None:
        try:
            self._resume_action(row)
        except Exception:
            log.exception("remediation: re-running decision %d failed", row.id)
            with self._state:
                self._running.discard(row.id)
        finally:
            with self._state:
                self._pending -= 1
                self._idle.notify_all()

    def _resume_action(self, row: audit.AuditRow) -> None:
        try:
            rule: Rule | None = self.policy.rule(row.rule)
        except KeyError:
            rule = None
        why = ""
        if rule is None or rule.action != row.action:
            why = f"the engine stopped while this action ran, and rule {row.rule!r} with action {row.action} is no " \
                  "longer in the policy: not re-run"
        elif row.action == "command" and not row.dry_run:
            why = "the engine stopped while the command ran: commands are not re-run (they are not known to be " \
                  "idempotent); check the host"
        if why or rule is None:
            with self._state:
                self._running.discard(row.id)
            audit.update_decision(self.store, row.id, outcome=audit.FAILED, reason=why, finished_ts=time.time())
            metrics.ACTIONS_TOTAL.labels(row.action, audit.FAILED).inc()
            log.warning("remediation decision %d: %s", row.id, why)
            return
        recorded = row.params
        ev = TriggerEvent(rule, row.trigger_kind, row.trigger_key, row.trigger, labels={}, node=row.node,
                          started_at=row.ts, received_ts=row.received_ts or row.ts,
                          episode=str(recorded.get("episode") or ""))
        workload = _text_map(recorded.get("workload"))
        target = Target(row.target_key, row.target, _text_map(recorded.get("target")), row.node, workload or None)
        stamp = recorded.get("restartedAt")
        with self._state:
            self._in_flight += 1
            metrics.IN_FLIGHT.set(self._in_flight)
        log.info("remediation: re-running decision %d (%s %s), left in progress", row.id, row.action, row.target)
        self._run_action(ev, target, row.dry_run, row.id, row.ts, _recorded_model(rule, recorded),
                         stamp if isinstance(stamp, str) else "", resumed=True)

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

    # scheduled jobs ----------------------------------------------------------------------------------
    def evaluate_triggers(self, now: float | None = None) -> int:
        """Evaluate every stored-data rule; queue new episodes; mark fallbacks whose condition cleared."""
        now = time.time() if now is None else now
        submitted = 0
        if self.leader is not None and not self.leader.is_leader:
            return 0  # the leader evaluates; a follower that became leader starts from fresh episodes
        for rule in self.data_rules:
            try:
                events = stored_data_events(self.store, rule, now, self.stale_s, self._episodes)
            except Exception as e:  # noqa: BLE001 - one rule's failure must not stop the others
                log.warning("remediation: evaluating rule %s failed: %s", rule.name, e)
                continue
            if rule.action == "dependency_fallback":
                self._note_clear(rule, events, now)
            for ev in events:
                if ev.key in self._seen:
                    continue
                try:
                    self.submit(ev)
                except IntakeError as e:
                    log.warning("remediation: rule %s: %s (evaluated again next time)", rule.name, e)
                    continue
                self._seen[ev.key] = now
                submitted += 1
        cutoff = now - self.settings.dedupe_retention_s
        for key in [kk for kk, ts in self._seen.items() if ts < cutoff]:
            del self._seen[key]
        return submitted

    def _note_clear(self, rule: Rule, events: list[TriggerEvent], now: float) -> None:
        """A fallback of ``rule`` is clear while no episode of the rule holds for it (its own, or another
        accelerator's naming the same ConfigMap or knobs file); its hold period runs from the first evaluation
        that sees it."""
        holding = {ev.episode for ev in events}
        for ev in events:
            if rule.knobs_file:   # named by the workload label alone: no lookup
                res = resolve_rule_target(rule, ev.labels, None)
                target, err = res.target, res.error
            else:
                target, err = resolve_target(rule, ev.labels)
            if not err:
                holding.add(target_key(rule, target)[0])
        for fb in audit.active_fallbacks(self.store):
            if fb.rule != rule.name:
                continue
            held = fb.trigger_key in holding or fb.target_key in holding
            if not held and fb.clear_since is None:
                audit.set_fallback_clear(self.store, fb.id, now)
            elif held and fb.clear_since is not None:
                audit.set_fallback_clear(self.store, fb.id, None)

    def announce_verdicts(self, now: float | None = None) -> int:
        """Scheduler job: Kubernetes Events on the pod and node for each verdict that would page, and
        when it ends (remediation/verdict_events.py), and each node's AcceleratorCoordinationDegraded
        condition (remediation/node_condition.py); the leader only.  The Events posted."""
        if self.leader is not None and not self.leader.is_leader:
            return 0
        if self.node_conditions is not None:
            self.node_conditions.evaluate(now)
        return 0 if self.verdict_events is None else self.verdict_events.evaluate(now)

    def untaint_accelerators(self, now: float | None = None) -> int:
        """Scheduler job: delete each DeviceTaintRule ``isolate_accelerator`` created once its GPU's verdict
        has been healthy for the rule's ``untaint_after`` (remediation/isolate.py); the leader only.  A
        dry-run engine deletes only its dry-run rules (``effect: None``)."""
        if self.kube is None or (self.leader is not None and not self.leader.is_leader):
            return 0
        events = self.settings.kubernetes.events_namespace if self.settings.kubernetes.events else None
        return len(isolate.release_healthy(self.store, self.kube, time.time() if now is None else now,
                                           self.stale_s, events, dry_run=self.dry_run))

    def refresh_workloads(self, now: float | None = None) -> int:
        """Scheduler job: resolve the pods the agent's per-accelerator series name (workload label left
        empty) into the store's ``workloads`` table, for the dashboard and for alerts that carry only a pod."""
        if self.kube is None or (self.leader is not None and not self.leader.is_leader):
            return 0
        now = time.time() if now is None else now
        latest = self.store.fleet_latest([WORKLOAD_INFO_METRIC, MISMATCH_METRIC], since=now - max(600.0, self.stale_s))
        pods = pods_in_series(parse_label_key(lk) for series in latest.values() for (_m, lk) in series)
        allowed = self.settings.namespaces   # the namespaces the engine is bound to (RBAC) and may act in
        return self.workloads.refresh([p for p in pods if not allowed or p[0] in allowed], now)

    def revert_fallbacks(self, now: float | None = None) -> int:
        """Revert each active fallback whose trigger has been clear for its hold period, or whose TTL ran out."""
        if self.leader is not None and not self.leader.is_leader:
            return 0
        return revert_due_fallbacks(self.store, self.kube, time.time() if now is None else now, self.engine_id,
                                    {r.name for r in self.policy.rules} if self.settings.kubernetes.events else set())

    def prune(self) -> int:
        with self._decide:
            now = time.time()
            self.window.trim(now)
            for ep in [e for e, ts in self._resolved.items() if ts < now - self.settings.dedupe_retention_s]:
                del self._resolved[ep]
        try:
            wstore.prune_workloads(self.store, time.time() - max(self.settings.dedupe_retention_s, 3 * self.workloads.ttl_s))
        except Exception as e:  # noqa: BLE001 - an older schema without the table: resolution still works from the API
            log.warning("remediation: cannot prune the workloads table: %s", e)
        return audit.prune(self.store, time.time() - self.settings.dedupe_retention_s)

    def leader_step(self) -> None:
        if self.leader is not None:
            was = self.leader.is_leader
            now_leader = self.leader.step()
            metrics.LEADER.set(1 if now_leader else 0)
            if now_leader and not was:  # another replica may have acted meanwhile: recount from the store
                with self._decide:
                    self.window.load(self.store, time.time())
                self.resume()  # and may have left actions in progress or triggers undecided

    def resume_inbox(self) -> int:
        """Scheduler job: decide inbox entries nobody here is deciding (their first attempt's store write
        failed), and re-run actions left ``in_progress`` that no worker here runs (their outcome could not
        be stored: the database failed over under them).  Both only once older than 30 s."""
        return self.resume(actions=True, older_than=max(30.0, 2 * self.settings.evaluate_interval_s))[1]

    # lifecycle ---------------------------------------------------------------------------------------
    def status(self) -> dict[str, object]:
        br = audit.breaker_state(self.store)
        with self._state:
            in_flight, pending = self._in_flight, self._pending
        return {"engine_id": self.engine_id, "dry_run": self.dry_run, "leader": self.leader_now,
                "breaker": br.state, "in_flight": in_flight, "pending": pending, "rules": len(self.policy.rules),
                "kubernetes": self.kube.describe if self.kube else None}

    def close(self, wait: float = 10.0) -> None:
        self._stop.set()
        self.drain(wait)
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._side.shutdown(wait=True)
        if self.leader is not None:
            self.leader.release()


def _recorded_model(rule: Rule, recorded: dict[str, object]) -> ActionParams:
    """The params a decision was taken with (its audit row's ``params``), as the rule's model; the rule's
    current params when the recorded ones no longer validate (the model changed since)."""
    model = type(rule.params)
    given: dict[str, object] = {a: b for a, b in recorded.items() if a in model.model_fields}
    try:
        return model.model_validate(given)
    except ValidationError as e:
        log.warning("remediation: rule %s: the recorded params no longer validate, re-run with the policy's: %s",
                    rule.name, e.error_count())
        return rule.params
