"""The dashboard in a real headless Chromium (Debian's, through Playwright), served by the real
``triscope dashboard`` command over a seeded SQLite store.

Screenshots of every page go to artifacts/screenshots/ (ignored by git).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from browser_support import chromium, stop_checked
from conftest import REPO, free_port, wait_for_port

TRISCOPE = os.path.join(os.path.dirname(sys.executable), "triscope")  # the console script

pytestmark = pytest.mark.browser

SHOTS = REPO / "artifacts" / "screenshots"


class Server:
    def __init__(self, db_url: str, port: int, proc: subprocess.Popen[bytes]) -> None:
        self.db_url, self.port, self.proc = db_url, port, proc
        self.base = f"http://127.0.0.1:{port}"


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, dict[str, tuple[float, float]]]]:
    from demo_seed import seed_demo

    from triscope.store import Store

    d = tmp_path_factory.mktemp("dash")
    url = f"sqlite:///{d / 'triscope.db'}"
    st = Store.open(url)
    st.upgrade()
    spans = seed_demo(st, time.time())
    yield st, spans
    st.close()


@pytest.fixture(scope="module")
def server(seeded: tuple[Any, Any]) -> Iterator[Server]:
    st, _ = seeded
    port = free_port()
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.pop("TRISCOPE_DASHBOARD_PASSWORD", None)
    proc = subprocess.Popen(
        [TRISCOPE, "dashboard", "--db", st.url, "--port", str(port),
         "--slo", str(REPO / "deploy" / "slo.example.yaml"), "--live-interval", "1"],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        wait_for_port(port, timeout=60)
        yield Server(st.url, port, proc)
    finally:
        # a callback that raised would have logged a traceback
        stop_checked(proc)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as b:
        yield b


class Page:
    """A Playwright page that records console errors and uncaught exceptions."""

    def __init__(self, browser: Any, base: str, timezone_id: str = "UTC") -> None:
        self.page = browser.new_page(viewport={"width": 1400, "height": 1000}, timezone_id=timezone_id,
                                     accept_downloads=True)
        self.base = base
        self.errors: list[str] = []
        self.page.on("console", lambda m: self.errors.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(f"pageerror: {e}"))

    def goto(self, path: str) -> Any:
        self.page.goto(self.base + path)
        self.settle()
        return self.page

    def settle(self, timeout: float = 20000) -> None:
        """Wait until Dash has no callback in flight."""
        self.page.wait_for_load_state("networkidle", timeout=timeout)
        self.page.wait_for_function(
            "() => document.querySelector('#_pages_content') && "
            "!document.querySelector('[data-dash-is-loading=\"true\"]')", timeout=timeout)

    def shot(self, name: str) -> None:
        SHOTS.mkdir(parents=True, exist_ok=True)
        self.page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)

    def close(self) -> None:
        self.page.close()


@pytest.fixture
def page(browser: Any, server: Server) -> Iterator[Page]:
    p = Page(browser, server.base)
    yield p
    p.close()


def graph_js(page: Any, gid: str, expr: str) -> Any:
    return page.evaluate(f"() => {{ const gd = document.querySelector('#{gid} .js-plotly-plot'); return {expr}; }}")


def trace_len(page: Any, gid: str, name: str) -> int:
    return int(graph_js(page, gid, f"(gd.data.find(t => t.name === {name!r}) || {{x: []}}).x.length"))


PAGES = [
    ("fleet", "/", "#fleet-table"),
    ("node-h200", "/node/h200-node", "#node-graph .js-plotly-plot"),
    ("node-cpu", "/node/cpu-node", "#node-graph .js-plotly-plot"),
    ("mismatch", "/mismatch", "#mismatch-scatter .js-plotly-plot"),
    ("slos", "/slos", ".slo-card"),
    ("remediation", "/remediation", "#remediation-table"),
    ("rootcause", "/rootcause", "#rootcause-states"),
]


@pytest.mark.parametrize(("name", "path", "selector"), PAGES, ids=[p[0] for p in PAGES])
def test_every_page_renders_without_console_errors(page: Page, name: str, path: str, selector: str) -> None:
    pg = page.goto(path)
    pg.wait_for_selector(selector, timeout=20000)
    page.settle()
    body = pg.inner_text("body")
    assert "Traceback" not in body and "Error loading" not in body and "failed:" not in body, body[:2000]
    page.shot(name)
    assert page.errors == [], page.errors


def test_node_page_lanes_ribbon_and_events(page: Page) -> None:
    pg = page.goto("/node/h200-node")
    pg.wait_for_selector("#node-graph .js-plotly-plot")
    names = graph_js(pg, "node-graph", "gd.data.map(t => t.name)")
    for expected in ("GPU 0 SM active", "GPU 0 PCIe RX (H2D)", "GPU 0 link capacity", "TCP retransmits/s",
                     "TIME_WAIT sockets", "io-saturated", "staging-bound", "compute-bound", "event: xid"):
        assert expected in names, names
    # the ribbon and the lanes share one time axis
    assert graph_js(pg, "node-graph", "gd._fullLayout.xaxis2.matches || gd._fullLayout.xaxis.matches") is not None
    assert page.errors == []


def test_node_without_gpu_says_so(page: Page) -> None:
    pg = page.goto("/node/cpu-node")
    pg.wait_for_selector("#node-graph .js-plotly-plot")
    notes = graph_js(pg, "node-graph", "gd.layout.annotations.map(a => a.text)")
    assert any("no GPU or NPU on this node" in n for n in notes), notes
    assert pg.locator("#node-graph").inner_text().count("no GPU or NPU on this node") == 1


def test_changing_the_time_range_redraws(page: Page) -> None:
    pg = page.goto("/node/h200-node")
    pg.wait_for_selector("#node-graph .js-plotly-plot")
    before = pg.inner_text("#node-window-note")
    span0 = graph_js(pg, "node-graph", "gd._fullLayout.xaxis.range.map(s => Date.parse(s.replace(' ', 'T') + 'Z'))")
    pg.get_by_label("24h").check()
    pg.wait_for_function("(b) => document.querySelector('#node-window-note').innerText !== b", arg=before)
    page.settle()
    span1 = graph_js(pg, "node-graph", "gd._fullLayout.xaxis.range.map(s => Date.parse(s.replace(' ', 'T') + 'Z'))")
    assert (span1[1] - span1[0]) > 20 * (span0[1] - span0[0]), (span0, span1)
    # a custom range
    st, en = time.time() - 600, time.time() - 300
    pg.fill("#node-start", str(int(st)))
    pg.fill("#node-end", str(int(en)))
    pg.get_by_label("custom").check()
    pg.click("#node-apply")
    pg.wait_for_function("() => document.querySelector('#node-window-note').innerText.includes('custom')")
    page.settle()
    r = graph_js(pg, "node-graph", "gd._fullLayout.xaxis.range.map(s => Date.parse(s.replace(' ', 'T') + 'Z') / 1000)")
    assert abs(r[0] - st) < 2 and abs(r[1] - en) < 2, r
    assert page.errors == []


def test_fleet_row_opens_its_node(page: Page) -> None:
    pg = page.goto("/")
    pg.wait_for_selector("#fleet-table")
    pg.locator("#fleet-table td", has_text="h200-node").first.click()
    pg.wait_for_url(re.compile(r".*/node/h200-node$"))
    pg.wait_for_selector("#node-graph .js-plotly-plot")
    assert pg.inner_text(".node-title") == "h200-node"
    # the fleet table filters (native filter row)
    page.goto("/")
    pg.locator("#fleet-table .dash-filter input").first.fill("cpu")
    pg.keyboard.press("Enter")
    pg.wait_for_function("() => document.querySelectorAll('#fleet-table tbody tr td[data-dash-column=node]').length === 1")
    assert page.errors == []


def _phase_window(spans: dict[str, tuple[float, float]], phase: str) -> tuple[float, float]:
    from triscope.analysis.synthetic import H200_PHASES

    start = spans["h200-node"][0]
    names = [p.name for p in H200_PHASES]
    span = spans["h200-node"][1] - start
    phase_s = span / (2 * len(names))
    i = names.index(phase)
    return start + i * phase_s + 10, start + (i + 1) * phase_s - 10


def test_explain_this_window_opens_root_cause(page: Page, seeded: tuple[Any, Any]) -> None:
    _, spans = seeded
    pg = page.goto("/node/h200-node")
    pg.wait_for_selector("#node-explain-link")
    pg.click("#node-explain-link")
    pg.wait_for_url(re.compile(r".*/rootcause\?node=h200-node&start=\d+&end=\d+"))
    pg.wait_for_selector("#rootcause-states")
    assert page.errors == []


@pytest.mark.parametrize(("phase", "state", "first_cause"), [
    ("pageable_h2d", "staging-bound", "Host staging"),
    ("pin_churn", "staging-bound", "DMA mapping"),
])
def test_root_cause_for_a_window(page: Page, seeded: tuple[Any, Any], phase: str, state: str, first_cause: str) -> None:
    """Windows of the H200-shaped trace: ranked causes from analysis.rca with evidence charts, and
    the detector's verdict for the window."""
    _, spans = seeded
    a, b = _phase_window(spans, phase)
    pg = page.goto(f"/rootcause?node=h200-node&start={a:.0f}&end={b:.0f}")
    pg.wait_for_selector("#rootcause-causes li")
    titles = pg.locator("#rootcause-causes .cause-title").all_inner_texts()
    assert titles and titles[0].startswith(first_cause), titles
    assert pg.locator("#rootcause-causes .js-plotly-plot").count() >= 1
    chips = pg.inner_text("#rootcause-states")
    assert chips.split()[0] == state, chips
    page.shot(f"rootcause-{phase}")
    assert page.errors == []


