"""The dashboard shows accelerators and workloads (docs/workloads.md section 5).

A store with the contract's series (``demo_seed.seed_workloads``): ``dual-gpu-node``, GPU 0
running ``inference/vit-serve-…`` (compute-bound, staging-bound for a stretch), GPU 1 running
``inference/whisper-asr-…`` (demand-limited), each pod's owner in the ``workloads`` table; next to
the demo's H200-shaped node (one GPU, no workload) and a host without accelerators.  The data
functions and figure builders on that store without a browser, then the real ``triscope
dashboard`` in Debian's headless Chromium: the Fleet shows a cell per accelerator with its
workload, the Node page switches accelerator, the Mismatch page groups by workload and shows
``demand-limited``, the Root cause page shows GPU 0's staging-bound episode.
"""

from __future__ import annotations

import functools
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

TRISCOPE = os.path.join(os.path.dirname(sys.executable), "triscope")
SHOTS = REPO / "artifacts" / "screenshots"
NODE = "dual-gpu-node"
SPAN = 1200
# an episode's bounds against the seeded stretch: the analysis timeline may date a stored state
# back by up to the detector's window (10 s) to when its evidence began
EPISODE_SLACK_S = 12.0


class Seeded:
    def __init__(self, store: Any, spans: dict[str, tuple[float, float]]) -> None:
        self.store, self.spans = store, spans

    @property
    def staging(self) -> tuple[float, float]:
        return self.spans["staging-bound"]

    @property
    def end(self) -> float:
        return self.spans[NODE][1]


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Seeded]:
    from demo_seed import seed_demo, seed_workloads

    from triscope.store import Store

    url = f"sqlite:///{tmp_path_factory.mktemp('workloads') / 'triscope.db'}"
    st = Store.open(url)
    st.upgrade()
    end = time.time()
    spans = seed_demo(st, end, phase_s=30, cycles=1)
    spans.update(seed_workloads(st, end, span_s=SPAN))
    yield Seeded(st, spans)
    st.close()


def _lookup(st: Any) -> Any:
    from triscope.dashboard.workload_data import workload_owners

    return functools.partial(workload_owners, st)


# ---------------------------------------------------------------------------------------------- no browser
def test_workload_names() -> None:
    from triscope.core.vocabulary import AcceleratorId
    from triscope.dashboard.workload_data import WorkloadRef

    pod = {"namespace": "inference", "pod": "vit-serve-6c9d7f8b4-k2x7q", "container": "vit", "workload": ""}
    assert WorkloadRef.of(pod).display == "inference/vit-serve-6c9d7f8b4-k2x7q"
    assert WorkloadRef.of(pod).brief == "inference/vit-serve-6c9d7f8b4-k2x7q"
    owned = WorkloadRef.of(pod, {("inference", "vit-serve-6c9d7f8b4-k2x7q"): "Deployment/vit-serve"})
    assert (owned.display, owned.brief) == ("inference/Deployment/vit-serve", "Deployment/vit-serve")
    assert WorkloadRef.of({"workload": "unit:triton.service"}).display == "unit:triton.service"
    assert WorkloadRef.of({"namespace": "x", "pod": "", "workload": "shared"}).display == "shared"
    assert WorkloadRef.of({"namespace": "", "pod": "", "container": "", "workload": ""}).empty
    assert AcceleratorId.of({"gpu": "3", "state": "idle"}) == AcceleratorId("gpu", "3")
    assert AcceleratorId.of({"npu": "1", "chip": "0"}) == AcceleratorId("npu", "1", "0")
    assert AcceleratorId.of({"state": "idle"}) is None and AcceleratorId.of({"gpu": ""}) is None
    assert AcceleratorId.from_query(gpu="1").query == "gpu=1"          # type: ignore[union-attr]
    assert AcceleratorId.from_query(npu="1", chip="0").name == "NPU 1/0"  # type: ignore[union-attr]
    assert AcceleratorId.from_query(gpu="1'><script>") is None


