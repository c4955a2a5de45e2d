"""Fleet: every node with its current mismatch state and score (the verdict history's current runs),
a cell per accelerator (its state colour and workload), SLO status and last remediation; sortable
and filterable; a row opens the node page, an accelerator's cell the node page on that accelerator.
Each state in its colour and ink (the quiet ``idle`` and ``demand-limited`` pale, the faults loud); a
recording is marked "recording" and its states outlined, never painted as live trouble."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import dash
from dash import Input, Output, State, dash_table, dcc, html, no_update

from triscope.core.vocabulary import IO_STATES, QUIET_STATES
from triscope.dashboard import data, slo_view, timeview
from triscope.dashboard.components import NAME_CHARS, error_note, fmt_ts, full, note, short
from triscope.dashboard.context import ctx
from triscope.dashboard.figures import DARK_INK, STATE_COLORS, state_style
from triscope.dashboard.ids import FleetIds
from triscope.dashboard.registry import page_callback

dash.register_page(__name__, path="/", name="Fleet", order=0, title="triscope - fleet")

COLUMNS = [
    {"name": ["", "node"], "id": "node"},
    {"name": ["node", "state"], "id": "state"},
    {"name": ["node", "score"], "id": "score", "type": "numeric"},
]
TAIL = [
    {"name": ["", "accelerators"], "id": "accelerators"},
    {"name": ["", "SLO"], "id": "slo"},
    {"name": ["", "last remediation"], "id": "last_remediation"},
    {"name": ["", "last seen (UTC)"], "id": "last_seen"},
]
MAX_ACCEL_COLUMNS = 16     # a node with more shows the rest on its node page
WORKLOAD_CHARS = 30        # a workload's name in a cell; the whole of it in the tooltip
ACCEL_HEAD = "per accelerator: workload, state (click one for its node page)"


RECORDING = "recording"


def accel_columns(rows: list[data.FleetRow], n: int) -> list[dict[str, Any]]:
    """One column per accelerator slot, named by the accelerator in it (``GPU 0``; ``GPU 0 / NPU 0/0``
    where nodes differ; ``accelerator 3`` when many kinds share the slot)."""
    out = []
    for i in range(n):
        names = sorted({r.cells[i].accel.name for r in rows if i < len(r.cells)})
        head = names[0] if len(names) == 1 else " / ".join(names) if len(names) == 2 else f"accelerator {i + 1}"
        out.append({"name": [ACCEL_HEAD, head], "id": f"a{i}"})
    return out


def state_styles(field: str, column: str) -> list[dict[str, Any]]:
    """The conditional styles of a state column: each state in its colour and ink
    (``figures.state_style``: the quiet states pale with dark text, the faults loud and bold); on a
    recording's row (hidden field ``rec``) every state outlined only, dashed, in its colour: the
    recording's last state is no live trouble."""
    out: list[dict[str, Any]] = []
    for s in STATE_COLORS:
        cond = {"filter_query": f'{{{field}}} = "{s}"', "column_id": column}
        out.append({"if": cond, **state_style(s), "fontWeight": "600" if s in IO_STATES else "400"})
    for s, col in STATE_COLORS.items():   # after the above: these win on a recording's row
        out.append({"if": {"filter_query": f'{{rec}} = 1 && {{{field}}} = "{s}"', "column_id": column},
                    "backgroundColor": "transparent", "color": DARK_INK if s in QUIET_STATES else col,
                    "borderLeft": f"4px dashed {col}"})
    return out


def seen_text(ts: float, live: bool, recording: str | None, zone: Any = None) -> str:
    """The "last seen" cell: the time, then "(recording)" for a recording, "(not live)" for an
    agent's node that stopped reporting."""
    return fmt_ts(ts, zone) + (f" ({RECORDING})" if recording else "" if live else " (not live)")


def cell_record(i: int, cell: Any) -> tuple[dict[str, Any], str]:
    """The record fields of accelerator cell ``i`` (text, hidden state for the colour, hidden
    URL parameters for the click) and its tooltip (the accelerator, score, the pod behind a
    resolved workload, the container: short, there is one per accelerator of the fleet)."""
    state = cell.state or ""
    text = short(cell.workload_text(brief=True), WORKLOAD_CHARS) + "\n" + (state or "-")
    w = cell.shown_workload
    tip = cell.accel.name + (f", score {cell.score:.2f}" if cell.score is not None and state else "")
    if not state:
        tip += ", no per-accelerator state stored (the node's is in its state column)"
    if w is not None and w.pod and w.kind_name:   # the cell shows Kind/name: say which pod
        tip += f": {w.namespace}/{w.pod}"
    if w is not None and w.container:
        tip += f" ({w.container})"
    if len(cell.workloads) > 1:
        tip += f"; {len(cell.workloads)} workloads: " + ", ".join(short(x.brief, 40) for x in cell.workloads[:4])
    return {f"a{i}": text, f"s{i}": state, f"q{i}": cell.accel.query}, full(tip)


