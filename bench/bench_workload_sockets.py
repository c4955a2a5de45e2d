"""The per-workload socket read against a workload holding 10,000 TCP sockets: the whole agent's CPU.

``triscope agent`` (the console script, every collector, as ``bench_workloads``' footprint runs it),
its workloads collector fed by a process list standing in for NVML's (the GPUs are the only part
that is not here): one GPU process, a real process holding 10,000 connected loopback TCP sockets
(5,000 connections, both ends its own), against the same agent whose listed process holds 16.  The
agent's CPU is its ``utime + stime`` (``/proc/PID/stat``: every thread) over a window after a warm-up;
medians of 3 alternating rounds (without, with, ...), each a fresh agent.  Issue 43: 0.4 % of a core
without, 3.3-3.6 % with, before the read got its CPU budget (``workloads.tcp.CPU_BUDGET``).
"""

from __future__ import annotations

import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.common import AgentProcess, Row, listed_process_env

SOCKETS = 10_000


HOLDER = r"""
import resource, socket, sys
n = int(sys.argv[1])
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, n + 256), max(hard, n + 256)))
lst = socket.socket()
lst.bind(("127.0.0.1", 0))
lst.listen(4096)
keep = []
for _ in range(n // 2):
    keep.append(socket.create_connection(lst.getsockname()))
    keep.append(lst.accept()[0])
lst.close()
print("ready", flush=True)
sys.stdin.read()
"""


def agent_cpu(sockets: int, tmp: Path, window: float, warm: float) -> float:
    """The agent's share of a core over ``window`` seconds, its listed GPU process holding ``sockets``."""
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(sockets)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "ready"
        (tmp / "pods").mkdir(exist_ok=True)
        env = listed_process_env(tmp, [[0, "GPU-00000000-0000-4000-8000-000000000000", holder.pid, 0.3]], tmp / "pods")
        with AgentProcess(tmp, str(sockets), [], env, duration=warm + window + 60) as agent:
            share = agent.cost(window, warm).cpu
            if "triscope_workload_tcp_segments_sent_total{" not in agent.metrics():
                raise RuntimeError("the agent published no per-workload TCP counters: " + agent.log_tail(300))
            return share
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(30)


def run(quick: bool = False) -> list[Row]:
    if not Path("/proc/self/fd").is_dir():
        return [Row("workloads sockets", "needs Linux procfs", float("nan"), "", ok=False)]
    if resource.getrlimit(resource.RLIMIT_NOFILE)[1] < SOCKETS + 256:
        return [Row("workloads sockets", "needs a descriptor limit of 10,256", float("nan"), "", ok=False)]
    window, warm, rounds = (40.0, 10.0, 1) if quick else (60.0, 12.0, 3)
    got: dict[int, list[float]] = {16: [], SOCKETS: []}
    with tempfile.TemporaryDirectory(prefix="bench-sockets-") as td:
        for r in range(rounds):
            for n in (16, SOCKETS):
                sub = Path(td, f"{r}-{n}")
                sub.mkdir()
                got[n].append(agent_cpu(n, sub, window, warm))
    base, loaded = (statistics.median(got[n]) * 100 for n in (16, SOCKETS))
    return [Row("workloads sockets", f"whole agent CPU, % of a core, with a workload holding {SOCKETS:,} TCP sockets "
                f"(utime+stime of every thread over {window:.0f} s, median of {rounds} alternating rounds; "
                f"each round {', '.join(f'{v * 100:.2f}' for v in got[SOCKETS])})", round(loaded, 2), "%",
                "<= 1", "the same agent, the workload holding 16 sockets (each round "
                + ", ".join(f"{v * 100:.2f}" for v in got[16]) + ")", round(base, 2), ok=loaded <= 1.0)]


if __name__ == "__main__":
    for row in run("--quick" in sys.argv):
        print(row)
