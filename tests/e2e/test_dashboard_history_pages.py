"""The pages read the one verdict history, mark recordings, and read through the store's identifiers.

Two H200 recordings imported with the real ``triscope import-trace --shift-to-now`` into a SQLite
store (so they end now, as ``make run`` imports them): the Fleet's state and score are the
history's current runs (h200-inference-3's last tick publishes ``staging-bound`` with score 0: the
row shows the stretch's score), the Mismatch page's shares are the history's time in each state
whatever the detector would say, the per-workload shares are the same at 24 h as over the
recording itself, every page says "recording" and never "live", and a Node page render lists the
node's series once and reads link capacity with ``store.latest``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import REPO

TRISCOPE = os.path.join(os.path.dirname(sys.executable), "triscope")
TRACES = {n: REPO / "examples" / "traces" / f"{n}.jsonl.gz" for n in ("h200-inference-3", "h200-inference-5")}


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from triscope.store import Store

    url = f"sqlite:///{tmp_path_factory.mktemp('history') / 'triscope.db'}"
    for path in TRACES.values():
        subprocess.run([TRISCOPE, "import-trace", str(path), "--db", url, "--shift-to-now"], cwd=REPO, check=True,
                       capture_output=True, timeout=300)
    st = Store.open(url)
    yield st
    st.close()


def _rollup(st: Any, node: str) -> list[Any]:
    return [r for r in st.verdict_runs(node, 0, 4e9) if r.accelerator == ""]


def test_fleet_rows_are_the_histories_current_runs(imported: Any) -> None:
    from triscope.dashboard import data

    rows = {r.node: r for r in data.fleet_rows(imported, time.time())}
    assert set(rows) == set(TRACES)
    for node, row in rows.items():
        newest = max(_rollup(imported, node), key=lambda r: r.end)
        assert row.state == newest.state, node
        assert row.recording == f"{node}.jsonl.gz" and not row.live, node   # ends now, yet no live agent
        assert [c.accel.name for c in row.cells] == ["GPU 0"]
    # h200-inference-3 ends staging-bound; its last tick alone scores 0, the stretch does not
    r3 = rows["h200-inference-3"]
    assert r3.state == "staging-bound" and r3.score is not None and r3.score > 0.5, r3
    assert r3.cells[0].state == "staging-bound" and (r3.cells[0].score or 0) > 0.5, r3.cells


def test_recordings_are_marked_until_an_agent_writes(imported: Any, tmp_path: Any) -> None:
    from triscope.core.samples import Sample, Tick
    from triscope.dashboard import data, timerange
    from triscope.store import Store

    now = time.time()
    for node in TRACES:
        w = timerange.window("1h", timerange.node_bounds(imported, node), now)
        assert not w.live and w.note.startswith("a recording: "), w        # it ends now, yet it is no live node
        assert f"{node}.jsonl.gz" in data.recording_note(imported, node)
        assert "live" not in data.recording_note(imported, node).replace("not a live agent", ""), node
    assert not timerange.window("1h", timerange.store_bounds(imported), now).live    # a fleet of recordings only
    assert set(data.recordings(imported)) == set(TRACES)
    # an agent writing under a recording's name later makes it a live node again
    url = f"sqlite:///{tmp_path / 'one.db'}"
    subprocess.run([TRISCOPE, "import-trace", str(TRACES["h200-inference-5"]), "--db", url, "--node", "n1"],
                   cwd=REPO, check=True, capture_output=True, timeout=300)
    st = Store.open(url)
    try:
        (n,) = st.nodes()
        assert n.recording == "h200-inference-5.jsonl.gz"
        st.write_ticks("n1", [Tick(now, [Sample("triscope_tcp_sockets", 1.0, {"state": "time_wait"})])])
        (n,) = st.nodes()
        assert n.recording is None
        assert timerange.window("1h", timerange.node_bounds(st, "n1"), now).live
    finally:
        st.close()


def test_mismatch_shares_come_from_the_history_without_detector_windows(store: Any) -> None:
    """A node whose agent stored its verdicts but none of the series the detector reads: the
    shares are the history's (the detector has no window to give)."""
    from triscope.core.samples import Sample, Tick
    from triscope.dashboard import data

    t0 = 1_800_000_000.0
    states = ["staging-bound"] * 60 + ["idle"] * 30
    store.write_ticks("n1", [Tick(t0 + i, [Sample("triscope_mismatch_state", 1.0, {"state": st}),
                                           Sample("triscope_mismatch_score", 0.9 if st != "idle" else 0.0)])
                             for i, st in enumerate(states)])
    w = data.Window(t0, t0 + len(states), False)
    pts, shares = data.mismatch_points(store, ["n1"], w)
    assert pts == []                                          # no busy series: no point to draw
    assert shares["n1"] == pytest.approx({"staging-bound": 60 / 90, "idle": 30 / 90}, abs=0.02)


