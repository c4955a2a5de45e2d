"""The verdict where Kubernetes users look: an Event on the pod and on the node when a verdict would page.

``kubectl describe pod`` is where an SRE looks first.  Each evaluation reads the verdict history
(``verdict_runs``, the one record every page and root cause read) and, for a run of one accelerator
in an I/O state that has held as long as the shipped alert's ``for`` (``PAGE_AFTER_S``: what would
page), posts a ``Warning`` Event

    StagingBound   gpu 0: inference/web-0 throttled in 99 % of its CPU periods (>= 25 %): held at its CPU limit

on the pod the verdict names (when its namespace is in ``settings.namespaces``: the engine's RBAC
reaches those only) and on the node (in ``kubernetes.events_namespace``), quoting the verdict's own
first reason (the tracker's ``accelerator_state`` event, analysis/online.py).  When that run ends,
one ``Normal`` ``AcceleratorRecovered`` Event says so, with how long it held and the state after.

Like the kubelet's event recorder: an identical Event (same object, reason and message) within
``DEDUPE_S`` is not posted again, and each object has a token bucket (``BURST`` Events, then one per
``REFILL_S``) so a flapping verdict cannot flood the API.  Unlike it, a repeat is dropped rather
than PATCHed into a count (the engine holds no ``events: patch`` grant).  What was announced is kept
in memory: after an engine restart a run still holding is announced once more.  Only the leader
posts.  Off Kubernetes (no API) nothing is posted.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from triscope.core.vocabulary import WorkloadKey, accelerator_labels
from triscope.remediation import metrics
from triscope.remediation.kube.adapter import KubeAdapter
from triscope.remediation.kube.errors import KubeError
from triscope.store.reader import StoreReader, VerdictRun

log = logging.getLogger("triscope.remediation.verdict_events")

PAGE_AFTER_S = {"io-saturated": 300.0, "staging-bound": 600.0, "network-bound": 300.0}
"""How long a state holds before it would page: the ``for`` of the shipped alerts TriscopeIOSaturated,
TriscopeStagingBound and TriscopeNetworkBound (deploy/kustomize/base/prometheusrule.yaml; a test
keeps the two in step)."""
REASONS = {"io-saturated": "IOSaturated", "staging-bound": "StagingBound", "network-bound": "NetworkBound"}
RECOVERED = "AcceleratorRecovered"
DEDUPE_S = 600.0     # the kubelet's aggregation window
BURST = 25           # the kubelet's per-object spam filter: 25 at once ...
REFILL_S = 300.0     # ... then one every 5 minutes
COMPONENT = "triscope-verdict"


@dataclass
class _Bucket:
    tokens: float
    at: float


def _accelerator_text(acc: str) -> str:
    """``gpu=0`` -> ``gpu 0``; ``chip=0,npu=1`` -> ``npu 1 chip 0``."""
    lab = accelerator_labels(acc)
    parts = [f"{name} {lab[name]}" for name in ("gpu", "npu", "chip") if name in lab]
    return " ".join(parts) or acc


def _duration(s: float) -> str:
    m = int(s // 60)
    return f"{m}m{int(s % 60):02d}s" if m else f"{int(s)}s"


def verdict_reasons(store: StoreReader, run: VerdictRun) -> list[str]:
    """The verdict's reasons (its chain, first the deciding one) when the accelerator entered the run's
    state: the tracker's ``accelerator_state`` event nearest the run's start; [] when none was stored."""
    try:
        evs = store.events(node=run.node, start=run.start - 120.0, end=run.start + 120.0,
                           kinds=["accelerator_state"], limit=200)
    except Exception as e:  # noqa: BLE001 - an Event without the reason beats no Event
        log.warning("verdict events: cannot read the verdict's reasons: %s", e)
        return []
    best: tuple[float, list[str]] | None = None
    for ev in evs:
        d = ev.details or {}
        labels = d.get("labels") or {}
        if d.get("to") != run.state or not d.get("reasons"):
            continue
        if not all(labels.get(a) == v for a, v in accelerator_labels(run.accelerator).items()):
            continue
        gap = abs(ev.ts - run.start)
        if best is None or gap < best[0]:
            best = (gap, [str(r) for r in d["reasons"]])
    return best[1] if best else []


class VerdictEvents:
    """Posts the verdict's paging changes as Kubernetes Events (``evaluate`` every evaluation)."""

    def __init__(self, store: StoreReader, kube: KubeAdapter, *, namespaces: tuple[str, ...],
                 events_namespace: str, stale_s: float = 60.0, page_after: dict[str, float] | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.store, self.kube = store, kube
        self.namespaces = namespaces
        self.events_namespace = events_namespace
        self.stale_s = stale_s
        self.page_after = dict(PAGE_AFTER_S if page_after is None else page_after)
        self.clock = clock
        self._announced: dict[tuple[str, str, str, WorkloadKey, float], VerdictRun] = {}
        self._recent: dict[tuple[str, str, str, str], float] = {}    # (object, reason, message) -> posted at
        self._buckets: dict[str, _Bucket] = {}
        self.posted = 0

    # one evaluation ------------------------------------------------------------------------------
    def evaluate(self, now: float | None = None) -> int:
        """Announce runs that came to page since the last evaluation, and the end of those announced."""
        now = self.clock() if now is None else now
        look = max(self.page_after.values(), default=600.0) + 2 * self.stale_s
        posted = 0
        latest: dict[tuple[str, str], VerdictRun] = {}
        for n in self.store.nodes():
            for run in self.store.verdict_runs(n.name, now - look, now):
                if not run.accelerator:
                    continue        # the node's roll-up: the per-accelerator runs say it per accelerator
                cur = latest.get((run.node, run.accelerator))
                if cur is None or run.end > cur.end:
                    latest[(run.node, run.accelerator)] = run
                after = self.page_after.get(run.state)
                if after is None or run.end - run.start < after or run.end < now - self.stale_s:
                    continue
                key = (run.node, run.accelerator, run.state, run.workload, run.start)
                if key in self._announced:
                    self._announced[key] = run
                    continue
                self._announced[key] = run
                posted += self._announce(run, now)
        for key, run in list(self._announced.items()):
            newest = latest.get((run.node, run.accelerator))
            still = newest is not None and newest.start == run.start and newest.end >= now - self.stale_s
            if still:
                continue
            del self._announced[key]
            now_in = "" if newest is None or newest.start == run.start else f"; now {newest.state}"
            msg = f"{_accelerator_text(run.accelerator)}: {run.state} for {_duration(run.end - run.start)} ended{now_in}"
            posted += self._post_all(run, RECOVERED, msg, "Normal", now)
        self._forget(now)
        self.posted += posted
        return posted

    def _announce(self, run: VerdictRun, now: float) -> int:
        reason = self._first_reason(run)
        msg = f"{_accelerator_text(run.accelerator)}: " + (
            reason or f"{run.state} for {_duration(run.end - run.start)} (score {run.score_mean:.2f})")
        return self._post_all(run, REASONS[run.state], msg, "Warning", now)

    def _first_reason(self, run: VerdictRun) -> str:
        """The verdict's own first reason when the accelerator entered this state."""
        reasons = verdict_reasons(self.store, run)
        return reasons[0] if reasons else ""

    # posting -------------------------------------------------------------------------------------
    def _objects(self, run: VerdictRun) -> list[tuple[str, dict[str, str]]]:
        """(namespace the Event goes to, involvedObject): the pod the verdict names, then the node."""
        ns, pod = run.workload[0], run.workload[1]
        out = []
        if ns and pod and ns in self.namespaces:
            out.append((ns, {"kind": "Pod", "apiVersion": "v1", "namespace": ns, "name": pod}))
        out.append((self.events_namespace, {"kind": "Node", "apiVersion": "v1", "name": run.node}))
        return out

    def _post_all(self, run: VerdictRun, reason: str, message: str, type_: str, now: float) -> int:
        n = 0
        for ns, obj in self._objects(run):
            n += self._post(ns, obj, reason, message, type_, now)
        return n

    def _post(self, ns: str, obj: dict[str, str], reason: str, message: str, type_: str, now: float) -> int:
        who = f"{obj['kind']}/{obj.get('namespace', '')}/{obj['name']}"
        same = (who, reason, message, type_)
        if now - self._recent.get(same, -1e18) < DEDUPE_S:
            metrics.VERDICT_EVENTS.labels("deduplicated").inc()
            return 0
        b = self._buckets.get(who)
        if b is None:
            b = self._buckets[who] = _Bucket(float(BURST), now)
        b.tokens = min(float(BURST), b.tokens + (now - b.at) / REFILL_S)
        b.at = now
        if b.tokens < 1.0:
            metrics.VERDICT_EVENTS.labels("rate_limited").inc()
            return 0
        try:
            self.kube.post_event(ns, obj, reason=reason, message=message, type_=type_, component=COMPONENT)
        except KubeError as e:
            metrics.VERDICT_EVENTS.labels("failed").inc()
            log.warning("verdict events: %s %s on %s: %s", reason, type_, who, e)
            return 0
        b.tokens -= 1.0
        self._recent[same] = now
        metrics.VERDICT_EVENTS.labels("posted").inc()
        return 1

    def _forget(self, now: float) -> None:
        for key in [x for x, t in self._recent.items() if now - t >= DEDUPE_S]:
            del self._recent[key]
        for who in [w for w, b in self._buckets.items() if b.tokens >= BURST - 1e-9 and now - b.at > REFILL_S]:
            del self._buckets[who]

    def describe(self) -> dict[str, Any]:
        return {"announced": len(self._announced), "posted": self.posted}
