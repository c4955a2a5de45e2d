"""Dashboard benchmark: the node page over 24 h at 1 Hz, 10 plotted series.

* server side: every callback of the node page (render for each preset, live append,
  "explain" link, live toggle), median of 20 runs, timed as the callback function plus the JSON
  encoding Dash does (what the server spends per request);
* browser: first render of the node page complete in headless Chromium (navigation start to
  the figure drawn with its traces and no callback in flight), median of 5 loads;
* named baseline, measured in the same run: the same figure built from raw, un-downsampled
  points (``max_points=None``): its render callback time and its payload size;
* the Root cause page's callback (everything the page computes for a node: the episode timeline
  with each bad episode explained, the ranked causes of the whole window, the verdict history's
  state shares, the events) at a 24 h look-back, against the same callback over 15 minutes, on
  the store above and on the six H200 recordings imported as ``make run`` imports them
  (``import_for_demo``: shifted to end now, marked recordings), the slowest of their nodes.

Run alone: ``python -m bench.bench_dashboard [--quick]``.
"""

from __future__ import annotations

import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.common import Row
from triscope.core.samples import Sample, Tick

if TYPE_CHECKING:
    from triscope.store.api import Store

NODE = "bench-node"
ROOT_CAUSE_24H = "root cause page, 24 h look-back"
ROOT_CAUSE_BASE = "root cause explain (15 min window)"
ROOT_CAUSE_TARGET_MS = 2000.0    # issue 27: the Root cause page answers within 2 s for 24 h
TRACES = Path(__file__).resolve().parents[1] / "examples" / "traces"
CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]


def _median_ms(fn: Any, runs: int) -> float:
    """Median wall time (ms) of ``fn``; the median process CPU time (all threads, so the
    database work in SQLite counts too) is kept in ``LAST_CPU`` -- on a shared, loaded machine
    the CPU time says what the callback costs, the wall time what a user waits."""
    global LAST_CPU
    fn()  # warm
    times, cpu = [], []
    for _ in range(runs):
        c = time.process_time()
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1000)
        cpu.append((time.process_time() - c) * 1000)
    LAST_CPU = statistics.median(cpu)
    return statistics.median(times)


LAST_CPU = 0.0


def _timed(fn: Any, runs: int) -> tuple[float, float]:
    wall = _median_ms(fn, runs)
    return wall, LAST_CPU