def test_workload_shares_do_not_depend_on_the_range(imported: Any) -> None:
    """Over the recording itself and over the 24 h before its end: the same shares (the history
    is read at full resolution whatever the range; the state series at 24 h are minute rollups)."""
    from triscope.dashboard import workload_data as wd

    node = "h200-inference-3"
    (n,) = [x for x in imported.nodes() if x.name == node]
    short = wd.workload_state_shares(imported, [node], n.first_seen, n.last_seen + 5)
    day = wd.workload_state_shares(imported, [node], n.last_seen + 5 - 86400, n.last_seen + 5)
    assert short.runs_read and short.series_read == 0
    assert set(day.shares) == set(short.shares)
    for k, sh in short.shares.items():
        assert day.shares[k] == pytest.approx(sh, abs=0.005), k


def test_a_node_render_lists_its_series_once(imported: Any) -> None:
    """The Node page's render: one listing of the node's series (kept for the workloads and the
    ribbon), link capacity from ``store.latest``, no range query outside the plotted series; trace
    keys are the series' ids, which live mode reads back."""
    from dash._utils import to_json

    from triscope.dashboard.app import create_app
    from triscope.store import Store

    calls: dict[str, int] = {}

    class Counting(Store):
        def series(self, *a: Any, **kw: Any) -> Any:
            calls["series"] = calls.get("series", 0) + 1
            return super().series(*a, **kw)

        def query(self, *a: Any, **kw: Any) -> Any:
            calls["query"] = calls.get("query", 0) + 1
            return super().query(*a, **kw)

    st = Counting.open(imported.url)
    try:
        app = create_app(store=st)
        from triscope.dashboard.pages import node as node_page  # pages register once an app exists

        with app.server.test_request_context("/_dash-update-component", method="POST"):
            calls.clear()
            fig, meta, *_ = node_page.render("all", 0, "h200-inference-3", None, None)
            to_json(fig)
        # one listing in the page, one inside each store.latest (link facts, workload info)
        assert calls.get("series") == 3 and calls.get("query", 0) == 0, calls
        by_key = dict(zip(meta["keys"], fig["data"], strict=True))
        (sm,) = [k for k, t in by_key.items() if t.get("name") == "GPU 0 SM active"]
        (info,) = st.series(node="h200-inference-3", metric="triscope_gpu_sm_active_ratio")
        assert sm == str(info.id) and meta["scale"][sm] == 100.0
        cap = by_key["capacity|gpu=0"]
        assert cap["y"][0] == pytest.approx(63.0, rel=0.02)         # Gen5 x16 in GB/s, from store.latest
    finally:
        st.close()


def test_fleet_page_names_accelerators_and_keeps_quiet_states_quiet(imported: Any) -> None:
    from triscope.core.vocabulary import IO_STATES, QUIET_STATES
    from triscope.dashboard.app import create_app
    from triscope.dashboard.figures import DARK_INK, STATE_COLORS, STATE_INK

    app = create_app(store=imported)
    from triscope.dashboard.pages import fleet  # pages register once an app exists

    with app.server.test_request_context("/"):
        page = fleet.layout()
    table = _find(page, "fleet-table")
    heads = [c["name"] for c in table.columns if c["id"][1:].isdigit()]
    assert heads == [[fleet.ACCEL_HEAD, "GPU 0"]]
    rules = [r for r in table.style_data_conditional if r["if"].get("column_id") == "state"]
    live = {r["if"]["filter_query"].split('"')[1]: r for r in rules if "{rec}" not in r["if"]["filter_query"]}
    for s, r in live.items():     # each state in its colour and ink: the quiet ones pale, dark text, not bold
        assert (r["backgroundColor"], r["color"]) == (STATE_COLORS[s], STATE_INK[s]), s
        assert (r["fontWeight"] == "600") == (s in IO_STATES), s
    assert {STATE_INK[s] for s in QUIET_STATES} == {DARK_INK} and {STATE_INK[s] for s in IO_STATES} == {"#ffffff"}
    # a recording's row (rec = 1): outlined, never painted
    rec_rules = [r for r in rules if "{rec} = 1" in r["if"]["filter_query"]]
    assert len(rec_rules) == len(STATE_COLORS) and {r["backgroundColor"] for r in rec_rules} == {"transparent"}
    assert rules.index(rec_rules[0]) > max(rules.index(r) for r in live.values())   # they come last: they win
    for rec in table.data:
        assert rec["last_seen"].endswith("(recording)") and rec["rec"] == 1, rec
    assert "recording" in str(_find(page, "fleet-recordings").children)


def test_store_downsamples_a_short_range(store: Any) -> None:
    """A short range (few raw points an output point) downsampled by the store, min and max kept."""
    from triscope.core.samples import Sample, Tick

    t0 = 1_800_000_000.0
    vals = [float(i % 7) for i in range(400)]
    vals[123] = 50.0
    store.write_ticks("n1", [Tick(t0 + i, [Sample("g", v)]) for i, v in enumerate(vals)])
    (info,) = store.series(node="n1", metric="g")
    d = store.query_series(info, t0, t0 + 400, max_points=100)
    assert len(d.ts) <= 100 and max(d.values) == 50.0 and min(d.values) == 0.0 and d.ts == sorted(d.ts)


def _find(comp: Any, cid: str) -> Any:
    if getattr(comp, "id", None) == cid:
        return comp
    kids = getattr(comp, "children", None)
    for k in kids if isinstance(kids, list) else [kids] if kids is not None else []:
        got = _find(k, cid)
        if got is not None:
            return got
    return None
