"""The per-workload socket read against a workload holding 10,000 TCP sockets: the whole agent's CPU.

``triscope agent`` (the console script, every collector, as ``bench_workloads``' footprint runs it),
its workloads collector fed by a process list standing in for NVML's (the GPUs are the only part
that is not here): one GPU process, a real process holding 10,000 connected loopback TCP sockets
(5,000 connections, both ends its own), against the same agent whose listed process holds 16.  The
agent's CPU is its ``utime + stime`` (``/proc/PID/stat``: every thread) over a window after a warm-up;
medians of 3 alternating rounds (without, with, ...), each a fresh agent.  Issue 43: 0.4 % of a core
without, 3.3-3.6 % with, before the read got its CPU budget (``workload_tcp.CPU_BUDGET``).
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from bench.bench_workloads import SITECUSTOMIZE  # the registry's workloads collector fed by a listed process
from bench.common import Row

ROOT = Path(__file__).resolve().parents[1]
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


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def agent_cpu(sockets: int, tmp: Path, window: float, warm: float) -> float:
    """The agent's share of a core over ``window`` seconds, its listed GPU process holding ``sockets``."""
    from bench.bench_ebpf import _free_port, _wait_port

    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(sockets)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "ready"
        (tmp / "pods").mkdir(exist_ok=True)
        rows = tmp / "rows.json"
        rows.write_text(json.dumps([[0, "GPU-00000000-0000-4000-8000-000000000000", holder.pid, 0.3]]))
        (tmp / "site").mkdir(exist_ok=True)
        (tmp / "site" / "sitecustomize.py").write_text(SITECUSTOMIZE)
        env = {**os.environ, "PYTHONPATH": f"{tmp / 'site'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}".rstrip(
            os.pathsep), "TRISCOPE_BENCH_ROWS": str(rows), "TRISCOPE_BENCH_PODS": str(tmp / "pods")}
        script = ROOT / ".venv" / "bin" / "triscope"
        cmd = [str(script)] if script.exists() else [sys.executable, "-m", "triscope"]
        port = _free_port()
        db = f"sqlite:///{tmp}/bench-{sockets}.db"
        subprocess.run([*cmd, "db", "upgrade", "--db", db], check=True, capture_output=True, cwd=tmp)
        argv = ["agent", "--db", db, "--interval", "1", "--spool", f"{tmp}/spool-{sockets}", "--listen",
                f"127.0.0.1:{port}", "--duration", str(int(warm + window + 60)), "--no-migrate"]
        with open(tmp / f"agent-{sockets}.log", "w") as log:
            agent = subprocess.Popen([*cmd, *argv], stdout=subprocess.DEVNULL, stderr=log, cwd=tmp, env=env)
            try:
                if not _wait_port(port, 60):
                    return float("nan")
                time.sleep(warm)
                c0, t0 = _cpu_s(agent.pid), time.monotonic()
                time.sleep(window)
                share = (_cpu_s(agent.pid) - c0) / (time.monotonic() - t0)
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                    text = r.read().decode()
                if "triscope_workload_tcp_segments_sent_total{" not in text:
                    raise RuntimeError("the agent published no per-workload TCP counters: "
                                       + (tmp / f"agent-{sockets}.log").read_text()[-300:])
                return share
            finally:
                agent.terminate()
                try:
                    agent.wait(15)
                except subprocess.TimeoutExpired:
                    agent.kill()
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