def _callbacks(app: Any, end: float, runs: int) -> tuple[dict[str, tuple[float, float]], float, int, int]:
    from dash._utils import to_json

    from triscope.dashboard.context import CONFIG_KEY
    from triscope.dashboard.pages import node

    c = app.server.config[CONFIG_KEY]
    out: dict[str, tuple[float, float]] = {}
    with app.server.test_request_context("/_dash-update-component", method="POST"):
        meta: dict[str, Any] = {}

        def render(preset: str) -> Any:
            res = node.render(preset, 0, NODE, None, None)
            to_json(res)
            meta.update(res[1] or {})
            return res

        for preset in ("15m", "1h", "24h", "7d"):
            out[f"render {preset}"] = _timed(lambda p=preset: render(p), runs)
        payload_ds = len(to_json(render("24h")[0]))
        render("24h")
        base_meta = dict(meta, cursor=end - 5)  # five new points per series, as after a 5 s live interval
        out["live append"] = _timed(lambda: to_json(node.live_append(1, dict(base_meta), None)), runs)
        relayout = {"xaxis.range[0]": "2026-01-01 00:00:00", "xaxis.range[1]": "2026-01-01 01:00:00"}
        out["explain link"] = _timed(lambda: to_json(node.explain_link(relayout, None, dict(meta))), runs)
        out["live toggle"] = _timed(lambda: node.toggle_live(["live"]), runs)
        # the other pages' callbacks over the same data
        from triscope.dashboard.pages import fleet, mismatch, remediation, rootcause

        out["fleet page layout"] = _timed(lambda: to_json(fleet.layout()), runs)
        out["mismatch render 24h"] = _timed(lambda: to_json(mismatch.render(NODE, "24h")), max(3, runs // 4))
        out["remediation render 7d"] = _timed(lambda: to_json(remediation.render("7d")), runs)
        a = f"{end - 900:.0f}"
        out["root cause explain (15 min window)"] = _timed(
            lambda: to_json(rootcause.explain(1, NODE, a, f"{end:.0f}")), max(3, runs // 4))
        day = f"{end - 86400:.0f}"
        out[ROOT_CAUSE_24H] = _timed(lambda: to_json(rootcause.explain(1, NODE, day, f"{end:.0f}")), max(3, runs // 4))
        # named baseline: the same 24 h figure from raw points
        mp = c.max_points
        c.max_points = None
        try:
            base_ms = _median_ms(lambda: render("24h"), max(3, runs // 5))
            payload_raw = len(to_json(render("24h")[0]))
        finally:
            c.max_points = mp
    return out, base_ms, payload_ds, payload_raw


def _browser(app: Any, loads: int) -> float | None:
    from triscope.dashboard.app import serve_in_thread

    if not Path(CHROMIUM).exists():
        return None
    from playwright.sync_api import sync_playwright

    handle = serve_in_thread(app, "127.0.0.1", 0)
    times = []
    try:
        with sync_playwright() as p:
            b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            page = b.new_page(viewport={"width": 1400, "height": 1000})
            url = f"{handle.url}node/{NODE}?range=24h"
            for i in range(loads + 1):
                page.goto("about:blank")
                page.goto(url, wait_until="commit")
                page.wait_for_function(
                    "() => { const gd = document.querySelector('#node-graph .js-plotly-plot');"
                    " return gd && gd.data && gd.data.length > 10 && gd._fullLayout && "
                    " document.querySelectorAll('#node-graph .scatterlayer .trace').length > 10 && "
                    " !document.querySelector('[data-dash-is-loading=\"true\"]'); }", timeout=30000, polling="raf")
                ms = page.evaluate("() => performance.now()")
                if i:  # the first load warms the caches of the server and the browser
                    times.append(ms)
            b.close()
    finally:
        handle.stop()
    return statistics.median(times)


def seed_bench(store: Store, end: float, hours: float = 24.0, node: str = "bench-node", batch: int = 3600) -> int:
    """One node, 10 plotted series at 1 Hz (2 GPUs: SM active x2, PCIe RX/TX x2, tensor; DMA maps,
    retransmits, TIME_WAIT) plus the 4 mismatch-state series of the ribbon, over ``hours`` ending at ``end``.  Returns samples written."""

    n = int(hours * 3600)
    start = end - n
    rnd = random.Random(11)
    rx = [0.0, 0.0]
    tx = [0.0, 0.0]
    maps = rtx = 0.0
    states = ("compute-bound", "io-saturated", "staging-bound", "idle")
    written = 0
    ticks: list[Tick] = []
    for i in range(n):
        ts = start + i
        phase = (i // 900) % 4  # 15-minute phases: compute, pinned copy, pageable copy, idle
        smp: list[Sample] = []
        for g in (0, 1):
            lab = {"gpu": str(g)}
            sm = (0.95, 0.02, 0.03, 0.0)[phase] + 0.02 * rnd.random()
            r = (0.1, 58.0, 23.0, 0.01)[phase] * 1e9 * (1 + 0.03 * rnd.random()) / (1 + g)
            rx[g] += r
            tx[g] += r * 0.1
            smp += [Sample("triscope_gpu_sm_active_ratio", min(1.0, sm), lab),
                    Sample("triscope_gpu_pcie_rx_bytes_total", rx[g], lab, "counter"),
                    Sample("triscope_gpu_pcie_tx_bytes_total", tx[g], lab, "counter")]
            if g == 0:
                smp.append(Sample("triscope_gpu_tensor_active_ratio", min(1.0, sm * 0.8), lab))
        maps += rnd.randint(0, 40) + (1100 if phase == 2 else 0)
        rtx += rnd.randint(0, 2)
        smp += [
            Sample("triscope_dma_map_total", maps, {"device": "0000:1b:00.0", "direction": "to_device"}, "counter"),
            Sample("triscope_tcp_retransmits_total", rtx, {}, "counter"),
            Sample("triscope_tcp_sockets", 50 + rnd.randint(0, 20), {"state": "time_wait"}),
        ]
        # the ribbon, stored the way the agent stores it: 1 for the current state, 0 for the others
        smp += [Sample("triscope_mismatch_state", 1.0 if k == phase else 0.0, {"state": st}) for k, st in enumerate(states)]
        ticks.append(Tick(ts, smp))
        if len(ticks) >= batch:
            written += store.write_ticks(node, ticks)
            ticks = []
    if ticks:
        written += store.write_ticks(node, ticks)
    return written


def run(quick: bool = False) -> list[Row]:
    from triscope.dashboard.app import create_app
    from triscope.store import Store

    hours = 3.0 if quick else 24.0
    runs = 5 if quick else 20
    tmp = Path(tempfile.mkdtemp(prefix="triscope-bench-dash-"))
    url = f"sqlite:///{tmp / 'bench.db'}"
    st = Store.open(url)
    st.upgrade()
    end = time.time()
    t = time.perf_counter()
    n = seed_bench(st, end, hours=hours, node=NODE)
    seed_s = time.perf_counter() - t
    app = create_app(url, store=st)
    cb, base_ms, payload_ds, payload_raw = _callbacks(app, end, runs)
    first = _browser(app, 2 if quick else 5)
    load = os.getloadavg()[0]
    label = f"dashboard node page ({hours:g} h at 1 Hz, 10 series, SQLite; load avg {load:.1f} on {os.cpu_count()} cpu)"
    rows = [_callback_row(label, k, v, cpu, base_ms, cb) for k, (v, cpu) in cb.items()]
    rows.append(Row(label, "node page payload (24h figure JSON)", round(payload_ds / 1024, 1), "KiB", "",
                    "raw points", round(payload_raw / 1024, 1)))
    if first is not None:
        rows.append(Row(label, "first render complete in Chromium (median)", round(first, 0), "ms", "<= 1500",
                        "", None, first <= 1500))
    rows.append(Row(label, f"seed: {n} samples written", round(n / seed_s), "samples/s"))
    st.close()
    rows += root_cause_on_recordings(tmp, 2 if quick else 6, 3)
    shutil.rmtree(tmp, ignore_errors=True)
    return rows


def _callback_row(label: str, k: str, v: float, cpu: float, base_ms: float,
                  cb: dict[str, tuple[float, float]]) -> Row:
    """One callback's row: <= 300 ms, the Root cause page at 24 h <= 2 s against its 15-minute view."""
    fig = f"callback {k} (server wall, median; CPU {cpu:.0f} ms)"
    if k == ROOT_CAUSE_24H:
        return Row(label, fig, round(v, 1), "ms", f"<= {ROOT_CAUSE_TARGET_MS:g}", "the same callback, 15 min window",
                   round(cb[ROOT_CAUSE_BASE][0], 1), v <= ROOT_CAUSE_TARGET_MS)
    return Row(label, fig, round(v, 1), "ms", "<= 300", "same figure from raw points (render 24h)" if k == "render 24h"
               else "", round(base_ms, 1) if k == "render 24h" else None, v <= 300)


def root_cause_on_recordings(tmp: Path, nodes: int = 6, runs: int = 3) -> list[Row]:
    """The Root cause page's callback on the demo's data: the first ``nodes`` H200 recordings imported
    as ``make run`` does (``import_for_demo``), for each node at a 24 h look-back and over its last 15
    minutes (the named baseline), ending at its last sample; the slowest node's median of ``runs``."""
    from dash._utils import to_json

    from triscope.commands.run import import_for_demo
    from triscope.dashboard.app import create_app
    from triscope.store import Store

    traces = sorted(TRACES.glob("h200-inference-*.jsonl.gz"))[:nodes]
    if not traces:
        return []
    url = f"sqlite:///{tmp / 'recordings.db'}"
    names = [import_for_demo(url, p) for p in traces]
    st = Store.open(url)
    app = create_app(url, store=st)
    from triscope.dashboard.pages import rootcause  # pages register once an app exists

    worst: tuple[float, float, float, str] = (0.0, 0.0, 0.0, "")
    with app.server.test_request_context("/_dash-update-component", method="POST"):
        for node in names:
            end = next(n.last_seen for n in st.nodes() if n.name == node) + 1

            def page(span: float, node: str = node, end: float = end) -> Any:
                return to_json(rootcause.explain(1, node, f"{end - span:.0f}", f"{end:.0f}"))

            day, cpu = _timed(lambda: page(86400.0), runs)
            base = _median_ms(lambda: page(900.0), runs)
            if day > worst[0]:
                worst = (day, cpu, base, node)
    st.close()
    load = os.getloadavg()[0]
    day, cpu, base, node = worst
    label = (f"dashboard root cause page ({len(names)} H200 recordings as make run imports them, SQLite; "
             f"load avg {load:.1f} on {os.cpu_count()} cpu)")
    return [Row(label, f"callback at a 24 h look-back, slowest node ({node}; server wall, median; CPU {cpu:.0f} ms)",
                round(day, 1), "ms", f"<= {ROOT_CAUSE_TARGET_MS:g}", "the same node, 15 min window",
                round(base, 1), day <= ROOT_CAUSE_TARGET_MS)]


if __name__ == "__main__":
    for r in run(quick="--quick" in sys.argv):
        print(r)
