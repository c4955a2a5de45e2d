"""The Node page's accelerator picker and workload panel: plain functions from
``triscope.dashboard.workload_data`` rows to Dash components (no request; ``workload_states``
reads the verdict history, the rest no store).

Each workload row is coloured by its own state over the range (the verdict history's runs of its
accelerator naming it, ``workload_states``): a quiet row (idle, demand-limited) stays quiet, a
fault is loud, and the host-side evidence (feeder pegged, CPU wait) is marked hot only on a row
whose state is a fault: a healthy service's busy feeder thread is not an alarm."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import quote, urlencode

from dash import dcc, html

from triscope.core.vocabulary import (
    IO_STATES,
    QUIET_STATES,
    WORST_FIRST,
    AcceleratorId,
    WorkloadKey,
)
from triscope.dashboard.components import full, note, short
from triscope.dashboard.figures import state_style
from triscope.dashboard.ids import NodeIds
from triscope.dashboard.workload_data import NodeNow, WorkloadRow
from triscope.store.reader import StoreReader

StateShares = dict[tuple[str, WorkloadKey], dict[str, float]]
"""(accelerator ``gpu=0``, workload key) -> seconds in each state over the range."""

# the thresholds file's defaults (triscope.analysis.config.MismatchThresholds): evidence at or above
# them is marked in the panel
FEEDER_PEGGED = 0.90
CPU_WAIT_HIGH = 0.20


def accel_id(a: AcceleratorId | None) -> str:
    """The picker link's element id: ``node-accel-all``, ``node-accel-gpu1``, ``node-accel-npu3-0``."""
    if a is None:
        return "node-accel-all"
    slug = "".join(ch if ch.isalnum() else "-" for ch in f"{a.kind}{a.index}" + (f"-{a.chip}" if a.chip else ""))
    return f"node-accel-{slug}"


def accel_picker(node: str, accels: Sequence[AcceleratorId], picked: AcceleratorId | None, now: NodeNow,
                 keep: Mapping[str, str]) -> html.Div:
    """A link per accelerator (its current state as the colour, its workload) and one for the
    whole node; each keeps the page's range (``keep``) and names its accelerator in the URL."""
    base = f"/node/{quote(node)}"
    q = urlencode(dict(keep))
    links: list[Any] = [dcc.Link(
        [html.B("whole node"), html.Span(now.state or "no state stored", className="accel-state",
                                         style=_state_style(now.state))],
        href=f"{base}?{q}", id=accel_id(None), className="accel-chip" + (" active" if picked is None else ""))]
    for a in accels:
        cur = now.accels.get(a)
        state = cur.state if cur is not None else ""
        wl = cur.workload_text(brief=True) if cur is not None else "no process"
        tip = f"{a.name}: {state or 'no per-accelerator state stored'}; " + (
            cur.shown_workload.detail if cur is not None and cur.shown_workload is not None else "no process")
        links.append(dcc.Link(
            [html.B(a.name), html.Span(short(wl, 40), className="accel-workload"),
             html.Span(state or "-", className="accel-state", style=_state_style(state))],
            href=f"{base}?{q}&{a.query}", id=accel_id(a), title=full(tip),
            className="accel-chip" + (" active" if picked == a else "")))
    label = f"showing {picked.name}" if picked is not None else "showing the whole node"
    return html.Div([html.Span(label + ":", className="muted")] + links, className="accel-links")


def _state_style(state: str) -> dict[str, str]:
    return state_style(state)


def workload_states(store: StoreReader, node: str, start: float, end: float) -> StateShares:
    """Seconds each (accelerator, workload) spent in each state over [start, end], from the verdict
    history (``StoreReader.verdict_runs``): the runs clipped to the range, a run of one tick counted
    as one second."""
    out: StateShares = {}
    for r in store.verdict_runs(node, start, end):
        if not r.accelerator:
            continue      # the node's roll-up names no workload of its own
        span = min(r.end, end) - max(r.start, start)
        weight = span if span > 0 else 1.0 if start <= r.start <= end else 0.0
        if weight > 0:
            per = out.setdefault((r.accelerator, r.workload), {})
            per[r.state] = per.get(r.state, 0.0) + weight
    return out


def row_state(shares: dict[str, float] | None) -> tuple[str, float]:
    """The state a row shows and its share of the time: the state it spent most time in (ties: the
    worst first, ``WORST_FIRST``); ("", 0) without any."""
    if not shares:
        return "", 0.0
    total = sum(shares.values()) or 1.0
    rank = {s: i for i, s in enumerate(WORST_FIRST)}
    state = max(shares, key=lambda s: (shares[s], -rank.get(s, len(rank))))
    return state, shares[state] / total


