"""The dashboard's colours, without a browser: quiet states pale with dark ink, faults saturated,
every series kind far (CIE76 distance) from every state colour, and a Node figure that gives each
kind its colour and one legend entry whatever else the node has."""

from __future__ import annotations

from triscope.dashboard import figures
from triscope.dashboard.data import LaneTrace, NodeLanes, Segment, Window
from triscope.dashboard.figures import (
    SERIES_KINDS,
    STATE_COLORS,
    STATE_INK,
    node_lanes_figure,
    shade,
    state_style,
)


def _lab(color: str) -> tuple[float, float, float]:
    rgb = [int(color[i:i + 2], 16) / 255 for i in (1, 3, 5)]
    r, g, b = (((c + 0.055) / 1.055) ** 2.4 if c > 0.04045 else c / 12.92 for c in rgb)
    x, y, z = ((r * 0.4124 + g * 0.3576 + b * 0.1805) / 0.95047, r * 0.2126 + g * 0.7152 + b * 0.0722,
               (r * 0.0193 + g * 0.1192 + b * 0.9505) / 1.08883)

    def f(t: float) -> float:
        return t ** (1 / 3) if t > 0.008856 else 7.787 * t + 16 / 116

    return 116 * f(y) - 16, 500 * (f(x) - f(y)), 200 * (f(y) - f(z))


def _distance(a: str, b: str) -> float:
    return float(sum((p - q) ** 2 for p, q in zip(_lab(a), _lab(b), strict=True)) ** 0.5)


def test_quiet_states_pale_faults_loud() -> None:
    for s in ("idle", "demand-limited"):
        assert _lab(STATE_COLORS[s])[0] > 70, s            # light
        assert STATE_INK[s] == figures.DARK_INK and state_style(s)["color"] == figures.DARK_INK
    for s in ("io-saturated", "staging-bound", "network-bound"):
        light, a, b = _lab(STATE_COLORS[s])
        assert light < 65 and (a * a + b * b) ** 0.5 > 50, s   # saturated
        assert state_style(s) == {"backgroundColor": STATE_COLORS[s], "color": "#ffffff"}
    assert state_style("") == {}


def test_series_kinds_never_look_like_a_state() -> None:
    for title, color in SERIES_KINDS.values():
        for s, sc in STATE_COLORS.items():
            assert _distance(color, sc) >= 25, (title, s)
        for i in range(4):
            assert shade(color, i) not in STATE_COLORS.values()


def _trace(metric: str, labels: dict[str, str], lane: str, name: str) -> LaneTrace:
    return LaneTrace(f"{metric}|{labels}", metric, labels, lane, name, "%", 1.0, [0.0, 10.0], [1.0, 2.0])


def test_node_figure_colours_by_kind_with_one_legend_entry_each() -> None:
    w = Window(0.0, 10.0, False)
    one = NodeLanes("a", w, traces=[_trace("triscope_gpu_sm_active_ratio", {"gpu": "0"}, "accelerators", "GPU 0 SM active"),
                                    _trace("triscope_gpu_sm_active_ratio", {"gpu": "1"}, "accelerators", "GPU 1 SM active"),
                                    _trace("triscope_tcp_retransmits_total", {}, "network", "TCP retransmits/s")],
                    segments=[Segment(0, 5, "demand-limited"), Segment(5, 10, "staging-bound")])
    # another node: other series first, the SM line later
    two = NodeLanes("b", w, traces=[_trace("triscope_workload_feeder_busy_ratio", {"gpu": "0", "workload": "x"},
                                           "accelerators", "x feeder busy"),
                                    _trace("triscope_gpu_pcie_rx_bytes_total", {"gpu": "0"}, "io", "GPU 0 PCIe RX (H2D)"),
                                    _trace("triscope_gpu_sm_active_ratio", {"gpu": "0"}, "accelerators", "GPU 0 SM active")])
    colours = []
    for lanes in (one, two):
        fig, keys = node_lanes_figure(lanes)
        assert len(keys) == len(fig["data"])
        sm = next(t for t in fig["data"] if t.get("name") == "GPU 0 SM active")
        colours.append(sm["line"]["color"])
        entries = [t["name"] for t in fig["data"] if t.get("legend", "legend") != "legend" and t.get("showlegend", True)]
        assert len(entries) == len(set(entries))
        assert all(t["legend"] == figures.LANE_LEGENDS[2] for t in fig["data"] if t.get("legendgroup") == "SM active")
        for t in fig["data"]:
            if t.get("fill") == "toself":
                assert t["fillcolor"] == STATE_COLORS[t["name"]]
    assert colours == [SERIES_KINDS["triscope_gpu_sm_active_ratio"][1]] * 2      # the same on both nodes
    gpu1 = next(t for t in node_lanes_figure(one)[0]["data"] if t.get("name") == "GPU 1 SM active")
    assert gpu1["line"]["color"] == shade(colours[0], 1) != colours[0]          # GPU 1: a lighter shade
    assert {e for e in [t["name"] for t in node_lanes_figure(one)[0]["data"]
                        if t.get("legend") == "legend2" and t.get("showlegend", True)]} == {"SM active"}
