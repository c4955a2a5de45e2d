"""The remediation engine: its decisions (``triscope.remediation.decisions``) run over time.

The scheduler's periodic jobs (``triscope.remediation.service`` schedules them): stored-data
triggers evaluated, fallbacks reverted, workloads resolved, verdicts announced, accelerators
untainted, the leader Lease renewed, old deliveries pruned; the resume after a crash or on becoming
the leader (the actions left ``in_progress`` re-run, the inbox decided); the engine's status and
shutdown.  Only the leader acts: every job of a follower returns at once.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from pydantic import ValidationError

from triscope import defaults
from triscope.core.samples import parse_label_key
from triscope.remediation import isolate, metrics
from triscope.remediation.conditions import MISMATCH_METRIC, VerdictReader, verdict_lookback
from triscope.remediation.decisions import Decisions, IntakeError
from triscope.remediation.fallbacks import revert_due_fallbacks
from triscope.remediation.kube.adapter import KubeAdapter
from triscope.remediation.leader import LeaderElector
from triscope.remediation.node_condition import NodeConditions
from triscope.remediation.policy import ActionParams, Policy, Rule
from triscope.remediation.target_resolution import resolve_rule_target, resolve_target, target_key
from triscope.remediation.targets import Target
from triscope.remediation.triggers import TriggerEvent, event_from_dict, stored_data_events
from triscope.remediation.verdict_events import VerdictEvents
from triscope.remediation.workloads import pods_in_series
from triscope.store import audit
from triscope.store import workloads as wstore

if TYPE_CHECKING:
    from triscope.store.api import Store

log = logging.getLogger(__name__)

DEFAULT_POLICY = defaults.POLICY   # deploy/policy.example.yaml, shipped as package data
WORKLOAD_INFO_METRIC = "triscope_accelerator_workload_info"   # the agent's attribution series (docs/workloads.md)


class Engine(Decisions):
    """The decisions of a policy over a store (and a Kubernetes API), with the jobs that feed and tend them."""

    def __init__(self, store: Store, policy: Policy, *, kube: KubeAdapter | None = None, dry_run: bool = False,
                 leader: LeaderElector | None = None) -> None:
        super().__init__(store, policy, kube=kube, dry_run=dry_run, leader=leader)
        self._seen: dict[str, float] = {}          # stored-data keys already submitted (avoid re-queueing)
        self._episodes: dict[tuple[str, str], float] = {}
        ks = policy.settings.kubernetes
        self.verdict_events = VerdictEvents(store, kube, namespaces=policy.settings.namespaces,
                                            events_namespace=ks.events_namespace, stale_s=self.stale_s) \
            if kube is not None and ks.events and ks.verdict_events else None
        self.node_conditions = NodeConditions(store, kube, stale_s=self.stale_s) \
            if kube is not None and ks.node_condition else None

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

    # scheduled jobs ----------------------------------------------------------------------------------
    def _verdict_reader(self, now: float) -> VerdictReader | None:
        """One read of the verdict history for every rule of this evaluation, as far back as the
        rules look (None when no rule reads it: nothing is read)."""
        looks = [verdict_lookback(r.trigger.for_s, self.stale_s) for r in self.data_rules
                 if r.trigger.kind in ("metric", "mismatch")]
        looks += [max(self.stale_s, 60.0) + r.trigger.within_s for r in self.data_rules if r.trigger.kind == "xid"]
        if not looks:
            return None
        try:
            return VerdictReader(self.store, now - max(looks))
        except Exception as e:  # noqa: BLE001 - each rule then reads for itself, and says why it failed
            log.warning("remediation: reading the verdict history failed: %s", e)
            return None

    def evaluate_triggers(self, now: float | None = None) -> int:
        """Evaluate every stored-data rule; queue new episodes; mark fallbacks whose condition cleared."""
        now = time.time() if now is None else now
        submitted = 0
        if self.leader is not None and not self.leader.is_leader:
            return 0  # the leader evaluates; a follower that became leader starts from fresh episodes
        verdicts = self._verdict_reader(now)
        for rule in self.data_rules:
            try:
                events = stored_data_events(self.store, rule, now, self.stale_s, self._episodes, verdicts)
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



def _text_map(value: object) -> dict[str, str]:
    return {str(a): str(b) for a, b in value.items()} if isinstance(value, dict) else {}


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