def test_current_state_per_accelerator_and_the_roll_up() -> None:
    """Newest state per accelerator (an NPU here), its dominant workload, the workloads present
    now; with no roll-up stored the worst accelerator stands for the node (I/O states first)."""
    from tests.state_series import current_from
    from triscope.core.vocabulary import AcceleratorId

    wl_a = {"namespace": "ml", "pod": "asr-0", "container": "asr", "workload": ""}
    wl_b = {"namespace": "ml", "pod": "tts-0", "container": "tts", "workload": ""}
    npu0, npu1 = {"npu": "0", "chip": "0"}, {"npu": "1", "chip": "0"}
    entries = [
        ("triscope_mismatch_state", {**npu0, **wl_a, "state": "compute-bound"}, 100.0, 1.0),
        ("triscope_mismatch_state", {**npu0, **wl_a, "state": "staging-bound"}, 110.0, 1.0),   # newer
        ("triscope_mismatch_state", {**npu0, **wl_a, "state": "idle"}, 110.0, 0.0),
        ("triscope_mismatch_score", {**npu0, **wl_a}, 110.0, 0.4),
        ("triscope_mismatch_state", {**npu1, **wl_b, "state": "demand-limited"}, 110.0, 1.0),
        ("triscope_accelerator_workload_info", {**npu1, **wl_b, "uuid": ""}, 110.0, 1.0),
        ("triscope_accelerator_workload_info", {**npu1, **wl_a, "uuid": ""}, 109.0, 1.0),     # shares NPU 1
        ("triscope_accelerator_workload_info", {**npu1, "namespace": "ml", "pod": "old-0", "container": "x",
                                                "workload": ""}, 20.0, 1.0),                 # long gone
    ]
    now = current_from(entries)
    a0, a1 = now.accels[AcceleratorId("npu", "0", "0")], now.accels[AcceleratorId("npu", "1", "0")]
    assert (a0.state, a0.score, a0.workload_text()) == ("staging-bound", 0.4, "ml/asr-0")
    assert (a0.accel.name, a0.accel.query) == ("NPU 0/0", "npu=0&chip=0")
    assert a1.state == "demand-limited" and a1.workload_text() == "ml/tts-0 +1"
    assert (now.state, now.score) == ("staging-bound", 0.4)      # no roll-up stored: the worst accelerator
    rolled = current_from([*entries, ("triscope_mismatch_state", {"state": "compute-bound"}, 110.0, 1.0)])
    assert rolled.state == "compute-bound"                       # the stored roll-up wins


def test_fleet_rows_have_a_cell_per_accelerator(seeded: Seeded) -> None:
    from triscope.dashboard.data import fleet_rows

    rows = {r.node: r for r in fleet_rows(seeded.store, time.time())}
    dual = rows[NODE]
    assert [c.accel.name for c in dual.cells] == ["GPU 0", "GPU 1"]
    assert [c.state for c in dual.cells] == ["compute-bound", "demand-limited"]   # the newest stored state
    assert [c.workload_text(brief=True) for c in dual.cells] == ["Deployment/vit-serve", "Deployment/whisper-asr"]
    assert dual.cells[0].shown_workload.pod == "vit-serve-6c9d7f8b4-k2x7q"  # type: ignore[union-attr]
    assert dual.state == "compute-bound"         # the node roll-up as stored
    assert len(rows["h200-node"].cells) == 1 and rows["h200-node"].cells[0].workload_text() == "no process"
    assert rows["cpu-node"].cells == [] and rows["cpu-node"].state == "no accelerator"


def test_pods_without_a_workloads_table_stay_pods(tmp_path: Path) -> None:
    """An older store (no ``workloads`` table): the fleet names the pod, nothing fails."""
    from demo_seed import seed_workloads
    from sqlalchemy import text

    from triscope.dashboard.data import fleet_rows
    from triscope.store import Store

    st = Store.open(f"sqlite:///{tmp_path / 'old.db'}")
    st.upgrade()
    with st.engine.begin() as c:
        c.execute(text("DROP TABLE workloads"))
    seed_workloads(st, time.time(), span_s=120)
    (row,) = fleet_rows(st, time.time())
    assert [c.workload_text(brief=True) for c in row.cells] == [
        "inference/vit-serve-6c9d7f8b4-k2x7q", "inference/whisper-asr-5b8c9d6f7-p4m2n"]
    st.close()


