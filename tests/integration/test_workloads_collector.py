"""The workloads collector end to end on this machine: real processes in real cgroups (the kubelet's
systemd and cgroupfs layouts, a systemd service, a host process), a process list standing in for
NVML's with their real PIDs, the kubelet's pod-resources API served with the real gRPC runtime, a
/var/log/pods tree; then the per-tick evidence: a pegged thread, threads competing for one CPU
(run-queue wait, cgroup cpu.pressure), CPU counters, the cap with "other", exits, the refresh
worker off the tick, and promtool on the real output."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from podresources_server import PodResourcesServer
from workloads_helpers import Cgroups, cgroup_skip_reason, kube_path, spawn, stop, writable_cgroup_root

from triscope.agent.collectors.base import Availability
from triscope.agent.workloads.accelprocs import AcceleratorProcess, ListedProcessSource, gpu_labels
from triscope.agent.workloads.collector import WorkloadsCollector
from triscope.core.metrics import CATALOGUE
from triscope.core.samples import EventRecord, Sample

ROOT = writable_cgroup_root()
needs_cgroups = pytest.mark.skipif(ROOT is None, reason=cgroup_skip_reason())

GPU_A = "GPU-5b1c2a3d-0000-1111-2222-333344445555"
GPU_B = "GPU-9e8d7c6b-aaaa-bbbb-cccc-ddddeeeeffff"
GPU_C = "GPU-00000000-cccc-cccc-cccc-cccccccccccc"
WL = ("namespace", "pod", "container", "workload")
PY = f"cmd:{Path(sys.executable).name[:15]}"   # what the children spawn() starts are called (their comm)


def row(gpu: int, uuid_: str, pid: int, sm: float | None = None) -> AcceleratorProcess:
    return AcceleratorProcess(gpu_labels(gpu), uuid_, pid, str(gpu), sm)


def series(items, name: str) -> dict[tuple[str, ...], float]:
    """{(accelerator label value, namespace, pod, container, workload): value} of one metric."""
    out = {}
    for s in items:
        if isinstance(s, Sample) and s.name == name:
            acc = s.labels.get("gpu", s.labels.get("npu", ""))
            out[(acc, *(s.labels[k] for k in WL))] = s.value
    return out


def ticks(c: WorkloadsCollector, n: int, gap: float = 1.0) -> list:
    out = []
    for i in range(n):
        if i:
            time.sleep(gap)
        out = list(c.collect(time.time()))
    return out


@pytest.fixture
def sockdir() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="wl-"))
    yield d
    shutil.rmtree(d, ignore_errors=True)



@needs_cgroups
def test_real_processes_in_real_cgroups_are_attributed(cgroups: Cgroups, sockdir: Path, tmp_path: Path) -> None:
    ua, ub0, ub1 = (str(uuid.uuid4()) for _ in range(3))
    cid = [uuid.uuid4().hex + uuid.uuid4().hex for _ in range(3)]
    unit = f"triscope-test-{uuid.uuid4().hex[:6]}.service"
    procs = [spawn(2) for _ in range(5)]
    vit, embed0, embed1, host, svc = procs
    try:
        cgroups.put(kube_path(ua, cid[0]), vit.pid)                                      # systemd driver
        cgroups.put(kube_path(ub0, cid[1], "besteffort", driver="cgroupfs"), embed0.pid)  # cgroupfs driver
        cgroups.put(kube_path(ub1, cid[2], "besteffort"), embed1.pid)
        cgroups.put(f"system.slice/{unit}", svc.pid)
        server = PodResourcesServer(sockdir / "kubelet.sock").start()
        server.set_pods([
            {"namespace": "inference", "name": "vit-7f9c", "containers": [
                {"name": "server", "devices": [{"resource_name": "nvidia.com/gpu", "device_ids": [GPU_A]}]}]},
            {"namespace": "batch", "name": "embed-0", "containers": [
                {"name": "worker", "devices": [{"resource_name": "nvidia.com/gpu", "device_ids": [GPU_B + "::0"]}]}]},
            {"namespace": "batch", "name": "embed-1", "containers": [
                {"name": "worker", "devices": [{"resource_name": "nvidia.com/gpu", "device_ids": [GPU_B + "::1"]}]}]},
        ])
        logs = tmp_path / "pods"
        for ns, pod, uid, ctr in (("inference", "vit-7f9c", ua, "server"), ("batch", "embed-0", ub0, "worker"),
                                  ("batch", "embed-1", ub1, "worker")):
            (logs / f"{ns}_{pod}_{uid}" / ctr).mkdir(parents=True)
        src = ListedProcessSource([row(0, GPU_A, vit.pid, 0.6), row(0, GPU_A, host.pid, 0.1),
                                   row(1, GPU_B, embed0.pid, 0.3), row(1, GPU_B, embed1.pid, 0.2),
                                   row(2, GPU_C, svc.pid)])
        c = WorkloadsCollector([src], pod_resources_socket=server.path, pods_log_dir=str(logs), background=False)
        try:
            assert c.check().ok
            c.refresh(force=True)
            items = ticks(c, 3)
        finally:
            c.close()
            server.stop()
        info = {s.labels["gpu"]: [] for s in items if isinstance(s, Sample)}
        for s in items:
            if isinstance(s, Sample) and s.name == "triscope_accelerator_workload_info":
                info[s.labels["gpu"]].append(({k: s.labels[k] for k in WL}, s.labels["uuid"]))
        me = Path(f"/proc/{host.pid}/comm").read_text().strip()
        assert sorted(info["0"], key=str) == sorted([
            ({"namespace": "inference", "pod": "vit-7f9c", "container": "server", "workload": ""}, GPU_A),
            # a host process on the pod's GPU is not the pod's
            ({"namespace": "", "pod": "", "container": "", "workload": f"cmd:{me}"}, GPU_A)], key=str)
        # time-slicing: two owners, told apart by each process's pod UID (cgroup) and /var/log/pods
        assert sorted(w["pod"] for w, _ in info["1"]) == ["embed-0", "embed-1"]
        assert all(w["namespace"] == "batch" and w["container"] == "worker" for w, _ in info["1"])
        assert info["2"] == [({"namespace": "", "pod": "", "container": "", "workload": f"unit:{unit}"}, GPU_C)]
        sm = series(items, "triscope_workload_sm_ratio")
        assert sm[("0", "inference", "vit-7f9c", "server", "")] == pytest.approx(0.6)
        assert not any(k[0] == "2" for k in sm)        # no share given for GPU 2: absent, not 0
        psi = series(items, "triscope_workload_cpu_pressure_ratio")
        assert ("0", "inference", "vit-7f9c", "server", "") in psi and ("1", "batch", "embed-0", "worker", "") in psi
        assert all(0.0 <= v <= 1.0 for v in psi.values())
        # the host process: its cgroup's pressure only where that is not the root (the node's)
        host_cg = Path(f"/proc/{host.pid}/cgroup").read_text()
        assert any(k[4] == f"cmd:{me}" for k in psi) == ("0::/\n" not in host_cg)
        for s in items:
            if isinstance(s, Sample):
                assert s.kind == CATALOGUE[s.name].kind and set(WL) <= set(s.labels), s
    finally:
        stop(*procs)


@needs_cgroups
def test_without_the_pod_log_tree_a_shared_gpu_is_shared(cgroups: Cgroups, sockdir: Path) -> None:
    ua, ub = str(uuid.uuid4()), str(uuid.uuid4())
    a, b = spawn(), spawn()
    try:
        cgroups.put(kube_path(ua, uuid.uuid4().hex * 2), a.pid)
        cgroups.put(kube_path(ub, uuid.uuid4().hex * 2), b.pid)
        server = PodResourcesServer(sockdir / "kubelet.sock").start()
        server.set_pods([{"namespace": "batch", "name": f"embed-{i}", "containers": [
            {"name": "worker", "devices": [{"resource_name": "nvidia.com/gpu", "device_ids": [f"{GPU_B}::{i}"]}]}]}
            for i in range(2)])
        c = WorkloadsCollector([ListedProcessSource([row(1, GPU_B, a.pid), row(1, GPU_B, b.pid)])],
                               pod_resources_socket=server.path, pods_log_dir=str(sockdir / "none"), background=False)
        c.refresh(force=True)
        items = ticks(c, 1)
        c.close()
        server.stop()
        assert series(items, "triscope_workload_processes") == {("1", "", "", "", "shared"): 2.0}
    finally:
        stop(a, b)


def test_a_pegged_thread_among_sleepers_reads_as_the_feeder() -> None:
    p = spawn(sleepers=15, leader="spin")
    key = ("0", "", "", "", PY)
    try:
        c = WorkloadsCollector([ListedProcessSource([row(0, GPU_A, p.pid)])], background=False, busy_cores=0.2,
                               pod_resources_socket="/nonexistent/kubelet.sock")
        c.refresh(force=True)
        first = list(c.collect(time.time()))
        assert series(first, "triscope_workload_cpu_seconds_total") == {key: 0.0}   # a baseline, not a spike
        totals, t = [], []
        for _ in range(3):
            time.sleep(1)
            t.append(time.monotonic())
            items = list(c.collect(time.time()))
            totals.append(series(items, "triscope_workload_cpu_seconds_total")[key])
        read = c.stats.threads_read
        c.close()
        feeder = series(items, "triscope_workload_feeder_busy_ratio")[key]
        share = (totals[-1] - totals[-2]) / (t[-1] - t[-2])
        assert totals[0] < totals[1] < totals[2]
        # the threads are read in order of their last CPU, and no further once the rest of the
        # process's CPU cannot beat the busiest: the pegged one, and perhaps one more, of 16
        assert 1 <= read <= 3, read
        assert share > 0.2, share                # one busy thread (less than a core on a loaded machine)
        # the busiest of the 16 threads is the pegged one: it holds (almost) all the process's CPU
        assert feeder == pytest.approx(share, abs=0.15), (feeder, share)
    finally:
        stop(p)


def test_threads_competing_for_one_cpu_wait_and_share_it() -> None:
    cpu = {sorted(os.sched_getaffinity(0))[-1]}
    p = spawn(sleepers=6, spinners=2, cpus=cpu)
    key = ("0", "", "", "", PY)
    try:
        c = WorkloadsCollector([ListedProcessSource([row(0, GPU_A, p.pid)])], background=False, busy_cores=0.1,
                               pod_resources_socket="/nonexistent/kubelet.sock")
        c.refresh(force=True)
        totals, t = [], []
        for _ in range(4):
            time.sleep(1)
            t.append(time.monotonic())
            items = list(c.collect(time.time()))
            totals.append(series(items, "triscope_workload_cpu_seconds_total")[key])
        read = c.stats.threads_read
        c.close()
        feeder = series(items, "triscope_workload_feeder_busy_ratio")[key]
        wait = series(items, "triscope_workload_cpu_wait_ratio")[key]
        share = (totals[-1] - totals[-2]) / (t[-1] - t[-2])
        assert 2 <= read <= 9, read               # both spinners (their CPU is the process's), not the sleepers
        # two spinners on one CPU: the busiest holds about half the process's CPU, and each waits
        # for the other (on a loaded machine for others too)
        assert share > 0.1 and feeder < 0.75 * share, (feeder, share)
        assert wait > 0.2, wait
    finally:
        stop(p)


@needs_cgroups
def test_cgroup_cpu_pressure_rises_with_contention(cgroups: Cgroups) -> None:
    cpu = {sorted(os.sched_getaffinity(0))[-1]}
    p = spawn(spinners=3, cpus=cpu)
    try:
        cgroups.put(kube_path(str(uuid.uuid4()), uuid.uuid4().hex * 2), p.pid)
        c = WorkloadsCollector([ListedProcessSource([row(0, GPU_A, p.pid)])], background=False,
                               pod_resources_socket="/nonexistent/kubelet.sock")
        c.refresh(force=True)
        deadline = time.monotonic() + 12
        value = 0.0
        while time.monotonic() < deadline and value < 0.1:
            time.sleep(1)
            c.refresh()                  # the worker's round: cpu.pressure every 2 s, off the tick
            items = list(c.collect(time.time()))
            got = series(items, "triscope_workload_cpu_pressure_ratio")
            value = next(iter(got.values()), 0.0)
        c.close()
        assert value >= 0.1, f"cpu.pressure some avg10 of the cgroup stayed at {value}"
    finally:
        stop(p)


@needs_cgroups
def test_the_cap_sums_the_rest_as_other(cgroups: Cgroups) -> None:
    procs = [spawn() for _ in range(11)]
    tag = uuid.uuid4().hex[:6]
    try:
        for i, p in enumerate(procs):
            cgroups.put(f"system.slice/tt-{tag}-{i}.service", p.pid)
        rows = [row(0, GPU_A, p.pid, sm=0.01 * (i + 1)) for i, p in enumerate(procs)]
        c = WorkloadsCollector([ListedProcessSource(rows)], background=False, max_workloads_per_accelerator=8,
                               pod_resources_socket="/nonexistent/kubelet.sock")
        c.refresh(force=True)
        items = ticks(c, 2, gap=0.3)
        c.close()
        n = series(items, "triscope_workload_processes")
        assert len(n) == 9 and n[("0", "", "", "", "other")] == 3.0 and sum(n.values()) == 11
        # the eight with the largest SM shares are kept; the three smallest are "other"
        kept = {k[4] for k in n} - {"other"}
        assert kept == {f"unit:tt-{tag}-{i}.service" for i in range(3, 11)}
        assert series(items, "triscope_workload_sm_ratio")[("0", "", "", "", "other")] == pytest.approx(0.06)
    finally:
        stop(*procs)


def test_exits_between_two_process_lists() -> None:
    a, b = spawn(), spawn()
    key = ("0", "", "", "", PY)
    try:
        src = ListedProcessSource([row(0, GPU_A, a.pid), row(0, GPU_A, b.pid)])
        # the process list is not read again during the test: exits are seen without it
        c = WorkloadsCollector([src], background=False, process_every=3600,
                               pod_resources_socket="/nonexistent/kubelet.sock")
        c.refresh(force=True)
        assert series(ticks(c, 1), "triscope_workload_processes") == {key: 2.0}
        stop(b)                                  # read every tick so far: its descriptor says it is gone
        assert series(ticks(c, 1), "triscope_workload_processes") == {key: 1.0}
        for _ in range(3):
            ticks(c, 1, gap=0.1)                 # quiet now: read only every few ticks
        stop(a)
        c.refresh()                              # the worker's next round (every second): a pidfd says it exited
        assert ticks(c, 1) == []                 # nothing left on the GPU: no series
        assert src.calls == 1
        c.close()
    finally:
        stop(a, b)


def test_attribution_runs_on_its_own_worker_never_on_the_tick() -> None:
    a, b = spawn(), spawn()

    class Slow(ListedProcessSource):
        def processes(self):  # type: ignore[no-untyped-def]
            time.sleep(0.4)     # a driver call that blocks
            return super().processes()

    src = Slow([row(0, GPU_A, a.pid)])
    c = WorkloadsCollector([src], process_every=0.2, share_every=0.1,
                           pod_resources_socket="/nonexistent/kubelet.sock")
    try:
        assert list(c.collect(time.time())) == []        # worker started, no plan yet: nothing, at once
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not series(list(c.collect(time.time())), "triscope_workload_processes"):
            time.sleep(0.05)
        src.set([row(0, GPU_A, a.pid), row(0, GPU_A, b.pid)])
        worst = 0.0
        got: dict = {}
        while time.monotonic() < deadline and got.get(("0", "", "", "", PY)) != 2.0:
            t0 = time.perf_counter()
            got = series(list(c.collect(time.time())), "triscope_workload_processes")
            worst = max(worst, time.perf_counter() - t0)
            time.sleep(0.05)
        assert got == {("0", "", "", "", PY): 2.0}
        assert worst < 0.1, f"a tick waited {worst:.3f} s for the source"
        assert isinstance(c._thread, threading.Thread) and c._thread.is_alive()
    finally:
        c.close()
        stop(a, b)
    assert c._thread is None


def test_sources_that_cannot_run_or_fail() -> None:
    class Broken(ListedProcessSource):
        def check(self) -> Availability:
            return Availability(False, "no driver here", "install it")

    c = WorkloadsCollector([Broken(name="nvml"), Broken(name="npu-smi")], background=False)
    av = c.check()
    assert not av.ok and "nvml: no driver here" in av.reason and "npu-smi: no driver here" in av.reason
    assert av.hint == "install it"
    assert not WorkloadsCollector([], background=False).check().ok

    class Failing(ListedProcessSource):
        def processes(self):  # type: ignore[no-untyped-def]
            raise RuntimeError("NVML: GPU is lost")

    c = WorkloadsCollector([Failing(name="nvml")], background=False, pod_resources_socket="/nonexistent/kubelet.sock")
    assert c.check().ok
    c.refresh(force=True)
    with pytest.raises(RuntimeError, match="nvml: NVML: GPU is lost"):
        list(c.collect(time.time()))
    c.close()


def test_pod_resources_trouble_becomes_one_event(sockdir: Path) -> None:
    import socket

    path = sockdir / "kubelet.sock"
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(str(path))
    srv.listen(4)            # accepts, never answers: the client's deadline ends it
    p = spawn()
    try:
        c = WorkloadsCollector([ListedProcessSource([row(0, GPU_A, p.pid)])], background=False,
                               pod_resources_socket=str(path))
        c.pod_resources.timeout = 0.3
        c.refresh(force=True)
        c.refresh(force=True)
        events = [e for e in c.collect(time.time()) if isinstance(e, EventRecord)]
        c.close()
        assert len(events) == 1 and events[0].severity == "warning" and "no answer within 0.3 s" in events[0].message
    finally:
        srv.close()
        stop(p)


def test_promtool_accepts_the_real_output(tmp_path: Path) -> None:
    from triscope.agent.exporter import render_text

    promtool = shutil.which("promtool")
    assert promtool, "promtool missing: 'make test' installs Debian's prometheus package"
    p = spawn(sleepers=3)
    try:
        c = WorkloadsCollector([ListedProcessSource([row(0, GPU_A, p.pid, 0.5), row(3, GPU_C, p.pid)])],
                               background=False, pod_resources_socket="/nonexistent/kubelet.sock")
        c.refresh(force=True)
        items = ticks(c, 2, gap=0.5)
        c.close()
    finally:
        stop(p)
    samples = [s for s in items if isinstance(s, Sample)]
    assert {s.name for s in samples} >= {"triscope_accelerator_workload_info", "triscope_workload_processes",
                                         "triscope_workload_sm_ratio", "triscope_workload_cpu_seconds_total",
                                         "triscope_workload_feeder_busy_ratio"}
    text = render_text(samples).decode()
    assert f'container="",gpu="0",namespace="",pod="",workload="{PY}"' in text   # empty labels: there, never missing
    res = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


def test_loader_workers_sharing_one_core_show_their_wait() -> None:
    """Four multi-threaded workers (a main thread that works, an idle helper thread: a DataLoader
    worker's shape) confined to one CPU each use about a quarter of it, below busy_cores, so their
    threads are not split; their main threads' run-queue wait is read all the same."""
    code = ("import threading, time\n"
            "threading.Thread(target=time.sleep, args=(1e6,), daemon=True).start()\n"
            "while True:\n    pass\n")
    cpu = {sorted(os.sched_getaffinity(0))[-1]}
    kids = [subprocess.Popen([sys.executable, "-c", code], preexec_fn=lambda: os.sched_setaffinity(0, cpu))
            for _ in range(4)]
    try:
        c = WorkloadsCollector([ListedProcessSource([row(0, GPU_A, kids[0].pid)])], background=False,
                               pod_resources_socket="/nonexistent/kubelet.sock")
        c.refresh(force=True)
        items = ticks(c, 4)
        c.close()
        key = ("0", "", "", "", PY)
        assert series(items, "triscope_workload_feeder_busy_ratio")[key] < 0.5
        wait = series(items, "triscope_workload_cpu_wait_ratio")[key]
        assert wait > 0.5, wait              # four on one core: each waits about three quarters
    finally:
        for k in kids:
            k.kill()
            k.wait()


def test_a_cgroup_two_workloads_share_gives_neither_its_pressure(monkeypatch: pytest.MonkeyPatch) -> None:
    """One cgroup for every service (a container or VM cgroup): its cpu.pressure is nobody's own, so
    neither workload reports it; a workload alone in its cgroup keeps it."""
    a, own = spawn(), spawn()
    b = subprocess.Popen(["sleep", "600"], text=True)      # another command: another workload
    for _ in range(200):     # Popen returns once the child's exec began; its comm is set a moment later
        if Path(f"/proc/{b.pid}/comm").read_text().strip() == "sleep":
            break
        time.sleep(0.01)
    try:
        c = WorkloadsCollector([ListedProcessSource([row(0, GPU_A, a.pid), row(0, GPU_A, b.pid),
                                                     row(1, GPU_B, own.pid)])], background=False,
                               pod_resources_socket="/nonexistent/kubelet.sock")
        shared = {a.pid: "/sys/fs/cgroup/machine.slice", b.pid: "/sys/fs/cgroup/machine.slice",
                  own.pid: "/sys/fs/cgroup/own.slice"}
        monkeypatch.setattr(c, "_cgroup_dirs", lambda pids: {p: shared[p] for p in pids if p in shared})
        # each process alone (in a container whose one cgroup holds every process, as on a fresh machine,
        # each process set would be all of them)
        monkeypatch.setattr(c, "_process_sets", lambda: {p: [p] for p in shared})
        # named by their commands whatever unit the test runs in (under a systemd service, all three
        # would be that one unit's: one workload)
        monkeypatch.setattr("triscope.agent.workloads.collector.attribute",
                            lambda info, owners, pods: ("", "", "", f"cmd:{info.comm}" if info else ""))
        c.refresh(force=True)
        assert c._dirs == {own.pid: "/sys/fs/cgroup/own.slice"}
        c.close()
    finally:
        stop(a, own)
        b.kill()
        b.wait()


def test_processes_that_just_exited_are_not_called_another_pid_namespace(caplog: pytest.LogCaptureFixture) -> None:
    """The driver lists a process for a moment after it died: one list in which no listed process is
    in /proc says nothing; a second in a row says the agent needs hostPID (once)."""
    import logging

    gone = AcceleratorProcess(gpu_labels(0), "GPU-x", 4_194_000, "0")      # above any PID in use here
    assert not os.path.exists(f"/proc/{gone.pid}")
    c = WorkloadsCollector([ListedProcessSource([gone])], background=False,
                           pod_resources_socket="/nonexistent/kubelet.sock")
    try:
        with caplog.at_level(logging.WARNING, logger="triscope.agent.workloads.collector"):
            c.refresh(force=True)
            assert "hostPID" not in caplog.text
            c.refresh(force=True)
            c.refresh(force=True)
        assert caplog.text.count("hostPID") == 1
    finally:
        c.close()
