"""eBPF benchmarks: kernel cost per event, start-to-attached time, agent footprint vs node_exporter.

- Kernel cost per event: a C loop of ``getpid`` syscalls (compiled with gcc here) timed without a
  probe and with each probe style attached; the difference per call is the probe's cost.  The
  styles are the program's own code paths (``probes.bpf.c``) driven from ``sys_enter``:
  raw tracepoint + per-CPU row of the mmapable counters array (IOMMU map/unmap), raw tracepoint + per-CPU hash
  keyed by device pointer (DMA map/unmap), and the named baseline, a classic tracepoint
  (``syscalls:sys_enter_getpid``) with a shared hash increment.
- Start to attached: ``EbpfCollector()`` construction (child compile + attach + fd hand-over).
- Footprint: ``triscope agent`` (all collectors, 1 s interval, /metrics scraped each second) vs
  Debian's ``prometheus-node-exporter`` scraped each second, both over the same window: steady
  RSS and CPU share of one core.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from bench.common import Row, free_port, wait_port

ROOT = Path(__file__).resolve().parents[1]
CLK_TCK = os.sysconf("SC_CLK_TCK")

DRIVER_C = r"""
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#include <sys/syscall.h>
int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 1000000;
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (long i = 0; i < n; i++) syscall(SYS_getpid);
    clock_gettime(CLOCK_MONOTONIC, &b);
    printf("%.3f\n", ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / n);
    return 0;
}
"""

# appended to probes.bpf.c: the same code paths as the real probes, fired by getpid()
BENCH_C = r"""
BPF_HASH(bench_hash, u32, u64, 16);

// style of the counting probes (iommu map/unmap): raw tracepoint + this CPU's row of the counters
int bench_raw_array(struct bpf_raw_tracepoint_args *ctx) {
    if (ctx->args[1] != BENCH_NR_GETPID)
        return 0;
    count(C_IOMMU_MAP, 1);
    count(C_IOMMU_MAP_BYTES, 4096);
    return 0;
}

// style of the DMA probes: raw tracepoint + per-CPU hash keyed by (device pointer, dir, op)
int bench_raw_dma(struct bpf_raw_tracepoint_args *ctx) {
    if (ctx->args[1] != BENCH_NR_GETPID)
        return 0;
    dma_account(bpf_get_current_task(), 1, 0, 4096);
    return 0;
}

