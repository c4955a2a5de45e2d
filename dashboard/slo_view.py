"""SLOs for the dashboard, through ``triscope.analysis.slo`` (Sloth ``prometheus/v1`` files).

``load(c)`` reads the configured SLO file once (errors are shown, not raised);
``data_bounds(c, slos)`` says where the SLOs' own series begin and end (a recording, or a service
that stopped reporting, ends before now: the SLOs page is evaluated where its data ends and says
so, ``triscope.dashboard.timerange``); ``fleet_status(c)`` gives each node its worst SLO status;
``burn_down`` evaluates the period's budget remaining at a few points of the shown window for the
burn-down chart (no point where the period is short of data:
``triscope.analysis.slo.PERIOD_MIN_COVERAGE``).  Both read the counters first, in bulk, and
compute with ``triscope.analysis.slo``'s pure functions.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from triscope.analysis.counters import fetch_counters
from triscope.analysis.slo import (
    NOT_ENOUGH_DATA,
    SLOStatus,
    evaluate_inputs,
    fetch_slo_inputs,
    load_slo_file,
    period_figure,
    query_metrics,
)
from triscope.analysis.slo import evaluate as ev
from triscope.analysis.slo_spec import SLOSpec
from triscope.dashboard.context import DashboardContext
from triscope.dashboard.timerange import Bounds

_RANK = {"page": 3, "ticket": 2, "ok": 1, NOT_ENOUGH_DATA: 0.5, "no data": 0}


@dataclass
class SloSet:
    slos: list[SLOSpec]
    problem: str     # why there are none ("no SLO file configured", a parse error, ...)


def load(c: DashboardContext) -> SloSet:
    if c.slo_file is None:
        return SloSet([], "no SLO file configured: start the dashboard with --slo FILE (a Sloth prometheus/v1 "
                          "file, e.g. deploy/slo.example.yaml) or set TRISCOPE_SLO_FILE")
    cached = c.cache.slos
    mtime = c.slo_file.stat().st_mtime if c.slo_file.exists() else None
    if cached and cached[0] == mtime:
        return cached[1]

    try:
        out = SloSet(list(load_slo_file(c.slo_file)), "")
        if not out.slos:
            out.problem = f"{c.slo_file} declares no SLOs"
    except Exception as e:  # noqa: BLE001 - the file's error, in one line
        out = SloSet([], f"SLO file problem: {str(e).splitlines()[0] if str(e) else type(e).__name__}")
    c.cache.slos = (mtime, out)
    return out


def data_bounds(c: DashboardContext, slos: list[SLOSpec], ttl: float = 10.0) -> Bounds | None:
    """Where the SLOs' series are: from the first sample of the nodes that carry them to the newest
    point of any of them (``fleet_latest``); None when no node has them."""

    metrics = sorted({m for slo in slos for m in query_metrics(slo)})
    key = ",".join(metrics)
    hit = c.cache.bounds.get(key)
    if hit and time.monotonic() - hit[0] < ttl:
        return hit[1]
    latest = c.store.fleet_latest(metrics) if metrics else {}
    last = max((ts for per in latest.values() for ts, _v in per.values()), default=None)
    nodes = [n for n in c.store.nodes() if n.name in latest]
    first = min((n.first_seen for n in nodes), default=None)
    rec = bool(nodes) and all(n.recording is not None for n in nodes)
    out = None if last is None or first is None else Bounds(min(first, last), last, rec)
    c.cache.bounds[key] = (time.monotonic(), out)
    return out


def evaluate(c: DashboardContext, slo: SLOSpec, now: float, node: str | None = None) -> SLOStatus:

    return ev(c.store, slo, now, node=node)


def fleet_status(c: DashboardContext, ttl: float = 30.0) -> dict[str, str] | None:
    """node -> worst status over the SLOs ("page", "ticket", "ok", "not enough data yet", "no data");
    None without SLOs.

    Nodes evaluated at the same instant (every live node: now) share one fleet-wide read per SLO
    (``fetch_slo_inputs`` with no node), evaluated per node (``SLOInputs.for_node``); a stale
    node is evaluated at its last sample, from its own read."""

    ss = load(c)
    if not ss.slos:
        return None
    hit = c.cache.fleet
    if hit and time.monotonic() - hit[0] < ttl:
        return hit[1]
    now = c.now()
    by_at: dict[float, list[str]] = {}
    for n in c.store.nodes():
        by_at.setdefault(now if abs(now - n.last_seen) <= 120 else n.last_seen + 1, []).append(n.name)
    out: dict[str, str] = {name: "no data" for names in by_at.values() for name in names}
    for at, names in by_at.items():
        for slo in ss.slos:
            try:
                inputs = fetch_slo_inputs(c.store, slo, at, node=names[0] if len(names) == 1 else None)
            except Exception:  # noqa: BLE001 - a broken store read: no data for these nodes
                continue
            for name in names:
                try:
                    st = evaluate_inputs(slo, inputs.for_node(name)).status
                except Exception:  # noqa: BLE001
                    st = "no data"
                if _RANK.get(st, 0) > _RANK.get(out[name], 0):
                    out[name] = st
    c.cache.fleet = (time.monotonic(), out)
    return out


def burn_down(c: DashboardContext, slo: SLOSpec, start: float, end: float, points: int = 16) -> tuple[list[float], list[float | None]]:
    """Budget remaining (1 = untouched) of the SLO's period window ending at each of ``points``
    instants across [start, end], None where there is no traffic or not enough data: the counters
    of every instant read first (``triscope.analysis.counters.fetch_counters``, one read per metric
    and instant), then ``triscope.analysis.slo.period_figure`` (a ratio of sums)."""

    ts = [start + (end - start) * (i + 1) / points for i in range(points)]
    reads = fetch_counters(c.store, query_metrics(slo), [(t - slo.period_s, t) for t in ts])
    out: list[float | None] = []
    for t in ts:
        burn = period_figure(slo, reads[(t - slo.period_s, t)]).burn_rate
        out.append(None if burn is None else 1.0 - burn)
    return ts, out
