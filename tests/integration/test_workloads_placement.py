"""Where a workload runs against its accelerator's NUMA node: real threads pinned to one CPU of
this machine, read through a sysfs tree that says which CPUs are the accelerator's (this machine
has one NUMA node: the tree stands in for the second socket); the parsing on procfs-shaped text;
and the verdict and root cause it feeds."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from workloads_helpers import spawn, stop

from triscope.agent.workloads.accelprocs import AcceleratorProcess, ListedProcessSource, gpu_labels
from triscope.agent.workloads.collector import WorkloadsCollector
from triscope.agent.workloads.placement import WorkloadPlacement, numa_pages
from triscope.analysis.config import MismatchThresholds
from triscope.analysis.features import AcceleratorFeatures, WindowFeatures, WorkloadEvidence, WorkloadKey
from triscope.analysis.verdict import classify_accelerator
from triscope.core.metrics import CATALOGUE
from triscope.core.samples import Sample

BUS = "0000:1b:00.0"
CPUS = sorted(os.sched_getaffinity(0))
two_cpus = pytest.mark.skipif(len(CPUS) < 2, reason="needs two CPUs to pin a feeder away from the accelerator's")


def sysfs(tmp: Path, local: str, node: int = 0) -> str:
    d = tmp / "sys" / "bus/pci/devices" / BUS
    d.mkdir(parents=True, exist_ok=True)
    (d / "local_cpulist").write_text(local + "\n")
    (d / "numa_node").write_text(f"{node}\n")
    return str(tmp / "sys")


def _collect(sys_root: str, pid: int) -> dict[str, float]:
    c = WorkloadsCollector([ListedProcessSource([AcceleratorProcess(gpu_labels(0), "GPU-a", pid, "0", bus_id=BUS)])],
                           sys=sys_root, background=False, pod_resources_socket="/nonexistent/kubelet.sock")
    try:
        c.refresh(force=True)              # the threads' baseline
        time.sleep(1.5)
        c.refresh(force=True)
        got = {s.name: s.value for s in c.collect(time.time()) if isinstance(s, Sample)}
        assert all(n in CATALOGUE for n in got)
        return got
    finally:
        c.close()


@two_cpus
@pytest.mark.parametrize("where", ["remote", "local"])
def test_a_feeder_pinned_off_its_accelerators_cpus_reads_remote(tmp_path: Path, where: str) -> None:
    run_on, other = CPUS[-1], CPUS[0]
    # the main thread spins too: a process below busy_cores counts where its main thread last ran, and a
    # main thread asleep since before the pinning would still show the CPU it ran on then
    p = spawn(sleepers=2, spinners=2, leader="spin", cpus={run_on})
    try:
        got = _collect(sysfs(tmp_path, str(other if where == "remote" else run_on)), p.pid)
    finally:
        stop(p)
    cpu_local = got["triscope_workload_cpu_local_ratio"]
    assert cpu_local == (pytest.approx(0.0, abs=0.05) if where == "remote" else pytest.approx(1.0, abs=0.05))
    # pinned (taskset-style affinity): none of the CPUs it may use are local, or all of them
    assert got["triscope_workload_cpus_allowed_local_ratio"] == (0.0 if where == "remote" else 1.0)
    # one NUMA node here: every page is on it
    assert got["triscope_workload_memory_local_ratio"] == pytest.approx(1.0)


def test_unknown_cpus_and_node_say_nothing(tmp_path: Path) -> None:
    d = tmp_path / "sys" / "bus/pci/devices" / BUS
    d.mkdir(parents=True)
    (d / "numa_node").write_text("-1\n")       # a VM: no NUMA information, no local_cpulist
    p = spawn(spinners=1)
    try:
        got = _collect(str(tmp_path / "sys"), p.pid)
    finally:
        stop(p)
    assert "triscope_workload_cpu_local_ratio" not in got and "triscope_workload_memory_local_ratio" not in got


def _stat(pid: int, ticks: int, cpu: int, threads: int = 1) -> str:
    fields = ["S"] + ["0"] * 37
    fields[11], fields[17], fields[36] = str(ticks), str(threads), str(cpu)
    return f"{pid} (python3) {' '.join(fields)}\n"


def _proc_tree(root: Path, threads: dict[int, tuple[int, int]], maps: str) -> None:
    """/proc/100 with threads {tid: (utime + stime ticks, the CPU it last ran on)}; 100 is the main one."""
    for tid, (ticks, cpu) in threads.items():
        d = root / "100" / "task" / str(tid)
        d.mkdir(parents=True, exist_ok=True)
        (d / "stat").write_text(_stat(tid, ticks, cpu))
    total = sum(t for t, _c in threads.values())
    (root / "100" / "stat").write_text(_stat(100, total, threads[100][1], len(threads)))
    (root / "100" / "numa_maps").write_text(maps)


def test_cpu_time_is_weighted_by_where_each_thread_ran_and_pages_by_node(tmp_path: Path) -> None:
    from conftest import FIXTURES

    dgx = str(FIXTURES / "sysfs-dgx-h100")         # GPU 0000:1b:00.0: node 0, CPUs 0-55,112-167
    proc = tmp_path / "proc"
    maps = ("7f00 default anon=1000 dirty=1000 N0=250 N1=750 kernelpagesize_kB=4\n"
            "7f10 default file=/usr/lib/libc.so.6 mapped=50 N1=50 kernelpagesize_kB=4\n"       # not counted
            "7f20 default file=/dev/nvidiactl mapped=512 N0=512 kernelpagesize_kB=2048\n")     # pinned host memory
    _proc_tree(proc, {100: (1000, 3), 101: (500, 60), 102: (10, 61)}, maps)
    now = [0.0]
    pl = WorkloadPlacement(str(proc), dgx, every=10.0, min_cpu_s=0.0, clock=lambda: now[0])
    pl.read({"k": (BUS, [100])})
    assert pl.get("k") is not None and pl.get("k").cpu_local is None        # a baseline
    _proc_tree(proc, {100: (2000, 3), 101: (3500, 60), 102: (10, 61)}, maps)   # 1000 ticks on CPU 3, 3000 on CPU 60
    now[0] = 10.0
    pl.read({"k": (BUS, [100])})
    placed = pl.get("k")
    assert placed is not None and placed.cpu_local == pytest.approx(0.25)
    _proc_tree(proc, {100: (3000, 3), 101: (6500, 60), 102: (10, 61)}, maps)
    now[0] = 20.0
    pl.read({"k": (BUS, [100])})
    assert pl.get("k").cpu_local == pytest.approx(0.25)
    assert pl.threads_read == 2          # the two that ran last time, not the sleeper: 90 % was placed
    # a process below busy_cores counts where its main thread ran, its threads unread
    _proc_tree(proc, {100: (3001, 3), 101: (6501, 60), 102: (10, 61)}, maps)
    now[0] = 30.0
    pl.min_cpu_s = 0.0
    pl.read({"k": (BUS, [100])})
    assert pl.threads_read == 0 and pl.get("k").cpu_local == pytest.approx(1.0)
    by = numa_pages(str(proc), 100)
    assert by == {0: 250 * 4096 + 512 * 2048 * 1024, 1: 750 * 4096}
    assert placed.mem_local == pytest.approx(by[0] / (by[0] + by[1]))      # read with the first round


def _verdict(cpu_local: float | None, mem_local: float | None = None, cores: float = 1.0,
             allowed_local: float | None = None) -> tuple[str, list[str]]:
    key: WorkloadKey = ("inference", "vit-0", "server", "Deployment/vit")
    w = WorkloadEvidence(key, feeder=0.45, cpu_wait=0.02, cpu_pressure=0.0, cores=cores, cpu_local=cpu_local,
                         mem_local=mem_local, allowed_local=allowed_local)
    acc = AcceleratorFeatures("gpu=0", busy=0.15, link_bytes_per_second=2.0e9, link_ceiling=50e9, coverage=1.0,
                              busy_typical=0.15, link_typical_bytes_per_second=2.0e9)
    acc.per_workload = [w]
    acc.feeder_busy, acc.feeder_of = 0.45, key
    acc.workload = key
    acc.workloads = 1
    acc.workload_cores = {key: cores}
    state, _score, reasons = classify_accelerator(acc, WindowFeatures([acc], cpu_busy=0.3, pressure=0.0),
                                                  MismatchThresholds())
    return state, reasons


def test_a_starved_gpu_fed_from_the_far_socket_is_staging_bound_and_says_why() -> None:
    state, reasons = _verdict(cpu_local=0.1)
    assert state == "staging-bound", (state, reasons)
    assert any("runs 90% of its CPU time off its accelerator's NUMA node" in r for r in reasons), reasons
    state, reasons = _verdict(cpu_local=0.95, mem_local=0.2)
    assert state == "staging-bound" and any("keeps 80% of its host pages" in r for r in reasons), reasons
    # the same feeder on the accelerator's own node: no staging evidence
    assert _verdict(cpu_local=0.95, mem_local=0.97)[0] != "staging-bound"
    _, reasons = _verdict(cpu_local=0.02, allowed_local=0.0)
    assert any("its CPU affinity allows none of that node's CPUs" in r for r in reasons), reasons
    # an idle process's placement is no feeder's
    assert _verdict(cpu_local=0.1, cores=0.05)[0] != "staging-bound"


def test_an_unpinned_workload_is_read_by_its_pages_not_where_the_scheduler_kept_it() -> None:
    """A workload allowed on both sockets (affinity half local) that the scheduler kept on the far
    one this window (CPU time all remote) is no finding: next window it may read all local.  The
    same reading with its affinity held off the node (at most a quarter of its CPUs local) is; its
    pages off the node are, whatever its affinity."""
    assert _verdict(cpu_local=0.0, allowed_local=0.5)[0] != "staging-bound"
    assert _verdict(cpu_local=0.0, allowed_local=0.25)[0] == "staging-bound"
    state, reasons = _verdict(cpu_local=0.0, allowed_local=0.5, mem_local=0.1)
    assert state == "staging-bound" and any("keeps 90% of its host pages" in r and "CPU time" not in r
                                            for r in reasons), reasons


def test_a_process_in_two_sets_is_read_once_and_counted_in_both(tmp_path: Path) -> None:
    """One pod's processes on each of its GPUs: the same PID in two sets, each against its own GPU's
    local CPUs; and an exited thread's record goes."""
    from conftest import FIXTURES

    dgx = str(FIXTURES / "sysfs-dgx-h100")          # 0000:1b:00.0 node 0, 0000:c2:00.0 node 1 (CPUs 56-111,168-223)
    proc = tmp_path / "proc"
    _proc_tree(proc, {100: (1000, 3), 101: (500, 60)}, "")
    now = [0.0]
    pl = WorkloadPlacement(str(proc), dgx, min_cpu_s=0.0, clock=lambda: now[0])
    groups = {"gpu0": (BUS, [100]), "gpu4": ("0000:c2:00.0", [100])}
    pl.read(groups)
    _proc_tree(proc, {100: (2000, 3), 101: (3500, 60)}, "")
    now[0] = 10.0
    pl.read(groups)
    assert pl.get("gpu0").cpu_local == pytest.approx(0.25) and pl.get("gpu4").cpu_local == pytest.approx(0.75)
    assert pl.threads_read == 2                      # read once for both sets
    import shutil
    shutil.rmtree(proc / "100" / "task" / "101")     # the thread exits
    _proc_tree(proc, {100: (3000, 3)}, "")
    (proc / "100" / "stat").write_text(_stat(100, 7000, 3, 2))
    now[0] = 20.0
    pl.read(groups)
    assert set(pl._threads[100]) == {100}


