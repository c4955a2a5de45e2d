"""The NVML path of workload attribution on a real GPU (the H200 machine; ``gpu`` marker): a real
CUDA process doing bf16 matrix products is listed by NVML with its SM share, attributed, and its
host evidence read per tick; the tick's cost with NVML's list measured."""

from __future__ import annotations

import statistics
import subprocess
import sys
import time

import pytest

from triscope.agent.workloads.collector import WorkloadsCollector
from triscope.agent.workloads.nvml_processes import NvmlProcessSource
from triscope.core.samples import Sample

pytestmark = pytest.mark.gpu

WORK = r"""
import sys, time, torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
torch.cuda.synchronize()
print("ready", flush=True)
end = time.time() + float(sys.argv[1])
while time.time() < end:
    for _ in range(10):
        c = a @ b
    torch.cuda.synchronize()
"""


@pytest.fixture(scope="module")
def nvml() -> NvmlProcessSource:
    src = NvmlProcessSource()
    av = src.check()
    if not av.ok:
        pytest.skip(f"no NVIDIA GPU here: {av.reason}")
    try:
        import torch  # noqa: F401
    except ImportError:
        pytest.skip("PyTorch is not installed here (the H200 machine has it)")
    return src


def test_a_cuda_process_is_listed_attributed_and_measured(nvml: NvmlProcessSource) -> None:
    proc = subprocess.Popen([sys.executable, "-c", WORK, "40"], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        deadline = time.monotonic() + 20
        rows = []
        while time.monotonic() < deadline:
            rows = [r for r in nvml.processes() if r.pid == proc.pid]
            if rows:
                break
            time.sleep(0.2)
        assert rows, f"NVML never listed PID {proc.pid}: {nvml.processes()}"
        gpu = dict(rows[0].labels)["gpu"]
        assert rows[0].uuid.startswith("GPU-")
        c = WorkloadsCollector([nvml], pod_resources_socket="/nonexistent/kubelet.sock", background=False,
                               busy_cores=0.3)
        c.refresh(force=True)
        costs = []
        items: list = []
        for _ in range(8):
            time.sleep(1)
            c.refresh()                   # what the worker does off the tick: SM shares every second
            t0 = time.thread_time()
            items = list(c.collect(time.time()))
            costs.append(time.thread_time() - t0)
        c.close()
        mine = [s for s in items if isinstance(s, Sample) and s.labels.get("gpu") == gpu]
        info = [s.labels for s in mine if s.name == "triscope_accelerator_workload_info"]
        # named: by its command here, or its unit, or its pod where the machine runs one
        assert info and all(lab["workload"].startswith(("cmd:", "unit:")) or lab["pod"] for lab in info), info
        sm = {s.labels["workload"]: s.value for s in mine if s.name == "triscope_workload_sm_ratio"}
        print(f"\nGPU {gpu}: info {info}\nSM shares {sm}\nevidence " + ", ".join(
            f"{s.name.removeprefix('triscope_workload_')}={s.value:.3f}" for s in mine
            if s.name.startswith("triscope_workload_")) +
            f"\ncollect() thread CPU per tick: median {statistics.median(costs[1:]) * 1e3:.3f} ms, "
            f"max {max(costs[1:]) * 1e3:.3f} ms")
        # bf16 matmuls back to back: the driver's per-process samples say the SMs are busy
        assert max(sm.values()) > 0.3, sm
        cpu = [s.value for s in mine if s.name == "triscope_workload_cpu_seconds_total"]
        assert cpu and max(cpu) > 0.1       # the launching thread spins in cudaDeviceSynchronize
        assert statistics.median(costs[1:]) < 0.001
    finally:
        proc.kill()
        proc.wait(10)


def test_a_process_that_exits_leaves_the_list(nvml: NvmlProcessSource) -> None:
    proc = subprocess.Popen([sys.executable, "-c", WORK, "3"], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    assert any(r.pid == proc.pid for r in nvml.processes())
    proc.wait(30)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(r.pid == proc.pid for r in nvml.processes()):
        time.sleep(0.2)
    assert not any(r.pid == proc.pid for r in nvml.processes())