def test_node_lanes_of_one_accelerator(seeded: Seeded) -> None:
    from triscope.core.vocabulary import AcceleratorId
    from triscope.dashboard import data
    from triscope.dashboard.workload_data import node_workloads

    w = data.Window(seeded.end - 900, seeded.end + 1, False)
    whole = data.node_lanes(seeded.store, NODE, w, max_points=400)
    names = {t.name for t in whole.traces}
    assert {"GPU 0 SM active", "GPU 1 SM active"} <= names
    assert [a.name for a in whole.accels] == ["GPU 0", "GPU 1"]
    g1 = data.node_lanes(seeded.store, NODE, w, max_points=400, accel=AcceleratorId("gpu", "1"))
    names = {t.name for t in g1.traces}
    assert "GPU 1 SM active" in names and "GPU 0 SM active" not in names and "GPU 0 link capacity" not in names
    assert "whisper-asr-5b8c9d6f7-p4m2n feeder busy" in names and "whisper-asr-5b8c9d6f7-p4m2n CPU wait" in names
    assert not any("vit-serve" in n for n in names)
    assert not any(n.startswith("DMA maps") for n in names)   # GPU 0's device, not GPU 1's
    assert "TCP retransmits/s" in names                          # the node-wide lane stays
    assert {s.state for s in g1.segments} == {"demand-limited"} and "GPU 1" in g1.segments_note
    g0 = data.node_lanes(seeded.store, NODE, w, max_points=400, accel=AcceleratorId("gpu", "0"))
    staged = [s for s in g0.segments if s.state == "staging-bound"]
    assert len(staged) == 1
    a, b = seeded.staging
    assert abs(staged[0].start - a) <= 5 and abs(staged[0].end - b) <= 5, (staged, seeded.staging)
    rows = node_workloads(seeded.store, NODE, a, b, AcceleratorId("gpu", "0"), owners=_lookup(seeded.store))
    (vit,) = rows
    assert vit.ref.display == "inference/Deployment/vit-serve" and vit.ref.container == "vit"
    assert vit.processes == 1 and vit.feeder_busy is not None and vit.feeder_busy > 0.9
    assert vit.cpu_wait is not None and 0.25 < vit.cpu_wait < 0.4
    assert vit.uuid.startswith("GPU-")


def test_workload_state_shares(seeded: Seeded) -> None:
    from triscope.dashboard.workload_data import workload_state_shares

    end = seeded.end
    ws = workload_state_shares(seeded.store, [NODE, "h200-node", "cpu-node"], end - SPAN, end + 1,
                               owners=_lookup(seeded.store))
    vit, whisper = ws.shares["inference/Deployment/vit-serve"], ws.shares["inference/Deployment/whisper-asr"]
    a, b = seeded.staging
    assert vit["staging-bound"] == pytest.approx((b - a) / SPAN, abs=0.03)
    assert vit["compute-bound"] == pytest.approx(1 - (b - a) / SPAN, abs=0.03)
    assert whisper == {"demand-limited": pytest.approx(1.0)}
    assert {n for n, _ in ws.where["inference/Deployment/whisper-asr"]} == {NODE}


def test_episode_timeline_has_gpu0_staging_episode(seeded: Seeded) -> None:
    from triscope.dashboard import figures, rca_view

    a, b = seeded.staging
    end = seeded.end
    for tv in (rca_view.timeline(seeded.store, NODE, end - 900, end + 1, owners=_lookup(seeded.store)),
               rca_view.fallback_timeline(seeded.store, NODE, end - 900, end + 1, owners=_lookup(seeded.store))):
        (ep,) = tv.bad
        assert (ep.accelerator, ep.state, ep.where) == ("gpu=0", "staging-bound", "GPU 0"), tv.source
        assert abs(ep.start - a) <= EPISODE_SLACK_S and abs(ep.end - b) <= EPISODE_SLACK_S, (ep, a, b)
        assert ep.workload is not None and ep.workload.display == "inference/Deployment/vit-serve"
        assert ep.causes and ep.causes[0].key == "host_staging", [c.key for c in ep.causes]
        assert {(e.where, e.state) for e in tv.episodes if not e.bad} >= {("GPU 0", "compute-bound"),
                                                                          ("GPU 1", "demand-limited")}
        fig = figures.episode_timeline_figure(tv.episodes, (end - 900, end + 1))
        assert {t.name for t in fig.data} >= {"staging-bound", "compute-bound", "demand-limited"}
        assert list(fig.layout.yaxis.ticktext) == ["GPU 0 \u00b7 inference/Deployment/vit-serve",
                                                   "GPU 1 \u00b7 inference/Deployment/whisper-asr"]