def test_root_cause_has_a_numa_locality_figure_for_a_working_feeder_only() -> None:
    from triscope.analysis.rca.evidence import evidence_context, figures
    from triscope.analysis.reader import SeriesPoints

    ts = [float(t) for t in range(100, 160)]
    wl = {"gpu": "0", "namespace": "inference", "pod": "vit-0", "container": "server", "workload": ""}

    def figs(cores: float) -> dict[str, list]:
        series = [SeriesPoints("triscope_gpu_sm_active_ratio", {"gpu": "0"}, ts, [0.1] * len(ts)),
                  SeriesPoints("triscope_workload_cpu_local_ratio", wl, ts, [0.1] * len(ts)),
                  SeriesPoints("triscope_workload_cpu_seconds_total", wl, ts, [cores] * len(ts), kind="counter")]
        return figures(evidence_context(series, [], MismatchThresholds()), "gpu=0", 100.0, 160.0)

    got = figs(1.0).get("numa_locality", [])
    assert [f.name for f in got] == ["cpu_remote"] and got[0].value == pytest.approx(0.9)
    assert "runs 90% of its CPU time off its accelerator's NUMA node" in got[0].detail
    assert not figs(0.05).get("numa_locality")        # an idle workload's placement is no feeder's


def test_where_every_cpu_is_local_nothing_is_read(tmp_path: Path) -> None:
    """A one-socket host (the H200 machine: local_cpulist is every online CPU): the CPU side is 1 by
    definition and no process's stat or threads are read for it."""
    root = Path(sysfs(tmp_path, "0-15"))
    (root / "devices/system/cpu").mkdir(parents=True)
    (root / "devices/system/cpu/online").write_text("0-15\n")
    proc = tmp_path / "proc"
    _proc_tree(proc, {100: (1000, 3), 101: (500, 7)}, "")
    now = [0.0]
    pl = WorkloadPlacement(str(proc), str(root), min_cpu_s=0.0, clock=lambda: now[0])
    pl.read({"gpu0": (BUS, [100])})
    now[0] = 10.0
    pl.read({"gpu0": (BUS, [100])})
    got = pl.get("gpu0")
    assert got is not None and got.cpu_local == 1.0 and got.allowed_local == 1.0
    assert pl.threads_read == 0 and not pl._ticks
    # one CPU more online than the accelerator's list: read as before
    (root / "devices/system/cpu/online").write_text("0-16\n")
    pl2 = WorkloadPlacement(str(proc), str(root), min_cpu_s=0.0, clock=lambda: now[0])
    pl2.read({"gpu0": (BUS, [100])})
    assert pl2._ticks