def layout(**_: Any) -> html.Div:
    c = ctx()
    try:
        rows = data.fleet_rows(c.store, c.now(), slo_view.fleet_status(c))
    except Exception as e:  # noqa: BLE001
        return html.Div([html.H2("Fleet"), error_note("reading the fleet", e)])
    if not rows:
        return html.Div([html.H2("Fleet"), note(
            "no nodes stored yet: start the agent ('triscope agent --db URL' or 'triscope run') or import a "
            "recorded trace ('triscope import-trace'); nodes appear here with their first tick.", "warn", id=FleetIds.EMPTY)])
    slots = min(MAX_ACCEL_COLUMNS, max((len(r.cells) for r in rows), default=0))
    # long node names are shown cut (the whole name in a tooltip); "node_full" (not a column) opens the page
    records: list[dict[str, Any]] = []
    tooltips: list[dict[str, Any]] = []
    n_accels = 0
    for r in rows:
        rec: dict[str, Any] = {
            "node": short(r.node), "node_full": r.node, "state": r.state,
            "score": None if r.score is None else round(r.score, 3),
            "accelerators": short(r.accelerators, 80), "slo": short(r.slo, 80),
            "last_remediation": short(r.last_remediation, 80),
            "last_seen": seen_text(r.last_seen, r.live, r.recording),
            # not columns: the local-time toggle rewrites last_seen; rec styles a recording's row
            "last_seen_ts": r.last_seen, "live": r.live, "recording": r.recording, "rec": 1 if r.recording else 0,
        }
        tip: dict[str, Any] = {"node": full(r.node)} if len(r.node) > NAME_CHARS else {}
        if r.recording:
            tip["last_seen"] = full(f"a recording imported from {r.recording}: its last tick, not a live agent")
            tip["state"] = full(f"{r.state}: the recording's last state (not live)")
        n_accels += len(r.cells)
        for i, cell in enumerate(r.cells[:slots]):
            fields, t = cell_record(i, cell)
            rec.update(fields)
            tip[f"a{i}"] = t
        records.append(rec)
        tooltips.append(tip)
    style = state_styles("state", "state") + [x for i in range(slots) for x in state_styles(f"s{i}", f"a{i}")]
    head = f"{len(rows)} node(s)" + (f", {n_accels} accelerator(s)" if n_accels else "") + \
        "; click a row to open the node, an accelerator's cell to open the node on it"
    recs = sum(1 for r in rows if r.recording)
    return html.Div([
        html.Div([html.H2("Fleet"), html.Span(head, className="window-note")], className="page-head"),
        note(data.recording_note(c.store) + "; their rows are outlined, not painted", "info", id=FleetIds.RECORDINGS)
        if recs else html.Div(),
        dcc.Location(id=FleetIds.NAV, refresh="callback-nav"),
        dash_table.DataTable(  # type: ignore[attr-defined]
            id=FleetIds.TABLE, columns=COLUMNS + accel_columns(rows, slots) + TAIL, data=records, sort_action="native",
            filter_action="native", page_size=50, style_data_conditional=style, row_selectable=False,
            cell_selectable=True, merge_duplicate_headers=True, tooltip_data=tooltips, tooltip_duration=None,
            style_table={"overflowX": "auto"},
            style_cell={"fontFamily": "inherit", "fontSize": "13px", "padding": "6px 10px", "textAlign": "left",
                        "cursor": "pointer"},
            style_cell_conditional=[{"if": {"column_id": f"a{i}"}, "whiteSpace": "pre-line", "minWidth": "120px",
                                     "maxWidth": "190px", "fontSize": "12px", "lineHeight": "1.3"}
                                    for i in range(slots)],
            style_header={"fontWeight": "600", "backgroundColor": "#eceff1"},
        ),
        html.Div([html.Span("states: ")] + [html.Span(s, className="state-chip", style=state_style(s))
                                            for s in STATE_COLORS], className="legend-line",
                 id=FleetIds.LEGEND),
    ])


@page_callback(
    Output(FleetIds.NAV, "href"),
    Input(FleetIds.TABLE, "active_cell"), State(FleetIds.TABLE, "derived_viewport_data"),
    prevent_initial_call=True,
)
def open_node(cell: dict[str, Any] | None, viewport: list[dict[str, Any]] | None) -> Any:
    if not cell or not viewport:
        return no_update
    row = cell.get("row")
    if row is None or row >= len(viewport):
        return no_update
    rec = viewport[row]
    href = f"/node/{quote(str(rec.get('node_full') or rec['node']))}"
    col = str(cell.get("column_id") or "")
    q = rec.get("q" + col[1:]) if col.startswith("a") and col[1:].isdigit() else None
    return href + (f"?{q}" if q else "")


@page_callback(
    Output(FleetIds.TABLE, "data"), Output(FleetIds.TABLE, "columns"),
    Input(timeview.TZ_STORE, "data"), State(FleetIds.TABLE, "data"), State(FleetIds.TABLE, "columns"),
)
def show_zone(tz: dict[str, Any] | None, records: list[dict[str, Any]] | None,
              columns: list[dict[str, Any]] | None) -> tuple[Any, Any]:
    """The "last seen" column in UTC or the browser's zone (the table is built in the layout, which
    cannot read the browser's choice)."""
    if not records or not columns:
        return no_update, no_update
    zone = timeview.zone_of(tz)
    label = f"last seen ({zone.key if zone else 'UTC'})"
    out = [dict(r, last_seen=seen_text(r["last_seen_ts"], bool(r.get("live")), r.get("recording"), zone))
           if r.get("last_seen_ts") is not None else r for r in records]
    cols = [dict(c, name=["", label]) if c.get("id") == "last_seen" else c for c in columns]
    return out, cols
