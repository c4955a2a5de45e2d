"""The wait-for chain drawn, in a real browser (Debian's headless Chromium): the host lab's cpu-lab-7
recording (GPU 0 simulated; two instances, lab-a and lab-b, share it) imported as the demo imports
it (``import_for_demo``: shifted to end now, marked a recording), next to an older recording
without wait-for series (cpu-lab-2, ``triscope import-trace --shift-to-now``), served by the real
``triscope dashboard``.

Its timeline file says which class ran when: over ``sidecar_shm`` and ``sidecar_tcp`` lab-b's GPU
container is fed by its throttled sidecar ``lab-b-prep``; over ``contention_weight`` lab-a's pod
waits for CPUs a burner holds.  The Node page's wait-for figure for GPU 0 must draw lab-b's chain
ending on ``lab-b-prep`` (the same pod, held at its CPU limit: the staging orange, outlined as
deciding) over the sidecar scenarios, and lab-a's on its own wait for a CPU over the contention
one; the older recording says it has no wait-for evidence instead of an empty chart; the Root
cause page shows each bad episode's chain with the same culprits and the verdict's reason.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest
from browser_support import chromium, dashboard_over
from conftest import REPO
from test_dashboard_browser import TRISCOPE, Page

pytestmark = pytest.mark.browser

NODE = "cpu-lab-7"
OLDER = "cpu-lab-2"
TRACES = REPO / "examples" / "hostlab" / "traces"
STAGING_RGB = "rgb(239, 108, 0)"          # figures.STATE_COLORS["staging-bound"], as the browser paints it


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Any, dict[str, tuple[float, float]]]]:
    from triscope.commands.run import import_for_demo
    from triscope.core.trace import read_trace

    url = f"sqlite:///{tmp_path_factory.mktemp('waitfor-browser') / 'triscope.db'}"
    assert import_for_demo(url, TRACES / f"{NODE}.jsonl.gz", now=time.time()) == NODE
    subprocess.run([TRISCOPE, "import-trace", str(TRACES / f"{OLDER}.jsonl.gz"), "--db", url, "--shift-to-now"],
                   cwd=REPO, check=True, capture_output=True, timeout=300)
    with dashboard_over(url) as (base, st):
        bounds = st.time_bounds(NODE)
        assert bounds is not None
        offset = bounds[1] - read_trace(TRACES / f"{NODE}.jsonl.gz").ticks[-1][0]
        spans: dict[str, tuple[float, float]] = {}
        for line in (TRACES / f"{NODE}.timeline.jsonl").read_text().splitlines():
            p = json.loads(line)
            spans.setdefault(p["scenario"], (p["start"] + offset, p["end"] + offset))
        yield base, st, spans


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as b:
        yield b


_FIG = "document.querySelector('#node-waitfor-gpu0 .js-plotly-plot')"


def _ends(pg: Any) -> list[dict[str, Any]]:
    """The chain-end traces of GPU 0's wait-for figure as the browser holds them."""
    return pg.evaluate(f"() => {_FIG}.data.filter(t => t.orientation === 'h').map(t => ({{"
                       " workload: t.meta.workload, group: t.meta.group, culprits: t.meta.culprits,"
                       " relations: t.meta.relations, causes: t.meta.causes, deciding: t.meta.deciding,"
                       " color: t.marker.color, labels: t.y, share: t.x}))")


def _first_hop(pg: Any, workload: str) -> dict[str, float]:
    """state -> the highest share (%) any time bucket of ``workload``'s first hop reaches."""
    got = pg.evaluate(f"() => {_FIG}.data.filter(t => t.type === 'bar' && t.orientation !== 'h'"
                      f" && t.meta.workload === {workload!r}).map(t => [t.meta.state, Math.max(...t.y.map(v => v || 0))])")
    return {s: v for s, v in got}


def _node(p: Page, span: tuple[float, float]) -> Any:
    pg = p.goto(f"/node/{NODE}?gpu=0&range=custom&start={span[0]:.0f}&end={span[1]:.0f}")
    pg.wait_for_selector("#node-waitfor-gpu0 .js-plotly-plot .bars path", state="attached", timeout=60000)
    p.settle(60000)
    return pg


