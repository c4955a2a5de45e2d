"""A recording's verdicts recomputed by today's code: its inputs replayed through this version's tracker.

A trace keeps every input the recording agent's tracker read (GPU activity, PCIe, the workloads'
host and network evidence, DMA maps, retransmits, wait-for counters) next to the verdicts that
tracker published then.  ``replay_trace`` feeds the recorded ticks, in time order with their own
timestamps, through ``MismatchTracker`` exactly as the agent's sampler does, and returns a trace
whose verdicts are today's:

* ``triscope_mismatch_state`` / ``_score`` / ``_pin_churn`` and the tracker's state-change events
  (``mismatch_state``, ``accelerator_state``) are today's tracker's; the verdict history the store
  writes from them is today's, so every page, ``triscope rca`` and the engine's stored-data triggers
  read today's verdict;
* the verdicts the recording published stay in the trace, **marked as recorded**: the same series
  renamed ``triscope_recorded_mismatch_state`` / ``_score`` / ``_pin_churn`` (same labels; no page
  reads them as a verdict, ``triscope query --metric triscope_recorded_mismatch_state`` prints them),
  and its state-change events as ``recorded_mismatch_state`` / ``recorded_accelerator_state``;
* the recording engine's decisions (made on the recorded verdicts) keep their rows with
  ``engine_id`` ``recorded`` and a reason that starts ``recorded:`` (``recorded_decisions``), its
  ``remediation`` events a message that starts ``recorded:``;
* the node is labelled ``triscope.verdicts=replayed`` with the triscope version that replayed it.

``triscope import-trace --replay`` and ``make run`` (``triscope run``'s ``import_for_demo``) load
recordings this way.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from triscope.core.trace import Trace, iter_ticks

VERDICT_PREFIX = "triscope_mismatch_"
RECORDED_PREFIX = "triscope_recorded_mismatch_"
VERDICT_EVENTS = ("mismatch_state", "accelerator_state")   # what the tracker publishes on a change
RECORDED_EVENT_PREFIX = "recorded_"
VERDICTS_LABEL = "triscope.verdicts"
RECORDED_ENGINE = "recorded"


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("triscope")
    except Exception:  # noqa: BLE001 - a source tree without metadata
        return "source"


def replay_trace(trace: Trace, thresholds: Any = None) -> Trace:
    """``trace`` with its verdicts recomputed by today's tracker and the recorded ones renamed
    (module docstring).  Pure: the store is not touched; ``import_trace(store, path, trace=...)``
    loads the result."""
    from triscope.analysis.online import MismatchTracker
    from triscope.core.samples import EventRecord, Sample

    series: list[list[Any]] = []
    for sid, metric, labels, kind in trace.header["series"]:
        if str(metric).startswith(VERDICT_PREFIX):
            metric = RECORDED_PREFIX + str(metric)[len(VERDICT_PREFIX):]
        series.append([sid, metric, labels, kind])
    recorded_sids = {int(s[0]) for s in trace.header["series"] if str(s[1]).startswith(VERDICT_PREFIX)}
    next_sid = max((int(s[0]) for s in series), default=0) + 1
    new_sids: dict[tuple[str, tuple[tuple[str, str], ...]], int] = {}
    tracker = MismatchTracker(thresholds)
    ticks: list[tuple[float, list[tuple[int, float]]]] = []
    events: list[dict[str, Any]] = []
    for (t, vals), tick in zip(trace.ticks, iter_ticks(trace, 0.0), strict=True):
        inputs = [s for s in tick.samples if not s.name.startswith(VERDICT_PREFIX)]
        out = list(vals)
        for item in tracker.process(t, inputs):
            if isinstance(item, EventRecord):
                events.append({"ts": item.ts or t, "kind": item.kind, "severity": item.severity,
                               "message": item.message, "details": item.details})
                continue
            if not isinstance(item, Sample):
                continue
            key = (item.name, tuple(sorted(item.labels.items())))
            sid = new_sids.get(key)
            if sid is None:
                sid = new_sids[key] = next_sid
                next_sid += 1
                series.append([sid, item.name, dict(item.labels), item.kind])
            out.append((sid, float(item.value)))
        ticks.append((t, out))
    assert recorded_sids.isdisjoint(new_sids.values())
    for e in trace.events:
        if e.get("kind") in VERDICT_EVENTS:
            events.append({**e, "kind": RECORDED_EVENT_PREFIX + str(e["kind"]),
                           "message": f"recorded: {e.get('message', '')}"})
        elif e.get("kind") == "remediation":      # the recording engine's, on the recorded verdicts
            events.append({**e, "message": f"recorded: {e.get('message', '')}",
                           "details": {**(e.get("details") or {}), "recorded": True}})
        else:
            events.append(e)
    events.sort(key=lambda e: float(e["ts"]))
    labels = {**(trace.header.get("labels") or {}), VERDICTS_LABEL: f"replayed by triscope {_version()}"}
    return Trace({**trace.header, "series": series, "labels": labels}, ticks, events, recorded_decisions(trace.decisions))


def recorded_decisions(decisions: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The recording engine's decisions marked as such: ``engine_id`` ``recorded`` and the reason
    prefixed ``recorded:`` (they were taken on the recorded verdicts, not today's)."""
    out = []
    for d in decisions:
        reason = str(d.get("reason") or "")
        out.append({**d, "engine_id": RECORDED_ENGINE,
                    "reason": reason if reason.startswith("recorded:") else f"recorded: {reason}".rstrip()})
    return out
