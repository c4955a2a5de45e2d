"""Workload attribution and per-workload host evidence: what it costs the agent's tick, and its memory.

Set-up, all real on this machine: 8 GPUs x 16 processes = 128 processes of 64 threads each
(forked from one small launcher: 63 threads asleep, the main thread asleep too, except in two
"busy" processes whose main thread spins ~90 % of a core and one "warm" one at ~20 %), each moved
into its own container cgroup in the kubelet's systemd layout (under ``triscope-bench.slice/``,
so a real ``kubepods.slice`` is never touched), a ``/var/log/pods``-shaped tree naming every pod,
and a process list standing in for NVML's (``ListedProcessSource`` with the real PIDs: the GPUs
are the only part that is not here).

* **Tick cost**: the thread CPU of the workloads collector's ``collect()`` per 1 s tick (median
  over the ticks; target <= 1 ms), beside the same tick without it (the host collectors the agent
  runs here: tcp, cpu, pressure, pcie, aer).  Also the same tick reading every process every tick
  (``quiet_every=1``, what the quiet-process rotation saves) and the worker's CPU off the tick.
* **Process sets**: 8 GPU processes with 16 loader workers each, every one read every tick (the
  targets: on 2 cores the loaders cannot all be above the rotation's quiet bar, so the rotation is
  switched off rather than defeated), beside the default rotation.
* **Memory**: ``triscope agent`` (the console script, all collectors, as bench_ebpf's footprint
  runs it) RSS with the collector following those 128 processes (the listed source standing in
  for NVML's, swapped into the registry by a ``sitecustomize``) vs ``--no-workloads``.
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
import uuid
from pathlib import Path
from typing import Any

from bench.common import Row

ROOT = Path(__file__).resolve().parents[1]
GPUS, PER_GPU, THREADS = 8, 16, 64

FARM = r"""
import os, sys, threading, time
n, threads, roles = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3].split(",")
def child(role):
    ev = threading.Event()
    for _ in range(threads - 1):
        threading.Thread(target=ev.wait, daemon=True).start()
    duty = float(role) if role else 0.0
    if not duty:
        ev.wait()
    period = 0.01
    while True:
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < duty * period:
            pass
        time.sleep(period * (1 - duty))
pids = []
for i in range(n):
    pid = os.fork()
    if pid == 0:
        child(roles[i] if i < len(roles) else "")
        os._exit(0)
    pids.append(pid)
print(" ".join(map(str, pids)), flush=True)
sys.stdin.read()
for p in pids:
    os.kill(p, 9)
for p in pids:
    os.waitpid(p, 0)
"""

# `triscope agent` itself (the console script, as bench_ebpf's footprint runs it), its workloads
# collector fed by a list standing in for NVML's: a sitecustomize on PYTHONPATH swaps the registry's
# source before the command starts (the GPUs are the only part that is not here)
SITECUSTOMIZE = r"""
import json, os
if os.environ.get("TRISCOPE_BENCH_ROWS"):
    from triscope.agent import registry
    from triscope.agent.workloads.accelprocs import AcceleratorProcess, ListedProcessSource, gpu_labels

    def _workloads(opts, npu, ebpf=None):
        from triscope.agent.workloads.collector import WorkloadsCollector

        with open(os.environ["TRISCOPE_BENCH_ROWS"]) as f:
            rows = [AcceleratorProcess(gpu_labels(g), u, p, str(g), s) for g, u, p, s in json.load(f)]
        return WorkloadsCollector([ListedProcessSource(rows, name="nvml")], proc=opts.proc, sys=opts.sys,
                                  pod_resources_socket=opts.pod_resources_socket,
                                  pods_log_dir=os.environ["TRISCOPE_BENCH_PODS"])

    registry._workloads = _workloads