def _deciding(ends: list[dict[str, Any]], workload: str) -> list[tuple[str, str, str]]:
    return [(c, r, cause) for t in ends if t["workload"] == workload
            for c, r, cause, d in zip(t["culprits"], t["relations"], t["causes"], t["deciding"], strict=True) if d]


def test_node_page_draws_the_sidecar_as_the_end_of_lab_bs_chain(browser: Any, served: Any) -> None:
    from triscope.dashboard.figures import STATE_COLORS

    base, _st, spans = served
    p = Page(browser, base)
    try:
        pg = _node(p, (spans["sidecar_shm"][0], spans["sidecar_tcp"][1]))
        ends = _ends(pg)
        assert {t["workload"] for t in ends} == {"lab/lab-a", "lab/lab-b"}, ends
        # lab-b: its chain ends on its sidecar in the same pod, held at its CPU limit: the deciding end
        assert _deciding(ends, "lab/lab-b")[0] == ("lab-b-prep", "pod", "cpu_throttled"), ends
        staging = next(t for t in ends if t["workload"] == "lab/lab-b" and t["group"] == "staging")
        assert staging["color"] == STATE_COLORS["staging-bound"]
        assert staging["labels"][0] == "lab-b-prep (same pod) \u2014 held at its CPU limit"
        assert staging["share"][0] > 50
        assert _deciding(ends, "lab/lab-a") == []               # the healthy instance: nothing decides
        # drawn: the end's label on the axis, its bar in the staging orange, the row's verdict
        ticks = pg.evaluate("() => Array.from(document.querySelectorAll('#node-waitfor-gpu0 .yaxislayer-above text'))"
                            ".map(t => t.textContent)")
        assert "lab-b-prep (same pod) \u2014 held at its CPU limit" in ticks, ticks
        fills = pg.evaluate("() => Array.from(document.querySelectorAll('#node-waitfor-gpu0 .bars path'))"
                            ".map(p => getComputedStyle(p).fill)")
        assert STAGING_RGB in fills
        titles = pg.evaluate(f"() => {_FIG}.layout.annotations.map(a => a.text)")
        assert any("lab/lab-b" in t and "staging-bound" in t and "naming lab/lab-b/lab-b-prep" in t for t in titles), titles
        # the first hop over time: IPC over the Unix socket (shm), then the loopback TCP socket
        hop = _first_hop(pg, "lab/lab-b")
        assert hop["ipc"] > 80 and hop["network"] > 80, hop
        assert "lab-b-prep" in pg.inner_text("#node-waitfor-reasons-gpu0")
        p.shot("node-waitfor-sidecar")
        assert p.errors == [], p.errors
    finally:
        p.close()


def test_node_page_draws_lab_as_wait_for_a_cpu_under_contention(browser: Any, served: Any) -> None:
    base, _st, spans = served
    p = Page(browser, base)
    try:
        pg = _node(p, spans["contention_weight"])
        ends = _ends(pg)
        assert _deciding(ends, "lab/lab-a")[0] == ("lab-a", "self", "cpu_wait"), ends
        assert "the driving thread \u2014 waiting for a CPU" in next(
            t for t in ends if t["workload"] == "lab/lab-a" and t["group"] == "staging")["labels"]
        titles = pg.evaluate(f"() => {_FIG}.layout.annotations.map(a => a.text)")
        assert any("lab/lab-a" in t and "staging-bound" in t for t in titles), titles
        assert _first_hop(pg, "lab/lab-a")["cpu_wait"] > 20
        assert p.errors == [], p.errors
    finally:
        p.close()


