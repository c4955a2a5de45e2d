"""Application scrapes: the whole agent's CPU and RSS against the series it scrapes (issue 46, item 2).

A real agent process (``python -m triscope agent``, 1 s ticks, ``--no-ebpf --no-nvml --no-npu``:
the scrape is what is measured) reads one real target: prometheus_client's own exporter serving
10, 100, 1,000 or 10,000 series (``bench.scrape_target``: half of them histogram samples, every
series moving twice a second, so no scrape sees the last exposition again).  The budget is raised
to hold all of them (``--budget-sender-samples 20000``): every sample is stored every tick.  The
agent's own /metrics is read once a second as Prometheus would.

Cost: the agent's ``utime + stime`` (``/proc/PID/stat``: all its threads) over a window after a
warm-up (the first scrape, which parses every line, falls in the warm-up), each configuration a
fresh agent, in alternating rounds; medians with min-max.  Baselines in the same rounds: the agent
scraping nothing, and ``prometheus-node-exporter`` (Debian) scraped once a second beside it.

``TRISCOPE_BENCH_BEFORE=DIR`` (a checkout of an earlier commit) adds that tree's agent at the same
sizes to the same rounds (``PYTHONPATH=DIR``): before and after in one run.

Also measured in the bench's own process (thread CPU): the parse of a 10,000-series exposition by
prometheus-client's parser and by the line cache, and the store's write of the same samples.

``python -m bench --only scrape --results /tmp/x.md``.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import AgentProcess, Row, free_port, wait_port

ROOT = Path(__file__).resolve().parents[1]
SIZES = (10, 100, 1_000, 10_000)


def _stop(p: subprocess.Popen | None) -> None:
    if p is None:
        return
    with contextlib.suppress(OSError):
        if p.stdin:
            p.stdin.close()
    p.terminate()
    try:
        p.wait(15)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait(5)


def one(tmp: Path, n: int, window: float, warm: float, tree: Path | None = None,
        extra: tuple[str, ...] = ()) -> dict[str, float]:
    """One fresh agent scraping a target of ``n`` series (0: none, with node_exporter beside it)
    for ``warm`` + ``window`` seconds: its CPU share, RSS and (n=0) node_exporter's."""
    tag = f"{'before-' if tree else ''}{n}-{time.monotonic_ns()}"
    env = dict(os.environ)
    if tree is not None:
        env["PYTHONPATH"] = str(tree)
    target = ne = None
    try:
        args = ["--no-ebpf", "--no-nvml", "--no-npu", "--budget-sender-samples", "20000",
                "--budget-total-samples", "40000"]
        scrape: list[int] = []
        if n:
            t_port = free_port()
            target = subprocess.Popen([sys.executable, "-m", "bench.scrape_target", str(n), str(t_port)],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT)
            assert target.stdout is not None
            line = target.stdout.readline().split()
            if not line or line[0] != "ready":
                raise RuntimeError(f"scrape target for {n} did not start")
            stored = int(line[1])
            args += ["--scrape", f"http://127.0.0.1:{t_port}/metrics", *extra]
        else:
            exe = shutil.which("prometheus-node-exporter")
            if exe:
                n_port = free_port()
                ne = subprocess.Popen([exe, f"--web.listen-address=127.0.0.1:{n_port}"], stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL)
                wait_port(n_port, 10)
                scrape.append(n_port)
        # ``python -m triscope``: with ``tree``, PYTHONPATH picks the checkout that runs
        with AgentProcess(tmp, tag, args, env, duration=warm + window + 60, module=True) as agent:
            cost = agent.cost(window, warm, scrape=scrape, beside=(ne.pid,) if ne is not None else ())
            got = {"cpu": cost.cpu, "rss": cost.rss_max}
            if ne is not None:
                got["ne"] = cost.beside[ne.pid]
            if n:
                text = agent.metrics()
                # the target's samples held by the budget: every one of them admitted (the exporter's own
                # rendering of 10,000 series may miss a tick's 0.25 s wait; that tick uses the last answer)
                used = re.search(r'triscope_budget_used_samples\{source="scrape"\} (\S+)', text)
                if not used or int(float(used.group(1))) != stored:
                    raise RuntimeError(f"the agent did not hold the target's {stored} samples: "
                                       f"used={used and used.group(1)}")
            return got
    finally:
        _stop(target)
        _stop(ne)


