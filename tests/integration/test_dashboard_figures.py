"""Figure builders and the dashboard's data functions, without a browser."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping
from typing import Any

import plotly.graph_objects as go
import pytest

from triscope.core.samples import label_key
from triscope.dashboard import data, figures, timerange
from triscope.dashboard.data import EventMark, LaneTrace, NodeLanes, Segment, Window, _accelerator_text
from triscope.dashboard.figures import Figure, _base_layout, empty_figure, new_figure
from triscope.store.reader import StoreReader


def _label_key_of(labels: Mapping[str, str]) -> str:

    return label_key(labels)


def accelerator_summary(store: StoreReader, node: str) -> str:
    """'8 x NVIDIA H200', '2 x Ascend NPU', 'none' for one node."""
    gk = {(s.metric, _label_key_of(s.labels)) for s in store.series(node=node, prefix="triscope_gpu_")}
    nk = {(s.metric, _label_key_of(s.labels)) for s in store.series(node=node, prefix="triscope_npu_")}
    return _accelerator_text(gk, nk)


def segments_from_points(points: Iterable[tuple[float, str]], end: float, max_gap: float | None = None) -> list[Segment]:
    """Runs of equal state from (ts, state) points sorted or not; a run ends at the next point
    (or ``end``); a gap longer than ``max_gap`` ends a run early (no data is not a state)."""
    pts = sorted(points)
    out: list[Segment] = []
    for i, (t, st) in enumerate(pts):
        nxt = pts[i + 1][0] if i + 1 < len(pts) else end
        if max_gap is not None and nxt - t > max_gap:
            nxt = t + max_gap
        if out and out[-1].state == st and abs(out[-1].end - t) < 1e-6:
            out[-1].end = nxt
        else:
            out.append(Segment(t, nxt, st))
    return out





def burn_rate_figure(name: str, burn: Mapping[str, float | None], page: float = 14.4, ticket: float = 1.0,
                     height: int = 260) -> Figure:
    windows = list(burn)
    vals = [burn[w] for w in windows]
    if not windows or all(v is None for v in vals):
        return empty_figure(f"{name}: no traffic in any burn-rate window (no data)", height)
    colors = ["#c62828" if (v or 0) >= page else "#f9a825" if (v or 0) >= ticket else "#2e7d32" for v in vals]
    fig = new_figure()
    fig.add_trace({"type": "bar", "x": windows, "y": [v if v is not None else 0 for v in vals],
                   "marker": {"color": colors}, "text": ["no data" if v is None else f"{v:.2f}x" for v in vals],
                   "textposition": "outside", "hovertemplate": "%{x}: %{text}<extra></extra>"})
    fig.add_hline(y=ticket, line={"color": "#f9a825", "dash": "dot", "width": 1})
    fig.update_yaxes(title_text="burn rate (x budget)")
    _base_layout(fig, height)
    return fig


def _lanes(traces: list[LaneTrace] | None = None, missing: dict[str, str] | None = None,
           segments: list[Segment] | None = None, events: list[EventMark] | None = None) -> NodeLanes:
    w = Window(1_800_000_000.0, 1_800_003_600.0, False)
    return NodeLanes("n1", w, traces or [], missing or {}, segments or [], "state stored by the agent", events or [])


def _trace(metric: str, lane: str, secondary: bool = False, n: int = 5, scale: float = 1.0) -> LaneTrace:
    ts = [1_800_000_000.0 + i for i in range(n)]
    return LaneTrace(f"{metric}|gpu=0", metric, {"gpu": "0"}, lane, metric, "u", scale, ts, [float(i) for i in range(n)],
                     secondary)


def test_to_dt_is_utc_iso_milliseconds() -> None:
    assert figures.to_dt([0.0, 1_800_000_000.5]) == ["1970-01-01T00:00:00.000", "2027-01-15T08:00:00.500"]


def test_node_figure_lanes_keys_and_json() -> None:
    lanes = _lanes(
        traces=[_trace("triscope_gpu_sm_active_ratio", "accelerators", scale=100.0),
                _trace("triscope_gpu_pcie_rx_bytes_total", "io", scale=1e-9),
                _trace("triscope_dma_map_total", "io", secondary=True),
                _trace("triscope_tcp_retransmits_total", "network")],
        segments=[Segment(1_800_000_000.0, 1_800_000_060.0, "io-saturated"),
                  Segment(1_800_000_060.0, 1_800_000_120.0, "compute-bound")],
        events=[EventMark(1_800_000_030.0, "xid", "critical", "XID 79")])
    fig, keys = figures.node_lanes_figure(lanes, uirevision="r1")
    assert len(fig["data"]) == len(keys)
    json.dumps(fig)  # plain JSON: no numpy, no base64 arrays (live mode extends these lists)
    by_key = dict(zip(keys, fig["data"], strict=True))
    sm = by_key["triscope_gpu_sm_active_ratio|gpu=0"]
    assert (sm["xaxis"], sm["yaxis"]) == ("x2", "y2") and sm["y"] == [0.0, 100.0, 200.0, 300.0, 400.0]
    assert by_key["triscope_gpu_pcie_rx_bytes_total|gpu=0"]["yaxis"] == "y3"
    assert by_key["triscope_dma_map_total|gpu=0"]["yaxis"] == "y4"  # the I/O lane's secondary axis
    assert by_key["triscope_tcp_retransmits_total|gpu=0"]["yaxis"] == "y5"
    assert by_key["ribbon|io-saturated"]["fillcolor"] == figures.STATE_COLORS["io-saturated"]
    assert by_key["events|xid"]["text"] == ["xid (critical): XID 79"]
    lay = fig["layout"]
    assert lay["uirevision"] == "r1"
    # one shared time axis: every x axis shows the window, the lanes match the bottom axis
    for ax in ("xaxis", "xaxis2", "xaxis3", "xaxis4"):
        assert lay[ax]["range"] == ["2027-01-15T08:00:00.000", "2027-01-15T09:00:00.000"]
    assert {lay[ax].get("matches") for ax in ("xaxis", "xaxis2", "xaxis3")} == {"x4"}
    assert lay["yaxis2"]["range"] == [0, 105]
    go.Figure(fig)  # Plotly accepts it


def test_node_figure_says_what_is_missing() -> None:
    lanes = _lanes(traces=[_trace("triscope_tcp_retransmits_total", "network")],
                   missing={"accelerators": "no GPU or NPU on this node", "io": "no PCIe series"})
    lanes.segments_note = "no mismatch state: no accelerator data in this range"
    fig, keys = figures.node_lanes_figure(lanes)
    notes = {a["text"]: (a["xref"], a["yref"]) for a in fig["layout"]["annotations"]}
    assert notes["no GPU or NPU on this node"] == ("x2 domain", "y2 domain")
    assert notes["no PCIe series"] == ("x3 domain", "y3 domain")
    assert "no mismatch state: no accelerator data in this range" in notes
    # every lane keeps an (invisible) trace, so its axes and its note are drawn
    assert [k for k in keys if k.startswith("frame|")] == ["frame|1", "frame|2", "frame|3", "frame|4"]


def test_secondary_only_lane_uses_its_primary_axis() -> None:
    fig, keys = figures.node_lanes_figure(_lanes(traces=[_trace("triscope_dma_map_total", "io", secondary=True)]))
    dma = fig["data"][keys.index("triscope_dma_map_total|gpu=0")]
    assert dma["yaxis"] == "y3"
    assert fig["layout"]["yaxis4"]["visible"] is False


def test_segments_from_points_merges_runs_and_cuts_gaps() -> None:
    pts = [(0.0, "idle"), (1.0, "idle"), (2.0, "io-saturated"), (3.0, "io-saturated"), (100.0, "idle")]
    segs = segments_from_points(pts, end=101.0, max_gap=5.0)
    assert [(s.start, s.end, s.state) for s in segs] == [(0.0, 2.0, "idle"), (2.0, 8.0, "io-saturated"),
                                                         (100.0, 101.0, "idle")]


def test_ribbon_shapes_one_polygon_per_segment() -> None:
    xs, ys, _ = figures.ribbon_shapes([Segment(0.0, 10.0, "idle"), Segment(20.0, 30.0, "idle")])
    assert len(xs["idle"]) == 12 and ys["idle"].count(None) == 2


def test_mismatch_and_share_figures() -> None:
    pts = [data.MismatchPoint("n1", 0.0, 0.02, 0.96, "io-saturated", 0.98),
           data.MismatchPoint("n1", 10.0, 0.95, 0.01, "compute-bound", 0.0)]
    fig = figures.mismatch_scatter(pts)
    assert {t.name for t in fig.data} == {"io-saturated", "compute-bound"}
    sat = next(t for t in fig.data if t.name == "io-saturated")
    assert list(sat.x) == [96.0] and list(sat.y) == [2.0]
    share = figures.state_share_figure({"n1": {"idle": 0.25, "io-saturated": 0.75}})
    assert [t.name for t in share.data] == ["idle", "io-saturated"]
    assert list(share.data[1].x) == [75.0]


@pytest.mark.parametrize(("fig", "text"), [
    (lambda: figures.mismatch_scatter([]), "no mismatch windows"),
    (lambda: figures.state_share_figure({}), "no node has accelerator data"),
    (lambda: figures.slo_figure("s", [1.0, 2.0], [None, None]), "no SLI data in this window"),
    (lambda: figures.evidence_figure("m", [], [], (0.0, 1.0)), "no points stored"),
    (lambda: burn_rate_figure("s", {"5m": None}), "no traffic"),
])
def test_empty_figures_say_why(fig: Any, text: str) -> None:
    f = fig()
    assert text in f.layout.annotations[0].text
    assert len(f.data) == 0


def test_slo_and_evidence_figures() -> None:
    f = figures.slo_figure("s", [1.8e9, 1.8e9 + 60], [1.0, 0.5], actions=[(1.8e9 + 30, "restart (dry_run)")])
    assert list(f.data[0].y) == [100.0, 50.0]
    assert f.data[1].text == ("restart (dry_run)",)
    e = figures.evidence_figure("m", [1.8e9, 1.8e9 + 1], [1.0, 2.0], (1.8e9 + 0.5, 1.8e9 + 1), (1.8e9 - 1, 1.8e9 + 0.5),
                                onset=1.8e9 + 0.7)
    assert [s.type for s in e.layout.shapes] == ["rect", "rect", "line"]


# ---------------------------------------------------------------------------------------------- data, on a real store
@pytest.fixture
def demo_store(db_url: str) -> Any:
    """The demo nodes on SQLite and on the real PostgreSQL server."""
    from demo_seed import seed_demo

    from triscope.store import Store

    st = Store.open(db_url)
    st.upgrade()
    spans = seed_demo(st, 1_800_000_000.0, phase_s=60, cycles=1)
    yield st, spans
    st.close()


def test_node_lanes_from_the_store(demo_store: Any) -> None:
    st, spans = demo_store
    w = timerange.window("15m", timerange.node_bounds(st, "h200-node"), time.time())
    assert not w.live and "not live" in w.note and w.end == pytest.approx(spans["h200-node"][1], abs=2)
    lanes = data.node_lanes(st, "h200-node", w, max_points=200)
    names = {t.name for t in lanes.traces}
    assert {"GPU 0 SM active", "GPU 0 PCIe RX (H2D)", "GPU 0 link capacity", "TCP retransmits/s",
            "TIME_WAIT sockets"} <= names
    assert all(len(t.ts) <= 200 for t in lanes.traces)  # downsampled by the store
    cap = next(t for t in lanes.traces if t.name == "GPU 0 link capacity")
    assert cap.values[0] == pytest.approx(63.0e9, rel=0.01)  # Gen5 x16, 128b/130b
    assert lanes.segments and lanes.segments_note == "state stored by the agent"
    assert {s.state for s in lanes.segments} >= {"io-saturated", "staging-bound", "compute-bound"}
    assert any(e.kind == "xid" for e in lanes.events)
    # remediation decisions come from the audit log, with their outcome
    rem = [e.message for e in lanes.events if e.kind == "remediation"]
    assert rem == ["gpu-xid-restart: rolling_restart inference/llm-server (dry-run, dry_run)",
                   "gpu-xid-restart: rolling_restart inference/llm-server (dry-run, suppressed (cooldown))"]
    assert lanes.missing == {}


def test_node_without_accelerators_says_so(demo_store: Any) -> None:
    st, _ = demo_store
    w = timerange.window("1h", timerange.node_bounds(st, "cpu-node"), time.time())
    lanes = data.node_lanes(st, "cpu-node", w)
    assert lanes.missing["accelerators"].startswith("no GPU or NPU on this node")
    assert "network" not in lanes.missing and "io" not in lanes.missing
    assert lanes.segments == [] and "no accelerator data" in lanes.segments_note


def test_fleet_rows_and_audit(demo_store: Any) -> None:
    st, spans = demo_store
    rows = {r.node: r for r in data.fleet_rows(st, now=spans["h200-node"][1])}
    assert rows["h200-node"].state in figures.STATE_COLORS and rows["h200-node"].live
    assert rows["h200-node"].accelerators == "1 x NVIDIA H200"
    assert rows["h200-node"].slo == "no SLO file configured"
    assert rows["h200-node"].last_remediation.startswith("rolling_restart")
    assert rows["cpu-node"].state == "no accelerator" and rows["cpu-node"].accelerators == "none"
    ar = data.audit_rows(st)
    assert ar.source == "audit" and {r["outcome"] for r in ar.rows} == {"dry_run", "suppressed (cooldown)"}
    assert all(r["mode"] == "dry-run" for r in ar.rows)


def test_audit_empty_state_is_explained(sqlite_url: str) -> None:
    from triscope.store import Store

    st = Store.open(sqlite_url)
    st.upgrade()
    ar = data.audit_rows(st)
    assert ar.rows == [] and "no remediation decisions recorded yet" in ar.note


def test_mismatch_points_and_shares(demo_store: Any) -> None:
    st, spans = demo_store
    a, b = spans["h200-node"]
    pts, shares = data.mismatch_points(st, ["h200-node", "cpu-node"], Window(a, b, False), max_windows=60)
    assert "cpu-node" not in shares
    assert sum(shares["h200-node"].values()) == pytest.approx(1.0)
    assert shares["h200-node"]["io-saturated"] > 0.2
    sat = [p for p in pts if p.state == "io-saturated"]
    assert sat and min(p.link_util for p in sat) >= 0.75


def test_live_delta_returns_only_new_points(demo_store: Any) -> None:
    from triscope.core.samples import Sample, Tick

    st, spans = demo_store
    end = spans["cpu-node"][1]
    st.write_ticks("cpu-node", [Tick(end + i, [Sample("triscope_tcp_sockets", 7.0 + i, {"state": "time_wait"})])
                                for i in (1, 2)])
    (info,) = st.series(node="cpu-node", metric="triscope_tcp_sockets", labels={"state": "time_wait"})
    key = str(info.id)   # a trace's key is its series' id
    d = data.live_delta(st, "cpu-node", [key, "capacity|gpu=0", "ribbon|idle"], since=end, until=end + 5)
    assert d == {key: ([end + 1, end + 2], [8.0, 9.0])}


def test_npu_node_lanes_and_fleet(sqlite_url: str) -> None:
    """An Ascend node (npu-smi series, no GPU): AICore in the accelerator lane, no PCIe lane."""
    from triscope.core.samples import Sample, Tick
    from triscope.store import Store

    st = Store.open(sqlite_url)
    st.upgrade()
    t0 = 1_800_000_000.0
    st.write_ticks("ascend-1", [Tick(t0 + i, [
        Sample("triscope_npu_aicore_utilization_ratio", 0.5, {"npu": "0", "chip": "0"}),
        Sample("triscope_npu_aicore_utilization_ratio", 0.25, {"npu": "1", "chip": "0"}),
        Sample("triscope_npu_health", 0.0, {"npu": "0", "chip": "0"}),
    ]) for i in range(120)])
    w = timerange.window("15m", timerange.node_bounds(st, "ascend-1"), time.time())
    lanes = data.node_lanes(st, "ascend-1", w)
    aicore = sorted((t.name, t.values[0] * t.scale) for t in lanes.traces if t.lane == "accelerators")
    assert aicore == [("NPU 0/0 AICore", 50.0), ("NPU 1/0 AICore", 25.0)]
    assert "accelerators" not in lanes.missing and "io" in lanes.missing
    assert accelerator_summary(st, "ascend-1") == "2 x Ascend NPU"
    st.close()


def test_a_node_with_little_data_opens_on_all_of_it(tmp_path):
    """A short trace or a node just started: the node page's default range is its data, not 15
    minutes of which most are empty."""
    from triscope.core.samples import Sample, Tick
    from triscope.store import Store

    st = Store.open(f"sqlite:///{tmp_path / 'short.db'}")
    st.upgrade()
    t0 = 1_900_000_000.0
    st.write_ticks("short", [Tick(t0 + i, [Sample("triscope_cpu_busy_ratio", 0.1)]) for i in range(180)])
    w = timerange.window(data.DATA_PRESET, timerange.node_bounds(st, "short"), t0 + 10_000)
    assert (w.start, w.end) == (t0, t0 + 180.0) and not w.live
    w = timerange.window(data.DATA_PRESET, timerange.node_bounds(st, "short"), t0 + 179.5)      # live: ends now
    assert w.live and (w.start, w.end) == (t0, t0 + 179.5)
    st.close()
