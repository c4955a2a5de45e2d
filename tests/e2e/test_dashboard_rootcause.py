"""The Root cause page over a recording, without a browser: it opens where every page opens
(``timerange``), says the node is a recording, paints the states the verdict history holds in their
``state_style``, draws lane events quietly, and reads the node's series once per burst of episodes.

One H200 recording (``examples/traces/h200-inference-5``) imported with the real ``triscope
import-trace`` (at its recorded times: it ended long ago) into a SQLite store; the page's layout and
callback run in the app's request context, as Dash runs them.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import REPO

TRISCOPE = os.path.join(os.path.dirname(sys.executable), "triscope")
NODE = "h200-inference-5"


@pytest.fixture(scope="module")
def app_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Any]]:
    from triscope.dashboard.app import create_app
    from triscope.store import Store

    url = f"sqlite:///{tmp_path_factory.mktemp('rootcause') / 'triscope.db'}"
    subprocess.run([TRISCOPE, "import-trace", str(REPO / "examples" / "traces" / f"{NODE}.jsonl.gz"), "--db", url],
                   cwd=REPO, check=True, capture_output=True, timeout=300)
    st = Store.open(url)
    app = create_app(url, store=st)
    yield app, st
    st.close()


def _walk(c: Any) -> Iterator[Any]:
    yield c
    kids = getattr(c, "children", None)
    for k in kids if isinstance(kids, list | tuple) else [kids] if kids is not None else []:
        if hasattr(k, "to_plotly_json"):
            yield from _walk(k)


def _by_id(parts: Any, cid: str) -> Any:
    return next((c for p in (parts if isinstance(parts, list) else [parts]) for c in _walk(p)
                 if getattr(c, "id", None) == cid), None)


def _bounds(st: Any) -> tuple[float, float]:
    (n,) = [n for n in st.nodes() if n.name == NODE]
    return n.first_seen, n.last_seen


def test_it_opens_on_the_recording(app_store: tuple[Any, Any]) -> None:
    """No window in the URL: all of a recording shorter than an hour, ending at its last sample, and
    the note says it is a recording; ``?range=24h`` the 24 h before that sample."""
    from triscope.dashboard.components import parse_ts
    from triscope.dashboard.pages import rootcause

    app, st = app_store
    first, last = _bounds(st)
    with app.server.test_request_context("/rootcause"):
        page = rootcause.layout(node=NODE)
        a, b = parse_ts(_by_id(page, "rootcause-start").value), parse_ts(_by_id(page, "rootcause-end").value)
        assert a is not None and b is not None
        assert abs(a - first) <= 1 and abs(b - (last + 1)) <= 1, (a, b, first, last)
        assert _by_id(page, "rootcause-window-note").children.startswith("a recording: showing all the data")
        day = rootcause.layout(node=NODE, range="24h")
        a = parse_ts(_by_id(day, "rootcause-start").value)
        assert a is not None and abs(a - (last + 1 - 86400)) <= 1
        links = [c.href for c in _walk(_by_id(page, "rootcause-lookbacks")) if getattr(c, "href", None)]
        assert f"/rootcause?node={NODE}&range=24h" in links and len(links) == 5


def test_states_are_the_history_in_their_colours(app_store: tuple[Any, Any]) -> None:
    """The window's state chips: the verdict history's shares (the Mismatch page's for the node, the
    same minutes), each chip in ``state_style`` (the quiet states pale with dark ink); the episode
    chips too; the recording note above everything."""
    from triscope.dashboard import data
    from triscope.dashboard.figures import DARK_INK, state_style
    from triscope.dashboard.pages import rootcause

    app, st = app_store
    first, last = _bounds(st)
    with app.server.test_request_context("/_dash-update-component", method="POST"):
        body, *_ = rootcause.explain(1, NODE, f"{first:.0f}", f"{last + 1:.0f}")
    assert "recording" in _by_id(body, "rootcause-recording-note").children
    chips = _by_id(body, "rootcause-states").children
    shown = {c.children.rsplit(" ", 1)[0]: float(c.children.rsplit(" ", 1)[1].rstrip("%")) / 100 for c in chips}
    _, shares = data.mismatch_points(st, [NODE], data.Window(float(f"{first:.0f}"), float(f"{last + 1:.0f}"), False))
    assert shown == pytest.approx(shares[NODE], abs=0.006), (shown, shares[NODE])
    assert {"idle", "demand-limited", "staging-bound"} <= set(shown), shown
    for c in chips:
        state = c.children.rsplit(" ", 1)[0]
        assert c.style == state_style(state), (state, c.style)
    assert state_style("idle")["color"] == DARK_INK
    eps = [c for c in _walk(_by_id(body, "rootcause-episodes")) if getattr(c, "className", "") == "state-chip"]
    assert len(eps) >= 3 and all(c.style == state_style(c.children) for c in eps)


def test_lane_events_are_drawn_quietly() -> None:
    """A scrape target's late /metrics (kind ``event``, never bad) is a small grey ring, not a red x
    like a health incident."""
    from triscope.core.vocabulary import AcceleratorId
    from triscope.dashboard import figures, rca_view

    t0 = 1_800_000_000.0
    acc = AcceleratorId.parse("gpu=0")
    eps = [rca_view.EpisodeView(t0, t0 + 60, "staging-bound", "gpu=0", acc, None, bad=True),
           rca_view.EpisodeView(t0 + 10, t0 + 12, "metrics-late", "gpu=0", acc, None, kind="event"),
           rca_view.EpisodeView(t0 + 20, t0 + 20, "xid", "gpu=0", acc, None, kind="health", bad=True)]
    fig = figures.episode_timeline_figure(eps, (t0, t0 + 60))
    marks = {t.name: t.marker for t in fig.data if t.mode == "markers" and t.name != "episodes"}
    assert set(marks) == {"event (context)", "health incident"}
    quiet, loud = marks["event (context)"], marks["health incident"]
    assert quiet.symbol == "circle-open" and quiet.color == "#78909c"
    assert loud.symbol == "x" and loud.color == "#c62828"
    assert quiet.color not in figures.STATE_COLORS.values()


def test_local_reads_are_planned_per_burst() -> None:
    """Overlapping spans join into one read while the join stays within an hour."""
    from triscope.analysis.config import default_thresholds
    from triscope.analysis.rca.timeline import LocalEvidence

    le = LocalEvidence(None, "n", default_thresholds())  # type: ignore[arg-type]
    le.plan([(100, 800), (0, 700), (5000, 5700), (200, 3700), (9000, 13000)])
    assert le._planned == [(0, 800), (200, 3700), (5000, 5700)]


class _Counting:
    """The store, counting the listings of the node's whole series set: one per read of everything."""

    def __init__(self, store: Any) -> None:
        self.store, self.reads = store, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    def series(self, node: str | None = None, metric: str | None = None, prefix: str | None = None,
               labels: Any = None) -> Any:
        if node is not None and metric is None and prefix is None and labels is None:
            self.reads += 1
        return self.store.series(node=node, metric=metric, prefix=prefix, labels=labels)