# ------------------------------------------------------------------- two sockets, real pinned threads
def two_socket_sysfs(tmp: Path) -> str:
    """The two-socket DGX H100 tree (``fixtures/sysfs-dgx-h100``: GPU 0000:1b:00.0 on node 0, GPU
    0000:c2:00.0 on node 1) with the CPU numbering of a two-socket server whose firmware numbers
    cores round-robin over the sockets (node 0: 0,2,4,...; node 1: 1,3,5,...), so that this
    machine's CPU 0 is on the GPU's socket and CPU 1 on the far one: real threads pinned to them
    run local or remote."""
    import shutil

    from conftest import FIXTURES

    root = tmp / "sys"
    shutil.copytree(FIXTURES / "sysfs-dgx-h100", root, symlinks=True)
    for f in root.rglob("local_cpulist"):
        node = int((f.parent / "numa_node").read_text())
        f.write_text(",".join(str(c) for c in range(node, 224, 2)) + "\n")
    return str(root)


def _placed(sys_root: str, pid: int, bus: str = BUS) -> WorkloadEvidence:
    """The workload's placement as the agent measures it (its CPU time's local share over 1.5 s, its
    affinity's, its pages', its cores), with the rest of its host side healthy: a feeder at 0.45 of
    a core, no CPU wait, no pressure (nothing else wrong, as in the issue)."""
    c = WorkloadsCollector([ListedProcessSource([AcceleratorProcess(gpu_labels(0), "GPU-a", pid, "0", bus_id=bus)])],
                           sys=sys_root, background=False, pod_resources_socket="/nonexistent/kubelet.sock")
    try:
        c.refresh(force=True)
        t0 = time.monotonic()
        first = {s.name: s for s in c.collect(time.time()) if isinstance(s, Sample)}
        time.sleep(1.5)
        c.refresh(force=True)
        got = {s.name: s for s in c.collect(time.time()) if isinstance(s, Sample)}
        dt = time.monotonic() - t0
    finally:
        c.close()
    lab = got["triscope_workload_cpu_local_ratio"].labels
    key: WorkloadKey = (lab["namespace"], lab["pod"], lab["container"], lab["workload"])
    cores = (got["triscope_workload_cpu_seconds_total"].value - first["triscope_workload_cpu_seconds_total"].value) / dt
    return WorkloadEvidence(key, feeder=0.45, cpu_wait=0.0, cpu_pressure=0.0, cores=cores,
                            cpu_local=got["triscope_workload_cpu_local_ratio"].value,
                            mem_local=got["triscope_workload_memory_local_ratio"].value,
                            allowed_local=got["triscope_workload_cpus_allowed_local_ratio"].value)


