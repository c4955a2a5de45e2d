"""The one cause score: every ranked cause — of an episode on the timeline, of the ranked view's
window, of the dashboard's explain — is ``score_cause`` over the same four parts.  Pure.

    absolute part   the strength of the family's strongest figure (``evidence.figures``): past its
                    threshold the strength itself, up to ``ABS_CAP``; between ``ABS_MIN`` and 1 only
                    the excess over ``ABS_MIN``; below, nothing (``evidence.absolute_part``)
  + relative part   (best moved series' score + 0.1 per further one, at most 0.3) x the limit
                    factor (``evidence.limit_factor``: "it rose" never beats "it is at its limit")
  + events part     0.5 + 0.1 per event (+0.2 if one is an error), at most 1, x the role weight
  + prior part      ``PRIOR_WEIGHT`` x the growth, window over baseline, of the share of the
                    detector's windows that point at the family (the ranked view only; 0 for an
                    episode, whose state is the detector's verdict already)

Families that are context (``categories.CONTEXT_KEYS``: application SLIs, remediation actions, the
agent itself) are never scored: ``score_cause`` returns None for them, and
``triscope.analysis.rca.context`` shows them beside the causes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from triscope.analysis.rca.categories import CATEGORY_BY_KEY, ROLE_WEIGHT
from triscope.analysis.rca.changes import SeriesChange, fmt
from triscope.analysis.rca.evidence import ABS_MIN, Figure, absolute_part, limit_factor

PRIOR_WEIGHT = 0.8
MIN_SCORE = 0.05            # a cause scoring less is not listed
FIGURE_MIN = 0.25           # figures shown as evidence: a quarter of their threshold or more (else the strongest)
MAX_SERIES_EVIDENCE = 6
MAX_EVENT_EVIDENCE = 5
MORE_SERIES_STEP, MORE_SERIES_CAP = 0.1, 0.3


@dataclass(slots=True)
class Cause:
    key: str
    title: str
    score: float
    onset: float | None
    summary: str
    evidence: list[dict[str, Any]] = field(default_factory=list)
    peers: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"cause": self.key, "title": self.title, "score": round(self.score, 4), "onset": self.onset,
                "summary": self.summary, "peers": self.peers, "evidence": self.evidence}


def event_dict(e: Any) -> dict[str, Any]:
    """A stored event (``EventRow``) as evidence."""
    return {"type": "event", "ts": e.ts, "kind": e.kind, "severity": e.severity, "message": e.message,
            "details": e.details}


def events_part(events: Sequence[Any], role_weight: float) -> float:
    """0.5 + 0.1 per event (+0.2 if one is an error or critical), at most 1, x ``role_weight``."""
    if not events:
        return 0.0
    severe = any(e.severity in ("error", "critical") for e in events)
    return min(1.0, 0.5 + 0.1 * len(events) + (0.2 if severe else 0.0)) * role_weight


def relative_part(changes: Sequence[SeriesChange]) -> float:
    """The best moved series' score, + 0.1 per further one (at most 0.3); ``changes`` best first."""
    if not changes:
        return 0.0
    return changes[0].score + min(MORE_SERIES_CAP, MORE_SERIES_STEP * (len(changes) - 1))


def score_cause(key: str, figs: Sequence[Figure] = (), changes: Sequence[SeriesChange] = (),
                events: Sequence[Any] = (), prior: float = 0.0, against: str = "the reference") -> Cause | None:
    """One family's cause from its figures, its moved series (best first), its events and the
    detector's prior; None for a context family or a score of at most ``MIN_SCORE``.  ``against``
    names what the series moved against (the episode's reference, the ranked view's baseline)."""
    cat = CATEGORY_BY_KEY[key]
    if not cat.ranked:
        return None
    strength = max((f.strength for f in figs), default=None)
    limit = limit_factor(key, strength)
    score = (absolute_part(strength) + relative_part(changes) * limit
             + events_part(events, ROLE_WEIGHT[cat.role]) + PRIOR_WEIGHT * max(0.0, prior))
    if score <= MIN_SCORE:
        return None
    onsets = [c.onset for c in changes if c.onset is not None] + [e.ts for e in events]
    ranked = sorted(figs, key=lambda f: -f.strength)
    evidence = [f.as_dict() for f in ranked if f.strength >= FIGURE_MIN] or [f.as_dict() for f in ranked[:1]]
    evidence += [c.as_dict() for c in changes[:MAX_SERIES_EVIDENCE]]
    evidence += [event_dict(e) for e in events[:MAX_EVENT_EVIDENCE]]
    if prior > 0:
        evidence.append({"type": "mismatch", "share": round(prior, 4),
                         "detail": f"mismatch detector: {prior:.0%} more windows point here than in the baseline"})
    c = Cause(key, cat.title, score, min(onsets) if onsets else None, "", evidence)
    if key == "network":
        c.peers = peers_of(events, changes)
    c.summary = summary(ranked, changes, events, limit, prior, against, c.peers)
    return c


def rank(causes: Sequence[Cause | None], top: int | None = None) -> list[Cause]:
    """Causes best first (earlier onset first among equals), at most ``top``."""
    out = sorted((c for c in causes if c is not None),
                 key=lambda c: (-c.score, c.onset if c.onset is not None else math.inf))
    return out[:top] if top is not None else out


def peers_of(events: Sequence[Any], changes: Sequence[SeriesChange] = ()) -> list[str]:
    """The network peers named by retransmit events (most retransmits first), then by per-peer series."""
    counts: dict[str, float] = {}
    for e in events:
        d = e.details or {}
        for p in d.get("top_peers", []) or []:
            if isinstance(p, dict) and p.get("peer"):
                counts[str(p["peer"])] = counts.get(str(p["peer"]), 0) + float(p.get("retransmits", 1) or 1)
            elif isinstance(p, str):
                counts[p] = counts.get(p, 0) + 1
        if d.get("peer"):
            counts[str(d["peer"])] = counts.get(str(d["peer"]), 0) + 1
    out = [p for p, _ in sorted(counts.items(), key=lambda kv: -kv[1])]
    for ch in changes:
        if "peer" in ch.labels and ch.labels["peer"] not in out:
            out.append(ch.labels["peer"])
    return out


def summary(figs: Sequence[Figure], changes: Sequence[SeriesChange], events: Sequence[Any], limit: float,
            prior: float = 0.0, against: str = "the reference", peers: Sequence[str] = ()) -> str:
    """One line: the strongest figure, the best moved series, a weak figure that limits it, the
    events, the peers, the detector's prior."""
    parts = []
    strong = [f for f in figs if f.strength >= ABS_MIN]
    if strong:
        parts.append(strong[0].detail)
    if changes:
        c = changes[0]
        if c.direction in ("appeared", "vanished"):
            what = f"{c.series} {c.direction}"
        else:
            what = f"{c.series} {fmt(c.baseline)} -> {fmt(c.window)} against {against}"
        parts.append(what + (f" (+{len(changes) - 1} more series)" if len(changes) > 1 else ""))
    if not strong and figs and limit < 1:
        parts.append(f"but {max(figs, key=lambda f: f.strength).detail}")
    if events:
        parts.append(f"{len(events)} event(s): {', '.join(sorted({x.kind for x in events}))}")
    if peers:
        parts.append("peer " + ", ".join(peers[:3]))
    if prior > 0:
        parts.append(f"mismatch detector: {prior:.0%} more windows point here than in the baseline")
    return "; ".join(parts)