"""


class Farm:
    """The 128 processes, their cgroups and the pod log tree; ``close()`` removes all of it."""

    def __init__(self, tmp: Path) -> None:
        from triscope.agent.workloads.cgroups import unified_root

        n = GPUS * PER_GPU
        self.proc = subprocess.Popen([sys.executable, "-c", FARM, str(n), str(THREADS), "0.9,0.9,0.2"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        self.pids = [int(p) for p in self.proc.stdout.readline().split()]
        self.logs = tmp / "pods"
        self.made: list[Path] = []
        self.rows: list[tuple[int, str, int, float]] = []
        root = unified_root("/sys")
        self.cgroups = False
        base = Path(root) / "triscope-bench.slice" if root and os.geteuid() == 0 else None
        for i, pid in enumerate(self.pids):
            g, k = divmod(i, PER_GPU)
            uid = str(uuid.uuid4())
            (self.logs / f"bench_gpu{g}-p{k}_{uid}" / "worker").mkdir(parents=True)
            sm = 0.3 if k == 0 else (0.1 if k == 1 else 0.0)   # two of the sixteen use the SMs at a time
            self.rows.append((g, f"GPU-{g:08x}-0000-4000-8000-000000000000", pid, sm))
            if base is None:
                continue
            u = uid.replace("-", "_")
            rel = (f"kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{u}.slice/"
                   f"cri-containerd-{uuid.uuid4().hex}{uuid.uuid4().hex}.scope")
            try:
                self._put(base / rel, pid)
                self.cgroups = True
            except OSError:
                break
        for _ in range(50):          # every child has started its 64 threads
            if all(len(os.listdir(f"/proc/{p}/task")) >= THREADS for p in self.pids):
                break
            time.sleep(0.1)

    def _put(self, d: Path, pid: int) -> None:
        missing = []
        p = d
        while not p.exists():
            missing.append(p)
            p = p.parent
        for m in reversed(missing):
            m.mkdir()
            self.made.append(m)
        (d / "cgroup.procs").write_text(str(pid))

    def close(self) -> None:
        with contextlib.suppress(Exception):
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            self.proc.wait(30)
        for d in sorted(self.made, key=lambda p: len(p.parts), reverse=True):
            for _ in range(100):
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.05)


def _worker_cpu(c) -> float:  # type: ignore[no-untyped-def]
    t = getattr(c, "_thread", None)
    if t is None or t.ident is None:
        return 0.0
    try:
        return time.clock_gettime(time.pthread_getcpuclockid(t.ident))
    except (OSError, AttributeError):
        return 0.0


def tick_cost(farm: Farm, n_ticks: int, quiet_every: int, sys_root: str | None = None) -> dict[str, float]:
    """The tick's and the worker's CPU; with ``sys_root`` each GPU has a PCI address whose local CPUs
    and NUMA node that tree gives, so the placement (NUMA locality) is read too."""
    from triscope.agent.registry import AgentOptions, build_collectors, split_available
    from triscope.agent.workloads.accelprocs import AcceleratorProcess, ListedProcessSource, gpu_labels
    from triscope.agent.workloads.collector import WorkloadsCollector

    base, _ = split_available(build_collectors(AgentOptions(ebpf=False, nvml=False, npu=False, workloads=False)))
    rows = [AcceleratorProcess(gpu_labels(g), u, p, str(g), s, bus_id=f"0000:{0x1b + g:02x}:00.0" if sys_root else "")
            for g, u, p, s in farm.rows]
    c = WorkloadsCollector([ListedProcessSource(rows, name="nvml")], pods_log_dir=str(farm.logs),
                           pod_resources_socket="/nonexistent/kubelet.sock", sys=sys_root or "/sys",
                           placement_every=10.0 if sys_root else 0.0)
    c.stats.quiet_every = quiet_every
    wl, bl, procs, threads, samples = [], [], [], [], []
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not list(c.collect(time.time())):
            time.sleep(0.2)          # the worker's first round (the process list, attribution)
        for _ in range(3):           # every process's first read (its baseline) and the first busy round
            time.sleep(1)
            list(c.collect(time.time()))
        w0, t_start = _worker_cpu(c), time.monotonic()
        for _ in range(n_ticks):
            time.sleep(1)
            t0 = time.thread_time()
            for b in base:
                with contextlib.suppress(Exception):
                    list(b.collect(time.time()))
            t1 = time.thread_time()
            got = list(c.collect(time.time()))
            t2 = time.thread_time()
            bl.append(t1 - t0)
            wl.append(t2 - t1)
            procs.append(c.stats.processes_read)
            threads.append(c.stats.threads_read)
            samples.append(len(got))
        worker = (_worker_cpu(c) - w0) / (time.monotonic() - t_start)
    finally:
        c.close()
        for b in base:
            with contextlib.suppress(Exception):
                b.close()
    q = statistics.quantiles(wl, n=20) if len(wl) >= 2 else wl
    return {"median": statistics.median(wl), "p95": q[-1], "base": statistics.median(bl),
            "procs": statistics.median(procs), "threads": statistics.median(threads),
            "threads_max": max(threads), "samples": statistics.median(samples), "worker": worker}


LOADERS = r"""
import os, sys, time
gpus, workers, duty = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
def spin():
    period = 0.02
    while True:
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < duty * period:
            pass
        time.sleep(period * (1 - duty))
