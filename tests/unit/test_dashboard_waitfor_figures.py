"""The wait-for figure builders and components, without a store or a browser: the Node page's
per-accelerator figure of where the driving threads' time went (first hop over time, the chain's
ends over the range), the line said for workloads without wait-for evidence, and the Root cause
page's chain of an episode."""

from __future__ import annotations

import json
from typing import Any

import plotly.graph_objects as go
import pytest
from dash import dcc, html

from triscope.core.vocabulary import AcceleratorId
from triscope.dashboard import waitfor_data
from triscope.dashboard.figures import STATE_COLORS
from triscope.dashboard.waitfor_data import AccelWaitFor, ChainEnd, DriverTime
from triscope.dashboard.waitfor_view import (
    FIRST_HOP_COLORS,
    GROUP_COLORS,
    chain_evidence,
    chain_view,
    driver_time_figure,
    end_label,
    node_panel,
)
from triscope.dashboard.workload_data import WorkloadRef

T0 = 1_800_000_000.0
LAB_B = WorkloadRef("lab", "lab-b", "lab-b", "")
LAB_A = WorkloadRef("lab", "lab-a", "lab-a", "")
PREP = ("lab", "lab-b", "lab-b-prep", "")


def _sidecar() -> DriverTime:
    """lab-b's driving thread: waits on its throttled sidecar, staging-bound naming the sidecar."""
    n = 6
    return DriverTime(
        AcceleratorId("gpu", "0"), LAB_B, [T0 + 10 * i for i in range(n)], 10.0,
        {"ipc": [0.9, 0.8, None, 0.85, 0.9, 0.9], "cpu": [0.1, 0.2, None, 0.15, 0.1, 0.1]},
        [1.0, 1.0, None, 1.0, 1.0, 1.0], 50.0, {"ipc": 0.87, "cpu": 0.13},
        [ChainEnd("cpu_throttled", "pod", "lab-b-prep", PREP, 0.62, "staging",
                  "on lab-b-prep (the same pod, container lab-b-prep) held at its CPU limit (throttled)"),
         ChainEnd("timer", "self", "lab-b", ("lab", "lab-b", "lab-b", ""), 0.25, "demand", "sleeping (pacing, timeouts)"),
         ChainEnd("cpu", "pod", "lab-b-prep", PREP, 0.13, "staging", "on lab-b-prep (...) working on a CPU")],
        {"staging": 0.75, "demand": 0.25, "network": 0.0, "accelerator": 0.0, "upstream": 0.0},
        "staging-bound", "staging", 1.0, 0.75, PREP, "main_thread",
        reasons=["GPU 0 busy 18%: lab/lab-b/lab-b's driving thread waited 62% on lab-b-prep ..."])


def _upstream() -> DriverTime:
    """lab-a's driving thread: its chain ends on a lossy upstream connection and on requests."""
    return DriverTime(
        AcceleratorId("gpu", "0"), LAB_A, [T0, T0 + 10], 10.0, {"network": [0.7, 0.6], "accelerator": [0.3, 0.4]},
        [2.0, 2.0], 40.0, {"network": 0.65, "accelerator": 0.35},
        [ChainEnd("network", "outbound", "10.0.0.5:8080", ("", "", "", ""), 0.5, "network",
                  "on its connection to 10.0.0.5:8080, which retransmits 4.0% of its segments (3.1/s)"),
         ChainEnd("network", "inbound", "10.0.0.9:51234", ("", "", "", ""), 0.3, "demand",
                  "for requests on its connection from 10.0.0.9:51234"),
         ChainEnd("accelerator", "", "", ("", "", "", ""), 0.2, "accelerator", "on the accelerator")],
        {"network": 0.5, "demand": 0.3, "accelerator": 0.2}, "network-bound", "network", 0.71, 0.7, ("lab", "lab-a", "lab-a", ""),
        "driver_calls")


def _accel(*rows: DriverTime, untraced: tuple[WorkloadRef, ...] = ()) -> AccelWaitFor:
    return AccelWaitFor(AcceleratorId("gpu", "0"), list(rows), list(untraced))


