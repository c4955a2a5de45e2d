"""The dashboard over the demo's recordings (two of the six H200 recordings, imported with the real
``triscope import-trace``, served by the real ``triscope dashboard`` with the demo's SLO file), in
headless Chromium: what is on each page, read from the page itself.

- SLOs: the two demo SLOs speak (a decided status, a budget figure, the latency one overspent),
  their card text is their definition, and the page says it is evaluated where the data ends.
- Colours: the ribbon's states are painted in their colours, the quiet ones pale; every series kind
  has the same colour on both nodes, one legend entry, never a state's colour; a workload row is
  coloured by its own state and a quiet row has no red evidence.
- Remediation: every decision names its node (the revert too), links to its episode, which opens
  the Root cause page on that node, and says its verdict before and after.
- Root cause: the same episodes (count, states, starts, top causes) at look-backs of 30 min, 6 h,
  24 h and 7 d over the same recording.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest
from browser_support import chromium, dashboard_over
from conftest import REPO
from test_dashboard_browser import TRISCOPE, Page, graph_js

pytestmark = pytest.mark.browser

NODES = ("h200-inference-5", "h200-inference-1")
DEMO_SLO = REPO / "deploy" / "slo.demo.yaml"


def _rgb(hex_color: str) -> str:
    r, g, b = (int(hex_color[i:i + 2], 16) for i in (1, 3, 5))
    return f"rgb({r}, {g}, {b})"


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Any]]:

    url = f"sqlite:///{tmp_path_factory.mktemp('demo') / 'demo.db'}"
    for node in NODES:
        subprocess.run([TRISCOPE, "import-trace", str(REPO / "examples" / "traces" / f"{node}.jsonl.gz"),
                        "--db", url], cwd=REPO, check=True, capture_output=True, timeout=300)
    with dashboard_over(url, "--slo", str(DEMO_SLO)) as served:
        yield served


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as b:
        yield b


@pytest.fixture
def page(browser: Any, demo: tuple[str, Any]) -> Iterator[Page]:
    p = Page(browser, demo[0])
    yield p
    p.close()


def test_slos_speak_on_the_recordings(page: Page) -> None:
    pg = page.goto("/slos")
    pg.wait_for_selector(".slo-card")
    page.settle()
    cards = pg.locator(".slo-card")
    assert cards.count() == 2
    promises = pg.locator(".slo-promise").all_inner_texts()
    assert promises == ["99.9 % of events good (at most 0.1 % bad), over a rolling 1h",
                        "99.5 % of events within 250 ms, over a rolling 1h"], promises
    assert not re.search(r"\b50 ms", pg.inner_text("body"))      # the old card's deadline, not the service's
    badges = pg.locator(".slo-card .badge").all_inner_texts()
    assert badges[0] == "ok" and badges[1] in ("ok", "page"), badges      # decided, both
    budgets = pg.locator(".slo-budget").all_inner_texts()
    assert budgets[0] == "100.0%", budgets
    assert re.fullmatch(r"-\d+\.\d%", budgets[1]), budgets               # the latency budget, overspent
    assert "scaled to the 1h period" in cards.nth(1).inner_text()
    note = pg.inner_text("#slos-note")
    assert note.startswith("not live: the SLOs' series end") and "evaluated where they end" in note, note
    page.shot("demo-slos")
    assert page.errors == []


def _kind_colours(pg: Any) -> dict[str, str]:
    """The lane legends' entries: kind title -> colour (the one legend-only trace of each kind)."""
    got = graph_js(pg, "node-graph", "gd.data.filter(t => t.legend && t.legend !== 'legend' && t.showlegend !== false)"
                                     ".map(t => [t.name, t.line.color, t.legend])")
    names = [g[0] for g in got]
    assert len(names) == len(set(names)), f"a kind listed twice: {names}"
    return {g[0]: g[1] for g in got}


def test_state_and_series_colours(page: Page) -> None:
    from triscope.dashboard.figures import SERIES_KINDS, STATE_COLORS

    kinds = {title: color for title, color in SERIES_KINDS.values()}
    seen: list[dict[str, str]] = []
    for node in NODES:
        pg = page.goto(f"/node/{node}")
        pg.wait_for_selector("#node-graph .js-plotly-plot")
        page.settle()
        ribbon = graph_js(pg, "node-graph", "gd.data.filter(t => t.fill === 'toself').map(t => [t.name, t.fillcolor])")
        assert {"demand-limited", "staging-bound"} <= {r[0] for r in ribbon}, ribbon
        for state, color in ribbon:
            assert color == STATE_COLORS[state], (state, color)
            quiet = min(int(color[i:i + 2], 16) for i in (1, 3, 5)) >= 170      # pale: every channel high
            assert quiet == (state in ("idle", "demand-limited")), (state, color)
        colours = _kind_colours(pg)
        assert {"SM active", "PCIe RX (H2D)", "TCP retransmits/s"} <= set(colours), colours
        for title, color in colours.items():
            assert color == kinds[title] and color not in STATE_COLORS.values(), (title, color)
        # every drawn series has its kind's colour family: never a state's colour
        lines = graph_js(pg, "node-graph", "gd.data.filter(t => t.meta && t.meta.kind).map(t => t.line.color)")
        assert lines and not set(lines) & set(STATE_COLORS.values())
        seen.append(colours)
    shared = set(seen[0]) & set(seen[1])
    assert shared and all(seen[0][k] == seen[1][k] for k in shared)       # the same on both nodes
    # the accelerator chips: a quiet state pale with dark text, a fault loud with white
    chip = pg.locator(".accel-chip .accel-state").first
    style = chip.evaluate("el => [el.innerText, getComputedStyle(el).backgroundColor, getComputedStyle(el).color]")
    assert style[1] == _rgb(STATE_COLORS[style[0]]), style
    assert style[2] == ("rgb(38, 50, 56)" if style[0] in ("idle", "demand-limited") else "rgb(255, 255, 255)"), style
    assert page.errors == []