def _window(w: WorkloadEvidence, busy: float):
    """One window of GPU 0 at ``busy`` (the link at 4 % of its ceiling) fed by ``w`` alone:
    (state, the workload named, reasons)."""
    from triscope.analysis.verdict import classify_window

    acc = AcceleratorFeatures("gpu=0", busy=busy, link_bytes_per_second=2.0e9, link_ceiling=50e9, coverage=1.0,
                              busy_typical=busy, link_typical_bytes_per_second=2.0e9)
    acc.per_workload = [w]
    acc.feeder_busy, acc.feeder_of = w.feeder, w.key
    acc.workload, acc.workloads = w.key, 1
    acc.workload_cores = {w.key: w.cores or 0.0}
    v = classify_window(WindowFeatures([acc], cpu_busy=0.3, pressure=0.0), MismatchThresholds())
    assert v is not None
    av = v.accelerators[0]
    return av.state, av.workload, av.evidence["reasons"]


# a serving process whose two feeder processes (DataLoader-style workers: single-threaded, so each
# counts whole where it runs, whatever share of a CPU this machine gives it) spin
FEEDERS = r"""
import hashlib, multiprocessing as mp, time
def work():
    buf = b"x" * (1 << 20)
    while True:
        hashlib.sha256(buf).digest()
if __name__ == "__main__":
    ps = [mp.Process(target=work, daemon=True) for _ in range(2)]
    for p in ps:
        p.start()
    print(" ".join(str(p.pid) for p in ps), flush=True)
    time.sleep(3600)
"""


