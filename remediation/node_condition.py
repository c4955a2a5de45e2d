"""The verdict as a node condition, where ``kubectl describe node`` shows it (Node Problem Detector style).

Every evaluation (the leader only, beside the verdict Events) each node the store knows gets one
condition of triscope's own type, ``AcceleratorCoordinationDegraded``:

* ``status: "True"`` while one of its accelerators is in an I/O state (``io-saturated``,
  ``staging-bound``, ``network-bound``) that has held as long as the shipped alert's ``for`` (what
  would page, ``verdict_events.PAGE_AFTER_S``) and is still published; ``reason`` the state in
  CamelCase (``StagingBound``; the longest-held one when several are), ``message`` each such
  accelerator, its state, since when, and the verdict's reason chain;
* ``status: "False"`` (set, not removed) with reason ``AcceleratorsHealthy`` otherwise.

``lastTransitionTime`` moves when ``status`` does; the condition is patched (``nodes/status``,
strategic merge: the kubelet's own conditions are untouched) only when status, reason or message
change, so a steady node costs no writes.  A store node that is no Kubernetes node (404) is skipped
and asked again after ten minutes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from triscope.core.timeparse import format_rfc3339
from triscope.core.vocabulary import IO_STATES
from triscope.remediation.kube.adapter import KubeAdapter
from triscope.remediation.kube.errors import KubeError, NotFound
from triscope.remediation.verdict_events import PAGE_AFTER_S, REASONS, _accelerator_text, verdict_reasons
from triscope.store.reader import StoreReader, VerdictRun

log = logging.getLogger("triscope.remediation.node_condition")

CONDITION = "AcceleratorCoordinationDegraded"
HEALTHY = "AcceleratorsHealthy"
HEALTHY_MESSAGE = ("no accelerator of this node has been in an I/O state (io-saturated, staging-bound, "
                   "network-bound) long enough to page")
NOT_A_NODE_S = 600.0


def desired(store: StoreReader, node: str, now: float, stale_s: float,
            page_after: dict[str, float]) -> tuple[str, str, str]:
    """(status, reason, message) of ``node``'s condition from its verdict history."""
    look = max(page_after.values(), default=600.0) + 2 * stale_s
    latest: dict[str, VerdictRun] = {}
    for run in store.verdict_runs(node, now - look, now):
        if run.accelerator and (run.accelerator not in latest or run.end > latest[run.accelerator].end):
            latest[run.accelerator] = run
    bad = [r for r in latest.values() if r.state in IO_STATES and r.end >= now - stale_s
           and r.end - r.start >= page_after.get(r.state, float("inf"))]
    if not bad:
        return "False", HEALTHY, HEALTHY_MESSAGE
    bad.sort(key=lambda r: (r.start, r.accelerator))
    parts = []
    for r in bad:
        chain = " <- ".join(verdict_reasons(store, r)) or f"score {r.score_mean:.2f}"
        parts.append(f"{_accelerator_text(r.accelerator)} {r.state} since {format_rfc3339(r.start)}: {chain}")
    return "True", REASONS[bad[0].state], "; ".join(parts)


class NodeConditions:
    """Keeps each node's ``AcceleratorCoordinationDegraded`` condition in step with its verdicts."""

    def __init__(self, store: StoreReader, kube: KubeAdapter, *, stale_s: float = 60.0,
                 page_after: dict[str, float] | None = None, clock: Callable[[], float] = time.time) -> None:
        self.store, self.kube, self.stale_s, self.clock = store, kube, stale_s, clock
        self.page_after = dict(PAGE_AFTER_S if page_after is None else page_after)
        self._written: dict[str, tuple[str, str, str]] = {}
        self._absent: dict[str, float] = {}

    def evaluate(self, now: float | None = None) -> int:
        """Patch each node whose condition changed; the number patched."""
        now = self.clock() if now is None else now
        changed = 0
        for n in self.store.nodes():
            if now - self._absent.get(n.name, -1e18) < NOT_A_NODE_S:
                continue
            want = desired(self.store, n.name, now, self.stale_s, self.page_after)
            if self._written.get(n.name) == want:
                continue
            try:
                out = self.kube.set_node_condition(n.name, CONDITION, *want)
            except NotFound:
                self._absent[n.name] = now
                continue
            except KubeError as e:
                log.warning("node condition: %s on node %s: %s", CONDITION, n.name, e)
                continue
            self._written[n.name] = want
            changed += int(out["changed"])
        return changed