// named baseline: classic tracepoint + shared hash increment
int bench_classic_hash(struct tracepoint__syscalls__sys_enter_getpid *args) {
    u32 k = 0;
    u64 zero = 0;
    u64 *v = bench_hash.lookup_or_try_init(&k, &zero);
    if (v)
        __sync_fetch_and_add(v, 1);
    return 0;
}
"""

STYLES = [
    ("raw tracepoint + per-CPU row of a mapped array (counters: iommu map/unmap)", "raw", "raw_syscalls:sys_enter", "bench_raw_array"),
    ("raw tracepoint + per-CPU hash by device (DMA map/unmap)", "raw", "raw_syscalls:sys_enter", "bench_raw_dma"),
    ("classic tracepoint + hash (baseline)", "tracepoint", "syscalls:sys_enter_getpid", "bench_classic_hash"),
]


def _getpid_nr() -> int:
    import platform

    return {"x86_64": 39, "aarch64": 172}.get(platform.machine(), 39)


def _driver(tmp: Path) -> Path:
    src = tmp / "getpid_loop.c"
    src.write_text(DRIVER_C)
    exe = tmp / "getpid_loop"
    subprocess.run(["gcc", "-O2", "-o", str(exe), str(src)], check=True)
    return exe


def _ns_per_call(exe: Path, n: int, reps: int) -> float:
    # minimum over repetitions: the machine is shared, noise only ever adds time
    vals = []
    for _ in range(reps):
        out = subprocess.run(["taskset", "-c", "0", str(exe), str(n)] if shutil.which("taskset") else [str(exe), str(n)],
                             capture_output=True, text=True, check=True).stdout
        vals.append(float(out.strip()))
    return min(vals)


def _events_counted(res, fn: str) -> int:
    import struct

    from triscope.agent.ebpf import layout as L
    from triscope.agent.ebpf.bpfsys import BpfMap, Counters, sum_u64_percpu

    if fn == "bench_raw_array":
        c = Counters(os.dup(res.maps["counters"]), L.N_COUNTERS)
        n = c.read()[L.C_IOMMU_MAP]
        c.close()
        return n
    if fn == "bench_raw_dma":
        m = BpfMap(os.dup(res.maps["dma_stats"]))
        n = sum(sum_u64_percpu(m, v, 2)[0] for _, v in m.items())
    else:
        m = BpfMap(os.dup(res.maps["bench_hash"]))
        v = m.lookup(struct.pack("<I", 0))
        n = struct.unpack_from("<Q", v)[0] if v else 0
    m.close()
    return n


def kernel_cost(quick: bool) -> list[Row]:
    from triscope.agent.ebpf.loader import SOURCE, run_loader

    n = 300_000 if quick else 2_000_000
    reps = 3 if quick else 7
    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as td:
        tmp = Path(td)
        exe = _driver(tmp)
        src = tmp / "bench.bpf.c"
        src.write_text(SOURCE.read_text() + BENCH_C)
        base = _ns_per_call(exe, n, reps)
        costs: dict[str, float] = {}
        for label, kind, tp, fn in STYLES:
            res = run_loader(["WANT_DMA_MAP", "WANT_IOMMU_MAP", f"BENCH_NR_GETPID={_getpid_nr()}"], [{"probe": "bench", "tp": tp, "kind": kind, "fn": fn}],
                             source=src, maps=["counters", "dma_stats", "bench_hash"])
            try:
                if res.fatal or not res.attachments or not res.attachments[0].ok:
                    raise RuntimeError(f"bench probe {fn} did not attach: {res.error or res.attachments}")
                with_probe = _ns_per_call(exe, n, reps)
                fired = _events_counted(res, fn)
                if fired < n * reps:  # the probe really ran on every call
                    raise RuntimeError(f"bench probe {fn} counted {fired} events, expected >= {n * reps}")
            finally:
                res.close()
            # the no-probe figure again, right after, so drift of the shared machine shows less
            base = min(base, _ns_per_call(exe, n, reps))
            costs[label] = with_probe - base
        baseline = costs[STYLES[2][0]]
        rows.append(Row("ebpf kernel cost", "getpid syscall, no probe", round(base, 1), "ns/call"))
        for label, *_ in STYLES[:2]:
            c = costs[label]
            rows.append(Row("ebpf kernel cost", label, round(c, 1), "ns/event", "<= 150",
                            STYLES[2][0], round(baseline, 1), c <= 150))
    return rows


def attach_time(quick: bool) -> list[Row]:
    from triscope.agent.collectors.ebpf import EbpfCollector

    times = []
    attached = 0
    for _ in range(2 if quick else 3):
        c = EbpfCollector()
        times.append(c.attach_seconds or 0.0)
        attached = sum(c.attached.values())
        c.close()
    worst = max(times)
    return [Row("ebpf attach", f"start to all supported probes attached ({attached} probes), worst of {len(times)}",
                round(worst, 2), "s", "<= 2", ok=worst <= 2.0)]


# ------------------------------------------------------------------------------------- footprint
def _cpu_ticks(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])   # utime + stime


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _scrape(port: int) -> None:
    with contextlib.suppress(OSError), urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
        r.read()


def _measure(agent: subprocess.Popen, ne: subprocess.Popen | None, a_port: int, n_port: int, warmup: float,
             window: float) -> tuple[float, float, list[float], list[float], str]:
    """Both scraped once a second: ``warmup`` seconds, then ``window`` seconds measured.  Returns
    (agent CPU %, node_exporter CPU %, agent RSS MB each second, node_exporter's, the agent's last
    /metrics)."""
    t_end = time.monotonic() + warmup
    while time.monotonic() < t_end:
        _scrape(a_port)
        if ne is not None:
            _scrape(n_port)
        time.sleep(1)
    a0 = _cpu_ticks(agent.pid)
    n0 = _cpu_ticks(ne.pid) if ne else 0
    t0 = time.monotonic()
    a_rss, n_rss = [], []
    while time.monotonic() - t0 < window:
        _scrape(a_port)
        if ne is not None:
            _scrape(n_port)
        a_rss.append(_rss_mb(agent.pid))
        if ne is not None:
            n_rss.append(_rss_mb(ne.pid))
        time.sleep(max(0.0, 1.0 - (time.monotonic() - t0) % 1.0))
    dt = time.monotonic() - t0
    a_cpu = (_cpu_ticks(agent.pid) - a0) / CLK_TCK / dt * 100
    n_cpu = (_cpu_ticks(ne.pid) - n0) / CLK_TCK / dt * 100 if ne else float("nan")
    with urllib.request.urlopen(f"http://127.0.0.1:{a_port}/metrics", timeout=2) as r:
        text = r.read().decode()
    return a_cpu, n_cpu, a_rss, n_rss, text


def _stop(*procs: subprocess.Popen | None) -> None:
    for p in procs:
        if p is not None:
            p.terminate()
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()


def footprint(quick: bool, no_migrate: bool = False, huge_pages: bool = False) -> list[Row]:
    triscope = ROOT / ".venv" / "bin" / "triscope"
    node_exporter = shutil.which("prometheus-node-exporter") or "/usr/bin/prometheus-node-exporter"
    if not triscope.exists():
        return [Row("ebpf footprint", "triscope agent not installed", float("nan"), "", ok=False)]
    window = 15.0 if quick else 60.0
    warmup = 5.0
    with tempfile.TemporaryDirectory() as td, open(f"{td}/agent.log", "w") as agent_log:
        a_port, n_port = free_port(), free_port()
        db = f"sqlite:///{td}/bench.db"
        extra = []
        if no_migrate:   # a fleet's agents write to a store whose schema a job upgraded once
            subprocess.run([str(triscope), "db", "upgrade", "--db", db], check=True, capture_output=True)
            extra = ["--no-migrate"]
        if huge_pages:
            extra.append("--huge-pages")
        agent = subprocess.Popen(
            [str(triscope), "agent", "--db", db, "--interval", "1", "--spool", f"{td}/spool",
             "--listen", f"127.0.0.1:{a_port}", "--duration", str(int(window + warmup + 30)), *extra],
            stdout=subprocess.DEVNULL, stderr=agent_log, cwd=td)
        ne = None
        if os.path.exists(node_exporter):
            ne = subprocess.Popen([node_exporter, f"--web.listen-address=127.0.0.1:{n_port}"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            if not wait_port(a_port, 60):
                log = Path(td, "agent.log").read_text()[-500:]
                return [Row("ebpf footprint", f"agent did not serve /metrics: {log}", float("nan"), "", ok=False)]
            if ne is not None:
                wait_port(n_port, 10)
            a_cpu, n_cpu, a_rss, n_rss, text = _measure(agent, ne, a_port, n_port, warmup, window)
            attached = sum(1 for line in text.splitlines()
                           if line.startswith("triscope_probe_attached{") and line.rstrip().endswith(" 1.0"))
        finally:
            _stop(agent, ne)
    a_rss_max = max(a_rss)
    n_rss_max = max(n_rss) if n_rss else float("nan")
    label = f"{int(window)} s, 1 s interval, all collectors, {attached} probes attached"
    if no_migrate:
        label += ", --no-migrate"
    if huge_pages:
        label += ", --huge-pages"
    # the target: at most node_exporter's CPU, scraped the same way in the same run, and half a percent
    return [
        Row("ebpf footprint", f"agent steady RSS (max over {label})", round(a_rss_max, 1), "MB", "<= 60",
            "prometheus-node-exporter", round(n_rss_max, 1), a_rss_max <= 60),
        Row("ebpf footprint", f"agent CPU ({label}, /metrics scraped 1/s)", round(a_cpu, 2), "% of a core",
            "<= 0.5 and <= baseline", "prometheus-node-exporter scraped 1/s", round(n_cpu, 2),
            a_cpu <= 0.5 and not a_cpu > n_cpu),
    ]


def exposition_cost(quick: bool) -> list[Row]:
    """Why /metrics keeps its own renderer: one tick's samples (every collector the agent runs here)
    rendered by ``render_text`` against prometheus_client's own exposition (``generate_latest`` over
    a registry whose collector yields the same families), CPU per render, median."""
    import logging

    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    from triscope.agent.exporter import render_text
    from triscope.agent.registry import AgentOptions, build_collectors, build_post_processors, split_available
    from triscope.agent.sampler import Sampler
    from triscope.core.metrics import CATALOGUE, kind_of

    logging.disable(logging.WARNING)
    try:
        collectors, _off = split_available(build_collectors(AgentOptions()))
        sampler = Sampler(collectors, [], post=build_post_processors())
        for _ in range(3):
            tick = sampler.tick()
        sampler.close()
    finally:
        logging.disable(logging.NOTSET)
    samples = [s for s in tick.samples if s.name.startswith("triscope_")]

    class TickFamilies:
        def collect(self):  # type: ignore[no-untyped-def]
            by: dict[str, list] = {}
            for s in samples:
                by.setdefault(s.name, []).append(s)
            for name, group in by.items():
                keys = sorted({k for s in group for k in s.labels})
                spec = CATALOGUE.get(name)
                help_ = spec.help if spec else name
                if (spec.kind if spec else kind_of(name)) == "counter" and name.endswith("_total"):
                    fam = CounterMetricFamily(name[:-6], help_, labels=keys)
                else:
                    fam = GaugeMetricFamily(name, help_, labels=keys)
                seen = set()
                for s in group:
                    values = tuple(str(s.labels.get(k, "")) for k in keys)
                    if values not in seen:
                        seen.add(values)
                        fam.add_metric(list(values), s.value)
                yield fam

    reg = CollectorRegistry()
    reg.register(TickFamilies())  # type: ignore[arg-type]
    reps = 200 if quick else 2000

    def median_us(fn) -> float:  # type: ignore[no-untyped-def]
        costs = []
        for _ in range(reps):
            t = time.thread_time()
            fn()
            costs.append(time.thread_time() - t)
        return statistics.median(costs) * 1e6

    ours = median_us(lambda: render_text(samples))
    theirs = median_us(lambda: generate_latest(reg))
    return [Row("agent /metrics", f"render one tick's {len(samples)} samples (median of {reps}, thread CPU)",
                round(ours, 1), "us", "", "prometheus_client generate_latest, same samples", round(theirs, 1))]


def tick_wakeup_cost(quick: bool) -> list[Row]:
    """Thread CPU of one sampler tick (every collector the agent would run here, the mismatch
    tracker) right after a 1 s sleep, as the agent runs it, against the same tick back to back:
    on a VM whose vCPU idles between ticks, the first is what the agent's CPU figure is made of."""
    import logging

    from triscope.agent.registry import AgentOptions, build_collectors, build_post_processors, split_available
    from triscope.agent.sampler import Sampler

    logging.disable(logging.WARNING)
    try:
        collectors, _off = split_available(build_collectors(AgentOptions()))
        sampler = Sampler(collectors, [], post=build_post_processors())
        reps = 5 if quick else 15
        for _ in range(5):
            sampler.tick()

        def median_ms(gap: float) -> float:
            costs = []
            for _ in range(reps):
                if gap:
                    time.sleep(gap)
                t = time.thread_time()
                sampler.tick()
                costs.append(time.thread_time() - t)
            return statistics.median(costs) * 1e3

        hot = median_ms(0.0)
        cold = median_ms(1.0)
        sampler.close()
    finally:
        logging.disable(logging.NOTSET)
    return [Row("agent tick", f"thread CPU of one tick after a 1 s sleep (median of {reps})", round(cold, 2), "ms",
                "", "same tick back to back", round(hot, 2))]