def _row_key(r: WorkloadRow) -> tuple[str, WorkloadKey]:
    ref = r.ref
    return r.accel.key, (ref.namespace, ref.pod, ref.container, ref.workload)


def _state_cell(shares: dict[str, float] | None) -> Any:
    state, share = row_state(shares)
    if not state:
        return html.Td("no state stored", className="muted wl-state")
    total = sum((shares or {}).values()) or 1.0
    tip = "; ".join(f"{s} {v / total:.0%}" for s, v in sorted((shares or {}).items(), key=lambda kv: -kv[1]))
    return html.Td(html.Span(f"{state} {share:.0%}", className="accel-state", style=state_style(state)),
                   title=f"over the range shown: {tip}", className="wl-state")


def _row_class(state: str) -> str:
    tone = "fault" if state in IO_STATES else "quiet" if state in QUIET_STATES or not state else "healthy"
    return f"wl-row wl-{tone}"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x * 100:.0f}%"


def _num(x: float | None, fmt: str = "{:.2f}") -> str:
    return "-" if x is None else fmt.format(x)


def workload_panel(rows: Sequence[WorkloadRow], picked: AcceleratorId | None, window: Any,
                   states: StateShares | None = None) -> html.Div:
    """The workloads on the node's accelerators (or the picked one) over the range: their state
    (``states``, from ``workload_states``), labels, processes, SM share, CPU, and the host-side
    evidence (feeder busy, CPU wait, CPU pressure), marked hot only where the row's state is a fault."""
    where = picked.name if picked is not None else "the node's accelerators"
    if not rows:
        return html.Div([html.H3(f"Workloads on {where}"), note(
            "no workload attribution stored in this range (triscope_accelerator_workload_info / "
            "triscope_workload_*: the agent's attribution needs NVML processes or npu-smi, see docs/workloads.md)",
            "info", id=NodeIds.WORKLOADS_NONE)])
    head = ["accelerator", "state", "workload", "pod", "container", "processes", "SM share", "CPU (cores)",
            "feeder busy (mean / peak)", "CPU wait (mean / peak)", "CPU pressure"]
    body = []
    for r in rows:
        shares = (states or {}).get(_row_key(r))
        state = row_state(shares)[0]
        fault = state in IO_STATES
        pegged = (r.feeder_busy_peak or 0.0) >= FEEDER_PEGGED
        waits = (r.cpu_wait_peak or 0.0) >= CPU_WAIT_HIGH
        body.append(html.Tr([
            html.Td(r.accel.name + (f" ({short(r.uuid, 20)})" if r.uuid else ""), title=r.uuid or None),
            _state_cell(shares),
            html.Td(short(r.ref.display or "no process", 60), title=full(r.ref.detail), className="wl-name"),
            html.Td(short(r.ref.pod or "-", 48), title=full(r.ref.pod) if len(r.ref.pod) > 48 else None),
            html.Td(short(r.ref.container or "-", 32)),
            html.Td(_num(r.processes, "{:.0f}")),
            html.Td(_pct(r.sm_share)),
            html.Td(_num(r.cpu_cores)),
            html.Td(f"{_pct(r.feeder_busy)} / {_pct(r.feeder_busy_peak)}" + (" pegged" if pegged else ""),
                    className=_evidence_class(pegged, fault)),
            html.Td(f"{_pct(r.cpu_wait)} / {_pct(r.cpu_wait_peak)}" + (" waiting for CPU" if waits else ""),
                    className=_evidence_class(waits, fault)),
            html.Td(_pct(r.cpu_pressure)),
        ], className=_row_class(state), style={"borderLeft": f"4px solid {state_style(state).get('backgroundColor', 'transparent')}"}))
    return html.Div([
        html.H3(f"Workloads on {where}"),
        html.Table([html.Thead(html.Tr([html.Th(h) for h in head])), html.Tbody(body)],
                   className="wl-table", id=NodeIds.WORKLOAD_TABLE),
        html.Div(f"over the range shown; state: the one the verdict history gives the workload most of the time "
                 f"(hover for every state's share); feeder busy: the busiest thread's share of one core (pegged at >= "
                 f"{FEEDER_PEGGED:.0%}); CPU wait: time runnable but not running (marked at >= {CPU_WAIT_HIGH:.0%}); "
                 "the evidence is red only where the workload's state is a fault", className="muted"),
    ])


def _evidence_class(marked: bool, fault: bool) -> str | None:
    """``hot`` (red) evidence on a faulty row, ``warm`` (said, not alarming) on another."""
    return None if not marked else "hot" if fault else "warm"
