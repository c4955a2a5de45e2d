"""The chart downloads (CSV / JSON) and the local-time view, without a browser: hostile labels stay
data, a figure drawn in local time exports UTC, file names stay file names."""

from __future__ import annotations

import csv
import io
import json
from zoneinfo import ZoneInfo

from triscope.dashboard import export, figures, timeview
from triscope.dashboard.data import LaneTrace, NodeLanes, Window

T0 = 1_800_000_000.0   # 2027-01-15T08:00:00Z
HOSTILE = {
    "node": "gpu-node-" + "x" * (10 * 1024 - 18) + "-end",          # 10 KiB, as tests/e2e/test_dashboard_long_names.py
    "pod": '=HYPERLINK("http://evil","x"),\n"quoted"; <script>',     # comma, quotes, newline, a formula, markup
    "ts": "clashes with the column",                                  # a label key named like a column
    "ns": "-1+2",
    "uni": "ünï\u2028cödé",
}


def _lanes() -> NodeLanes:
    ts = [T0 + 10 * i for i in range(5)]
    return NodeLanes("n1", Window(T0, T0 + 3600, False), [
        LaneTrace("triscope_gpu_sm_active_ratio|gpu=0", "triscope_gpu_sm_active_ratio", dict(HOSTILE), "accelerators",
                  "GPU 0 SM active", "%", 100.0, ts, [0.1, 0.2, float("nan"), 0.4, 0.5]),
        LaneTrace("triscope_tcp_retransmits_total|", "triscope_tcp_retransmits_total", {}, "network",
                  "TCP retransmits/s", "/s", 1.0, ts[:3], [1.0, 2.0, 3.0]),
    ], {}, [], "", [])


def test_series_come_from_the_drawn_figure_only() -> None:
    fig, _ = figures.node_lanes_figure(_lanes())
    series = export.series_from_figure(fig)
    # the frame traces, the ribbon and the events are drawing aids, not series
    assert [s.name for s in series] == ["GPU 0 SM active", "TCP retransmits/s"]
    sm = series[0]
    assert sm.labels == HOSTILE and sm.unit == "%"
    assert [p[0] for p in sm.points] == [T0 + 10 * i for i in range(5)]
    assert sm.points[1][1] == 20.0 and sm.points[2][1] is None     # drawn values (scaled), NaN a gap


def test_csv_with_hostile_labels_parses_back() -> None:
    fig, _ = figures.node_lanes_figure(_lanes())
    text = export.render_csv(export.series_from_figure(fig))
    rows = list(csv.reader(io.StringIO(text)))
    head = rows[0]
    assert head[0] == "ts" and head[1] == "series" and head[-1] == "value"
    assert "label_ts" in head and "node" in head and head.count("ts") == 1      # no column named twice
    body = [dict(zip(head, r, strict=True)) for r in rows[1:]]
    assert len(body) == 5 + 3                                                   # one row per point
    first = body[0]
    assert first["ts"] == "2027-01-15T08:00:00.000Z" and first["value"] == "10.0"
    assert first["node"] == HOSTILE["node"]                                     # whole, 10 KiB
    assert first["pod"] == "'" + HOSTILE["pod"]                                 # a formula is not run
    assert first["ns"] == "'-1+2" and first["uni"] == HOSTILE["uni"]
    assert body[2]["value"] == ""                                               # the gap
    assert body[5]["series"] == "TCP retransmits/s" and body[5]["pod"] == ""


def test_json_with_hostile_labels_parses_back() -> None:
    fig, _ = figures.node_lanes_figure(_lanes())
    doc = json.loads(export.render_json("node", HOSTILE["node"], T0, T0 + 3600, export.series_from_figure(fig)))
    assert set(doc) == {"chart", "node", "start", "end", "series"}
    assert doc["node"] == HOSTILE["node"] and doc["start"] == "2027-01-15T08:00:00.000Z"
    sm = doc["series"][0]
    assert sm["labels"] == HOSTILE and sm["unit"] == "%" and sm["name"] == "GPU 0 SM active"
    assert sm["points"][0] == ["2027-01-15T08:00:00.000Z", 10.0] and sm["points"][2][1] is None


def test_a_figure_drawn_in_local_time_exports_utc() -> None:
    fig, _ = figures.node_lanes_figure(_lanes())
    utc_points = [s.points for s in export.series_from_figure(fig)]
    timeview.localize_figure(fig, ZoneInfo("Asia/Tokyo"))
    assert fig["layout"]["meta"]["tz"] == "Asia/Tokyo"
    assert fig["layout"]["xaxis"]["range"][0] == "2027-01-15T17:00:00.000"      # drawn at +9 h
    drawn = [t for t in fig["data"] if t["x"] is not None and t["x"][0] is not None]   # legend-only entries hold no points
    assert drawn[-1]["x"][0] == "2027-01-15T17:00:00.000"
    assert [s.points for s in export.series_from_figure(fig)] == utc_points      # the file stays UTC


