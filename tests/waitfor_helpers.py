"""Real processes and threads for the wait-for tests, and a small driver that runs the agent's own
wait-for pipeline over them (``WorkloadWaits``: the kernel probes, the reader, the chain) as the
workloads collector does, one tick a second, and sums what it published.

The processes are plain Python with their own ``comm`` (``prctl(PR_SET_NAME)``), started from
source strings here, so each test says in a few lines what waits on what.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from triscope.agent.workloads.attribution import attribute, read_pod_dirs, read_process
from triscope.agent.workloads.waits import WorkloadWaits
from triscope.core.samples import Sample

PRELUDE = r"""
import ctypes, os, socket, sys, threading, time
def name(n):
    ctypes.CDLL(None).prctl(15, n.encode()[:15], 0, 0, 0)
def burn(sec):
    t = time.monotonic()
    while time.monotonic() - t < sec:
        pass
"""

WL = ("", "", "", "cmd:wf-test")


def start(code: str, *args: str, cpus: set[int] | None = None, pass_fds: tuple[int, ...] = ()) -> subprocess.Popen[str]:
    """A Python process running ``PRELUDE + code`` with ``args``; waits for it to print ``ready``."""
    p = subprocess.Popen([sys.executable, "-c", PRELUDE + code, *args], stdout=subprocess.PIPE, text=True,
                         pass_fds=pass_fds, start_new_session=True)
    assert p.stdout is not None
    line = p.stdout.readline().strip()
    assert line == "ready", f"child did not start: {line!r}"
    if cpus is not None:
        for tid in os.listdir(f"/proc/{p.pid}/task"):
            os.sched_setaffinity(int(tid), cpus)
    return p


def stop(*procs: subprocess.Popen[str]) -> None:
    for p in procs:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(p.pid, 9)
    for p in procs:
        with contextlib.suppress(Exception):
            p.wait(10)


@dataclass
class Traced:
    """What the agent published for one workload over a run: the driving threads' seconds by state,
    by chain end (cause, relation, culprit, culprit's workload labels), and the demand counters."""

    states: dict[str, float] = field(default_factory=dict)
    chain: dict[tuple[str, ...], float] = field(default_factory=dict)
    service: dict[tuple[str, ...], float] = field(default_factory=dict)
    found_by: str = ""
    requests_wait: float = 0.0
    waited_on: float = 0.0
    connections: dict[str, dict[str, float]] = field(default_factory=dict)

    def share(self, state: str) -> float:
        tot = sum(self.states.values())
        return self.states.get(state, 0.0) / tot if tot else 0.0

    def blocked_share(self, state: str) -> float:
        """Of the time blocked (not on a CPU, not waiting for one), the share in ``state``: what a
        thread waits on, whatever else runs on this machine."""
        tot = sum(v for k, v in self.states.items() if k not in ("cpu", "cpu_wait"))
        return self.states.get(state, 0.0) / tot if tot else 0.0

    def chain_share(self, pred: Any) -> float:
        tot = sum(self.chain.values())
        return sum(v for k, v in self.chain.items() if pred(*k)) / tot if tot else 0.0

    def top(self) -> tuple[str, ...]:
        return max(self.chain.items(), key=lambda kv: kv[1])[0]

    def culprits(self) -> set[str]:
        """The culprits the run's chain ended on (seconds counted in the run, not before it)."""
        return {k[2] for k, v in self.chain.items() if v > 0}


def trace(waitfor: Any, pids: list[int], listed: list[int], seconds: float = 4.0, warmup: float = 4.5,
          api: Any = None) -> Traced:
    """Follow ``pids`` (one workload on "GPU 0", ``listed`` its processes on it) for ``warmup``
    seconds (two reads of the maps, 2 s apart: the chain's producers get followed), then count
    ``seconds`` more."""
    ww = WorkloadWaits(waitfor, api=api, pods=lambda: read_pod_dirs())
    info = read_process("/proc", listed[0])
    wl = attribute(info, (), read_pod_dirs()) if info is not None else WL
    plan = [SimpleNamespace(labels=(("gpu", "0"),), groups=((wl, tuple(pids)),), listed=((wl, tuple(listed)),))]
    try:
        base: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        t_end = time.monotonic() + warmup
        while time.monotonic() < t_end:
            ww.tick(plan, [])
            time.sleep(0.5)
        out: list[Any] = []
        ww.tick(plan, out)
        base = {(s.name, tuple(sorted(s.labels.items()))): s.value for s in out if isinstance(s, Sample)}
        t_end = time.monotonic() + seconds
        while time.monotonic() < t_end:
            time.sleep(0.5)
            out = []
            ww.tick(plan, out)
        return _summed(out, base)
    finally:
        ww.close()


def _summed(out: list[Any], base: dict[tuple[str, tuple[tuple[str, str], ...]], float]) -> Traced:
    t = Traced()
    for s in out:
        if not isinstance(s, Sample):
            continue
        d = s.value - base.get((s.name, tuple(sorted(s.labels.items()))), 0.0) if s.kind == "counter" else s.value
        lab = s.labels
        if s.name == "triscope_workload_driver_seconds_total":
            t.states[lab["state"]] = t.states.get(lab["state"], 0.0) + d
        elif s.name in ("triscope_workload_wait_chain_seconds_total", "triscope_workload_service_chain_seconds_total"):
            k = (lab["cause"], lab["relation"], lab["culprit"], lab["culprit_namespace"], lab["culprit_pod"],
                 lab["culprit_container"], lab["culprit_workload"])
            into = t.chain if s.name == "triscope_workload_wait_chain_seconds_total" else t.service
            into[k] = into.get(k, 0.0) + d
        elif s.name == "triscope_workload_driver_threads":
            t.found_by = lab["found_by"]
        elif s.name == "triscope_workload_requests_wait_seconds_total":
            t.requests_wait += d
        elif s.name == "triscope_workload_driver_waited_on_seconds_total":
            t.waited_on += d
        elif s.name.startswith("triscope_workload_wait_connection_"):
            which = s.name.removeprefix("triscope_workload_wait_connection_").removesuffix("_total")
            t.connections.setdefault(lab["culprit"], {})[which] = s.value
    return t
