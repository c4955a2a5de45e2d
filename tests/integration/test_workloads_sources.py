"""The process sources and the wiring: the npu-smi process table (a real executable printing an
Ascend table whose process rows carry real PIDs) attributed through the kubelet's pod-resources
API; NVML's no-driver path on a host without a GPU; the share bookkeeping against a stand-in NVML
binding (the real one runs on the H200: tests/integration/test_workloads_nvml.py); the registry and the CLI."""

from __future__ import annotations

import shutil
import stat
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from podresources_server import PodResourcesServer
from workloads_helpers import Cgroups, cgroup_skip_reason, kube_path, spawn, stop, writable_cgroup_root

from triscope.agent.collectors.npu import NpuSmiCollector
from triscope.agent.registry import AgentOptions, UnavailableCollector, build_collectors, split_available
from triscope.agent.workloads.accelprocs import NpuProcessSource, npu_labels
from triscope.agent.workloads.collector import WorkloadsCollector
from triscope.agent.workloads.nvml_processes import NvmlProcessSource
from triscope.core.samples import Sample

ROOT = writable_cgroup_root()

TABLE = """+------------------------------------------------------------------------------------------------+
| npu-smi 23.0.rc3                 Version: 23.0.rc3                                             |
+---------------------------+---------------+----------------------------------------------------+
| NPU   Name                | Health        | Power(W)    Temp(C)           Hugepages-Usage(page)|
| Chip                      | Bus-Id        | AICore(%)   Memory-Usage(MB)  HBM-Usage(MB)        |
+===========================+===============+====================================================+
| 0     910B3               | OK            | 97.8        36                0    / 0             |
| 0                         | 0000:C1:00.0  | 37          0 /0              58626/ 65536         |
+===========================+===============+====================================================+
| 1     910B3               | OK            | 95.1        41                0    / 0             |
| 0                         | 0000:C2:00.0  | 100         0    / 0          65536 /65536         |
+===========================+===============+====================================================+
+---------------------------+---------------+----------------------------------------------------+
| NPU     Chip              | Process id    | Process name             | Process memory(MB)      |
+===========================+===============+====================================================+
| No running processes found in NPU 0                                                            |
+===========================+===============+====================================================+
| 1       0                 | {pid1}          | python3                  | 61000                   |
| 1       0                 | {pid2}          | python3                  | 3000                    |
+===========================+===============+====================================================+
"""


@pytest.fixture
def sockdir() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="wn-"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.mark.skipif(ROOT is None, reason=cgroup_skip_reason())
def test_npu_processes_are_attributed_through_pod_resources(sockdir: Path) -> None:
    assert ROOT is not None
    a, b = spawn(), spawn()
    cg = Cgroups(ROOT)
    try:
        cg.put(kube_path(str(uuid.uuid4()), uuid.uuid4().hex * 2), a.pid)
        cg.put(kube_path(str(uuid.uuid4()), uuid.uuid4().hex * 2), b.pid)
        exe = sockdir / "npu-smi"
        (sockdir / "table").write_text(TABLE.format(pid1=a.pid, pid2=b.pid))
        exe.write_text(f"#!/bin/sh\n[ \"$2\" = \"-t\" ] && exit 0\ncat {sockdir / 'table'}\n")
        exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
        server = PodResourcesServer(sockdir / "kubelet.sock").start()
        server.set_pods([{"namespace": "npu", "name": "llm-0", "containers": [
            {"name": "mindie", "devices": [{"resource_name": "huawei.com/Ascend910", "device_ids": ["Ascend910-1"]}]}]}])
        npu = NpuSmiCollector(npu_smi=str(exe), interval=0.2, timeout=3.0, usages=False)
        src = NpuProcessSource(npu)
        assert src.check().ok
        with pytest.raises(RuntimeError):
            src.processes()                 # npu-smi has not run yet: the source says so
        list(npu.collect(time.time()))      # starts its worker
        deadline = time.monotonic() + 5
        while npu.process_table() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        rows = src.processes()
        assert sorted(r.pid for r in rows) == sorted([a.pid, b.pid])
        assert {r.labels for r in rows} == {npu_labels("1", "0")} and {r.device_index for r in rows} == {"1"}
        c = WorkloadsCollector([src], pod_resources_socket=server.path, background=False)
        c.refresh(force=True)
        list(c.collect(time.time()))
        time.sleep(0.5)
        items = [s for s in c.collect(time.time()) if isinstance(s, Sample)]
        c.close()
        npu.close()
        server.stop()
        info = [s.labels for s in items if s.name == "triscope_accelerator_workload_info"]
        assert info == [{"npu": "1", "chip": "0", "namespace": "npu", "pod": "llm-0", "container": "mindie",
                         "workload": "", "uuid": ""}]
        assert next(s.value for s in items if s.name == "triscope_workload_processes") == 2.0
        assert not any(s.name == "triscope_workload_sm_ratio" for s in items)    # NPUs give no SM share
    finally:
        stop(a, b)
        cg.cleanup()


def test_nvml_without_a_driver_says_why() -> None:
    src = NvmlProcessSource()
    av = src.check()
    if av.ok:
        pytest.skip("this host has an NVIDIA driver: tests/integration/test_workloads_nvml.py covers it")
    assert "libnvidia-ml.so.1 not found" in av.reason or "NVML" in av.reason, av.reason
    src.close()