leaders = []
for g in range(gpus):
    pid = os.fork()
    if pid == 0:
        for w in range(workers):
            if os.fork() == 0:
                spin()
        spin()
    leaders.append(pid)
print(" ".join(map(str, leaders)), flush=True)
sys.stdin.read()
"""


class LoaderFarm:
    """8 GPU processes, each with 16 DataLoader-style worker processes forked from it (no GPU, so
    only the 8 are listed): every process busy ``duty`` of each 20 ms, all of them every tick, the
    whole farm held under 1.5 cores of this 2-core machine."""

    def __init__(self, duty: float) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", LOADERS, str(GPUS), str(PER_GPU), str(duty)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True)
        assert self.proc.stdout is not None
        self.leaders = [int(p) for p in self.proc.stdout.readline().split()]
        self.rows = [(g, f"GPU-{g:08x}-0000-4000-8000-000000000000", pid, 0.2) for g, pid in enumerate(self.leaders)]
        time.sleep(1.0)

    def close(self) -> None:
        import signal

        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(Exception):
            self.proc.wait(10)


def process_set_cost(farm: LoaderFarm, n_ticks: int, whole_set: bool, quiet_every: int = 5) -> dict[str, float]:
    """Tick and worker CPU of the workloads collector over the loader farm: following each GPU
    process's whole process set (its 16 workers found as its descendants), or the GPU process alone."""
    from triscope.agent.workloads.accelprocs import AcceleratorProcess, ListedProcessSource, gpu_labels
    from triscope.agent.workloads.collector import WorkloadsCollector

    rows = [AcceleratorProcess(gpu_labels(g), u, p, str(g), s) for g, u, p, s in farm.rows]
    c = WorkloadsCollector([ListedProcessSource(rows, name="nvml")], pods_log_dir="/nonexistent/pods",
                           pod_resources_socket="/nonexistent/kubelet.sock",
                           max_processes_per_workload=64 if whole_set else 1)
    c.stats.quiet_every = quiet_every
    ticks, procs = [], []
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not list(c.collect(time.time())):
            time.sleep(0.2)
        for _ in range(3):
            time.sleep(1)
            list(c.collect(time.time()))
        w0, t_start = _worker_cpu(c), time.monotonic()
        for _ in range(n_ticks):
            time.sleep(1)
            t0 = time.thread_time()
            got = list(c.collect(time.time()))
            ticks.append(time.thread_time() - t0)
            procs.append(sum(s.value for s in got if getattr(s, "name", "") == "triscope_workload_processes"))
        worker = (_worker_cpu(c) - w0) / (time.monotonic() - t_start)
    finally:
        c.close()
    return {"median": statistics.median(ticks), "p99": max(ticks) if len(ticks) < 100 else
            statistics.quantiles(ticks, n=100)[-1], "worker": worker, "procs": statistics.median(procs)}


