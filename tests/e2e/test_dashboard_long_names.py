"""A node whose name is 10 KB long (a store written before names were bounded at ingest, or by
another writer) must not stall the dashboard: every page that names nodes renders in seconds in a
real headless Chromium, shows the name cut short with an ellipsis and keeps the whole of it in a
tooltip.  (dcc.Dropdown indexes every substring of each option's value and label: a 10 KB value
froze the Mismatch page for minutes.)  Plus the display helpers, without a browser."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import pytest
from browser_support import chromium, stop_checked
from conftest import REPO, free_port, wait_for_port

TRISCOPE = os.path.join(os.path.dirname(sys.executable), "triscope")
LONG = "gpu-node-" + "x" * (10 * 1024 - 18) + "-end"   # 10 KiB, one unbroken word
PROMPT_S = 10.0   # "renders promptly": the unfixed Mismatch page took minutes


# ---------------------------------------------------------------------------------------------- no browser
def test_node_dropdown_values_stay_short_and_resolve() -> None:
    from triscope.dashboard.components import VALUE_CHARS, node_from_value, node_options, node_value

    names = ["h200-node", LONG, LONG[:-1] + "f"]
    opts = node_options(names)
    assert [o["value"] for o in opts][0] == "h200-node"
    assert all(len(o["value"]) <= VALUE_CHARS and len(o["label"]) <= 48 for o in opts)
    assert opts[1]["value"] != opts[2]["value"]           # two long names with one prefix stay two
    assert opts[1]["label"].endswith("\u2026") and opts[1]["title"].startswith(LONG[:1000])
    assert [node_from_value(o["value"], names) for o in opts] == names
    assert node_from_value(node_value("gone-" + LONG), names) is None


def test_state_share_bars_keep_long_names_apart() -> None:
    from triscope.dashboard import figures

    a, b = LONG, LONG[:-1] + "f"
    fig = figures.state_share_figure({a: {"idle": 1.0}, b: {"compute-bound": 1.0}})
    ys = list(fig.data[0].y)
    assert len(ys) == 2 and len(set(ys)) == 2 and all(len(y) <= 48 for y in ys), ys
    assert len(fig.to_json()) < 20_000   # not the 10 KB name in every trace


def test_long_label_values_are_cut_in_trace_names_and_accelerator_text() -> None:
    from triscope.dashboard import data

    name = data._fmt("GPU {gpu} SM active", {"gpu": "g" * 5000})
    assert name.startswith("GPU ggg") and name.endswith("SM active") and len(name) < 80, name
    text = data._accelerator_text([("triscope_gpu_info", '{"gpu":"0","name":"' + "H" * 5000 + '"}')], [])
    assert text.startswith("1 x HHH") and len(text) < 60, text


# ---------------------------------------------------------------------------------------------- the browser
class Server:
    def __init__(self, base: str, store: Any) -> None:
        self.base, self.store = base, store


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The demo store with ``h200-node`` renamed to a 10 KB name (the store refuses to create such a
    node, so the row is renamed in SQL, as an old store would hold it), served by 'triscope dashboard'."""
    from demo_seed import seed_demo
    from sqlalchemy import text

    from triscope.store import Store

    url = f"sqlite:///{tmp_path_factory.mktemp('longnames') / 'triscope.db'}"
    st = Store.open(url)
    st.upgrade()
    seed_demo(st, time.time(), phase_s=60, cycles=1)
    with st.engine.begin() as conn:
        conn.execute(text("UPDATE nodes SET name = :long WHERE name = 'h200-node'"), {"long": LONG})
    port = free_port()
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.pop("TRISCOPE_DASHBOARD_PASSWORD", None)
    proc = subprocess.Popen([TRISCOPE, "dashboard", "--db", url, "--port", str(port)], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        wait_for_port(port, timeout=60)
        yield Server(f"http://127.0.0.1:{port}", st)
    finally:
        st.close()
        stop_checked(proc)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as b:
        yield b


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    pg = browser.new_page(viewport={"width": 1400, "height": 1000}, timezone_id="UTC")
    errors: list[str] = []
    pg.on("console", lambda m: errors.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
    pg.on("pageerror", lambda e: errors.append(f"pageerror: {e}"))
    pg.errors = errors
    yield pg
    pg.close()


def _load(pg: Any, url: str, selector: str) -> float:
    """Open ``url`` and wait until ``selector`` shows and no Dash callback is in flight; seconds taken.
    Every wait is bounded by PROMPT_S, so a stalled page fails here rather than after minutes."""
    t0 = time.monotonic()
    ms = PROMPT_S * 1000
    pg.goto(url, timeout=ms)
    pg.wait_for_selector(selector, timeout=ms)
    pg.wait_for_load_state("networkidle", timeout=ms)
    pg.wait_for_function("() => document.querySelector('#_pages_content') && "
                         "!document.querySelector('[data-dash-is-loading=\"true\"]')", timeout=ms)
    return time.monotonic() - t0


def _assert_not_spelled_out(pg: Any) -> None:
    body = pg.inner_text("body")
    assert LONG[:200] not in body, "the long name is printed in full"
    assert "Traceback" not in body and "failed:" not in body, body[:2000]


@pytest.mark.browser
def test_mismatch_page_with_a_10kb_node_name_renders_promptly(page: Any, server: Server) -> None:
    took = _load(page, server.base + "/mismatch", "#mismatch-share .js-plotly-plot")
    assert took < PROMPT_S, took
    _assert_not_spelled_out(page)
    # the share of time has a bar for the long-named node, labelled short; the whole name on hover
    ys = page.evaluate("() => document.querySelector('#mismatch-share .js-plotly-plot').data[0].y")
    short = [y for y in ys if y.startswith("gpu-node-xxx")]
    assert len(short) == 1 and short[0].endswith("\u2026") and len(short[0]) <= 48, ys
    # pick the long-named node in the dropdown (its search index stays small) and render it alone
    page.click("#mismatch-node")
    search = page.locator(".dash-dropdown-search")
    search.wait_for(timeout=PROMPT_S * 1000)
    search.fill("gpu-node")
    option = page.locator(".dash-dropdown-option", has_text="gpu-node-xxx").first
    option.wait_for(timeout=PROMPT_S * 1000)
    assert (option.locator("[title]").first.get_attribute("title") or "").startswith(LONG[:1000])
    t0 = time.monotonic()
    option.click()
    page.wait_for_function(
        "() => { const gd = document.querySelector('#mismatch-share .js-plotly-plot');"
        " return gd && gd.data.length && gd.data.every(t => t.y.length === 1); }", timeout=PROMPT_S * 1000)
    assert time.monotonic() - t0 < PROMPT_S
    assert page.errors == [], page.errors


@pytest.mark.browser
def test_fleet_page_shows_the_name_short_and_opens_the_node(page: Any, server: Server) -> None:
    took = _load(page, server.base + "/", "#fleet-table")
    assert took < PROMPT_S, took
    _assert_not_spelled_out(page)
    cell = page.locator("#fleet-table td[data-dash-column=node]", has_text="gpu-node-xxx").first
    text = cell.inner_text().strip()
    assert text.endswith("\u2026") and len(text) <= 48, text
    cell.click()   # the row opens the node by its whole name
    page.wait_for_url(re.compile(r".*/node/gpu-node-x+-end$"), timeout=PROMPT_S * 1000)
    page.wait_for_selector("#node-graph .js-plotly-plot", timeout=PROMPT_S * 1000)
    title = page.locator(".node-title span")
    assert title.inner_text().endswith("\u2026") and title.get_attribute("title").startswith(LONG[:1000])
    assert page.errors == [], page.errors


@pytest.mark.browser
def test_node_and_root_cause_pages_with_a_10kb_node_name(page: Any, server: Server) -> None:
    took = _load(page, server.base + "/node/" + quote(LONG), "#node-graph .js-plotly-plot")
    assert took < PROMPT_S, took
    _assert_not_spelled_out(page)
    took = _load(page, server.base + "/rootcause?node=" + quote(LONG), "#rootcause-states")
    assert took < PROMPT_S, took
    _assert_not_spelled_out(page)
    shown = page.inner_text("#rootcause-node").strip()
    assert shown.startswith("gpu-node-xxx") and shown.endswith("\u2026") and len(shown) <= 48, shown
    assert page.errors == [], page.errors
