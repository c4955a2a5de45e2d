"""A bad episode whose cause changes part-way is two incidents: its phases.  Pure.

An episode is a run of one state; back-to-back faults of the same state (pageable copies, then
one core short, then pin churn: all ``staging-bound``) make one run with one state and, explained
as one, one top cause for all of them.  So each bad episode is cut into equal slots of about half
the detector's window (at most ``MAX_WINDOWS``: longer episodes get longer slots), and each slot's
**lead** is the ranked family whose strongest figure (``evidence.figures``, against the detector's
own thresholds) is past its threshold and strongest (``leads``); the lead so far keeps it while
it stays past its threshold and no other family is ``LEAD_MARGIN`` times stronger (two strong
causes trading places are no new phase).  Slots with no figure past its threshold have no lead
and join their neighbours; runs of one lead shorter than ``MIN_PHASE_WINDOWS`` slots (one
detector window, the one flicker threshold of episodes) are merged into a neighbour, shortest
first (into both when they agree, else into the longer one).  Two or more runs left: the episode
is split at their boundaries, each phase an episode of the same state and workload explained on
its own (``detail["phase"]``, ``"phases"``, ``"episode"``: the whole run's bounds).  The figures
are read from the same points whatever the look-back (the raw reads around each episode), so are
the phases.
"""

from __future__ import annotations

from dataclasses import replace

from triscope.analysis.episodes import Episode
from triscope.analysis.rca.categories import CATEGORY_BY_KEY
from triscope.analysis.rca.evidence import EvidenceContext, figures

MIN_PHASE_WINDOWS = 2      # slots of half the detector's window: one window, the flicker threshold (MIN_EPISODE_S)
MAX_WINDOWS = 120
LEAD_STRENGTH = 1.0         # a figure at its threshold or past it leads
LEAD_MARGIN = 1.25          # ... and takes the lead from another one past its threshold when this much stronger


def strengths_over(ctx: EvidenceContext, acc: str, a: float, b: float) -> dict[str, float]:
    """Ranked family -> its strongest figure over [a, b)."""
    out = {}
    for key, figs in figures(ctx, acc, a, b).items():
        cat = CATEGORY_BY_KEY.get(key)
        if cat is not None and cat.ranked and figs:
            out[key] = max(f.strength for f in figs)
    return out


def leads(slots: list[dict[str, float]]) -> list[str | None]:
    """Each slot's lead: its strongest family past its threshold; the lead so far keeps it while it
    is past its threshold and no other family is ``LEAD_MARGIN`` times stronger (a phase changes
    where another cause clearly takes over, not where two strong ones trade places)."""
    out: list[str | None] = []
    cur: str | None = None
    for st in slots:
        best = max(((s, k) for k, s in st.items() if s >= LEAD_STRENGTH), default=None)
        if best is None:
            out.append(None)
            continue
        held = st.get(cur, 0.0) if cur is not None else 0.0
        if cur is None or held < LEAD_STRENGTH or best[0] >= LEAD_MARGIN * held:
            cur = best[1]
        out.append(cur)
    return out


def _runs(lead_of: list[str | None]) -> list[tuple[str | None, int, int]]:
    """Runs (lead, first window, window after the last) with leaderless windows and short runs
    merged into their neighbours."""
    runs: list[tuple[str | None, int, int]] = []
    for i, x in enumerate(lead_of):
        if runs and runs[-1][0] == x:
            runs[-1] = (x, runs[-1][1], i + 1)
        else:
            runs.append((x, i, i + 1))
    while len(runs) > 1:
        # leaderless runs first, then the shortest
        k = min(range(len(runs)), key=lambda j: (runs[j][0] is not None, runs[j][2] - runs[j][1], j))
        lead_k, a, b = runs[k]
        if lead_k is not None and b - a >= MIN_PHASE_WINDOWS:
            break
        prev = runs[k - 1] if k > 0 else None
        nxt = runs[k + 1] if k + 1 < len(runs) else None
        if prev is not None and nxt is not None and prev[0] == nxt[0]:
            runs[k - 1:k + 2] = [(prev[0], prev[1], nxt[2])]
        elif nxt is None or (prev is not None and prev[2] - prev[1] >= nxt[2] - nxt[1]):
            assert prev is not None
            runs[k - 1:k + 1] = [(prev[0], prev[1], b)]
        else:
            runs[k:k + 2] = [(nxt[0], a, nxt[2])]
    return runs


def split_phases(e: Episode, ctx: EvidenceContext, window_s: float) -> list[Episode]:
    """The episode's phases (itself alone when its lead does not change)."""
    n = min(MAX_WINDOWS, max(1, round(e.duration / (window_s / 2))))
    if n < 2 * MIN_PHASE_WINDOWS:
        return [e]
    w = e.duration / n
    runs = _runs(leads([strengths_over(ctx, e.accelerator, e.start + i * w, e.start + (i + 1) * w)
                        for i in range(n)]))
    if len(runs) < 2:
        return [e]
    out = []
    for i, (_lead, a, b) in enumerate(runs):
        p = replace(e, start=e.start + a * w, end=e.end if b >= n else e.start + b * w,
                    causes=[], context=[], events=list(e.events), detail=dict(e.detail))
        p.samples = max(1, round(e.samples * (p.end - p.start) / e.duration)) if e.samples else 0
        p.detail.update(phase=i + 1, phases=len(runs), episode={"start": e.start, "end": e.end})
        out.append(p)
    return out
