"""The Root cause page on a recording, in a real browser (Debian's headless Chromium).

Two H200 recordings (``examples/traces/h200-inference-5`` and ``-3``, three hours apart) imported
with the real ``triscope import-trace`` at their recorded times (they ended long ago) and served by
the real ``triscope dashboard``.  Opened with no window in its URL, the page opens on the
recording's data (all of it: it lasts minutes), says it is a recording, lists its bad episodes, and
paints every state chip in ``figures.state_style`` as the browser computes it (the quiet states
pale with dark ink, the faults loud with white); its 24 h look-back link answers with the same
episodes; picking the other recording opens on that one's data, not on the first one's window.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from browser_support import chromium, dashboard_over
from conftest import REPO
from test_dashboard_browser import TRISCOPE, Page

pytestmark = pytest.mark.browser

NODE = "h200-inference-5"
OTHER = "h200-inference-3"


def _rgb(hex_color: str) -> str:
    r, g, b = (int(hex_color[i:i + 2], 16) for i in (1, 3, 5))
    return f"rgb({r}, {g}, {b})"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Any]]:

    url = f"sqlite:///{tmp_path_factory.mktemp('rootcause-browser') / 'triscope.db'}"
    for node in (NODE, OTHER):
        subprocess.run([TRISCOPE, "import-trace", str(REPO / "examples" / "traces" / f"{node}.jsonl.gz"), "--db", url],
                       cwd=REPO, check=True, capture_output=True, timeout=300)
    with dashboard_over(url) as served:
        yield served


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as b:
        yield b


def _ts(text: str) -> float:
    return datetime.fromisoformat(text.strip().replace(" ", "T")).replace(tzinfo=UTC).timestamp()


def _episodes(pg: Any) -> list[list[str]]:
    return pg.evaluate("() => Array.from(document.querySelectorAll('#rootcause-episodes > li.episode')).map(li => ["
                       " li.dataset.accelerator, li.dataset.state, li.dataset.start,"
                       " (li.querySelector('.ep-causes .cause-title') || {innerText: ''}).innerText])")


def _chip_colours(pg: Any, selector: str) -> list[tuple[str, str, str]]:
    """(state, background, text colour) of each chip, as the browser paints it."""
    return [tuple(x) for x in pg.evaluate(
        f"() => Array.from(document.querySelectorAll({selector!r})).map(el => {{"
        " const s = getComputedStyle(el);"
        " return [el.dataset.state || el.innerText.trim(), s.backgroundColor, s.color]; })")]


def test_it_opens_on_the_recording_with_state_style_chips(browser: Any, served: tuple[str, Any]) -> None:
    from triscope.dashboard.figures import STATE_COLORS, state_style

    base, st = served
    (info,) = [n for n in st.nodes() if n.name == NODE]
    p = Page(browser, base)
    try:
        pg = p.goto(f"/rootcause?node={NODE}")
        pg.wait_for_selector("#rootcause-states", timeout=60000)
        p.settle(60000)
        # the window: the recording itself (minutes long), ending at its last sample, said to be a recording
        a, b = _ts(pg.input_value("#rootcause-start")), _ts(pg.input_value("#rootcause-end"))
        assert abs(a - info.first_seen) <= 1 and abs(b - (info.last_seen + 1)) <= 1, (a, b, info)
        assert pg.inner_text("#rootcause-window-note").startswith("a recording: showing all the data")
        assert f"{NODE}.jsonl.gz" in pg.inner_text("#rootcause-recording-note")
        eps = _episodes(pg)
        assert len(eps) >= 3 and all(e[3] for e in eps), eps      # its incidents, each with a top cause
        # every chip in its state's colour and ink, as the browser computes them
        chips = _chip_colours(pg, "#rootcause-states .state-chip")
        chips += _chip_colours(pg, "#rootcause-episodes .state-chip")
        states = {c[0] for c in chips}
        assert {"idle", "demand-limited"} & states and {"staging-bound", "io-saturated"} <= states, chips
        for state, bg, ink in chips:
            assert state in STATE_COLORS, chips
            want = state_style(state)
            assert (bg, ink) == (_rgb(want["backgroundColor"]), _rgb(want["color"])), (state, bg, ink)
        quiet = [c for c in chips if c[0] in ("idle", "demand-limited")]
        assert quiet and all(ink != "rgb(255, 255, 255)" for _, _, ink in quiet), quiet   # readable, not white
        p.shot("rootcause-recording")
        # the 24 h look-back link: the day before the last sample, the same episodes
        pg.click("#rootcause-lookbacks a:text-is('24h')")
        pg.wait_for_url(f"**/rootcause?node={NODE}&range=24h")
        pg.wait_for_function(f"() => document.querySelector('#rootcause-start') && "
                             f"document.querySelector('#rootcause-start').value.length > 0 && "
                             f"Math.abs(Date.parse(document.querySelector('#rootcause-start').value.replace(' ', 'T') + 'Z')"
                             f" / 1000 - {info.last_seen + 1 - 86400:.0f}) <= 1", timeout=30000)
        pg.wait_for_selector("#rootcause-episodes", timeout=60000)
        p.settle(60000)
        assert _episodes(pg) == eps
        assert pg.inner_text("#rootcause-lookbacks b") == "24h"         # the look-back shown, not a link
        assert p.errors == [], p.errors
    finally:
        p.close()


def test_another_node_opens_on_its_own_data(browser: Any, served: tuple[str, Any]) -> None:
    base, st = served
    other = next(n for n in st.nodes() if n.name == OTHER)
    p = Page(browser, base)
    try:
        pg = p.goto(f"/rootcause?node={NODE}")
        pg.wait_for_selector("#rootcause-states", timeout=60000)
        p.settle(60000)
        pg.click("#rootcause-node")
        option = pg.locator(".dash-dropdown-option", has_text=OTHER).first
        option.wait_for(timeout=10000)
        option.click()
        pg.wait_for_function(f"() => Math.abs(Date.parse(document.querySelector('#rootcause-start').value"
                             f".replace(' ', 'T') + 'Z') / 1000 - {other.first_seen:.0f}) <= 1", timeout=30000)
        p.settle(60000)
        assert abs(_ts(pg.input_value("#rootcause-end")) - (other.last_seen + 1)) <= 1
        assert f"{OTHER}.jsonl.gz" in pg.inner_text("#rootcause-recording-note")
        assert len(_episodes(pg)) >= 1 and pg.locator("#rootcause-states .state-chip").count() >= 2
        assert all(f"node={OTHER}" in (a.get_attribute("href") or "")
                   for a in pg.locator("#rootcause-lookbacks a").all())
        assert p.errors == [], p.errors
    finally:
        p.close()