def test_a_day_reads_the_recording_twice(app_store: tuple[Any, Any]) -> None:
    """At a 24 h look-back: the timeline's read of the day (rollups), one raw read around the
    recording's burst of bad episodes (not one each), and the ranked view reuses the day's read —
    with the causes it ranks on its own read."""
    from triscope.analysis.rca.ranked import rank_causes
    from triscope.dashboard import rca_view

    _, st = app_store
    _, last = _bounds(st)
    a, b = last + 1 - 86400, last + 1
    counting = _Counting(st)
    tv = rca_view.timeline(counting, NODE, a, b)  # type: ignore[arg-type]
    assert len(tv.bad) >= 3 and tv.read is not None and tv.read.tier == "1h", tv.notes
    assert counting.reads == 2, counting.reads
    res = rca_view.explain(counting, NODE, a, b, inputs=tv.read)  # type: ignore[arg-type]
    assert counting.reads == 2, counting.reads
    own = rank_causes(st, NODE, a, b)
    assert [(c.key, c.score) for c in res.causes] == [(c.key, c.score) for c in own.causes[:8]]
    # a shorter window is read raw at the ranked view's own resolution: nothing is reused there
    rca_view.explain(counting, NODE, last - 900, b, inputs=rca_view.timeline(st, NODE, last - 900, b).read)  # type: ignore[arg-type]
    assert counting.reads == 3