def _feeders(server: set[int], first: set[int], second: set[int]) -> subprocess.Popen[str]:
    """The serving process pinned to ``server``, its two feeders to ``first`` and ``second``."""
    p = subprocess.Popen([sys.executable, "-c", FEEDERS], stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert p.stdout is not None
    kids = [int(x) for x in p.stdout.readline().split()]
    for pid, cpus in ((p.pid, server), (kids[0], first), (kids[1], second)):
        for tid in os.listdir(f"/proc/{pid}/task"):
            os.sched_setaffinity(int(tid), cpus)
    return p


def _stop_feeders(p: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(p.pid, signal.SIGKILL)
    p.wait(10)


def _numa_reasons(reasons: list[str]) -> list[str]:
    return [r for r in reasons if "NUMA node" in r]


@two_cpus
def test_a_service_split_over_both_sockets_is_never_paged(tmp_path: Path) -> None:
    """The issue's false page: a service whose CPU time is split 50/50 over the two sockets (one
    spinning feeder process pinned to each) with nothing else wrong read ``staging-bound`` (0.6-0.8).  It
    reads half remote, below the bar, and is not paged whether its GPU is starved (demand-limited),
    partly busy or busy; nor is the same service left to the scheduler (its affinity spans both
    sockets: wherever the scheduler keeps it this window, its CPU side is no finding)."""
    sys_root = two_socket_sysfs(tmp_path)
    local, remote = CPUS[0], CPUS[1]
    both = {local, remote}
    p = _feeders(both, {local}, {remote})
    try:
        split = _placed(sys_root, p.pid)
    finally:
        _stop_feeders(p)
    p = _feeders(both, both, both)
    try:
        free = _placed(sys_root, p.pid)
    finally:
        _stop_feeders(p)
    assert split.cpu_local == pytest.approx(0.5, abs=0.2), split
    assert split.allowed_local == 0.5 and free.allowed_local == 0.5
    assert split.cores is not None and split.cores >= MismatchThresholds().numa_min_cores
    for w in (split, free):
        for busy, states in ((0.15, {"demand-limited"}), (0.5, {"balanced", "demand-limited"}),
                             (0.85, {"compute-bound"})):
            state, _named, reasons = _window(w, busy)
            assert state in states and not _numa_reasons(reasons), (w, busy, state, reasons)


@two_cpus
def test_a_feeder_pinned_wholly_off_its_gpus_socket_is_staging_bound_only_while_the_gpu_starves(
        tmp_path: Path) -> None:
    """The same service with every process pinned to the far socket: its GPU starved, it reads
    ``staging-bound`` naming it, the reason saying where it runs and that it is pinned there; its GPU
    partly busy or busy, it is not paged.  Measured against the GPU on the far socket's own node
    (0000:c2:00.0), the same processes' CPU time is local."""
    sys_root = two_socket_sysfs(tmp_path)
    remote = CPUS[1]
    p = _feeders({remote}, {remote}, {remote})
    try:
        off = _placed(sys_root, p.pid)
        near = _placed(sys_root, p.pid, "0000:c2:00.0")
    finally:
        _stop_feeders(p)
    assert near.cpu_local == pytest.approx(1.0, abs=0.05) and near.allowed_local == 1.0, near
    # ... but this machine has one NUMA node, node 0: against node 1 its pages are all remote, and
    # they alone are the finding
    assert near.mem_local == 0.0
    numa = _numa_reasons(_window(near, 0.15)[2])
    assert len(numa) == 1 and "keeps 100% of its host pages off" in numa[0] and "CPU time" not in numa[0], numa
    assert off.cpu_local == pytest.approx(0.0, abs=0.05) and off.allowed_local == 0.0, off
    state, named, reasons = _window(off, 0.15)
    assert state == "staging-bound", (state, reasons)
    assert (named["namespace"], named["pod"], named["container"], named["workload"]) == off.key
    numa = _numa_reasons(reasons)
    assert len(numa) == 1 and re.search(r"runs (9[5-9]|100)% of its CPU time off its accelerator.s NUMA node", numa[0]), reasons
    assert "its CPU affinity allows none of that node's CPUs: it is pinned there" in numa[0]
    for busy, states in ((0.5, {"balanced", "demand-limited"}), (0.85, {"compute-bound"})):
        state, _named, reasons = _window(off, busy)
        assert state in states and not _numa_reasons(reasons), (busy, state, reasons)