def page_touch_cost(quick: bool) -> list[Row]:
    """What touching memory again costs after a 1 s pause, per 4 KiB page: on 4 KiB pages against
    inside 2 MiB transparent huge pages.  Where the host ages guest memory (this VM), the first is
    what most of a tick's CPU is made of, and why the agent keeps its code and heap on huge pages
    (agent/hugepages.py)."""
    import mmap

    from triscope.agent.hugepages import thp_mode

    n_pages, reps = 2048, (4 if quick else 9)
    out: dict[str, float] = {}
    for kind, advice in (("4k", getattr(mmap, "MADV_NOHUGEPAGE", 15)), ("2m", getattr(mmap, "MADV_HUGEPAGE", 14))):
        size = n_pages * 4096
        m = mmap.mmap(-1, size + (2 << 20), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        try:
            m.madvise(advice)
            for i in range(0, len(m), 4096):
                m[i] = 1
            costs = []
            for _ in range(reps):
                time.sleep(1.0)
                t = time.thread_time()
                s = 0
                for i in range(0, size, 4096):
                    s += m[i]
                costs.append(time.thread_time() - t)
            out[kind] = statistics.median(costs) / n_pages * 1e9
        finally:
            m.close()
    label = f"re-touch one page after a 1 s pause (2 MiB pages; THP mode {thp_mode()})"
    return [Row("agent memory", label, round(out["2m"]), "ns/page", "", "4 KiB pages", round(out["4k"]))]


def _pages_referenced(pid: int) -> tuple[int, int]:
    """(4 KiB pages, 2 MiB pages) with their accessed bit set since the last clear_refs, from
    /proc/PID/smaps.  Within a mapping, referenced huge pages are counted first (Referenced is in
    whole huge pages for them), so the 4 KiB count is a lower bound."""
    small = huge = 0
    ref = ahp = 0

    def flush() -> None:
        nonlocal small, huge
        h = min(ahp, ref) // 2048 * 2048
        huge += h // 2048
        small += (ref - h) // 4

    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            head = line.split(maxsplit=1)[0]
            if not head.endswith(":"):          # a new mapping's header line
                flush()
                ref = ahp = 0
            elif head == "Referenced:":
                ref = int(line.split()[1])
            elif head == "AnonHugePages:":
                ahp = int(line.split()[1])
    flush()
    return small, huge


def _count_pages(procs: dict[str, tuple[subprocess.Popen, int]], reps: int,
                 got: dict[str, list[tuple[int, int]]]) -> str:
    """``reps`` rounds: every agent's accessed bits cleared, /metrics scraped, the pages each
    touched in that second counted into ``got``.  Returns "" or, when an agent exited, what to say."""
    for _ in range(reps):
        for p, _port in procs.values():
            with open(f"/proc/{p.pid}/clear_refs", "w") as f:
                f.write("1")
        t0 = time.monotonic()
        for _p, port in procs.values():
            _scrape(port)
        time.sleep(max(0.0, 1.0 - (time.monotonic() - t0)))
        for label, (p, _port) in procs.items():
            if p.poll() is not None:   # a zombie's smaps reads empty: it would count as 0 pages
                return f"agent ({label}) exited ({p.returncode}) during the count"
            got[label].append(_pages_referenced(p.pid))
    return ""


def pages_touched(quick: bool) -> list[Row]:
    """Distinct pages one tick touches, the figure the CPU of a tick follows where the host ages
    guest memory (row ``agent memory``: re-touch cost per page): three agents side by side (all
    collectors, 1 s interval, /metrics scraped 1/s), each second their accessed bits cleared
    (``/proc/PID/clear_refs``) and counted one second later (``/proc/PID/smaps``).  The same on
    any host, unlike the CPU figure."""
    from triscope.agent.hugepages import REEXEC_MARK, heap_reexec_blocker

    triscope = ROOT / ".venv" / "bin" / "triscope"
    if not triscope.exists():
        return [Row("agent memory", "triscope agent not installed", float("nan"), "", ok=False)]
    variants = {   # label -> (extra args, extra environment)
        "--huge-pages: code, heap and objects on huge pages": (["--huge-pages"], {}),
        "--huge-pages, objects left in pymalloc arenas (PYTHONMALLOC=pymalloc)": (["--huge-pages"],
                                                                                  {"PYTHONMALLOC": "pymalloc"}),
        "default (4 KiB pages)": ([], {}),
    }
    settle = 20.0 if quick else 65.0   # past tick 60, when the agent advises its heap the second time
    reps = 5 if quick else 9
    procs: dict[str, tuple[subprocess.Popen, int]] = {}
    got: dict[str, list[tuple[int, int]]] = {k: [] for k in variants}
    with tempfile.TemporaryDirectory() as td:
        try:
            for i, (label, (extra, env)) in enumerate(variants.items()):
                port = free_port()
                db = f"sqlite:///{td}/{i}.db"
                subprocess.run([str(triscope), "db", "upgrade", "--db", db], check=True, capture_output=True)
                procs[label] = (subprocess.Popen(
                    [str(triscope), "agent", "--db", db, "--interval", "1", "--spool", f"{td}/spool{i}",
                     "--listen", f"127.0.0.1:{port}", "--no-migrate", "--duration", str(int(settle + 3 * reps + 60)),
                     *extra], env={**os.environ, **env}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=td),
                    port)
            for label, (_p, port) in procs.items():
                if not wait_port(port, 60):
                    return [Row("agent memory", f"agent ({label}) did not serve /metrics", float("nan"), "", ok=False)]
            t_end = time.monotonic() + settle
            while time.monotonic() < t_end:
                for _p, port in procs.values():
                    _scrape(port)
                time.sleep(1)
            exited = _count_pages(procs, reps, got)
            if exited:
                return [Row("agent memory", exited, float("nan"), "", ok=False)]
            default = procs[next(iter(variants))][0]
            with open(f"/proc/{default.pid}/environ", "rb") as f:
                restarted = f"{REEXEC_MARK}=".encode() in f.read()
        except (OSError, subprocess.CalledProcessError) as e:   # clear_refs: ptrace rights over the agent
            return [Row("agent memory", f"pages touched: {e}", float("nan"), "", ok=False)]
        finally:
            _stop(*(p for p, _port in procs.values()))
    med = {k: (statistics.median_low(s for s, _ in v), statistics.median_low(h for _, h in v)) for k, v in got.items()}
    base = med["default (4 KiB pages)"]
    rows = []
    for label in list(variants)[:2]:
        small, huge = med[label]
        if label == next(iter(variants)) and not restarted:   # say so: the row is then not what --huge-pages does
            label += f" - NOT restarted with the compact heap ({heap_reexec_blocker()})"
        rows.append(Row("agent memory", f"pages one 1 s tick touches, 4 KiB + 2 MiB ({small:.0f} + {huge:.0f}; median "
                        f"of {reps}): {label}", small + huge, "pages", "", f"default ({base[0]:.0f} + {base[1]:.0f})",
                        base[0] + base[1]))
    return rows


def run(quick: bool = False) -> list[Row]:
    """Kernel cost per event, start-to-attached, tick cost awake vs after a sleep, and agent vs
    node_exporter footprint (60 s each)."""
    rows = []
    rows += kernel_cost(quick)
    rows += attach_time(quick)
    rows += tick_wakeup_cost(quick)
    rows += page_touch_cost(quick)
    rows += pages_touched(quick)
    rows += exposition_cost(quick)
    rows += footprint(quick, no_migrate=True)   # how a fleet runs it: schema upgraded once by a job
    rows += footprint(quick)                    # `triscope agent` as is: Alembic upgrade at start
    rows += footprint(quick, no_migrate=True, huge_pages=True)   # the opt-in memory layer
    return rows


if __name__ == "__main__":
    quick = "--quick" in sys.argv
    for r in run(quick):
        base = f"  (baseline {r.baseline}: {r.baseline_value})" if r.baseline else ""
        ok = "" if r.ok is None else ("  ok" if r.ok else "  MISSED")
        print(f"{r.benchmark:18} {r.figure:70} {r.value:>10} {r.unit:12} {r.target:8}{base}{ok}")