def test_workload_rows_take_their_own_state(page: Page) -> None:
    from triscope.dashboard.figures import STATE_COLORS

    pg = page.goto(f"/node/{NODES[0]}?gpu=0")
    pg.wait_for_selector("#node-workload-table tr.wl-row")
    page.settle()
    rows = pg.locator("#node-workload-table tr.wl-row")
    states = []
    for i in range(rows.count()):
        row = rows.nth(i)
        chip = row.locator("td.wl-state .accel-state")
        if not chip.count():
            continue
        state = chip.inner_text().rsplit(" ", 1)[0]
        states.append(state)
        assert chip.evaluate("el => getComputedStyle(el).backgroundColor") == _rgb(STATE_COLORS[state])
        assert row.evaluate("el => getComputedStyle(el).borderLeftColor") == _rgb(STATE_COLORS[state])
        if state in ("idle", "demand-limited", "compute-bound", "balanced"):
            assert row.locator("td.hot").count() == 0, row.inner_text()      # a healthy row is not red
    assert len(set(states)) >= 2, states       # rows differ: not every row painted alike
    assert any(s in ("staging-bound", "io-saturated", "network-bound") for s in states), states
    page.shot("demo-node-gpu0")
    assert page.errors == []


def test_remediation_rows_link_episode_node_and_outcome(page: Page, demo: tuple[str, Any]) -> None:
    pg = page.goto("/remediation?range=all")
    pg.wait_for_selector("#remediation-table")
    page.settle()
    records = pg.evaluate("() => Array.from(document.querySelectorAll('#remediation-table tbody tr'))"
                          ".filter(tr => tr.querySelector('td[data-dash-column=node]'))"
                          ".map(tr => ['node', 'effect', 'episode', 'target', 'mode'].map(c => {"
                          " const td = tr.querySelector(`td[data-dash-column=${c}]`);"
                          " const a = td && td.querySelector('a');"
                          " return a ? [td.innerText.trim(), a.getAttribute('href')] : [td ? td.innerText.trim() : '', '']; }))")
    from triscope.store.audit import audit_log

    assert len(records) == len(audit_log(demo[1], limit=1000)) >= 6, records    # every decision of both recordings
    for node, effect, episode, target, mode in records:
        assert node[0].split()[0] in NODES and node[1].startswith("/node/"), node      # a revert's too
        assert re.match(r"(staging-bound|network-bound|io-saturated|demand-limited|idle|compute-bound|balanced)"
                        r" \u2192 |still ", effect[0]) or effect[0].startswith("no verdict"), effect
        q = parse_qs(urlparse(episode[1]).query)
        assert q["node"][0] in NODES and float(q["start"][0]) < float(q["end"][0]), episode
        assert "\u2026" not in target[0], target           # whole targets: the workload name is at the end
        assert mode[0] in ("dry-run, in the recording", "live, in the recording"), mode   # never plain "live"
    pg.locator("td[data-dash-column=episode] a").first.click()
    pg.wait_for_url(re.compile(r".*/rootcause\?node=h200-inference-\d&start=\d+&end=\d+"))
    pg.wait_for_selector("#rootcause-states", timeout=60000)
    assert page.errors == []


LOOKBACKS = {"30m": 1800, "6h": 6 * 3600, "24h": 86400, "7d": 7 * 86400}


def test_root_cause_episodes_do_not_depend_on_the_look_back(page: Page, demo: tuple[str, Any]) -> None:
    _, st = demo
    node = NODES[0]
    last = next(n.last_seen for n in st.nodes() if n.name == node)
    seen: dict[str, list[tuple[str, str, str, str]]] = {}
    for label, span in LOOKBACKS.items():
        pg = page.goto(f"/rootcause?node={node}&start={last - span:.0f}&end={last + 1:.0f}")
        pg.wait_for_selector("#rootcause-episodes, #rootcause-noepisodes", timeout=90000)
        page.settle(90000)
        seen[label] = pg.evaluate(
            "() => Array.from(document.querySelectorAll('#rootcause-episodes > li.episode')).map(li => ["
            " li.dataset.accelerator, li.dataset.state, li.dataset.start,"
            " (li.querySelector('.ep-causes .cause-title') || {innerText: ''}).innerText])")
    counts = {k: len(v) for k, v in seen.items()}
    assert counts["30m"] >= 3, seen["30m"]           # the recording's incidents: staging, I/O, network
    assert len(set(counts.values())) == 1, counts
    assert all(v == seen["30m"] for v in seen.values()), seen
    assert page.errors == []
