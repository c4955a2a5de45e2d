"""The Node page's accelerator picker and workload panel: plain functions from
``triscope.dashboard.workload_data`` rows to Dash components (no store, no request)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import quote, urlencode

from dash import dcc, html

from triscope.dashboard.components import full, note, short
from triscope.dashboard.figures import STATE_COLORS
from triscope.dashboard.workload_data import Accel, NodeNow, WorkloadRow

# the thresholds file's defaults (triscope.analysis.config.MismatchThresholds): evidence at or above
# them is marked in the panel
FEEDER_PEGGED = 0.90
CPU_WAIT_HIGH = 0.20


def accel_id(a: Accel | None) -> str:
    """The picker link's element id: ``node-accel-all``, ``node-accel-gpu1``, ``node-accel-npu3-0``."""
    if a is None:
        return "node-accel-all"
    slug = "".join(ch if ch.isalnum() else "-" for ch in f"{a.kind}{a.index}" + (f"-{a.chip}" if a.chip else ""))
    return f"node-accel-{slug}"


def accel_picker(node: str, accels: Sequence[Accel], picked: Accel | None, now: NodeNow,
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
    col = STATE_COLORS.get(state)
    return {"backgroundColor": col, "color": "white"} if col else {}


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x * 100:.0f}%"


def _num(x: float | None, fmt: str = "{:.2f}") -> str:
    return "-" if x is None else fmt.format(x)


def workload_panel(rows: Sequence[WorkloadRow], picked: Accel | None, window: Any) -> html.Div:
    """The workloads on the node's accelerators (or the picked one) over the range: labels,
    processes, SM share, CPU, and the host-side evidence (feeder busy, CPU wait, CPU pressure)."""
    where = picked.name if picked is not None else "the node's accelerators"
    if not rows:
        return html.Div([html.H3(f"Workloads on {where}"), note(
            "no workload attribution stored in this range (triscope_accelerator_workload_info / "
            "triscope_workload_*: the agent's attribution needs NVML processes or npu-smi, see docs/workloads.md)",
            "info", id="node-workloads-none")])
    head = ["accelerator", "workload", "pod", "container", "processes", "SM share", "CPU (cores)",
            "feeder busy (mean / peak)", "CPU wait (mean / peak)", "CPU pressure"]
    body = []
    for r in rows:
        pegged = (r.feeder_busy_peak or 0.0) >= FEEDER_PEGGED
        waits = (r.cpu_wait_peak or 0.0) >= CPU_WAIT_HIGH
        body.append(html.Tr([
            html.Td(r.accel.name + (f" ({short(r.uuid, 20)})" if r.uuid else ""), title=r.uuid or None),
            html.Td(short(r.ref.display or "no process", 60), title=full(r.ref.detail), className="wl-name"),
            html.Td(short(r.ref.pod or "-", 48), title=full(r.ref.pod) if len(r.ref.pod) > 48 else None),
            html.Td(short(r.ref.container or "-", 32)),
            html.Td(_num(r.processes, "{:.0f}")),
            html.Td(_pct(r.sm_share)),
            html.Td(_num(r.cpu_cores)),
            html.Td(f"{_pct(r.feeder_busy)} / {_pct(r.feeder_busy_peak)}" + (" pegged" if pegged else ""),
                    className="hot" if pegged else None),
            html.Td(f"{_pct(r.cpu_wait)} / {_pct(r.cpu_wait_peak)}" + (" waiting for CPU" if waits else ""),
                    className="hot" if waits else None),
            html.Td(_pct(r.cpu_pressure)),
        ], className="wl-row"))
    return html.Div([
        html.H3(f"Workloads on {where}"),
        html.Table([html.Thead(html.Tr([html.Th(h) for h in head])), html.Tbody(body)],
                   className="wl-table", id="node-workload-table"),
        html.Div(f"over the range shown; feeder busy: the busiest thread's share of one core (pegged at >= "
                 f"{FEEDER_PEGGED:.0%}); CPU wait: time runnable but not running (marked at >= {CPU_WAIT_HIGH:.0%})",
                 className="muted"),
    ])
