"""The Mismatch, Node, Fleet and Root cause pages show the same state for the same minute, in a real browser.

Two H200 recordings (``examples/traces/h200-inference-3`` and ``-5``) imported with the real
``triscope import-trace --shift-to-now`` (they end now, as ``make run`` imports them) and served by
the real ``triscope dashboard``, read in Debian's headless Chromium.  For each recording, minutes
taken from the verdict history (the middle of its longest bad run and of its longest healthy one,
where the node's roll-up and its GPU agree for a while around it): the Node page's state ribbon,
the Mismatch page's points (their state as the page drew them) and the Root cause page's episode
timeline give that minute the same state; the Fleet page's current state is the state the other
three pages give the recording's last minute.  Every page says "recording", none offers "live".
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from browser_support import chromium, dashboard_over
from conftest import REPO

TRISCOPE = os.path.join(os.path.dirname(sys.executable), "triscope")
NODES = ("h200-inference-3", "h200-inference-5")
AROUND_S = (-20.0, 30.0)     # the minute's state holds this long around it (the pages' windows and lags fit in)
MIN_RUN_S = 60.0

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Any]]:

    url = f"sqlite:///{tmp_path_factory.mktemp('same-state') / 'triscope.db'}"
    for node in NODES:
        subprocess.run([TRISCOPE, "import-trace", str(REPO / "examples" / "traces" / f"{node}.jsonl.gz"), "--db", url,
                        "--shift-to-now"], cwd=REPO, check=True, capture_output=True, timeout=300)
    with dashboard_over(url) as served:
        yield served


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as b:
        yield b


def _state_at(runs: list[Any], t: float, step: float = 1.0) -> str | None:
    """The state of the history's runs at ``t`` (a run holds from its first tick to one 1 Hz tick past its last)."""
    return next((r.state for r in runs if r.start <= t < r.end + step), None)


def _minutes(st: Any, node: str) -> list[tuple[float, str]]:
    """(t, state): the middle of the longest bad and of the longest healthy run of the node's roll-up
    where its GPU's own runs agree over ``AROUND_S``."""
    from triscope.core.vocabulary import IO_STATES

    runs = st.verdict_runs(node, 0, 4e9)
    rollup = [r for r in runs if r.accelerator == ""]
    gpu = [r for r in runs if r.accelerator == "gpu=0"]
    out: list[tuple[float, str]] = []
    for bad in (True, False):
        for r in sorted((r for r in rollup if (r.state in IO_STATES) == bad), key=lambda r: r.start - r.end):
            t = (r.start + r.end) / 2
            if r.end - r.start < MIN_RUN_S:
                break
            if all(_state_at(rs, t + d) == r.state for rs in (rollup, gpu) for d in (*AROUND_S, 0.0)):
                out.append((t, r.state))
                break
    assert any(s in IO_STATES for _, s in out), f"{node}: no bad run long enough to compare"
    return out


class Page:
    def __init__(self, browser: Any, base: str) -> None:
        self.page = browser.new_page(viewport={"width": 1400, "height": 1000}, timezone_id="UTC")
        self.base = base
        self.errors: list[str] = []
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))

    def goto(self, path: str, selector: str, timeout: float = 60000) -> Any:
        self.page.goto(self.base + path)
        self.page.wait_for_selector(selector, timeout=timeout)
        self.page.wait_for_function("() => !document.querySelector('[data-dash-is-loading=\"true\"]')", timeout=timeout)
        self.page.wait_for_load_state("networkidle", timeout=timeout)
        return self.page

    def graph(self, sel: str, expr: str) -> Any:
        return self.page.evaluate(f"() => {{ const gd = document.querySelector('{sel} .js-plotly-plot'); return {expr}; }}")


def _ts(x: str) -> float:
    return datetime.fromisoformat(x).replace(tzinfo=UTC).timestamp()


def node_ribbon(p: Page, node: str) -> list[tuple[float, float, str]]:
    """The Node page's ribbon as drawn: (start, end, state) of every rectangle."""
    pg = p.goto(f"/node/{node}", "#node-graph .js-plotly-plot")
    pg.wait_for_function("() => document.querySelector('#node-graph .js-plotly-plot').data.length > 4", timeout=60000)
    assert pg.inner_text("#node-recording") == "recording"
    assert pg.locator("#node-live input").is_disabled()             # no live mode for a recording
    assert "recording" in pg.inner_text("#node-window-note")
    # the ribbon: the filled rectangles on the top row, one trace per state
    traces = p.graph("#node-graph", "gd.data.filter(t => t.fill === 'toself' && t.yaxis === 'y')"
                                    ".map(t => [t.name, t.x])")
    out = []
    for name, xs in traces:
        for i in range(0, len(xs) - 5, 6):        # [a, a, b, b, a, None] per rectangle
            out.append((_ts(xs[i]), _ts(xs[i + 2]), name))
    assert out, "no ribbon drawn"
    return sorted(out)


