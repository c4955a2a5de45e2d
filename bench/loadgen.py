"""Fleet load generator: N nodes x S series at 1 Hz into PostgreSQL through the store's real write path.

Each simulated node behaves like an agent: once a second it writes one tick of S samples with
``Store.write_ticks(node, [tick])`` (one transaction, COPY, rollups of closed buckets), from a
pool of worker processes, each holding one connection and serving its share of the nodes in
order. A tick's *lag* is the time from its timestamp (the second it belongs to) to its commit:
the staleness a dashboard or the remediation engine sees. A worker that falls behind keeps
going through the schedule instead of skipping, so falling behind shows up as growing lag.

While the load runs, the dashboard's fleet page (every node, its mismatch state, score,
accelerators, last remediation) is rendered server-side in this process at intervals and timed.

    python -m bench.loadgen                    # 1,000 nodes x 200 series, 5 minutes, own PostgreSQL
    python -m bench.loadgen --quick            # 100 nodes, 20 s
    python -m bench.loadgen --db postgresql://... --nodes 500 --duration 60 --json

Without ``--db`` it starts a private PostgreSQL (tests/conftest.PostgresServer) configured like a
fleet server that values throughput over the last second of telemetry: fsync and
full_page_writes on, synchronous_commit off (a crash loses at most ~0.6 s of ticks, never
corrupts).
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import os
import statistics
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
STATES = ("idle", "compute-bound", "balanced", "io-saturated", "staging-bound", "network-bound")


# ---------------------------------------------------------------------------------------------
# what one node sends: 200 series shaped like a real 8-GPU agent


def node_series(series: int = 200, gpus: int = 8) -> list[tuple[str, dict[str, str], str]]:
    """(metric, labels, kind) of one node's series: mismatch, host, kernel, then GPU/PCIe, then self metrics."""
    out: list[tuple[str, dict[str, str], str]] = []
    gpu_metrics = [("triscope_gpu_utilization_ratio", "gauge"), ("triscope_gpu_sm_active_ratio", "gauge"),
                   ("triscope_gpu_tensor_active_ratio", "gauge"), ("triscope_gpu_dram_bw_ratio", "gauge"),
                   ("triscope_gpu_memory_used_bytes", "gauge"), ("triscope_gpu_memory_total_bytes", "gauge"),
                   ("triscope_gpu_pcie_rx_bytes_total", "counter"), ("triscope_gpu_pcie_tx_bytes_total", "counter"),
                   ("triscope_gpu_pcie_replays_total", "counter"), ("triscope_gpu_power_watts", "gauge"),
                   ("triscope_gpu_temperature_celsius", "gauge"), ("triscope_gpu_sm_clock_hertz", "gauge"),
                   ("triscope_gpu_up", "gauge")]
    for s in STATES:
        out.append(("triscope_mismatch_state", {"state": s}, "gauge"))
    out.append(("triscope_mismatch_score", {}, "gauge"))
    host = [("triscope_tcp_retransmits_total", {}, "counter"), ("triscope_tcp_segments_out_total", {}, "counter"),
            ("triscope_cpu_busy_ratio", {}, "gauge"), ("triscope_memory_available_bytes", {}, "gauge"),
            ("triscope_tick_duration_seconds", {}, "gauge"), ("triscope_ticks_total", {}, "counter")]
    out += host
    for r in ("cpu", "memory", "io"):
        for k in ("some", "full"):
            out.append(("triscope_pressure_ratio", {"resource": r, "kind": k}, "gauge"))
    for mode in ("user", "system", "idle", "iowait", "irq", "softirq"):
        out.append(("triscope_cpu_seconds_total", {"mode": mode}, "counter"))
    for g in range(gpus):
        for m, k in gpu_metrics:
            out.append((m, {"gpu": str(g)}, k))
        dev = f"0000:{0x18 + g * 0x10:02x}:00.0"
        out.append(("triscope_pcie_link_speed_gts", {"device": dev, "kind": "current"}, "gauge"))
        out.append(("triscope_pcie_link_width", {"device": dev, "kind": "current"}, "gauge"))
        out.append(("triscope_pcie_link_degraded", {"device": dev}, "gauge"))
        out.append(("triscope_dma_map_total", {"device": dev, "direction": "to_device"}, "counter"))
        out.append(("triscope_dma_map_bytes_total", {"device": dev, "direction": "to_device"}, "counter"))
    c = 0
    while len(out) < series:   # fill up with per-collector self metrics
        out.append(("triscope_collector_duration_seconds", {"collector": f"c{c}"}, "gauge"))
        c += 1
    return out[:series]