def test_live_mode_appends_points_and_keeps_zoom(page: Page, seeded: tuple[Any, Any]) -> None:
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    from triscope.core.samples import Sample, Tick

    st, _ = seeded
    pg = page.goto("/node/cpu-node?range=15m")
    pg.wait_for_selector("#node-graph .js-plotly-plot")
    n0 = trace_len(pg, "node-graph", "TIME_WAIT sockets")
    assert n0 > 0
    # a user's zoom: the last ten minutes of the view, drag-zoomed on the accelerator-less lane.
    # On a loaded machine a late re-render can swallow the first drag (Plotly replaces its drag
    # layers): drag again until the page shows the selected span, at most three times.
    for attempt in range(3):
        page.settle()
        box = pg.locator("#node-graph .nsewdrag").nth(3).bounding_box()
        y = box["y"] + box["height"] / 2
        pg.mouse.move(box["x"] + box["width"] * 0.4, y)
        pg.mouse.down()
        pg.mouse.move(box["x"] + box["width"] * 0.7, y, steps=5)
        pg.mouse.up()
        try:
            pg.wait_for_function(
                "() => document.querySelector('#node-explain-link').innerText.includes('selected span')",
                timeout=15000)
            break
        except PlaywrightTimeout:
            if attempt == 2:
                raise
    zoom = graph_js(pg, "node-graph", "gd._fullLayout.xaxis.range")
    pg.get_by_label("live").check()
    # the agent writes three new ticks
    now = time.time()
    st.write_ticks("cpu-node", [Tick(now + i, [Sample("triscope_tcp_sockets", 200.0 + i, {"state": "time_wait"})])
                                for i in range(3)])
    pg.wait_for_function(
        "(n) => { const gd = document.querySelector('#node-graph .js-plotly-plot');"
        " const t = gd.data.find(t => t.name === 'TIME_WAIT sockets'); return t && t.x.length >= n + 3; }",
        arg=n0, timeout=15000)
    y = graph_js(pg, "node-graph", "gd.data.find(t => t.name === 'TIME_WAIT sockets').y.slice(-3)")
    assert y == [200.0, 201.0, 202.0]
    assert graph_js(pg, "node-graph", "gd._fullLayout.xaxis.range") == zoom  # uirevision kept the zoom
    page.shot("node-live")
    assert page.errors == []


