"""SLOs for the dashboard, through ``triscope.analysis.slo`` (Sloth ``prometheus/v1`` files).

``load(c)`` reads the configured SLO file once (errors are shown, not raised);
``fleet_status(c)`` gives each node its worst SLO status; ``burn_down`` evaluates the period's
budget remaining at a few points of the shown window for the burn-down chart.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from triscope.dashboard.context import DashboardContext
from triscope.dashboard.data import optional

_RANK = {"page": 3, "ticket": 2, "ok": 1, "no data": 0}


@dataclass
class SloSet:
    slos: list[Any]
    problem: str     # why there are none ("no SLO file configured", a parse error, ...)


def load(c: DashboardContext) -> SloSet:
    if c.slo_file is None:
        return SloSet([], "no SLO file configured: start the dashboard with --slo FILE (a Sloth prometheus/v1 "
                          "file, e.g. deploy/slo.example.yaml) or set TRISCOPE_SLO_FILE")
    cached = c.cache.get("slos")
    mtime = c.slo_file.stat().st_mtime if c.slo_file.exists() else None
    if cached and cached[0] == mtime:
        return cached[1]
    fn, why = optional("triscope.analysis.slo", "load_slo_file")
    if fn is None:
        out = SloSet([], f"SLO analysis is not available in this build ({why})")
    else:
        try:
            out = SloSet(list(fn(c.slo_file)), "")
            if not out.slos:
                out.problem = f"{c.slo_file} declares no SLOs"
        except Exception as e:  # noqa: BLE001 - the file's error, in one line
            out = SloSet([], f"SLO file problem: {str(e).splitlines()[0] if str(e) else type(e).__name__}")
    c.cache["slos"] = (mtime, out)
    return out


def evaluate(c: DashboardContext, slo: Any, now: float, node: str | None = None) -> Any:
    from triscope.analysis.slo import evaluate as ev

    return ev(c.store, slo, now, node=node)


def fleet_status(c: DashboardContext, ttl: float = 30.0) -> dict[str, str] | None:
    """node -> worst status over the SLOs ("page", "ticket", "ok", "no data"); None without SLOs."""
    ss = load(c)
    if not ss.slos:
        return None
    hit = c.cache.get("fleet_slo")
    if hit and time.monotonic() - hit[0] < ttl:
        return hit[1]
    out: dict[str, str] = {}
    now = c.now()
    for n in c.store.nodes():
        at = now if abs(now - n.last_seen) <= 120 else n.last_seen + 1
        worst = "no data"
        for slo in ss.slos:
            try:
                st = evaluate(c, slo, at, node=n.name).status
            except Exception:  # noqa: BLE001
                st = "no data"
            if _RANK.get(st, 0) > _RANK.get(worst, 0):
                worst = st
        out[n.name] = worst
    c.cache["fleet_slo"] = (time.monotonic(), out)
    return out


def burn_down(c: DashboardContext, slo: Any, start: float, end: float, points: int = 16) -> tuple[list[float], list[float | None]]:
    """Budget remaining (1 = untouched) of the SLO's period window ending at each of ``points``
    instants across [start, end], from ``triscope.analysis.slo.counter_increase`` (ratio of sums)."""
    from triscope.analysis.slo import counter_increase

    infos_cache: dict[str, list[Any]] = {}

    def qsum(q: Any, a: float, b: float) -> float | None:
        total, found = 0.0, False
        for term in q.terms:
            infos = infos_cache.get(term.metric)
            if infos is None:
                infos = infos_cache[term.metric] = c.store.series(metric=term.metric)
            for info in infos:
                if term.matches(info.labels):
                    found = True
                    total += term.sign * counter_increase(c.store, info, a, b)[0]
        return total if found else None

    ts: list[float] = []
    out: list[float | None] = []
    for i in range(points):
        t = start + (end - start) * (i + 1) / points
        errors = qsum(slo.error_query, t - slo.period_s, t)
        total = qsum(slo.total_query, t - slo.period_s, t)
        ts.append(t)
        if not total or errors is None:
            out.append(None)
        else:
            out.append(1.0 - min(1.0, max(0.0, errors / total)) / slo.error_budget)
    return ts, out