def make_tick(ts: float, node_idx: int, series: list[tuple[str, dict[str, str], str]]) -> Any:
    """One tick of one simulated node: fresh Sample objects, as an agent's collectors make them."""
    from triscope.core.samples import Sample, Tick

    k = int(ts)
    state = STATES[(node_idx + k // 60) % len(STATES)]     # each node changes state once a minute
    score = 0.6 if state in ("io-saturated", "staging-bound", "network-bound") else 0.05
    phase = k / 30.0 + node_idx
    sin = math.sin
    samples = []
    append = samples.append
    for i, (m, labels, kind) in enumerate(series):
        if kind == "counter":
            v = float(k * (i + 1))
        elif m == "triscope_mismatch_state":
            v = 1.0 if labels["state"] == state else 0.0
        elif m == "triscope_mismatch_score":
            v = score
        else:
            v = 0.5 + 0.4 * sin(phase + i)
        append(Sample(m, v, labels, kind))   # type: ignore[arg-type]
    return Tick(ts, samples)


# ---------------------------------------------------------------------------------------------
# workers


def _worker(url: str, nodes: list[int], series_n: int, t_warm: float, ready: Any, go: Any, start_at: Any,
            duration: float, out: Any, prefix: str) -> None:
    from triscope.store import Store

    st = Store.open(url)
    series = node_series(series_n)
    # warm-up, untimed: the agents are already running when the measurement starts, so each
    # worker writes its nodes' first tick (creating nodes and series, filling its own caches of
    # ids and rollup watermarks) before the schedule begins
    for n in nodes:
        st.write_ticks(f"{prefix}{n:04d}", [make_tick(t_warm, n, series)])
    ready.put(os.getpid())
    go.wait()
    t_start = start_at.value
    cpu0 = os.times()
    lags: list[float] = []
    worst: dict[int, float] = {}     # tick second -> worst lag among this worker's nodes
    written = 0
    errors = 0
    # a run that falls far behind stops at this deadline: the ticks it did not write count as
    # missed (never as fast), and `make bench` stays bounded
    deadline = t_start + 1.5 * duration + 30
    missed = 0
    try:
        k = 0
        while True:
            ts = t_start + k
            if ts >= t_start + duration:
                break
            if time.time() > deadline:
                missed += int(math.ceil(duration - k)) * len(nodes)
                break
            wait = ts - time.time()
            if wait > 0:
                time.sleep(wait)
            for n in nodes:
                if time.time() > deadline:
                    missed += 1
                    continue
                try:
                    written += st.write_ticks(f"{prefix}{n:04d}", [make_tick(ts, n, series)])
                except Exception:  # noqa: BLE001 - counted, the run goes on
                    errors += 1
                    continue
                lag = time.time() - ts
                lags.append(lag)
                worst[k] = max(worst.get(k, 0.0), lag)
            k += 1
    finally:
        st.close()
        cpu = os.times()
        out.put({"lags": lags, "worst": worst, "written": written, "errors": errors, "ticks": len(lags),
                 "missed_ticks": missed, "finished": time.time(),
                 "cpu_s": cpu.user + cpu.system - cpu0.user - cpu0.system})


# ---------------------------------------------------------------------------------------------
# the fleet page, rendered server-side and timed


def time_fleet_page(url: str) -> tuple[float, int]:
    """Seconds to build the fleet page's content (store queries + Dash components + JSON), rows shown."""
    import plotly

    from triscope.dashboard.app import create_app
    from triscope.store import Store

    st = Store.open(url)
    try:
        app = create_app(store=st)
        from triscope.dashboard.pages import fleet  # importable only once an app exists (dash.register_page)

        with app.server.test_request_context("/"):
            t = time.perf_counter()
            page = fleet.layout()
            body = json.dumps(page, cls=plotly.utils.PlotlyJSONEncoder)
            elapsed = time.perf_counter() - t
        rows = body.count('"last_seen"') - 1   # one per record, minus the column definition
        return elapsed, max(rows, 0)
    finally:
        st.close()


def _fleet_sampler(url: str, every: float, stop: threading.Event, results: list[tuple[float, int]],
                   errors: list[str]) -> None:
    while not stop.wait(every):
        try:
            results.append(time_fleet_page(url))
        except Exception as e:  # noqa: BLE001 - a failed measurement is reported in the results, not a crashed bench
            errors.append(f"{type(e).__name__}: {e}")
            return


# ---------------------------------------------------------------------------------------------
# the run


@dataclass
class LoadResult:
    nodes: int
    series: int
    duration_s: float
    workers: int
    samples_expected: int
    samples_written: int
    write_errors: int
    samples_per_s: float                   # committed samples / wall time from the first tick to the last commit
    ticks_missed: int
    wall_s: float
    lag_p50_s: float
    lag_p99_s: float
    lag_max_s: float
    start_ts: float = 0.0
    worst_lag_by_second: list[float] = field(default_factory=list)   # second k of the run -> worst lag
    fleet_page_s: list[float] = field(default_factory=list)
    fleet_page_rows: int = 0
    fleet_page_error: str = ""
    db_bytes: int = 0
    samples_bytes_per_day_est: int = 0
    postgres: str = ""
    server_cpu_s: float | None = None      # PostgreSQL processes' CPU during the timed run
    client_cpu_s: float = 0.0              # the simulated agents' CPU (on real nodes, not the DB host)

    @property
    def server_cores_used(self) -> float | None:
        return None if self.server_cpu_s is None else self.server_cpu_s / max(self.wall_s, self.duration_s)

    @property
    def server_cpu_us_per_sample(self) -> float | None:
        return None if self.server_cpu_s is None else self.server_cpu_s / max(self.samples_written, 1) * 1e6

    @property
    def kept_up(self) -> bool:
        return (self.write_errors == 0 and self.ticks_missed == 0 and self.lag_max_s < 2.0
                and self.samples_written >= 0.99 * self.samples_expected)

    def summary(self) -> str:
        fp = (f"fleet page {max(self.fleet_page_s):.2f} s max over {len(self.fleet_page_s)} renders of "
              f"{self.fleet_page_rows} nodes") if self.fleet_page_s else f"fleet page not measured {self.fleet_page_error}"
        return (f"{self.nodes} nodes x {self.series} series for {self.duration_s:.0f} s (took {self.wall_s:.0f} s, "
                f"{self.ticks_missed} ticks missed): {self.samples_per_s:,.0f} samples/s, lag p50 {self.lag_p50_s:.2f} s p99 {self.lag_p99_s:.2f} s "
                f"max {self.lag_max_s:.2f} s, {self.write_errors} errors; PostgreSQL "
                f"{self.server_cores_used if self.server_cores_used is not None else float('nan'):.2f} cores, "
                f"agents {self.client_cpu_s / max(self.wall_s, self.duration_s):.2f} cores; {fp}")


def _percentile(xs: list[float], q: float) -> float:
    if not xs:
        return math.inf
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


# points stored in the node-tick rows (the non-NULL elements), without reading them through the view
SAMPLES_STORED = "SELECT coalesce(sum(cardinality(vals) - num_nulls(VARIADIC vals)), 0) FROM sample_rows"


def run_load(url: str, nodes: int = 1000, series: int = 200, duration: float = 300.0, workers: int | None = None,
             fleet_every: float = 30.0, prefix: str = "gpu-node-") -> LoadResult:
    from sqlalchemy import text

    from triscope.store import Store
    from triscope.store.db import upgrade
    from triscope.store.partitions import ensure_partitions

    upgrade(url)
    st = Store.open(url)
    ensure_partitions(st.engine, time.time(), 3)
    workers = workers or max(2, min(8, (os.cpu_count() or 2) * 2))
    shares = [list(range(w, nodes, workers)) for w in range(workers)]
    ctx = mp.get_context("spawn")   # no inherited connections or threads
    # the workers warm up (one untimed tick per node) and wait; the timed schedule starts after
    t_warm = math.floor(time.time()) - 1
    q = ctx.Queue()
    ready = ctx.Queue()
    go = ctx.Event()
    start_at = ctx.Value("d", 0.0)
    procs = [ctx.Process(target=_worker, args=(url, s, series, t_warm, ready, go, start_at, duration, q, prefix))
             for s in shares if s]
    for p in procs:
        p.start()
    for _ in procs:
        ready.get(timeout=900)
    fleet_errors: list[str] = []
    try:   # untimed first render: imports the dashboard and builds its app in this (main) thread
        time_fleet_page(url)
    except Exception as e:  # noqa: BLE001 - a failed measurement is reported in the results, not a crashed bench
        fleet_errors.append(f"{type(e).__name__}: {e}")
    t_start = math.floor(time.time()) + 2
    start_at.value = float(t_start)
    pg_cpu0 = postgres_cpu_snapshot()
    go.set()
    stop = threading.Event()
    fleet_times: list[tuple[float, int]] = []
    sampler = threading.Thread(target=_fleet_sampler, args=(url, fleet_every, stop, fleet_times, fleet_errors),
                               daemon=True)
    time.sleep(max(0.0, t_start - time.time()))
    if not fleet_errors:
        sampler.start()
    parts = [q.get() for _ in procs]
    for p in procs:
        p.join()
    pg_cpu1 = postgres_cpu_snapshot()
    stop.set()
    if sampler.is_alive():
        sampler.join(timeout=120)
    if not fleet_times and not fleet_errors:
        try:   # the run was shorter than one sampling interval: measure once at the end
            fleet_times.append(time_fleet_page(url))
        except Exception as e:  # noqa: BLE001 - a failed measurement is reported in the results, not a crashed bench
            fleet_errors.append(f"{type(e).__name__}: {e}")
    lags = [x for p in parts for x in p["lags"]]
    wall = max(p["finished"] for p in parts) - t_start
    written = sum(p["written"] for p in parts)
    with st.engine.connect() as c:
        db_bytes = int(c.execute(text("SELECT pg_database_size(current_database())")).scalar() or 0)
        samples_bytes = int(c.execute(text(
            "SELECT coalesce(sum(pg_total_relation_size(i.inhrelid)), 0) FROM pg_inherits i "
            "JOIN pg_class p ON p.oid = i.inhparent WHERE p.relname = 'sample_rows'")).scalar() or 0)
        n_samples = int(c.execute(text(SAMPLES_STORED)).scalar() or 0)
        version = str(c.execute(text("SHOW server_version")).scalar())
    st.close()
    per_day = int(samples_bytes / max(n_samples, 1) * nodes * series * 86400)
    return LoadResult(
        nodes=nodes, series=series, duration_s=duration, workers=len(procs),
        samples_expected=int(nodes * series * duration), samples_written=written,
        write_errors=sum(p["errors"] for p in parts),
        samples_per_s=written / max(wall, duration), ticks_missed=sum(p["missed_ticks"] for p in parts), wall_s=wall,
        lag_p50_s=statistics.median(lags) if lags else math.inf, lag_p99_s=_percentile(lags, 0.99),
        lag_max_s=max(lags) if lags else math.inf,
        start_ts=t_start,
        worst_lag_by_second=[round(max(p["worst"].get(k, 0.0) for p in parts), 3) for k in range(int(duration))],
        fleet_page_s=[t for t, _ in fleet_times], fleet_page_rows=max((r for _, r in fleet_times), default=0),
        fleet_page_error="; ".join(fleet_errors), db_bytes=db_bytes, samples_bytes_per_day_est=per_day,
        postgres=version,
        server_cpu_s=postgres_cpu_between(pg_cpu0, pg_cpu1),
        client_cpu_s=sum(p["cpu_s"] for p in parts))


def postgres_cpu_snapshot() -> dict[tuple[int, int], float] | None:
    """CPU seconds so far of every PostgreSQL process on this machine, by (pid, start time).

    Each process counts its own time plus its reaped children's (a postmaster collects its
    exited backends'), so the time of a backend that ends inside the window is not lost.
    """
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[tuple[int, int], float] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            if (d / "comm").read_text().strip() not in ("postgres", "postmaster"):
                continue
            f = (d / "stat").read_text().rsplit(")", 1)[1].split()
            # utime stime cutime cstime, start time
            out[(int(d.name), int(f[19]))] = (int(f[11]) + int(f[12]) + int(f[13]) + int(f[14])) / tick
        except (OSError, ValueError, IndexError):
            continue
    return out or None


def postgres_cpu_between(before: dict[tuple[int, int], float] | None,
                         after: dict[tuple[int, int], float] | None) -> float | None:
    """CPU the PostgreSQL processes used between two snapshots.  A process that ended in between
    (another cluster shutting down) drops out instead of making the figure negative."""
    if before is None or after is None:
        return None
    return sum(cpu - before.get(key, 0.0) for key, cpu in after.items())


def find_capacity(trial: Any, start: int = 50, limit: int = 4000, refine: int = 2) -> tuple[int, list[tuple[int, bool]]]:
    """Largest node count for which ``trial(nodes) -> bool`` (kept up) holds: doubling from ``start``
    until a failure or ``limit``, then ``refine`` bisection steps.  Returns (nodes, trials run)."""
    tried: list[tuple[int, bool]] = []
    ok, bad = 0, None
    n = start
    while n <= limit:
        good = bool(trial(n))
        tried.append((n, good))
        if not good:
            bad = n
            break
        ok = n
        n *= 2
    for _ in range(refine if bad is not None else 0):
        mid = (ok + bad) // 2 if bad is not None else ok
        if mid in (ok, bad):
            break
        good = bool(trial(mid))
        tried.append((mid, good))
        if good:
            ok = mid
        else:
            bad = mid
    return ok, tried


class PrivatePostgres:
    """A throw-away PostgreSQL (tests/conftest.PostgresServer), tuned like a fleet telemetry server."""

    def __init__(self) -> None:
        sys.path.insert(0, str(REPO / "tests"))
        from conftest import PostgresServer  # type: ignore[import-not-found]

        self.server = PostgresServer()
        with open(self.server.data / "postgresql.conf", "a") as f:
            # a quarter of the RAM for shared buffers (the usual sizing, at most 8 GB): the hot
            # leaf pages of the samples primary key (one insertion point per series) stay cached;
            # WAL room for the run, and lz4 for the full-page images a checkpoint makes the next
            # touch of every hot page write (pglz: a 9-11 s lag step at the first checkpoint of a
            # 1,000-node run; lz4: 1-3 s; docs/scaling.md)
            mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
            sb = max(256, min(8192, mem // 4 // 2**20))
            f.write("\nfsync = on\nfull_page_writes = on\nsynchronous_commit = off\nwal_compression = lz4\n"
                    f"shared_buffers = {sb}MB\nmax_wal_size = 16GB\ncheckpoint_timeout = 15min\nwork_mem = 16MB\n")
        self.server.stop()
        self.server.start()
        self.url = self.server.create_database("loadgen")

    def close(self) -> None:
        self.server.destroy()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.loadgen", description=__doc__.split("\n\n")[0])
    p.add_argument("--db", help="PostgreSQL URL (default: start a private server)")
    p.add_argument("--nodes", type=int, default=None, help="simulated nodes (default 1000; --quick 100)")
    p.add_argument("--series", type=int, default=200, help="series per node (default 200)")
    p.add_argument("--duration", type=float, default=None, help="seconds of load (default 300; --quick 20)")
    p.add_argument("--workers", type=int, default=None, help="writer processes (default 2 x CPUs, 2..8)")
    p.add_argument("--fleet-every", type=float, default=None, help="seconds between fleet page renders")
    p.add_argument("--quick", action="store_true", help="100 nodes for 20 s")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--find-capacity", action="store_true",
                   help="search the largest node count that keeps every tick's lag under 2 s (doubling from 50, "
                        "then bisecting; each trial runs --duration seconds, default 30, on a fresh private "
                        "server, or on --db with new node names)")
    a = p.parse_args(argv)
    nodes = a.nodes or (100 if a.quick else 1000)
    duration = a.duration or (20.0 if a.quick else 300.0)
    if nodes < 1 or a.series < 1 or duration <= 0:
        p.error("--nodes, --series and --duration must be positive")
    if a.find_capacity:
        return _capacity_main(a.db, a.series, a.duration or 30.0, a.workers, a.json)
    pg = None
    url = a.db
    if url is None:
        pg = PrivatePostgres()
        url = pg.url
    elif not url.startswith(("postgresql", "postgres")):
        p.error("--db must be a PostgreSQL URL (the fleet store)")
    try:
        res = run_load(url, nodes, a.series, duration, a.workers,
                       a.fleet_every or (duration / 2 if a.quick else 30.0))
    finally:
        if pg:
            pg.close()
    if a.json:
        print(json.dumps(asdict(res) | {"kept_up": res.kept_up, "server_cores_used": res.server_cores_used,
                                        "server_cpu_us_per_sample": res.server_cpu_us_per_sample}, indent=2))
    else:
        print(res.summary())
    return 0 if res.kept_up else 1


def _capacity_main(db: str | None, series: int, duration: float, workers: int | None, as_json: bool) -> int:
    results: list[dict[str, Any]] = []

    def trial(n: int) -> bool:
        pg = PrivatePostgres() if db is None else None
        try:
            url = pg.url if pg else str(db)
            # a fresh node-name prefix per trial, so trials on a given --db do not share nodes
            res = run_load(url, n, series, duration, workers, fleet_every=1e9, prefix=f"cap{n}-")
        finally:
            if pg:
                pg.close()
        results.append({"nodes": n, "kept_up": res.kept_up, "lag_max_s": res.lag_max_s,
                        "lag_p99_s": res.lag_p99_s, "server_cpu_us_per_sample": res.server_cpu_us_per_sample})
        print(res.summary(), file=sys.stderr, flush=True)
        return res.kept_up

    best, _ = find_capacity(trial)
    if as_json:
        print(json.dumps({"capacity_nodes": best, "series": series, "trials": results}, indent=2))
    else:
        print(f"largest fleet that kept every tick under 2 s: {best} nodes x {series} series at 1 Hz")
    return 0


if __name__ == "__main__":
    sys.exit(main())