def test_end_labels_name_the_culprit_its_relation_and_what_it_did() -> None:
    ends = _sidecar().ends + _upstream().ends
    assert [end_label(e) for e in ends] == [
        "lab-b-prep (same pod) \u2014 held at its CPU limit",
        "the driving thread \u2014 sleeping (timer, pacing)",
        "lab-b-prep (same pod) \u2014 working on a CPU",
        "connection to 10.0.0.5:8080 (outbound) \u2014 loses packets",
        "connection from 10.0.0.9:51234 (inbound) \u2014 waiting for requests",
        "the accelerator",
    ]
    # the agent's summed rest of a cause, a lossless upstream, the driving thread's own CPU by its group
    assert end_label(ChainEnd("cpu", "", "", ("", "", "", ""), 0.1, "staging", "")) == \
        "other producers (summed) \u2014 working on a CPU"
    assert end_label(ChainEnd("network", "outbound", "db:5432", ("", "", "", ""), 0.1, "upstream", "")) == \
        "connection to db:5432 (outbound) \u2014 slow peer, no loss"
    assert end_label(ChainEnd("cpu", "self", "w", ("", "", "", ""), 0.1, "accelerator", "")) == \
        "the driving thread \u2014 on its CPU, launching work"
    assert end_label({"cause": "cpu_wait", "relation": "other", "culprit": "lab-hog", "group": "staging"}) == \
        "lab-hog (another workload) \u2014 waiting for a CPU"


def test_colours_are_the_states_they_make() -> None:
    # an end takes the colour of the state its group makes; network-bound and staging-bound as on every page
    assert GROUP_COLORS["staging"] == STATE_COLORS["staging-bound"]
    assert GROUP_COLORS["network"] == STATE_COLORS["network-bound"]
    assert GROUP_COLORS["accelerator"] == STATE_COLORS["compute-bound"]
    assert GROUP_COLORS["demand"] == STATE_COLORS["demand-limited"]
    assert GROUP_COLORS["upstream"] not in STATE_COLORS.values()     # a slow peer is no state of its own
    assert FIRST_HOP_COLORS["copy_pageable"] == STATE_COLORS["staging-bound"]
    assert FIRST_HOP_COLORS["accelerator"] == STATE_COLORS["compute-bound"]
    # a socket wait is not a loss until the chain says so: not the network-bound purple on the first hop
    assert FIRST_HOP_COLORS["network"] != STATE_COLORS["network-bound"]
    assert set(FIRST_HOP_COLORS) == set(waitfor_data.FIRST_HOP_STATES)


def _traces(fig: dict[str, Any], **where: Any) -> list[dict[str, Any]]:
    return [t for t in fig["data"] if all(t.get(k) == v for k, v in where.items())]