# ---------------------------------------------------------------------------------------------- the recorded H200 trace
H200_TRACES = sorted((REPO / "examples" / "traces").glob("h200-phases.*"))


def _phase_from_store(st: Any, node: str, phase: str) -> tuple[float, float] | None:
    """[start, end] of a labelled phase: its ``phase`` events, else the ``inference_phase`` gauge."""
    evs = [e for e in st.events(node=node, kinds=["phase"])
           if phase in (e.details.get("name"), e.details.get("phase"))]
    starts = [e.ts for e in evs if e.details.get("edge", "start") == "start"]
    ends = [e.ts for e in evs if e.details.get("edge") == "end"]
    if starts:
        a = min(starts)
        after = sorted(e.ts for e in st.events(node=node, kinds=["phase"]) if e.ts > a)
        b = min(ends) if ends else (after[0] if after else a + 60)
        return a, b
    for sd in st.query("inference_phase", node=node, labels={"phase": phase}, start=0, end=4e9, max_points=None):
        on = [t for t, v in zip(sd.ts, sd.values, strict=False) if v >= 0.5]
        if on:
            return min(on), max(on)
    return None


@pytest.fixture(scope="module")
def h200_source(seeded: tuple[Any, Any], server: Server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, Any]]:
    """(base URL, node, store) of the recorded H200 trace when examples/traces/h200-phases.* exists
    (imported with 'triscope import-trace' and served by its own dashboard), else the seeded
    H200-shaped node."""
    if not H200_TRACES:
        yield server.base, "h200-node", seeded[0]
        return
    from triscope.store import Store

    url = f"sqlite:///{tmp_path_factory.mktemp('trace') / 'trace.db'}"
    subprocess.run([TRISCOPE, "db", "upgrade", "--db", url], cwd=REPO, check=True, capture_output=True, timeout=120)
    subprocess.run([TRISCOPE, "import-trace", str(H200_TRACES[0]), "--db", url, "--node", "h200-trace"], cwd=REPO,
                   check=True, capture_output=True, timeout=300)
    port = free_port()
    proc = subprocess.Popen([TRISCOPE, "dashboard", "--db", url, "--port", str(port)], cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    st = Store.open(url)
    try:
        wait_for_port(port, timeout=60)
        yield f"http://127.0.0.1:{port}", "h200-trace", st
    finally:
        proc.terminate()
        proc.wait(10)
        st.close()


def test_root_cause_on_the_h200_trace(browser: Any, h200_source: tuple[str, str, Any]) -> None:
    base, node, st = h200_source
    win = _phase_from_store(st, node, "pageable_h2d")
    assert win is not None, "no pageable_h2d phase found in the trace (phase events or inference_phase gauge)"
    a, b = win
    pad = min(10.0, (b - a) / 4)
    p = Page(browser, base)
    try:
        pg = p.goto(f"/rootcause?node={node}&start={a + pad:.0f}&end={b - pad:.0f}")
        pg.wait_for_selector("#rootcause-causes li", timeout=30000)
        titles = pg.locator("#rootcause-causes .cause-title").all_inner_texts()
        assert titles, "no ranked causes"
        net = [i for i, t in enumerate(titles) if t.startswith("Network")]
        staging = [i for i, t in enumerate(titles) if t.startswith("Host staging")]
        assert staging and (not net or staging[0] < net[0]), titles  # host staging above everything network
        assert pg.locator("#rootcause-causes .js-plotly-plot").count() >= 1
        p.shot("rootcause-h200-trace" if H200_TRACES else "rootcause-h200-seeded")
        assert p.errors == []
    finally:
        p.close()


def test_live_mode_moves_the_time_axis_without_a_zoom(page: Page, seeded: tuple[Any, Any]) -> None:

    from triscope.core.samples import Sample, Tick

    st, _ = seeded
    pg = page.goto("/node/cpu-node?range=15m")
    pg.wait_for_selector("#node-graph .js-plotly-plot")
    end0 = graph_js(pg, "node-graph", "Date.parse(gd._fullLayout.xaxis.range[1].replace(' ', 'T') + 'Z') / 1000")
    pg.get_by_label("live").check()
    newest = time.time() + 0.5  # after the render (end0), not in the server's future
    assert newest > end0
    st.write_ticks("cpu-node", [Tick(newest, [Sample("triscope_tcp_sockets", 99.0, {"state": "time_wait"})])])
    pg.wait_for_function(
        "(t) => { const gd = document.querySelector('#node-graph .js-plotly-plot');"
        " return Date.parse(gd._fullLayout.xaxis.range[1].replace(' ', 'T') + 'Z') / 1000 >= t; }",
        arg=newest, timeout=15000)
    rng = graph_js(pg, "node-graph", "gd._fullLayout.xaxis.range.map(s => Date.parse(s.replace(' ', 'T') + 'Z') / 1000)")
    assert rng[1] - rng[0] == pytest.approx(900, abs=2)  # still a 15-minute view, now ending at the newest point
    assert page.errors == []


def _download(pg: Any, button: str) -> tuple[str, str]:
    with pg.expect_download(timeout=20000) as dl:
        pg.click(button)
    d = dl.value
    return d.suggested_filename, Path(d.path()).read_text(encoding="utf-8")


def test_node_chart_downloads_hold_what_is_drawn(page: Page) -> None:
    """CSV and JSON of the node chart: the drawn trace's points, values and UTC times, a file name
    that says what and when."""
    import csv
    import io
    import json

    pg = page.goto("/node/h200-node")
    pg.wait_for_selector("#node-graph .js-plotly-plot")
    name = "GPU 0 SM active"
    drawn_n = trace_len(pg, "node-graph", name)
    drawn = graph_js(pg, "node-graph", f"(t => [t.x.slice(0, 3), t.y.slice(0, 3), t.x[t.x.length - 1]])"
                                       f"(gd.data.find(t => t.name === {name!r}))")
    assert drawn_n > 10, drawn_n
    fname, text = _download(pg, "#node-graph-csv")
    assert re.fullmatch(r"triscope-node-h200-node-\d{8}T\d{4}Z\.csv", fname), fname
    rows = list(csv.DictReader(io.StringIO(text)))
    ours = [r for r in rows if r["series"] == name]
    assert len(ours) == drawn_n
    assert {"ts", "series", "value", "gpu"} <= set(rows[0])
    # the page draws UTC (the toggle is off): the file's times are the drawn ones with a Z
    assert [r["ts"] for r in ours[:3]] == [x.replace(" ", "T") + "Z" for x in drawn[0]]
    assert ours[-1]["ts"] == drawn[2].replace(" ", "T") + "Z"
    assert [float(r["value"]) for r in ours[:3]] == pytest.approx(drawn[1])
    fname, text = _download(pg, "#node-graph-json")
    assert fname.endswith(".json") and fname.startswith("triscope-node-h200-node-")
    doc = json.loads(text)
    assert doc["chart"] == "node" and doc["node"] == "h200-node" and doc["start"] < doc["end"]
    sm = next(s for s in doc["series"] if s["name"] == name)
    assert len(sm["points"]) == drawn_n and sm["unit"] == "%" and sm["labels"].get("gpu") == "0"
    assert [p[1] for p in sm["points"][:3]] == pytest.approx(drawn[1])
    assert page.errors == []


def test_local_time_toggle_shows_the_browser_zone_and_stays_on(browser: Any, server: Server) -> None:
    """In a browser in Tokyo: off, UTC as always; on, the range label and the time axis move by
    +9 h and name the zone; the choice holds on other pages and after a reload."""
    from datetime import datetime

    p = Page(browser, server.base, timezone_id="Asia/Tokyo")
    try:
        pg = p.goto("/node/h200-node")
        pg.wait_for_selector("#node-graph .js-plotly-plot")
        assert not pg.is_checked("#tz-local input")
        note0 = pg.inner_text("#node-window-note")
        assert " UTC" in note0 and "Asia/Tokyo" not in note0, note0
        axis0 = graph_js(pg, "node-graph", "gd._fullLayout.xaxis.range[1]")
        pg.get_by_label("local time").check()
        pg.wait_for_function("() => document.querySelector('#node-window-note').innerText.includes('Asia/Tokyo')")
        p.settle()
        note1 = pg.inner_text("#node-window-note")
        assert "Asia/Tokyo (UTC+09:00)" in note1, note1

        def first_ts(text: str) -> float:
            m = re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", text)
            assert m, text
            return datetime.fromisoformat(m.group(0)).timestamp()

        assert first_ts(note1) - first_ts(note0) == pytest.approx(9 * 3600, abs=120)
        axis1 = graph_js(pg, "node-graph", "gd._fullLayout.xaxis.range[1]")
        shift = datetime.fromisoformat(axis1.replace(" ", "T")) - datetime.fromisoformat(axis0.replace(" ", "T"))
        assert shift.total_seconds() == pytest.approx(9 * 3600, abs=120)
        # the link is rewritten by its own callback, which may land after the note's: wait for it
        pg.wait_for_function("() => document.querySelector('#node-explain-link').innerText.includes('Asia/Tokyo')",
                             timeout=15000)
        assert "Asia/Tokyo" in pg.inner_text("#node-explain-link")
        # another page, then back: still on (the choice is in the browser's localStorage)
        pg = p.goto("/mismatch")
        pg.wait_for_selector("#mismatch-scatter .js-plotly-plot")
        assert pg.is_checked("#tz-local input")
        assert "Asia/Tokyo" in pg.inner_text("#mismatch-note")
        pg = p.goto("/")
        pg.wait_for_function("() => document.querySelector('#fleet-table').innerText.includes('last seen (Asia/Tokyo)')")
        pg = p.goto("/remediation")
        pg.wait_for_function("() => document.querySelector('#remediation-note').innerText.includes('Asia/Tokyo')")
        pg = p.goto("/rootcause?node=h200-node")
        pg.wait_for_selector("#rootcause-states")
        assert "Asia/Tokyo" in pg.inner_text("#rootcause-body")
        pg = p.goto("/node/h200-node")
        pg.wait_for_function("() => document.querySelector('#node-window-note').innerText.includes('Asia/Tokyo')")
        # and off again: UTC
        pg.get_by_label("local time").uncheck()
        pg.wait_for_function("() => !document.querySelector('#node-window-note').innerText.includes('Asia/Tokyo')")
        assert p.errors == []
    finally:
        p.close()



def test_evidence_chart_download(page: Page, seeded: tuple[Any, Any]) -> None:
    """A chart built in a page's callback (a cause's evidence on the Root cause page) downloads the
    same way: JSON of what is drawn, UTC."""
    import json

    _, spans = seeded
    a, b = _phase_window(spans, "pin_churn")
    pg = page.goto(f"/rootcause?node=h200-node&start={a:.0f}&end={b:.0f}")
    pg.wait_for_selector("#rootcause-causes .chart-with-export .js-plotly-plot")
    page.settle()
    first = pg.locator("#rootcause-causes .chart-with-export").first
    drawn = first.evaluate("el => { const gd = el.querySelector('.js-plotly-plot');"
                           " return gd.data.filter(t => t.meta && t.meta.labels).map(t => [t.name, t.x.length, t.x[0]]); }")
    assert drawn and drawn[0][1] > 0, drawn
    with pg.expect_download(timeout=20000) as dl:
        first.locator("button", has_text="JSON").click()
    d = dl.value
    assert re.fullmatch(r"triscope-rootcause-evidence-h200-node-\d{8}T\d{4}Z\.json", d.suggested_filename)
    doc = json.loads(Path(d.path()).read_text(encoding="utf-8"))
    assert [[s["name"], len(s["points"])] for s in doc["series"]] == [x[:2] for x in drawn]
    assert doc["series"][0]["points"][0][0] == drawn[0][2].replace(" ", "T") + "Z"
    assert doc["node"] == "h200-node" and "metric" in doc["series"][0]["labels"]
    assert page.errors == []


def test_mismatch_scatter_download(page: Page) -> None:
    """The Mismatch scatter (x is link load, not time): per node and state, busy, link load and
    score at each drawn window's time."""
    import csv
    import io

    pg = page.goto("/mismatch?node=h200-node")
    pg.wait_for_selector("#mismatch-scatter .js-plotly-plot")
    page.settle()
    drawn = graph_js(pg, "mismatch-scatter", "gd.data.reduce((n, t) => n + (t.x || []).length, 0)")
    assert drawn > 0
    fname, text = _download(pg, "#mismatch-scatter-csv")
    assert re.fullmatch(r"triscope-mismatch-windows-h200-node-\d{8}T\d{4}Z\.csv", fname), fname
    rows = list(csv.DictReader(io.StringIO(text)))
    assert len(rows) == 3 * drawn and {r["node"] for r in rows} == {"h200-node"}
    assert page.errors == []
