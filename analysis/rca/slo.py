"""SLO burn periods on the timeline, from the series the root-cause query already read.  Pure.

For each SLO (``triscope.analysis.slo.SLOSpec``, the Sloth subset: sums of ``rate``/``increase``
terms) the error and total queries are summed per tick from the node's counter rates, over a
centred window (``BURN_WINDOW_S``, the detector's 10 s, or one sampling step of rollups); burn
rate = error ratio / error budget.  A **burn period** is a run of ticks whose burn rate is at
least the SLO's fast page factor (``burn_factor("1h", 0.02)``, 14.4 for a 30-day period: 2 % of
the budget in an hour); runs closer than the window are one.  A short window, not the page alert's
5 minutes: a 20 s phase of failures next to a minute of ten times the traffic would vanish in a
ratio of sums over 5 minutes, and the point here is to place the burn on the timeline next to the
coordination episodes; ``triscope slo status`` gives the multi-window figures.  Ticks without
requests are no data, never a burn.

Each burn period is **linked** (``link_burn``) to the bad coordination episode it overlaps most,
else to the one it follows within its burn window (the latest that ended at most
``burn_window_s`` before the burn began: the burn rate at a tick counts the requests of the window
before it, and requests held up by an episode complete, late, after it); it takes that episode's
causes.  With none, it says so.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import Any

from triscope.analysis.episodes import NODE, Episode, is_bad
from triscope.analysis.reader import SeriesPoints

BURN_WINDOW_S = 10.0


def _rate_sum(query: Any, series: Sequence[SeriesPoints]) -> dict[float, float]:
    out: dict[float, float] = {}
    for term in query.terms:
        for sp in series:
            if sp.metric != term.metric or not term.matches(sp.labels):
                continue
            for t, v in zip(sp.ts, sp.values, strict=True):
                if v == v:
                    out[t] = out.get(t, 0.0) + term.sign * v
    return out


def _centred(ts: list[float], vals: list[float], window: float) -> list[float]:
    """Sum of ``vals`` over (t - window/2, t + window/2] for each t (ts sorted): looking back at
    history, the window need not trail."""
    prefix = [0.0]
    for v in vals:
        prefix.append(prefix[-1] + v)
    out = []
    for t in ts:
        i = bisect.bisect_right(ts, t - window / 2)
        j = bisect.bisect_right(ts, t + window / 2)
        out.append(prefix[j] - prefix[i])
    return out


def slo_metrics(slos: Sequence[Any]) -> set[str]:
    """The metrics the SLOs' queries name (what ``slo_burn_episodes`` reads from the series)."""
    return {t.metric for slo in slos for q in (slo.error_query, slo.total_query) for t in q.terms}


def slo_burn_episodes(slos: Sequence[Any], series: Sequence[SeriesPoints], start: float, end: float,
                      step: float = 1.0) -> list[Episode]:
    """The SLOs' burn periods in [start, end) (kind ``slo``, state ``slo-burn``, on the node)."""
    window = max(BURN_WINDOW_S, step)
    out: list[Episode] = []
    for slo in slos:
        metrics = slo_metrics([slo])
        mine = [sp for sp in series if sp.metric in metrics and sp.kind == "counter"]
        if not mine:
            continue
        err = _rate_sum(slo.error_query, mine)
        tot = _rate_sum(slo.total_query, mine)
        ts = sorted(t for t in tot if start - window <= t < end + window)
        if not ts:
            continue
        e_sum = _centred(ts, [err.get(t, 0.0) for t in ts], window)
        t_sum = _centred(ts, [tot[t] for t in ts], window)
        factor = slo.burn_factor("1h", 0.02)
        cur: Episode | None = None
        for t, es, tsum in zip(ts, e_sum, t_sum, strict=True):
            if t < start or t >= end or tsum <= 0:
                continue
            burn = max(0.0, es / tsum) / slo.error_budget
            if burn < factor:
                continue
            if cur is not None and t - cur.end <= window:
                cur.end = min(t + step, end)
                cur.samples += 1
                cur.detail["peak_burn_rate"] = round(max(cur.detail["peak_burn_rate"], burn), 3)
                continue
            cur = Episode(t, min(t + step, end), "slo-burn", NODE, kind="slo", samples=1)
            cur.detail.update(slo=slo.id, objective=slo.objective, page_factor=factor,
                              peak_burn_rate=round(burn, 3), burn_window_s=window)
            out.append(cur)
    return out


def link_burn(s: Episode, eps: Sequence[Episode]) -> None:
    """Give an SLO burn period the causes of the bad coordination episode it overlaps most, else of
    the one it follows within its burn window (``s.reference`` says which, ``link``)."""
    window = float(s.detail.get("burn_window_s", BURN_WINDOW_S))
    bad = [e for e in eps if e.kind == "state" and is_bad(e.state)]
    best, most = None, 0.0
    for e in bad:
        ov = min(e.end, s.end) - max(e.start, s.start)
        if ov > most:
            best, most = e, ov
    link = "overlaps"
    if best is None:
        before = [e for e in bad if e.end <= s.start + 1e-6 and s.start - e.end <= window]
        best = max(before, key=lambda e: e.end, default=None)
        link = "follows"
    if best is None:
        s.reference = {"kind": "none", "why": "no bad coordination episode overlaps this burn period or ends "
                                              f"within its {window:g} s burn window before it"}
        return
    s.causes = list(best.causes)
    s.context = list(best.context)
    s.reference = {"kind": "episode", "link": link, "accelerator": best.accelerator, "state": best.state,
                   "start": best.start, "end": best.end}