def footprint(farm: Farm, tmp: Path, window: float, workloads: bool) -> tuple[float, str]:
    from bench.common import AgentProcess, listed_process_env

    env = listed_process_env(tmp, farm.rows, farm.logs)
    try:
        with AgentProcess(tmp, str(int(workloads)), [] if workloads else ["--no-workloads"], env,
                          duration=window + 40) as agent:
            # warm: the worker's first rounds, every process's baseline; /metrics read once a second
            cost = agent.cost(window, warm=10.0, scrape=[])
            text = agent.metrics()
    except RuntimeError as e:
        return float("nan"), str(e)[-300:]
    series = sum(1 for line in text.splitlines() if line.startswith("triscope_workload_processes{"))
    probes = sum(1 for line in text.splitlines()
                 if line.startswith("triscope_probe_attached{") and line.rstrip().endswith(" 1.0"))
    return cost.rss_max, f"{series} workload series, {probes} probes attached"


def _gpu_tree(tmp: Path) -> str:
    """A sysfs tree giving each farm GPU a PCI address, local CPUs (CPU 0) and NUMA node 0."""
    for g in range(GPUS):
        d = tmp / "sys" / "bus/pci/devices" / f"0000:{0x1b + g:02x}:00.0"
        d.mkdir(parents=True, exist_ok=True)
        (d / "local_cpulist").write_text("0\n")
        (d / "numa_node").write_text("0\n")
    return str(tmp / "sys")


def _numa_maps_cost(pids: list[int]) -> float:
    from triscope.agent.workloads.placement import numa_pages

    t0 = time.thread_time()
    for p in pids:
        numa_pages("/proc", p)
    return time.thread_time() - t0


TIME_WAIT_SOCKETS = 2000


def _tcp_read_cost(reps: int) -> dict[str, float]:
    """Thread CPU of one per-workload TCP read, three ways, over 32 loopback connections of this
    process (64 sockets) and whatever else the host holds: a workload's 16 sockets asked for alone
    (``tcp_lookup``, what the worker does), one dump of the whole table for both families
    (``TCPDIAG_GETSOCK``), and one dump per family (the fallback).  The dump of the states a process
    can hold (``DUMP_STATES``) against the same with ``BOUND_INACTIVE``; then, with ``TIME_WAIT``
    connections closed by this side (a service opening a connection per request), against the same
    with ``TIME_WAIT``, and against every state (the agent before)."""
    import socket

    from triscope.agent.workloads.sockdiag import (
        ALL_STATES,
        DUMP_STATES,
        TCP_BOUND_INACTIVE,
        TCP_TIME_WAIT,
        SockKey,
        tcp_counters,
        tcp_lookup,
    )

    lst = socket.socket()
    lst.bind(("127.0.0.1", 0))
    lst.listen(64)
    socks: list[socket.socket] = [lst]
    for _ in range(32):
        c = socket.create_connection(lst.getsockname())
        a, _ = lst.accept()
        socks += [c, a]
    try:
        keys: dict[int, SockKey] = {}
        table = tcp_counters(keys=keys)
        mine = {os.fstat(s.fileno()).st_ino for s in socks[1:17]}
        want = {i: keys[i] for i in mine if i in keys}

        def median(fn: Any) -> float:
            out = []
            for _ in range(reps):
                t0 = time.thread_time()
                fn()
                out.append(time.thread_time() - t0)
            return statistics.median(out)

        got = {"lookup": median(lambda: tcp_lookup(want)), "both": median(tcp_counters),
               "apart": median(lambda: (tcp_counters((socket.AF_INET,)), tcp_counters((socket.AF_INET6,)))),
               "asked": len(want), "table": len(table)}
        # the bind table (kernel 6.8+), walked whatever it holds when BOUND_INACTIVE is asked for
        got["bind_asked"] = median(lambda: tcp_counters(states=DUMP_STATES | 1 << TCP_BOUND_INACTIVE))
        for _ in range(TIME_WAIT_SOCKETS):
            c = socket.create_connection(lst.getsockname())
            a, _ = lst.accept()
            c.close()           # the active close: c's side waits in TIME_WAIT for a minute
            a.close()
        got["tw_live"] = median(tcp_counters)
        got["tw_asked"] = median(lambda: tcp_counters(states=DUMP_STATES | 1 << TCP_TIME_WAIT))
        got["tw_all"] = median(lambda: tcp_counters(states=ALL_STATES))
        return got
    finally:
        for s in socks:
            s.close()