def _fmt(vals: list[float], scale: float = 100.0, nd: int = 2) -> str:
    return f"{statistics.median(vals) * scale:.{nd}f} ({min(vals) * scale:.{nd}f}-{max(vals) * scale:.{nd}f})"


def run(quick: bool = False) -> list[Row]:
    if not Path("/proc/self/stat").exists():
        return [Row("scrape", "needs Linux procfs", float("nan"), "", ok=False)]
    window, warm, rounds = (15.0, 6.0, 1) if quick else (20.0, 8.0, 3)
    before = os.environ.get("TRISCOPE_BENCH_BEFORE")
    trees: list[Path | None] = [None] + ([Path(before)] if before else [])
    got: dict[tuple[str, int], list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-scrape-") as td:
        for _ in range(rounds):
            got.setdefault(("now", 0), []).append(one(Path(td), 0, window, warm))
            for n in SIZES:
                for tree in trees:
                    key = ("before" if tree else "now", n)
                    got.setdefault(key, []).append(one(Path(td), n, window, warm, tree))
            got.setdefault(("every5", SIZES[-1]), []).append(
                one(Path(td), SIZES[-1], window, warm, extra=("--scrape-interval", "5")))
            got.setdefault(("write30", SIZES[-1]), []).append(
                one(Path(td), SIZES[-1], window, warm, extra=("--write-every", "30")))
    alone = [g["cpu"] for g in got[("now", 0)]]
    ne = [g["ne"] for g in got[("now", 0)] if "ne" in g]
    base_cpu = statistics.median(alone)
    how = f"whole agent, utime+stime of all threads over {window:.0f} s at 1 s ticks, median (min-max) of {rounds}"
    rows = [Row("scrape", f"agent scraping nothing: % of a core ({how}; RSS "
                f"{statistics.median(g['rss'] for g in got[('now', 0)]):.1f} MB)", round(base_cpu * 100, 2),
                "%", "", "prometheus-node-exporter scraped 1/s, same windows: " + (_fmt(ne) if ne else "not installed"),
                round(statistics.median(ne) * 100, 2) if ne else None)]
    for n in SIZES:
        now = got[("now", n)]
        cpu = [g["cpu"] for g in now]
        med = statistics.median(cpu)
        per_sample_us = (med - base_cpu) / n * 1e6     # CPU seconds a second = a tick
        extra = ""
        if ("before", n) in got:
            b = [g["cpu"] for g in got[("before", n)]]
            extra = (f"; the previous parser in the same rounds {_fmt(b)} %, RSS "
                     f"{statistics.median(g['rss'] for g in got[('before', n)]):.1f} MB")
        target = "<= 2 (20 ms a tick)" if n == 10_000 else ""
        rows.append(Row("scrape", f"agent scraping {n:,} series: % of a core ({how}: {_fmt(cpu)}; "
                        f"{med * 1000:.1f} ms a tick, {per_sample_us:.2f} us a sample over the baseline; RSS "
                        f"{statistics.median(g['rss'] for g in now):.1f} MB{extra})", round(med * 100, 2), "%",
                        target, "the agent scraping nothing, same rounds", round(base_cpu * 100, 2),
                        ok=(med <= 0.02) if n == 10_000 else None))
    e5 = [g["cpu"] for g in got[("every5", SIZES[-1])]]
    rows.append(Row("scrape", f"agent scraping {SIZES[-1]:,} series with --scrape-interval 5 (read every 5th tick): "
                    f"% of a core ({how}: {_fmt(e5)}; RSS {statistics.median(g['rss'] for g in got[('every5', SIZES[-1])]):.1f} MB)",
                    round(statistics.median(e5) * 100, 2), "%", "<= 2", "the agent scraping nothing, same rounds",
                    round(base_cpu * 100, 2), ok=statistics.median(e5) <= 0.02))
    w30 = [g["cpu"] for g in got[("write30", SIZES[-1])]]
    rows.append(Row("scrape", f"agent scraping {SIZES[-1]:,} series with --write-every 30 (the store 30 s behind "
                    f"/metrics at most, instead of 5): % of a core ({how}: {_fmt(w30)}; RSS "
                    f"{statistics.median(g['rss'] for g in got[('write30', SIZES[-1])]):.1f} MB)",
                    round(statistics.median(w30) * 100, 2), "%", "", "the agent scraping nothing, same rounds",
                    round(base_cpu * 100, 2)))
    return rows + in_process(quick)


def in_process(quick: bool) -> list[Row]:
    """Where a 10,000-series tick's CPU goes, in this process (thread CPU, median of alternating
    reps): the scrape's parse by prometheus-client's parser and by the line cache, and the store's
    write of the same samples (SQLite, five ticks a write as the agent's --write-every 5, and 30), on a
    store holding minutes of them already (the agent rows' stores are seconds old)."""
    import random

    from prometheus_client import CollectorRegistry, generate_latest

    from bench.scrape_target import build
    from triscope.agent.collectors.scrape import ScrapeCollector

    n = SIZES[-1]
    reg = CollectorRegistry()
    h, c, g = build(n, reg)
    rnd = random.Random(2)
    bodies = []
    for _ in range(4):
        for x in h:
            x.observe(rnd.random())
        for x in c:
            x.inc()
        for x in g:
            x.set(rnd.random())
        bodies.append(generate_latest(reg).decode())
    col = ScrapeCollector("http://127.0.0.1:9/metrics")
    col.parse(bodies[0])
    slow: list[float] = []
    fast: list[float] = []
    reps = 3 if quick else 9
    for i in range(reps):
        body = bodies[1 + i % 3]
        t = time.thread_time()
        col._slow(body)
        slow.append(time.thread_time() - t)
        t = time.thread_time()
        samples = col.parse(body)
        fast.append(time.thread_time() - t)
    us = 1e6 / n
    rows = [Row("scrape parse", f"{n:,}-series exposition ({len(bodies[1]):,} bytes), values moved, thread CPU per "
                f"sample, median of {reps} (min {min(fast) * us:.2f}, max {max(fast) * us:.2f})",
                round(statistics.median(fast) * us, 2), "us", "",
                "prometheus-client's parser + the agent's per-sample work (the path before, same reps)",
                round(statistics.median(slow) * us, 2))]
    history = 60 if quick else 300
    for per in (5, 30):
        write = _store_write(samples, per, history, reps)
        rows.append(Row("scrape parse", f"the store's write of the same {n:,} samples a tick (SQLite steady path, "
                        f"{per} ticks a write, after {history} s of history), thread CPU per sample, median of "
                        f"{len(write)} (min {min(write) * us:.2f}, max {max(write) * us:.2f})",
                        round(statistics.median(write) * us, 2), "us", "", "", None))
    return rows


def _store_write(samples: list, per: int, history: float, reps: int) -> list[float]:
    """Thread CPU a tick of writing ``samples`` every second, ``per`` ticks a transaction, on a store
    that already holds ``history`` seconds of them (a young B-tree costs less a row than a settled one)."""
    from triscope.core.samples import Sample, Tick
    from triscope.store.api import Store

    out: list[float] = []
    with tempfile.TemporaryDirectory(prefix="bench-scrape-store-") as td:
        st = Store.open(f"sqlite:///{td}/s.db", check=False)
        st.upgrade()
        t0 = time.time() - 7200
        k = 0
        for i in range(int(history // per) + reps):
            ticks = [Tick(t0 + k + j, [Sample(s.name, s.value + k + j, s.labels, s.kind) for s in samples])
                     for j in range(per)]
            k += per
            t = time.thread_time()
            st.write_ticks("bench", ticks)
            if i >= history // per:
                out.append((time.thread_time() - t) / per)
        st.engine.dispose()
    return out


if __name__ == "__main__":
    for row in run("--quick" in sys.argv):
        print(row)
