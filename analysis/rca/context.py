"""Context beside an episode: what is worth seeing next to its causes but is no cause.  Pure.

* ``application`` — the workload's own SLIs that moved (latency, queue depth, in-flight requests):
  a symptom of whatever held the accelerator back, never its cause; and its own ``/metrics``
  answering late (the agent's scrape missed the tick's budget);
* ``remediation`` — the engine's actions inside the episode: its answer, not a cause;
* ``agent`` — the agent itself was unhealthy (a collector down, store write errors, dropped
  samples): a gap in the evidence, not a reason the accelerator waited.

A scrape target's late ``/metrics`` is also an **event on that workload's lane**
(``metrics_late_events``): kind ``event``, state ``metrics-late``, never a bad episode; repeated
blips of one target within ``HEALTH_MERGE_S`` of each other are one event (``detail["blips"]``).
The lane is found from the target's own series: the ``workload`` label the service exports on its
``instance``, matched to the workloads of the state episodes (``cmd:inference-b`` and
``Deployment/inference-b`` match ``inference-b``); without one, the node's lane.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from triscope.analysis.episodes import (
    NODE,
    SCRAPE_PREFIX,
    Episode,
    Workload,
    collector_episodes,
    is_application_collector,
)
from triscope.analysis.rca.categories import CATEGORY_BY_KEY
from triscope.analysis.rca.changes import SeriesChange, fmt
from triscope.analysis.rca.evidence import Figure
from triscope.analysis.rca.score import event_dict
from triscope.analysis.reader import SeriesPoints
from triscope.core.vocabulary import NO_WORKLOAD

MAX_CONTEXT_EVIDENCE = 5
METRICS_LATE = "metrics-late"


@dataclass(slots=True)
class Context:
    kind: str                       # application | remediation | agent
    title: str
    summary: str
    evidence: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"context": self.kind, "title": self.title, "summary": self.summary, "evidence": self.evidence}


def _application(changes: Sequence[SeriesChange], late: Sequence[Any]) -> Context | None:
    sli = sorted((c for c in changes if c.category == "application"), key=lambda c: (-c.magnitude, c.series))
    if not sli and not late:
        return None
    parts = []
    if sli:
        c = sli[0]
        parts.append(f"{c.series} {fmt(c.baseline)} -> {fmt(c.window)}"
                     + (f" (+{len(sli) - 1} more series)" if len(sli) > 1 else ""))
    if late:
        targets = sorted({str((e.details or {}).get("collector", "?")).removeprefix(SCRAPE_PREFIX) for e in late})
        downs = sum(1 for e in late if (e.details or {}).get("up") is False)
        parts.append(f"its /metrics ({', '.join(targets)}) answered late or not at all {downs} time(s)")
    ev = [c.as_dict() for c in sli[:MAX_CONTEXT_EVIDENCE]] + [event_dict(e) for e in late[:MAX_CONTEXT_EVIDENCE]]
    return Context("application", CATEGORY_BY_KEY["application"].title + " (a symptom, not a cause)",
                   "; ".join(parts), ev)


def _agent(figs: Sequence[Figure], changes: Sequence[SeriesChange], events: Sequence[Any]) -> Context | None:
    if not figs and not events:
        return None         # the agent's own metrics move with the node: only trouble is context
    own = [c for c in changes if c.category == "agent"]
    text = "; ".join(f.detail for f in figs) or "; ".join(sorted({e.message for e in events}))[:300]
    ev = [f.as_dict() for f in figs] + [c.as_dict() for c in own[:MAX_CONTEXT_EVIDENCE]]
    ev += [event_dict(e) for e in events[:MAX_CONTEXT_EVIDENCE]]
    return Context("agent", CATEGORY_BY_KEY["agent"].title + " (a gap in the evidence, not a cause)", text, ev)


def _remediation(events: Sequence[Any]) -> Context | None:
    if not events:
        return None
    msgs = list(dict.fromkeys(e.message for e in events))
    return Context("remediation", CATEGORY_BY_KEY["remediation"].title + " (the engine's answer, not a cause)",
                   f"{len(events)} action(s): " + "; ".join(msgs[:3]), [event_dict(e) for e in events[:MAX_CONTEXT_EVIDENCE]])


def context_lines(changes: Sequence[SeriesChange], events: Sequence[Any],
                  figs: Mapping[str, Sequence[Figure]]) -> list[Context]:
    """The context of an episode (or a window) from its moved series, its events and its figures."""
    late = [e for e in events if e.kind == "collector"
            and is_application_collector(str((e.details or {}).get("collector", "")))]
    agent_events = [e for e in events if e.kind == "collector" and e not in late
                    and (e.details or {}).get("up") is False]
    out = [_application(changes, late), _remediation([e for e in events if e.kind == "remediation"]),
           _agent(list(figs.get("agent", ())), changes, agent_events)]
    return [c for c in out if c is not None]


# ---------------------------------------------------------------------------------------------- late /metrics
def scrape_workloads(series: Iterable[SeriesPoints]) -> dict[str, str]:
    """scrape target (``host:port``) -> the workload name its own series carry (``workload`` label)."""
    out: dict[str, str] = {}
    for sp in series:
        inst, wl = sp.labels.get("instance"), sp.labels.get("workload")
        if inst and wl and inst not in out:
            out[inst] = wl
    return out


def names_workload(key: Workload, name: str) -> bool:
    """Whether a workload key is the workload a service calls ``name`` (``cmd:NAME``, ``Kind/NAME``,
    its pod or container)."""
    w = key[3]
    return bool(name) and name in (w, w.split(":", 1)[-1], w.rsplit("/", 1)[-1], key[1], key[2])


def _lane(name: str, states: Sequence[Episode]) -> tuple[str, Workload]:
    """(accelerator, workload) of the state episodes that name ``name`` most, else the node's lane."""
    counts: dict[tuple[str, Workload], float] = {}
    for e in states:
        if e.kind == "state" and names_workload(e.workload, name):
            counts[(e.accelerator, e.workload)] = counts.get((e.accelerator, e.workload), 0.0) + e.duration
    if counts:
        return max(counts.items(), key=lambda kv: (kv[1], kv[0]))[0]
    return NODE, ("", "", "", name) if name else NO_WORKLOAD


def metrics_late_events(events: Iterable[Any], series: Iterable[SeriesPoints],
                        states: Sequence[Episode]) -> list[Episode]:
    """A scrape target's late or missing ``/metrics`` as events on its workload's lane, blips merged."""
    owners = scrape_workloads(series)
    out = []
    for ep in collector_episodes(events, is_application_collector):
        target = str(ep.detail.get("collector", "")).removeprefix(SCRAPE_PREFIX)
        acc, wl = _lane(owners.get(target, ""), states)
        ev = Episode(ep.start, ep.end, METRICS_LATE, acc, wl, kind="event", samples=ep.samples, events=ep.events)
        ev.detail.update(ep.detail)
        ev.detail["target"] = target
        out.append(ev)
    return out