def mismatch_points(p: Page, node: str) -> list[tuple[float, str]]:
    """The Mismatch page's points for the node as drawn (their download rows): (window start, state)."""
    pg = p.goto(f"/mismatch?node={node}&range=1h", "#mismatch-scatter .js-plotly-plot")
    assert "recording" in pg.inner_text("#mismatch-note")
    series = p.graph("#mismatch-scatter", "(gd.layout.meta || {}).series || []")
    pts = sorted((float(ts), s["labels"]["state"]) for s in series if s["name"].endswith("accelerator busy")
                 for ts, _ in s["points"])
    assert pts, "no point drawn"
    drawn = p.graph("#mismatch-scatter", "gd.data.map(t => [t.name, t.x.length])")
    assert sum(n for _, n in drawn) == len(pts)     # the rows are the points drawn
    return pts


def root_cause(p: Page, node: str, a: float, b: float) -> list[tuple[float, float, str]]:
    """The Root cause page's episode timeline for the GPU over [a, b]: (start, end, state)."""
    p.goto(f"/rootcause?node={node}&start={a:.0f}&end={b:.0f}", "#rootcause-timeline .js-plotly-plot", timeout=120000)
    series = p.graph("#rootcause-timeline", "(gd.layout.meta || {}).series || []")
    eps = [(float(s["points"][0][0]), float(s["points"][0][0]) + float(s["points"][0][1]), s["labels"]["state"])
           for s in series if s["labels"].get("accelerator") == "gpu=0" and s["labels"].get("kind") == "state"]
    assert eps, series
    return eps


def _at(spans: list[tuple[float, float, str]], t: float) -> str | None:
    return next((s for a, b, s in spans if a <= t < b), None)


def _point_at(pts: list[tuple[float, str]], t: float) -> str | None:
    """The state of the window that holds ``t`` (the last one that starts at or before it)."""
    before = [s for ts, s in pts if ts <= t]
    return before[-1] if before else None


@pytest.mark.parametrize("node", NODES)
def test_pages_show_the_same_state_for_the_same_minute(browser: Any, served: tuple[str, Any], node: str) -> None:
    base, st = served
    minutes = _minutes(st, node)
    (info,) = [n for n in st.nodes() if n.name == node]
    last = info.last_seen
    p = Page(browser, base)
    try:
        ribbon = node_ribbon(p, node)
        pts = mismatch_points(p, node)
        for t, state in minutes:
            eps = root_cause(p, node, t - 120, t + 120)
            seen = {"node": _at(ribbon, t), "mismatch": _point_at(pts, t), "root cause": _at(eps, t)}
            assert set(seen.values()) == {state}, (node, t, state, seen)
        # the Fleet's current state: what the other pages give the recording's last minute
        pg = p.goto("/", "#fleet-table")
        row = pg.locator("#fleet-table tbody tr", has=pg.locator("td[data-dash-column=node]", has_text=node))
        fleet_state = row.locator("td[data-dash-column=state]").inner_text().strip()
        cell_state = row.locator("td[data-dash-column=a0]").inner_text().strip().splitlines()[-1]
        assert "(recording)" in row.locator("td[data-dash-column=last_seen]").inner_text()
        assert "recording" in pg.inner_text("#fleet-recordings")
        eps = root_cause(p, node, last - 240, last + 1)
        t = last - 5
        seen = {"fleet": fleet_state, "fleet GPU 0": cell_state, "node": _at(ribbon, t), "mismatch": _point_at(pts, t),
                "root cause": _at(eps, t)}
        assert len(set(seen.values())) == 1, (node, seen)
        assert p.errors == [], p.errors
    finally:
        p.page.close()


def test_every_page_says_the_nodes_are_recordings(browser: Any, served: tuple[str, Any]) -> None:
    """The top bar of every page (those without a node of their own too) says how many nodes are
    recordings, and names them in its tooltip."""
    base, _ = served
    p = Page(browser, base)
    try:
        for path in ("/", "/slos", "/remediation", "/rootcause", f"/mismatch?node={NODES[0]}", f"/node/{NODES[1]}"):
            pg = p.goto(path, "#store-recordings")
            pg.wait_for_function("() => document.querySelector('#store-recordings').innerText.length > 0")
            assert pg.inner_text("#store-recordings") == "2 of 2 nodes: recordings", path
            assert all(n in (pg.get_attribute("#store-recordings", "title") or "") for n in NODES), path
        assert p.errors == [], p.errors
    finally:
        p.page.close()