class StandInNvml:
    """A stand-in for the pynvml binding with one GPU: its process lists and utilization samples
    are set by the test, its errors carry NVML's codes (the real binding runs on the H200)."""

    class NVMLError(Exception):
        def __init__(self, value: int) -> None:
            super().__init__(f"NVML error {value}")
            self.value = value

    def __init__(self) -> None:
        self.compute: list[Any] = []
        self.samples: list[Any] | Exception = []
        self.lost = False
        self.calls: list[int] = []

    def nvmlInit(self) -> None: ...  # noqa: N802 - the binding's names

    def nvmlShutdown(self) -> None: ...  # noqa: N802

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        return 1

    def nvmlDeviceGetHandleByIndex(self, i: int) -> str:  # noqa: N802
        return f"h{i}"

    def nvmlDeviceGetUUID(self, h: str) -> bytes:  # noqa: N802
        return b"GPU-5b1c2a3d-0000-1111-2222-333344445555"

    def nvmlDeviceGetComputeRunningProcesses(self, h: str) -> list[Any]:  # noqa: N802
        if self.lost:
            raise self.NVMLError(15)
        return self.compute

    def nvmlDeviceGetGraphicsRunningProcesses(self, h: str) -> list[Any]:  # noqa: N802
        raise self.NVMLError(3)     # not supported on this GPU

    def nvmlDeviceGetProcessUtilization(self, h: str, since: int) -> list[Any]:  # noqa: N802
        self.calls.append(since)
        if isinstance(self.samples, Exception):
            raise self.samples
        return self.samples


def test_shares_average_the_drivers_samples_and_errors_are_guarded() -> None:
    nv = StandInNvml()
    now = [0.0]
    src = NvmlProcessSource(nvml=nv, lost_retry_s=30.0, clock=lambda: now[0])
    assert src.check().ok
    nv.compute = [SimpleNamespace(pid=101), SimpleNamespace(pid=102), SimpleNamespace(pid=101)]
    rows = src.processes()
    assert [(r.pid, r.uuid, r.device_index) for r in rows] == [
        (101, "GPU-5b1c2a3d-0000-1111-2222-333344445555", "0"), (102, "GPU-5b1c2a3d-0000-1111-2222-333344445555", "0")]
    s = SimpleNamespace
    nv.samples = [s(pid=101, timeStamp=10, smUtil=80), s(pid=101, timeStamp=20, smUtil=40),
                  s(pid=102, timeStamp=20, smUtil=5)]
    assert src.shares() == {(("gpu", "0"),): {101: pytest.approx(0.6), 102: pytest.approx(0.05)}}
    # the next call asks for samples after the newest one seen; older ones it returns are ignored
    nv.samples = [s(pid=101, timeStamp=20, smUtil=99), s(pid=102, timeStamp=30, smUtil=50)]
    assert src.shares() == {(("gpu", "0"),): {102: pytest.approx(0.5)}} and nv.calls[-1] == 20
    nv.samples = nv.NVMLError(6)          # NOT_FOUND: no sample since then, the GPU answered: shares 0
    assert src.shares() == {(("gpu", "0"),): {}}
    nv.samples = nv.NVMLError(3)          # NOT_SUPPORTED: remembered, never asked again, no share
    assert src.shares() == {}
    n = len(nv.calls)
    assert src.shares() == {} and len(nv.calls) == n
    nv.lost = True                        # GPU_IS_LOST: skipped until the retry time
    assert src.processes() == []
    nv.lost = False
    assert src.processes() == []
    now[0] = 31.0
    assert [r.pid for r in src.processes()] == [101, 102]


def test_registry_builds_it_with_the_sources_and_turns_it_off_without_accelerators() -> None:
    names = [c.name for c in build_collectors(AgentOptions(ebpf=False, pod_resources_socket="/x/kubelet.sock"))]
    assert "workloads" in names and names.index("workloads") > names.index("npu")
    built = build_collectors(AgentOptions(ebpf=False))
    wl = next(c for c in built if c.name == "workloads")
    assert isinstance(wl, WorkloadsCollector) and [s.name for s in wl.sources] == ["nvml", "npu-smi"]
    kept, off = split_available(built)
    if not any(c.name == "nvml" for c, _ in off) or not any(c.name == "npu" for c, _ in off):
        pytest.skip("this host has an accelerator")
    wl_off = next(c for c in kept if c.name == "workloads")
    assert isinstance(wl_off, UnavailableCollector) and "no accelerator to attribute" in wl_off.reason
    for c in kept:
        c.close()
    assert "workloads" not in [c.name for c in build_collectors(AgentOptions(ebpf=False, workloads=False))]
    assert "workloads" not in [c.name for c in build_collectors(AgentOptions(ebpf=False, nvml=False, npu=False))]


def test_cli_options() -> None:
    from triscope.cli import build_parser
    from triscope.commands.agent import build_config

    args = build_parser().parse_args(["agent", "--no-workloads", "--pod-resources-socket", "/run/k/kubelet.sock",
                                      "--db", "sqlite:///x.db"])
    cfg = build_config(args, None)
    assert cfg.options.workloads is False and cfg.options.pod_resources_socket == "/run/k/kubelet.sock"
    default = build_config(build_parser().parse_args(["agent", "--db", "sqlite:///x.db"]), None)
    assert default.options.workloads is True
    assert default.options.pod_resources_socket == "/var/lib/kubelet/pod-resources/kubelet.sock"