def test_file_names_say_what_and_when_and_stay_names() -> None:
    assert export.filename("node", "h200-node", 1_796_137_200.0, "csv") == "triscope-node-h200-node-20261201T1500Z.csv"
    long = export.filename("node", HOSTILE["node"], T0, "json")
    assert len(long) < 100 and long.endswith("-20270115T0800Z.json")
    other = export.filename("node", HOSTILE["node"][:-1] + "f", T0, "json")
    assert other != long                                                       # two long names, two files
    hostile = export.filename("node", "../../etc/passwd\x00;rm -rf", T0, "csv")
    assert "/" not in hostile and "\x00" not in hostile and " " not in hostile and ".." not in hostile


def test_zone_helpers() -> None:
    assert timeview.zone_of(None) is None and timeview.zone_of({"local": False, "zone": "Asia/Tokyo"}) is None
    assert timeview.zone_of({"local": True, "zone": "Not/AZone"}) is None       # unknown: UTC
    tokyo = timeview.zone_of({"local": True, "zone": "Asia/Tokyo"})
    assert tokyo is not None and timeview.zone_name(tokyo, T0) == "Asia/Tokyo (UTC+09:00)"
    assert timeview.fmt(T0, tokyo) == "2027-01-15 17:00:00" and timeview.fmt(T0) == "2027-01-15 08:00:00"
    assert timeview.to_utc_ts("2027-01-15T17:00:00.000", "Asia/Tokyo") == T0


def test_series_attached_to_a_chart_whose_x_is_not_time() -> None:
    """The Mismatch scatter and the share bars carry their series in layout.meta; the download
    reads them back (after a JSON round trip, as the browser sends the figure)."""
    fig = figures.state_share_figure({"n1": {"io-saturated": 0.25, "compute-bound": 0.75}})
    series = [export.Series("n1: io-saturated", {"node": "n1", "state": "io-saturated"}, "% of time", [(T0, 25.0)])]
    sent = json.loads(json.dumps(export.attach_series(fig, series)))
    back = export.series_from_figure(sent)
    assert [(s.name, s.labels, s.unit, s.points) for s in back] == [(s.name, s.labels, s.unit, s.points) for s in series]
    assert export.render_csv(back) == \
        "ts,series,node,state,value\n2027-01-15T08:00:00.000Z,n1: io-saturated,n1,io-saturated,25.0\n"


def test_the_episode_timeline_downloads_its_episodes() -> None:
    """The Root cause page's episode timeline (bars, not time series): each episode drawn is one
    series, its start and length, its accelerator, state, workload and top cause as labels; clipped
    to the window; the chart's figure carries them, in UTC whatever the zone it is drawn in."""
    from triscope.core.vocabulary import AcceleratorId
    from triscope.dashboard.rca_view import EpisodeCause, EpisodeView, episode_series
    from triscope.dashboard.workload_data import WorkloadRef

    t0 = 1_796_140_000.0
    eps = [EpisodeView(t0 - 50, t0 + 30, "staging-bound", "gpu=0", AcceleratorId("gpu", "0"),
                       WorkloadRef(workload="cmd:inference-b"), bad=True,
                       causes=[EpisodeCause("host_staging", "Host staging", 0.8)]),
           EpisodeView(t0 + 30, t0 + 90, "idle", "gpu=0", AcceleratorId("gpu", "0"), None),
           EpisodeView(t0 + 200, t0 + 300, "idle", "gpu=1", AcceleratorId("gpu", "1"), None)]   # after the window
    series = episode_series(eps, t0, t0 + 120)
    assert [(s.name, s.points) for s in series] == [("GPU 0: staging-bound", [(t0, 30.0)]), ("GPU 0: idle", [(t0 + 30, 60.0)])]
    assert series[0].labels == {"accelerator": "gpu=0", "state": "staging-bound", "kind": "state",
                                "workload": "cmd:inference-b", "bad": "true", "top_cause": "host_staging"}
    fig = export.attach_series(figures.episode_timeline_figure(eps[:2], (t0, t0 + 120)), series)
    timeview.localize_figure(fig, ZoneInfo("Asia/Tokyo"))
    rows = list(csv.DictReader(io.StringIO(export.render_csv(export.series_from_figure(fig)))))
    assert [(r["ts"], r["state"], r["value"]) for r in rows] == [
        (export.iso(t0), "staging-bound", "30.0"), (export.iso(t0 + 30), "idle", "60.0")]