def test_figure_rows_first_hop_over_time_and_ends_over_the_range() -> None:
    fig = driver_time_figure(_accel(_sidecar(), _upstream()), (T0, T0 + 60), uirevision="r1")
    json.dumps(fig)                    # plain JSON
    go.Figure(fig)                     # Plotly accepts it
    lay = fig["layout"]
    assert lay["uirevision"] == "r1"
    # row 1 (lab-b): first hop on x/y, ends on x2/y2; row 2 (lab-a): x3/y3 and x4/y4
    hop_b = [t for t in fig["data"] if t["xaxis"] == "x" and t["yaxis"] == "y"]
    assert {t["name"] for t in hop_b} == {"a producer (IPC)", "on a CPU"}
    ipc = next(t for t in hop_b if t["meta"]["state"] == "ipc")
    assert ipc["y"] == [90.0, 80.0, None, 85.0, 90.0, 90.0]              # % of the bucket; a gap stays a gap
    assert ipc["x"][0] == "2027-01-15T08:00:05.000" and ipc["width"] == 10_000.0    # bucket centres, its width
    assert ipc["marker"]["color"] == FIRST_HOP_COLORS["ipc"]
    assert lay["xaxis"]["type"] == "date" and lay["xaxis"]["range"] == ["2027-01-15T08:00:00.000",
                                                                        "2027-01-15T08:01:00.000"]
    assert lay["yaxis"]["range"] == [0, 100]
    ends_b = [t for t in fig["data"] if t["xaxis"] == "x2"]
    staging = next(t for t in ends_b if t["meta"]["group"] == "staging")
    assert staging["orientation"] == "h" and staging["marker"]["color"] == STATE_COLORS["staging-bound"]
    assert staging["y"] == ["lab-b-prep (same pod) \u2014 held at its CPU limit",
                            "lab-b-prep (same pod) \u2014 working on a CPU"]
    assert staging["x"] == [62.0, 13.0] and staging["text"] == ["62%", "13%"]
    assert staging["meta"]["culprits"] == ["lab-b-prep", "lab-b-prep"] and staging["meta"]["relations"] == ["pod", "pod"]
    # the deciding group outlined, the others not
    assert staging["marker"]["line"]["width"] == [2.5, 2.5] and staging["meta"]["deciding"] == [True, True]
    demand = next(t for t in ends_b if t["meta"]["group"] == "demand")
    assert demand["marker"]["line"]["width"] == [0] and demand["marker"]["color"] == STATE_COLORS["demand-limited"]
    # the ends' axis lists them largest first
    assert lay["yaxis2"]["categoryarray"][0] == "lab-b-prep (same pod) \u2014 held at its CPU limit"
    assert lay["yaxis2"]["autorange"] == "reversed"
    ends_a = [t for t in fig["data"] if t["xaxis"] == "x4"]
    net = next(t for t in ends_a if t["meta"]["group"] == "network")
    assert net["marker"]["color"] == STATE_COLORS["network-bound"] and net["meta"]["culprits"] == ["10.0.0.5:8080"]
    assert net["y"] == ["connection to 10.0.0.5:8080 (outbound) \u2014 loses packets"]
    # one legend entry per first-hop state and per group, whatever the rows
    shown = [t["name"] for t in fig["data"] if t["showlegend"]]
    assert len(shown) == len(set(shown))
    assert {t["legend"] for t in fig["data"] if t.get("orientation") == "h"} == {"legend2"}
    # the rows say who and what the verdict reads from their chain
    titles = [a["text"] for a in lay["annotations"] if "thread(s)" in a["text"]]
    assert "lab/lab-b" in titles[0] and "staging-bound" in titles[0] and "naming lab/lab-b/lab-b-prep" in titles[0]
    assert "lab/lab-a" in titles[1] and "network-bound" in titles[1] and "driver calls" in titles[1]
    # the rows stack without overlapping
    assert lay["yaxis3"]["domain"][1] < lay["yaxis"]["domain"][0]


def test_a_figure_needs_evidence_and_the_panel_says_so_instead() -> None:
    with pytest.raises(ValueError):
        driver_time_figure(_accel(), (T0, T0 + 60))
    other = WorkloadRef("inference", "vit-serve-6c9d", "vit", "")
    panel = node_panel([_accel(untraced=(other,))], (T0, T0 + 60))
    assert not _find(panel, dcc.Graph)
    text = _text(panel)
    assert "inference/vit-serve-6c9d / vit: no wait-for evidence: the verdict decided on host symptoms" in text
    # a traced workload draws its figure, an untraced one beside it is said in a line
    panel = node_panel([_accel(_sidecar(), untraced=(other,))], (T0, T0 + 60), uirevision="u")
    (graph,) = _find(panel, dcc.Graph)
    assert graph.id == "node-waitfor-gpu0" and graph.figure["layout"]["uirevision"] == "u|gpu0"
    assert waitfor_data.NO_EVIDENCE in _text(panel) and "lab-b-prep" in _text(panel)


def test_the_panel_in_local_time_moves_the_time_axis_only() -> None:
    from zoneinfo import ZoneInfo

    panel = node_panel([_accel(_sidecar())], (T0, T0 + 60), zone=ZoneInfo("Asia/Tokyo"))
    (graph,) = _find(panel, dcc.Graph)
    fig = graph.figure
    assert fig["layout"]["xaxis"]["range"][0] == "2027-01-15T17:00:00.000"
    assert fig["layout"]["meta"]["tz"] == "Asia/Tokyo"
    assert next(t for t in fig["data"] if t["xaxis"] == "x2")["x"][0] == 62.0      # shares stay shares


CHAIN = {
    "type": "chain", "state": "staging-bound", "workload": ["lab", "lab-b", "lab-b", ""], "named": list(PREP),
    "strength": 0.97, "work": 0.97, "groups": {"staging": 0.9687, "demand": 0.0313, "network": 0.0},
    "detail": "GPU 0 busy 19%: lab/lab-b/lab-b's driving thread waited 70% on lab-b-prep (the same pod, container "
              "lab-b-prep) held at its CPU limit (throttled)",
    "ends": [
        {"cause": "cpu_throttled", "relation": "pod", "culprit": "lab-b-prep", "workload": list(PREP), "share": 0.698,
         "group": "staging", "words": "on lab-b-prep (the same pod, container lab-b-prep) held at its CPU limit"},
        {"cause": "producer", "relation": "pod", "culprit": "lab-b-prep", "workload": list(PREP), "share": 0.0209,
         "group": "demand", "words": "on lab-b-prep (not traced yet)"},
    ],
}