def test_an_older_recording_says_it_has_no_wait_for_evidence(browser: Any, served: Any) -> None:
    from triscope.dashboard.waitfor_data import NO_EVIDENCE

    base, _st, _spans = served
    p = Page(browser, base)
    try:
        pg = p.goto(f"/node/{OLDER}?gpu=0")
        pg.wait_for_selector("#node-waitfor-untraced-gpu0", timeout=60000)
        p.settle(60000)
        assert NO_EVIDENCE in pg.inner_text("#node-waitfor-untraced-gpu0")
        assert pg.locator("#node-waitfor-panel .js-plotly-plot").count() == 0    # never an empty chart
        assert p.errors == [], p.errors
    finally:
        p.close()


_CHAINS = """() => Array.from(document.querySelectorAll('#rootcause-episodes > li.episode')).map(li => {
    const c = li.querySelector('.wf-chain');
    if (!c) return {state: li.dataset.state, start: +li.dataset.start, end: +li.dataset.end, chain: null};
    const first = c.querySelector('.wf-end');
    return {state: li.dataset.state, start: +li.dataset.start, end: +li.dataset.end, chain: {
        state: c.dataset.state, named: c.dataset.named,
        deciding: Array.from(c.querySelectorAll('.wf-end.wf-deciding')).map(x => [x.dataset.culprit, x.dataset.relation, x.dataset.cause]),
        label: first.querySelector('.wf-label').innerText,
        bar: getComputedStyle(first.querySelector('.wf-bar')).backgroundColor,
        detail: (c.querySelector('.wf-detail') || {innerText: ''}).innerText}};
})"""


def _overlaps(e: dict[str, Any], span: tuple[float, float]) -> bool:
    return e["start"] < span[1] and e["end"] > span[0]


def test_root_cause_shows_each_episodes_chain(browser: Any, served: Any) -> None:
    base, _st, spans = served
    p = Page(browser, base)
    try:
        pg = p.goto(f"/rootcause?node={NODE}")
        pg.wait_for_selector("#rootcause-episodes .wf-chain", timeout=90000)
        p.settle(90000)
        eps = pg.evaluate(_CHAINS)
        chained = [e for e in eps if e["chain"]]
        assert chained, eps
        # the sidecar episode: lab-b's driving thread waits on lab-b-prep, held at its CPU limit
        prep = next(e for e in chained if e["chain"]["named"] == "lab/lab-b/lab-b-prep")
        assert _overlaps(prep, spans["sidecar_shm"]) or _overlaps(prep, spans["sidecar_tcp"]), prep
        assert prep["state"] == prep["chain"]["state"] == "staging-bound"
        assert prep["chain"]["deciding"][0] == ["lab-b-prep", "pod", "cpu_throttled"], prep
        assert prep["chain"]["label"] == "lab-b-prep (same pod) \u2014 held at its CPU limit"
        assert prep["chain"]["bar"] == STAGING_RGB
        assert "lab-b-prep" in prep["chain"]["detail"] and "held at its CPU limit" in prep["chain"]["detail"]
        # the contention episode: lab-a's own threads wait for a CPU
        own = next(e for e in chained if e["chain"]["named"] == "lab/lab-a/lab-a")
        assert _overlaps(own, spans["contention_weight"]), own
        assert own["chain"]["deciding"][0] == ["lab-a", "self", "cpu_wait"], own
        # the rest of the page stays: the ranked causes (or the line saying there are none), the states
        assert pg.locator("#rootcause-causes, #rootcause-nocauses").count() == 1
        assert pg.locator("#rootcause-states .state-chip").count() >= 1
        p.shot("rootcause-waitfor")
        # the episode's own link explains just it, its chain again
        pg.click(f"#rootcause-episodes > li.episode[data-start='{prep['start']:.0f}'] a:text('explain this episode')")
        pg.wait_for_url(f"**/rootcause?node={NODE}&start={prep['start']:.0f}&end={prep['end']:.0f}")
        pg.wait_for_selector("#rootcause-episodes .wf-chain", timeout=90000)
        p.settle(90000)
        assert any(e["chain"] and e["chain"]["named"] == "lab/lab-b/lab-b-prep" for e in pg.evaluate(_CHAINS))
        assert p.errors == [], p.errors
    finally:
        p.close()
