"""The fourth set in the CPU host lab: ``fourth.CPU``'s classes on this machine, the GPU simulated.

    sudo .venv/bin/python -m examples.hostlab.lab --node cpu-lab-3 --set fourth --hold 50     # ~8 minutes

As ``lab.record``: the agent's collectors in this process (host CPU, PSI, TCP, the workloads collector
with its process sets, CFS and per-workload TCP; eBPF with the wait-for probes where BCC loads, the
wait-for reader handed to the workloads collector), a SQLite store, the trace and its timeline at the
end.  What differs: every service runs in a Kubernetes-style pod (``pods.py``, cgroup v1 here; the
pods' log directories in a scratch ``/var/log/pods`` the workloads collector reads), and the services
drive the simulated GPU through the stand-in CUDA driver (``fakecuda.py``'s ``libcuda.so.1``, loaded
with ctypes: launches, copies and spinning synchronisations a real driving thread makes).  GPU 0's
SM activity is the sum of the GPU processes' simulated busy shares (``fake_busy_ratio``, written to
their busy files), as ``lab.LabGpu`` publishes it.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from . import fourth
from .lab import NFT_TABLE, Lab, LabGpu, lab_network, nft


class SimLab(Lab):
    """``lab.Lab`` over a ``fourth.Runner``: the GPU processes are the runner's, the busy shares
    their busy files."""

    def __init__(self, tmp: Path, runner: fourth.Runner) -> None:
        super().__init__(tmp)
        self.runner = runner
        self.busy_files = {w: runner.busy_file(w) for w in ("a", "b")}

    @property
    def procs(self) -> dict[str, Any]:
        return dict(self.runner.gpu)

    @procs.setter
    def procs(self, value: dict[str, Any]) -> None:
        return None


def record(node: str, out: Path, hold: float, only: list[str] | None = None, ebpf: bool = True,
           by_name: dict[str, Any] | None = None, runner_cls: type[fourth.Runner] = fourth.Runner) -> Path:
    """``by_name``/``runner_cls``: another set's CPU classes and runner (the fifth set's, fifth.py)."""
    from triscope.agent.registry import AgentOptions, build_collectors, split_available
    from triscope.agent.sampler import Sampler
    from triscope.agent.workloads.collector import WorkloadsCollector
    from triscope.analysis.online import MismatchTracker
    from triscope.core.samples import Tick
    from triscope.core.trace import export_trace
    from triscope.store import Store

    from .fakecuda import build

    names = only or list(fourth.FOURTH)
    scenarios = [(by_name or fourth.CPU_BY_NAME)[n] for n in names]
    blob, limit = lab_network()
    tmp = Path(tempfile.mkdtemp(prefix="hostlab4-"))
    pods_dir = tmp / "pods"
    runner = runner_cls(tmp / "logs", tmp / "run", pods_log_dir=pods_dir, libcuda=str(build(tmp / "fakecuda")))
    runner.prepare(scenarios)
    lab = SimLab(tmp, runner)
    base, _ = split_available(build_collectors(AgentOptions(ebpf=ebpf, nvml=False, npu=False, workloads=False)))
    kw: dict[str, Any] = {}
    waitfor = next((getattr(c, "waitfor", None) for c in base if getattr(c, "name", "") == "ebpf"), None)
    if waitfor is not None and "waitfor" in inspect.signature(WorkloadsCollector).parameters:
        kw["waitfor"] = waitfor
        # the driver probes on the stand-in libcuda the services map (as the agent does on a GPU node)
        from triscope.agent.collectors.cudacalls import CudaCalls

        kw["api"] = CudaCalls(search_host=False)
    wl = WorkloadsCollector([lab.source], pods_log_dir=str(pods_dir), pod_resources_socket=str(tmp / "no.sock"), **kw)
    print(f"hostlab: fourth set, eBPF {'on' if any(getattr(c, 'name', '') == 'ebpf' for c in base) else 'off'}, "
          f"wait-for {'on' if kw else 'off'}", file=sys.stderr, flush=True)
    ticks: list[Tick] = []

    class Keep:
        def submit(self, tick: Tick) -> None:
            ticks.append(tick)

    sampler = Sampler([*base, LabGpu(lab), wl], [Keep()], interval=1.0, post=[MismatchTracker()])
    timeline: list[dict[str, Any]] = []
    done = threading.Event()
    failed: list[BaseException] = []

    def drive() -> None:
        try:
            for sc in scenarios:
                runner.start(sc)
                t0 = time.time()
                print(f"hostlab: {sc.name}: {sc.title}", file=sys.stderr, flush=True)
                time.sleep(hold)
                timeline.extend(runner.lines(sc, t0, time.time()))
                runner.stop()
                time.sleep(2.0)
        except BaseException as e:  # noqa: BLE001 - reported by the recording thread
            failed.append(e)
        finally:
            done.set()

    driver = threading.Thread(target=drive, daemon=True)
    try:
        driver.start()
        nxt = time.monotonic()
        while not done.is_set():
            sampler.tick()
            nxt += 1.0
            time.sleep(max(0.0, nxt - time.monotonic()))
    finally:
        runner.close()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(blob.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.CalledProcessError):
            nft("delete", "table", "inet", NFT_TABLE)
        limit.remove()
        wl.close()
        for c in base:
            with contextlib.suppress(Exception):
                c.close()
    if failed:
        raise SystemExit(f"hostlab: the fourth set stopped: {failed[0]} (the services' logs: {tmp / 'logs'})")
    out.mkdir(parents=True, exist_ok=True)
    db = tmp / "lab.db"
    st = Store.open(f"sqlite:///{db}")
    st.upgrade()
    try:
        for i in range(0, len(ticks), 60):
            st.write_ticks(node, ticks[i:i + 60])
        trace = out / f"{node}.jsonl.gz"
        export_trace(st, node, trace, node_labels={"lab": "host lab, GPU simulated (stand-in libcuda)"})
    finally:
        st.close()
    (out / f"{node}.timeline.jsonl").write_text(fourth.timeline_text(timeline))
    shutil.rmtree(tmp, ignore_errors=True)
    return trace