def test_chain_evidence_is_the_first_item_of_type_chain() -> None:
    assert chain_evidence([CHAIN, {"type": "series"}]) == CHAIN
    assert chain_evidence([{"type": "series"}, CHAIN]) is None       # the contract: the first item
    assert chain_evidence([]) is None and chain_evidence(None) is None


def test_chain_view_draws_the_driving_thread_its_ends_and_the_reason() -> None:
    view = chain_view(CHAIN, "GPU 0", id="chain-1")
    assert view.id == "chain-1" and view.className == "wf-chain"
    attrs = view.to_plotly_json()["props"]
    assert attrs["data-state"] == "staging-bound" and attrs["data-named"] == "lab/lab-b/lab-b-prep"
    ends = [li for li in _find(view, html.Li)]
    assert [li.to_plotly_json()["props"]["data-culprit"] for li in ends] == ["lab-b-prep", "lab-b-prep"]
    assert [li.className for li in ends] == ["wf-end wf-deciding", "wf-end"]     # the deciding group marked
    bar = _find(ends[0], html.Span)[1].children
    assert bar.style == {"width": "69.8%", "backgroundColor": STATE_COLORS["staging-bound"]}
    text = _text(view)
    assert "lab/lab-b/lab-b" in text and "lab-b-prep (same pod) \u2014 held at its CPU limit" in text
    assert "naming lab/lab-b/lab-b-prep" in text and CHAIN["detail"] in text and "staging 97% (decides)" in text


def test_bucket_width_and_read_plan() -> None:
    assert waitfor_data.bucket_width(425.0) == 10.0           # a recording of minutes: 43 buckets of 10 s
    assert waitfor_data.bucket_width(3600.0) == 60.0
    assert waitfor_data.bucket_width(86400.0, step=60.0) == 1800.0
    assert waitfor_data.bucket_width(20.0) == 1.0              # never under a sample step
    assert waitfor_data.read_plan(900.0) == (None, None)       # raw, every point: sums of rates stay exact
    assert waitfor_data.read_plan(6 * 3600.0) == ("1m", None)
    assert waitfor_data.read_plan(7 * 86400.0) == ("1h", None)


# ---------------------------------------------------------------------------------------------- helpers
def _walk(c: Any) -> list[Any]:
    out = [c]
    kids = getattr(c, "children", None)
    if isinstance(kids, list | tuple):
        for k in kids:
            out += _walk(k)
    elif kids is not None and not isinstance(kids, str | int | float):
        out += _walk(kids)
    return out


def _find(c: Any, kind: type) -> list[Any]:
    return [x for x in _walk(c) if isinstance(x, kind)]


def _text(c: Any) -> str:
    parts: list[str] = []
    for x in _walk(c):
        kids = getattr(x, "children", None)
        if isinstance(kids, str | int | float):
            parts.append(str(kids))
        elif isinstance(x, str):
            parts.append(x)
        if isinstance(kids, list | tuple):
            parts += [str(k) for k in kids if isinstance(k, str)]
    return " ".join(parts)


def test_a_rollup_reads_unrolled_tail_becomes_one_point_a_minute() -> None:
    from triscope.store.reader import SeriesData, SeriesInfo

    info = SeriesInfo(1, "n", "triscope_workload_driver_seconds_total", {"state": "cpu"}, "counter")
    # two rolled minutes (one point each, at their middle), then 90 raw seconds of the tail
    ts = [T0 + 30, T0 + 90] + [T0 + 120 + i for i in range(90)]
    vals = [0.5, 0.5] + [1.0] * 60 + [0.0] * 30
    got = waitfor_data.per_step(SeriesData(info, ts, vals, "1m"), 60.0)
    assert got.ts == [T0 + 30, T0 + 90, T0 + 150, T0 + 210] and got.values == [0.5, 0.5, 1.0, 0.0]
