"""The safety rails a decision passes before its action runs, from ``stale`` to ``recheck`` (the
pipeline, ``triscope.remediation.decisions``).

Read under the engine's decision lock, once per decision, from what the store says (the claim, the
breaker, the target's cooldown: ``audit.DecisionState``) and what the engine counts (its
``DecisionWindow`` of recent decisions, the actions in flight, the alerts resolved since).  An acting
decision counts acting decisions only; a dry-run decision counts dry-run decisions too.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from triscope.remediation import metrics
from triscope.remediation.policy import NODE_ACTIONS, Rule
from triscope.remediation.settings import Settings
from triscope.remediation.targets import Target
from triscope.remediation.triggers import TriggerEvent, recheck
from triscope.store import audit
from triscope.store.audit import DecisionWindow

if TYPE_CHECKING:
    from triscope.store.api import Store


@dataclass(frozen=True)
class Rail:
    """A rail that stops a decision: its name, why, and the breaker's reason when the decision opens it."""

    name: str
    reason: str
    trip: str | None = None


class Rails:
    """The rails of one engine: its settings, its window of decisions, its store."""

    def __init__(self, settings: Settings, store: Store, window: DecisionWindow, stale_s: float,
                 resolved: dict[str, float], in_flight: Callable[[], int]) -> None:
        self.settings, self.store, self.window, self.stale_s = settings, store, window, stale_s
        self._resolved = resolved       # alert episode -> when a resolved notification came (the engine's)
        self._in_flight = in_flight     # the actions running now
        self._nodes_cache: tuple[float, int] = (0.0, 0)

    def first(self, ev: TriggerEvent, rule: Rule, target: Target, now: float, dry: bool,
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
        return (self._scope(rule, target) or self._count(rule, target, now, dry, seen.last_action)
                or self._breaker(target, now, br.reset_at, dry) or self._recheck(ev, now))

    def _scope(self, rule: Rule, target: Target) -> Rail | None:
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

    def _count(self, rule: Rule, target: Target, now: float, dry: bool, last: float | None) -> Rail | None:
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
        in_flight = self._in_flight()
        if in_flight >= s.max_in_flight:
            return Rail("in_flight", f"{in_flight} actions in flight (cap {s.max_in_flight})")
        return None

    def _breaker(self, target: Target, now: float, reset_at: float | None, dry: bool) -> Rail | None:
        trip = self._breaker_trips(target, now, reset_at, dry)
        if not trip:
            return None
        if dry:   # the breaker is shared with acting engines: a dry-run only says it would trip
            return Rail("breaker", f"circuit breaker would open: {trip}")
        return Rail("breaker", f"circuit breaker opened: {trip}", trip)

    def _recheck(self, ev: TriggerEvent, now: float) -> Rail | None:
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
