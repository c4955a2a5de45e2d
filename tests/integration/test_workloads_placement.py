"""Where a workload runs against its accelerator's NUMA node: real threads pinned to one CPU of
this machine, read through a sysfs tree that says which CPUs are the accelerator's (this machine
has one NUMA node: the tree stands in for the second socket); the parsing on procfs-shaped text;
and the verdict and root cause it feeds."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from workloads_helpers import spawn, stop

from triscope.agent.collectors.accelprocs import AcceleratorProcess, ListedProcessSource, gpu_labels
from triscope.agent.collectors.placement import WorkloadPlacement, numa_pages
from triscope.agent.collectors.workloads import WorkloadsCollector
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
    p = spawn(sleepers=2, spinners=2, cpus={run_on})
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