def run(quick: bool = False) -> list[Row]:
    if not sys.platform.startswith("linux"):
        return [Row("workloads", "needs Linux procfs", float("nan"), "", ok=False)]
    n_ticks = 8 if quick else 20
    window = 15.0 if quick else 45.0
    with tempfile.TemporaryDirectory(prefix="bench-wl-") as td:
        tmp = Path(td)
        farm = Farm(tmp)
        try:
            load = os.getloadavg()[0]
            tcp = _tcp_read_cost(20 if quick else 50)
            cost = tick_cost(farm, n_ticks, quiet_every=5)
            placed = tick_cost(farm, n_ticks, quiet_every=5, sys_root=_gpu_tree(tmp))
            maps_s = _numa_maps_cost(farm.pids)
            every = tick_cost(farm, max(4, n_ticks // 2), quiet_every=1)
            loaders = LoaderFarm(duty=0.008)
            try:
                # every process read every tick (issue 42: on 2 cores the 136 loaders get ~0.015 core
                # each, under the 0.05-core quiet bar, so loading them cannot defeat the rotation)
                whole_all = process_set_cost(loaders, n_ticks, whole_set=True, quiet_every=1)
                alone = process_set_cost(loaders, n_ticks, whole_set=False, quiet_every=1)
                whole = process_set_cost(loaders, n_ticks, whole_set=True)
                load = max(load, os.getloadavg()[0])
            finally:
                loaders.close()
            rss_on, on_note = footprint(farm, tmp, window, workloads=True)
            rss_off, _ = footprint(farm, tmp, window, workloads=False)
            load = max(load, os.getloadavg()[0])
        finally:
            farm.close()
            shutil.rmtree(tmp / "spool", ignore_errors=True)
    where = (f"{GPUS} GPUs x {PER_GPU} processes x {THREADS} threads, each in its own pod cgroup"
             if farm.cgroups else f"{GPUS} GPUs x {PER_GPU} processes x {THREADS} threads (no cgroups: not root)")
    ms = 1e3
    return [
        Row("workloads tick", f"collect() thread CPU per 1 s tick, median of {n_ticks} ({where}; "
            f"{cost['procs']:.0f} processes and {cost['threads']:.0f} threads read per tick, "
            f"{cost['samples']:.0f} samples; load avg {load:.1f} on {os.cpu_count()} cpu)",
            round(cost["median"] * ms, 3), "ms", "<= 1", "the same tick without it (tcp, cpu, pressure, pcie, aer)",
            round(cost["base"] * ms, 3), cost["median"] <= 0.001),
        Row("workloads tick", "collect() thread CPU per tick, p95", round(cost["p95"] * ms, 3), "ms"),
        Row("workloads tick", f"every process read every tick (quiet_every=1; {every['procs']:.0f} processes)",
            round(every["median"] * ms, 3), "ms", "", "quiet processes in rotation (the default: every 5th tick, at most 12 a tick)",
            round(cost["median"] * ms, 3)),
        Row("workloads refresh", "worker CPU off the tick (process list, cgroups, attribution, threads, "
            "cpu.pressure), per second", round(cost["worker"] * ms, 3), "ms/s"),
        Row("workloads placement", f"collect() thread CPU per 1 s tick with the NUMA locality series, median of "
            f"{n_ticks} ({placed['samples']:.0f} samples)", round(placed["median"] * ms, 3), "ms",
            f"<= base + 0.1 ({(cost['median'] + 1e-4) * ms:.3f})", "without them (the same farm, same run)",
            round(cost["median"] * ms, 3), placed["median"] <= cost["median"] + 1e-4),
        Row("workloads placement", "worker CPU off the tick with the placement (each process's stat, a busy one's busiest "
            "threads, every 10 s), "
            "per second", round(placed["worker"] * ms, 3), "ms/s", "", "without it", round(cost["worker"] * ms, 3)),
        Row("workloads placement", f"numa_maps of the {len(farm.pids)} farm processes, one round (every 60 s, "
            "off the tick)", round(maps_s * ms, 2), "ms"),
        Row("workloads process set", f"collect() thread CPU per 1 s tick, median of {n_ticks}: {GPUS} GPU processes "
            f"each with {PER_GPU} loader workers found as its descendants ({whole_all['procs']:.0f} processes followed, "
            "every one read every tick (quiet_every=1), each busy every 20 ms, the farm under 1.5 cores)",
            round(whole_all["median"] * ms, 3), "ms", "<= 1", "the GPU processes alone, every tick",
            round(alone["median"] * ms, 3), whole_all["median"] <= 0.001),
        Row("workloads process set", "collect() thread CPU per tick, every process every tick, worst of the run "
            "(p99 target)", round(whole_all["p99"] * ms, 3), "ms", "<= 2", "the GPU processes alone",
            round(alone["p99"] * ms, 3), whole_all["p99"] <= 0.002),
        Row("workloads process set", "worker CPU off the tick (process tree, cgroups, sock_diag and fds every 5 s), "
            "per second", round(whole_all["worker"] * ms, 3), "ms/s", "<= 2", "the GPU processes alone",
            round(alone["worker"] * ms, 3), whole_all["worker"] <= 0.002),
        Row("workloads process set", f"the default rotation: each loader (~0.015 core, under the 0.05-core quiet bar) "
            f"read every {max(5, -(-int(whole['procs']) // 12))}th tick (at most 12 quiet ones a tick), so its figure "
            "is up to that many seconds old; its next read carries the whole delta", round(whole["median"] * ms, 3),
            "ms", "", "every process every tick", round(whole_all["median"] * ms, 3)),
        Row("workloads tcp", f"per-workload TCP read, thread CPU, median: a workload's {tcp['asked']:.0f} sockets "
            f"asked for alone (sock_diag exact requests; {tcp['table']:.0f} TCP sockets on the host)",
            round(tcp["lookup"] * ms, 3), "ms", "", "the whole table, one dump for both families (read every 5 s before)",
            round(tcp["both"] * ms, 3)),
        Row("workloads tcp", "the whole table, one dump for both families (TCPDIAG_GETSOCK), thread CPU, median",
            round(tcp["both"] * ms, 3), "ms", "", "one dump per family (the fallback; the agent's route before 2026-12-05)",
            round(tcp["apart"] * ms, 3)),
        Row("workloads tcp", "the whole table, the states a process holds, thread CPU, median (no TIME_WAIT added)",
            round(tcp["both"] * ms, 3), "ms", "", "BOUND_INACTIVE asked for as well (the kernel walks its bind table)",
            round(tcp["bind_asked"] * ms, 3)),
        Row("workloads tcp", f"the whole table with {TIME_WAIT_SOCKETS:,} more in TIME_WAIT, the states a process holds "
            "(sock_diag's state filter), thread CPU, median",
            round(tcp["tw_live"] * ms, 3), "ms", "", "TIME_WAIT asked for as well", round(tcp["tw_asked"] * ms, 3)),
        Row("workloads tcp", f"the same table ({TIME_WAIT_SOCKETS:,} in TIME_WAIT), the states a process holds, "
            "thread CPU, median", round(tcp["tw_live"] * ms, 3), "ms", "", "every state (the agent before)",
            round(tcp["tw_all"] * ms, 3)),
        Row("workloads footprint", f"agent steady RSS, workloads on ({on_note}; max over {window:.0f} s)",
            round(rss_on, 1), "MB", "<= 60", "--no-workloads, same agent", round(rss_off, 1), rss_on <= 60),
    ]