def test_demand_limited_has_its_own_colour() -> None:
    from triscope.core.vocabulary import STATES
    from triscope.dashboard import figures

    assert set(STATES) <= set(figures.STATE_COLORS)
    assert len(set(figures.STATE_COLORS.values())) == len(figures.STATE_COLORS)
    fig = figures.state_share_figure({"inference/Deployment/whisper-asr": {"demand-limited": 1.0}},
                                     notes={"inference/Deployment/whisper-asr": "1 accelerator(s) on 1 node(s)"})
    (bar,) = fig.data
    assert bar.name == "demand-limited" and bar.marker.color == figures.STATE_COLORS["demand-limited"]
    assert "1 accelerator(s) on 1 node(s)" in bar.customdata[0]


# ---------------------------------------------------------------------------------------------- the browser
@pytest.fixture(scope="module")
def server(seeded: Seeded) -> Iterator[str]:
    port = free_port()
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.pop("TRISCOPE_DASHBOARD_PASSWORD", None)
    proc = subprocess.Popen([TRISCOPE, "dashboard", "--db", seeded.store.url, "--port", str(port)], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        wait_for_port(port, timeout=60)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_checked(proc)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as b:
        yield b


class Page:
    def __init__(self, browser: Any, base: str) -> None:
        self.page = browser.new_page(viewport={"width": 1400, "height": 1000}, timezone_id="UTC")
        self.base = base
        self.errors: list[str] = []
        self.page.on("console", lambda m: self.errors.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(f"pageerror: {e}"))

    def goto(self, path: str) -> Any:
        self.page.goto(self.base + path)
        self.settle()
        return self.page

    def settle(self, timeout: float = 20000) -> None:
        self.page.wait_for_load_state("networkidle", timeout=timeout)
        self.page.wait_for_function(
            "() => document.querySelector('#_pages_content') && "
            "!document.querySelector('[data-dash-is-loading=\"true\"]')", timeout=timeout)

    def shot(self, name: str) -> None:
        SHOTS.mkdir(parents=True, exist_ok=True)
        self.page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


@pytest.fixture
def page(browser: Any, server: str) -> Iterator[Page]:
    p = Page(browser, server)
    yield p
    p.page.close()


def graph_js(pg: Any, gid: str, expr: str) -> Any:
    return pg.evaluate(f"() => {{ const gd = document.querySelector('#{gid} .js-plotly-plot'); return {expr}; }}")


def _rgb(hex_colour: str) -> str:
    h = hex_colour.lstrip("#")
    return "rgb({}, {}, {})".format(*(int(h[i:i + 2], 16) for i in (0, 2, 4)))


@pytest.mark.browser
def test_fleet_shows_a_cell_per_accelerator_with_its_workload(page: Page) -> None:
    from triscope.dashboard.figures import STATE_COLORS

    pg = page.goto("/")
    pg.wait_for_selector("#fleet-table")
    row = pg.locator("#fleet-table tbody tr", has=pg.locator("td[data-dash-column=node]", has_text=NODE))
    cells = [row.locator(f"td[data-dash-column=a{i}]") for i in (0, 1)]
    texts = [c.inner_text() for c in cells]
    assert texts[0].splitlines() == ["Deployment/vit-serve", "compute-bound"], texts
    assert texts[1].splitlines() == ["Deployment/whisper-asr", "demand-limited"], texts
    colours = [c.evaluate("e => getComputedStyle(e).backgroundColor") for c in cells]
    assert colours == [_rgb(STATE_COLORS["compute-bound"]), _rgb(STATE_COLORS["demand-limited"])], colours
    # a node without accelerators keeps one cell: no accelerator cells filled
    cpu = pg.locator("#fleet-table tbody tr", has=pg.locator("td[data-dash-column=node]", has_text="cpu-node"))
    assert cpu.locator("td[data-dash-column=a0]").inner_text().strip() == ""
    assert "demand-limited" in pg.inner_text("#fleet-legend")
    page.shot("workloads-fleet")
    # the whisper cell opens the node page on GPU 1
    cells[1].click()
    pg.wait_for_url(re.compile(rf".*/node/{NODE}\?gpu=1$"))
    pg.wait_for_selector("#node-accel-gpu1.active")
    assert page.errors == [], page.errors


@pytest.mark.browser
def test_node_page_switches_accelerator(page: Page) -> None:
    pg = page.goto(f"/node/{NODE}")
    pg.wait_for_selector("#node-graph .js-plotly-plot")
    pg.wait_for_selector("#node-accel-gpu1")
    names = graph_js(pg, "node-graph", "gd.data.map(t => t.name)")
    assert "GPU 0 SM active" in names and "GPU 1 SM active" in names
    assert pg.locator("#node-workload-table tr.wl-row").count() == 2
    # keep a range picked on the page when switching accelerator
    pg.get_by_label("1h").check()
    pg.wait_for_function("() => document.querySelector('#node-accel-gpu1').getAttribute('href').includes('range=1h')")
    page.settle()
    pg.click("#node-accel-gpu1")
    pg.wait_for_url(re.compile(rf".*/node/{NODE}\?range=1h&gpu=1$"))
    pg.wait_for_selector("#node-accel-gpu1.active")
    page.settle()
    pg.wait_for_function("() => document.querySelector('#node-graph .js-plotly-plot') && "
                         "document.querySelector('#node-graph .js-plotly-plot').data.some(t => t.name === 'GPU 1 SM active')")
    names = graph_js(pg, "node-graph", "gd.data.map(t => t.name)")
    assert "GPU 0 SM active" not in names, names
    assert "whisper-asr-5b8c9d6f7-p4m2n feeder busy" in names and "whisper-asr-5b8c9d6f7-p4m2n CPU wait" in names
    ribbon = [n for n in names if n in ("compute-bound", "staging-bound", "demand-limited")]
    assert ribbon == ["demand-limited"], names
    assert pg.get_by_label("1h").is_checked()
    table = pg.inner_text("#node-workload-table")
    assert "inference/Deployment/whisper-asr" in table and "whisper-asr-5b8c9d6f7-p4m2n" in table and "vit" not in table
    page.shot("workloads-node-gpu1")
    # and over to GPU 0: staging-bound in its ribbon, its feeder pegged
    pg.click("#node-accel-gpu0")
    pg.wait_for_url(re.compile(rf".*/node/{NODE}\?range=1h&gpu=0$"))
    pg.wait_for_selector("#node-accel-gpu0.active")
    page.settle()
    pg.wait_for_function("() => document.querySelector('#node-graph .js-plotly-plot').data.some(t => "
                         "t.name === 'vit-serve-6c9d7f8b4-k2x7q feeder busy')")
    names = graph_js(pg, "node-graph", "gd.data.map(t => t.name)")
    assert "staging-bound" in names and "compute-bound" in names and "GPU 1 SM active" not in names
    row = pg.inner_text("#node-workload-table tr.wl-row")
    assert "inference/Deployment/vit-serve" in row and "pegged" in row and "waiting for CPU" in row, row
    page.shot("workloads-node-gpu0")
    assert page.errors == [], page.errors


def test_the_topology_picture_places_each_gpu_and_marks_a_far_feeder(tmp_path: Path) -> None:
    """dual-gpu-node's topology series (a two-socket box) as the picture reads them; a workload on GPU 0
    running 90 % of its CPU time off GPU 0's NUMA node turns GPU 0 red."""
    from demo_seed import VIT, seed_workloads

    from triscope.core.samples import Sample, Tick
    from triscope.dashboard import topology_view as tv
    from triscope.store import Store

    st = Store.open(f"sqlite:///{tmp_path / 't.db'}")
    try:
        st.upgrade()
        end = time.time()
        seed_workloads(st, end, span_s=120)
        t = tv.node_topology(st, NODE)
        assert [(d.name, d.numa, d.cpus, d.host_bridge) for d in t.devices] == [
            ("GPU 0", "0", "0-27,56-83", "pci0000:15"), ("GPU 1", "1", "28-55,84-111", "pci0000:26")]
        assert t.devices[0].nics == [("0000:19:00.0", "ens1f0,mlx5_0", "PIX")] and t.sockets == ["0", "1"]
        marks = [tr for tr in tv.topology_figure(t).data if tr.name == "topology"][0]
        colour = dict(zip(marks.text, marks.marker.color, strict=True))
        assert {"NUMA 0", "NUMA 1", "GPU 0", "GPU 1", "ens1f0", "ens2f0"} <= set(colour)
        assert colour["GPU 0"] == colour["GPU 1"] != "#c62828"
        st.write_ticks(NODE, [Tick(end + 1, [Sample("triscope_workload_cpu_local_ratio", 0.1, {"gpu": "0", **VIT})])])
        t = tv.node_topology(st, NODE)
        assert t.devices[0].cpu_local == pytest.approx(0.1) and t.devices[1].cpu_local is None
        marks = [tr for tr in tv.topology_figure(t).data if tr.name == "topology"][0]
        colour = dict(zip(marks.text, marks.marker.color, strict=True))
        assert colour["GPU 0"] == "#c62828" and colour["GPU 1"] != "#c62828"
        assert "local 10%" in dict(zip(marks.text, marks.hovertext, strict=True))["GPU 0"]
    finally:
        st.close()


@pytest.mark.browser
def test_the_node_page_draws_the_topology(page: Page) -> None:
    pg = page.goto(f"/node/{NODE}")
    pg.wait_for_selector("#node-topology .js-plotly-plot")
    assert "Topology: 2 NUMA node(s), 2 accelerator(s)" in pg.inner_text("details.topology summary")
    texts = graph_js(pg, "node-topology", "gd.data.filter(t => t.name === 'topology')[0].text")
    assert {"NUMA 0", "NUMA 1", "GPU 0", "GPU 1"} <= set(texts), texts
    page.shot("node-topology")
    assert page.errors == [], page.errors


@pytest.mark.browser
def test_mismatch_page_groups_by_workload_and_shows_demand_limited(page: Page) -> None:
    from triscope.dashboard.figures import STATE_COLORS

    pg = page.goto("/mismatch")
    pg.wait_for_selector("#mismatch-workloads .js-plotly-plot")
    page.settle()
    bars = graph_js(pg, "mismatch-workloads", "gd.data.map(t => ({name: t.name, y: t.y, x: t.x, color: t.marker.color}))")
    by = {b["name"]: b for b in bars}
    assert {"staging-bound", "compute-bound", "demand-limited"} <= set(by), list(by)
    ys = by["demand-limited"]["y"]
    assert "inference/Deployment/vit-serve" in ys and "inference/Deployment/whisper-asr" in ys, ys
    whisper = ys.index("inference/Deployment/whisper-asr")
    assert by["demand-limited"]["x"][whisper] == pytest.approx(100.0)
    assert by["demand-limited"]["color"] == STATE_COLORS["demand-limited"]
    vit = ys.index("inference/Deployment/vit-serve")
    assert 25 < by["staging-bound"]["x"][vit] < 45          # 35 % of the 20 minutes (within the hour shown)
    # the figure's legend and the page's state legend both list demand-limited
    legend = pg.locator("#mismatch-workloads .legend .legendtext").all_text_contents()
    assert "demand-limited" in legend, legend
    assert "demand-limited" in pg.inner_text("#mismatch-legend")
    page.shot("workloads-mismatch")
    assert page.errors == [], page.errors


@pytest.mark.browser
def test_root_cause_shows_the_staging_episode_of_gpu0(page: Page, seeded: Seeded) -> None:
    a, b = seeded.staging
    pg = page.goto(f"/rootcause?node={NODE}")
    pg.wait_for_selector("#rootcause-episodes li.episode", timeout=30000)
    page.settle()
    eps = pg.locator("#rootcause-episodes li.episode")
    assert eps.count() == 1
    ep = eps.first
    assert ep.get_attribute("data-accelerator") == "gpu=0" and ep.get_attribute("data-state") == "staging-bound"
    assert abs(float(ep.get_attribute("data-start")) - a) <= EPISODE_SLACK_S
    assert abs(float(ep.get_attribute("data-end")) - b) <= EPISODE_SLACK_S
    text = ep.inner_text()
    assert "GPU 0" in text and "inference/Deployment/vit-serve" in text, text
    assert ep.locator(".ep-causes .cause-title").first.inner_text().startswith("Host staging"), text
    names = graph_js(pg, "rootcause-timeline", "gd.data.map(t => t.name)")
    assert {"staging-bound", "compute-bound", "demand-limited"} <= set(names), names
    # today's ranked list of the whole window is still there
    assert pg.locator("#rootcause-causes li").count() >= 1
    page.shot("workloads-rootcause")
    # the episode's own link explains just it
    from triscope.dashboard.components import fmt_ts

    start = fmt_ts(float(ep.get_attribute("data-start") or 0))
    ep.get_by_text("explain this episode").click()
    pg.wait_for_url(re.compile(rf".*/rootcause\?node={NODE}&start=\d+&end=\d+$"))
    pg.wait_for_function("(s) => { const i = document.querySelector('#rootcause-start'); return i && i.value === s; }",
                         arg=start)
    page.settle()
    pg.wait_for_selector("#rootcause-causes li", timeout=30000)
    assert pg.locator("#rootcause-causes .cause-title").first.inner_text().startswith("Host staging")
    assert page.errors == [], page.errors
