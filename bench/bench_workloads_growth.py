"""The whole agent's cost against busy workloads (issue 46 item 4): 8, 64 and 256 of them.

``triscope agent`` (the console script, every collector, as ``bench_workload_sockets`` runs it), its
workloads collector fed by a process list standing in for NVML's (the GPUs are the only part that
is not here; a ``sitecustomize`` swaps the registry's source before the command starts, every other
option as the registry passes it).  The host, all real:

* **N workloads**, each one process of 4 threads in a pod cgroup of its own (the kubelet's cgroupfs
  layout under ``triscope-bench/`` in every v1 hierarchy the agent reads, or under
  ``triscope-bench.slice/`` on a v2 host; a CPU limit of half a core each), a
  ``/var/log/pods``-shaped tree naming every pod, spread over 8 GPUs (``N / 8`` on each: at 256 more
  than the 8 a GPU names, the rest summed as ``other``);
* **32 TCP connections a workload** to one upstream process outside every workload (64 workloads:
  2,048 connections, ~4,100 sockets, plus whatever the host holds);
* **busy**: every workload wakes every 50 ms, works, and sends a request on a few of its connections
  that the upstream answers (every socket moves within a few seconds); the farm holds ~0.6 of a core
  in all, whatever N (so each workload is below the rotation's 0.05-core "quiet" bar at 64 and 256).

The agent's CPU is its ``utime + stime`` (``/proc/PID/stat``: every thread) over a window after a
warm-up, RSS its ``VmRSS`` at the end; rounds alternate baseline and each N, each a fresh agent.
The baseline is the same agent on the same host (the farm running, the sockets there) whose listed
process is nobody's: the workloads collector on, nothing to attribute.
"""

from __future__ import annotations

import contextlib
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from bench.common import AgentProcess, Row, listed_process_env

ROOT = Path(__file__).resolve().parents[1]
GPUS = 8
CONNS = 32           # connections a workload
FARM_CORES = 0.6     # the whole farm's CPU, whatever N


UPSTREAM = r"""
import resource, selectors, socket, sys
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
lst = socket.socket()
lst.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
lst.bind(("127.0.0.1", 0))
lst.listen(4096)
lst.setblocking(False)
sel = selectors.DefaultSelector()
sel.register(lst, selectors.EVENT_READ)
print(lst.getsockname()[1], flush=True)
while True:
    for key, _ in sel.select():
        s = key.fileobj
        if s is lst:
            try:
                c, _ = lst.accept()
            except BlockingIOError:
                continue
            c.setblocking(False)
            sel.register(c, selectors.EVENT_READ)
            continue
        try:
            data = s.recv(4096)
        except (BlockingIOError, ConnectionError):
            continue
        if not data:
            sel.unregister(s)
            s.close()
            continue
        try:
            s.send(data)
        except (BlockingIOError, ConnectionError):
            pass
"""

WORKLOADS = r"""
import os, random, resource, socket, sys, threading, time
n, port, conns, duty = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
def child(i):
    socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(conns)]
    ev = threading.Event()
    for _ in range(3):
        threading.Thread(target=ev.wait, daemon=True).start()
    os.read(r, 1)          # every workload connected and moved into its cgroup
    rnd = random.Random(i)
    period = 0.05
    time.sleep(rnd.random() * period)
    k = 0
    while True:
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < duty * period:
            pass
        for s in (socks[(k + j) % conns] for j in range(2)):
            s.send(b"x" * 64)
            s.recv(4096)
        k += 2
        time.sleep(max(0.0, period - (time.perf_counter() - t0)))
r, w = os.pipe()
pids = []
for i in range(n):
    pid = os.fork()
    if pid == 0:
        os.close(w)
        child(i)
        os._exit(0)
    pids.append(pid)
os.close(r)
print(" ".join(map(str, pids)), flush=True)
sys.stdin.readline()        # moved into their cgroups: go
os.write(w, b"g" * n)
sys.stdin.read()
for p in pids:
    os.kill(p, 9)
for p in pids:
    os.waitpid(p, 0)
"""

V1_HIERARCHIES = ("systemd", "cpu", "cpuacct", "pids")


class Host:
    """The upstream, the N workloads, their cgroups and pod logs; ``close()`` removes all of it."""

    def __init__(self, n: int, tmp: Path) -> None:
        from triscope.agent.workloads.cgroups import unified_root

        self.made: list[Path] = []
        self.logs = tmp / "pods"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.upstream = subprocess.Popen([sys.executable, "-c", UPSTREAM], stdout=subprocess.PIPE, text=True,
                                         start_new_session=True)
        assert self.upstream.stdout is not None
        port = int(self.upstream.stdout.readline())
        duty = min(0.9, FARM_CORES / n)
        self.farm = subprocess.Popen([sys.executable, "-c", WORKLOADS, str(n), str(port), str(CONNS), str(duty)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True)
        assert self.farm.stdout is not None and self.farm.stdin is not None
        self.pids = [int(p) for p in self.farm.stdout.readline().split()]
        v2 = unified_root("/sys") if os.geteuid() == 0 else None
        self.cgroups = 0
        self.rows: list[tuple[int, str, int, float]] = []
        for i, pid in enumerate(self.pids):
            g = i % GPUS
            uid = str(uuid.uuid4())
            cid = uuid.uuid4().hex + uuid.uuid4().hex
            (self.logs / f"bench_wl{i}_{uid}" / "server").mkdir(parents=True)
            self.rows.append((g, f"GPU-{g:08x}-0000-4000-8000-000000000000", pid, 0.1))
            if os.geteuid() != 0:
                continue
            try:
                if v2:
                    u = uid.replace("-", "_")
                    d = (Path(v2) / "triscope-bench.slice/kubepods.slice/kubepods-burstable.slice"
                         / f"kubepods-burstable-pod{u}.slice" / f"cri-containerd-{cid}.scope")
                    self._put(d, pid, {"cpu.max": "50000 100000"})
                else:
                    rel = f"triscope-bench/kubepods/burstable/pod{uid}/{cid}"
                    for h in V1_HIERARCHIES:
                        base = Path("/sys/fs/cgroup") / h
                        if base.is_dir():
                            self._put(base / rel, pid, {"cpu.cfs_quota_us": "50000"} if h == "cpu" else {})
                self.cgroups += 1
            except OSError:
                pass
        self.farm.stdin.write("go\n")
        self.farm.stdin.flush()

    def _put(self, d: Path, pid: int, settings: dict[str, str]) -> None:
        missing = []
        p = d
        while not p.exists():
            missing.append(p)
            p = p.parent
        for m in reversed(missing):
            m.mkdir()
            self.made.append(m)
        for k, v in settings.items():
            with contextlib.suppress(OSError):
                (d / k).write_text(v)
        (d / "cgroup.procs").write_text(str(pid))

    def close(self) -> None:
        import signal

        for p in (self.farm, self.upstream):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            with contextlib.suppress(Exception):
                p.wait(30)
        for d in sorted(self.made, key=lambda p: len(p.parts), reverse=True):
            for _ in range(100):
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.05)


def host_sockets() -> int:
    n = 0
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(name) as f:
            n += sum(1 for _ in f) - 1
    return n


def agent_cost(host: Host, rows: list[tuple[int, str, int, float]], tmp: Path, window: float, warm: float,
               tag: str) -> tuple[float, float, int]:
    """(share of a core, RSS MB at the window's end, workload series) of a fresh agent following ``rows``."""
    env = listed_process_env(tmp, rows, host.logs, tag)
    with AgentProcess(tmp, tag, [], env, duration=warm + window + 60) as agent:
        cost = agent.cost(window, warm)
        text = agent.metrics()
        series = sum(1 for line in text.splitlines() if line.startswith("triscope_workload_processes{"))
        if any(r[2] in host.pids for r in rows) and not series:
            raise RuntimeError("the agent published no workload series: " + agent.log_tail(300))
        return cost.cpu, cost.rss_end, series


def _fmt(vals: list[float], scale: float = 100.0) -> str:
    return f"min {min(vals) * scale:.2f}, max {max(vals) * scale:.2f}, n={len(vals)}"


def run(quick: bool = False, sizes: tuple[int, ...] = (8, 64, 256)) -> list[Row]:
    if not Path("/proc/self/fd").is_dir():
        return [Row("workloads growth", "needs Linux procfs", float("nan"), "", ok=False)]
    if resource.getrlimit(resource.RLIMIT_NOFILE)[1] < max(sizes) * CONNS + 256:
        return [Row("workloads growth", "needs a larger descriptor limit", float("nan"), "", ok=False)]
    window, warm, rounds = (30.0, 12.0, 1) if quick else (30.0, 12.0, 3)
    out: list[Row] = []
    targets = {64: 0.005, 256: 0.01}
    with tempfile.TemporaryDirectory(prefix="bench-growth-") as td:
        for n in sizes:
            sub = Path(td, str(n))
            sub.mkdir()
            host = Host(n, sub)
            try:
                time.sleep(3)
                socks = host_sockets()
                nobody = [[0, "GPU-00000000-0000-4000-8000-000000000000", 2 ** 22 - 1, 0.0]]
                got: dict[str, list[tuple[float, float, int]]] = {"base": [], "on": []}
                for r in range(rounds):
                    for tag, rows in (("base", nobody), ("on", host.rows)):
                        got[tag].append(agent_cost(host, rows, sub, window, warm, f"{tag}{r}"))  # type: ignore[arg-type]
            finally:
                host.close()
            base = [g[0] for g in got["base"]]
            on = [g[0] for g in got["on"]]
            rss_b = [g[1] for g in got["base"]]
            rss_on = [g[1] for g in got["on"]]
            series = got["on"][-1][2]
            target = targets.get(n)
            where = (f"{n} busy workloads in pod cgroups of their own ({host.cgroups} placed) over {GPUS} GPUs, "
                     f"{n * CONNS:,} connections, {socks:,} TCP sockets on the host; {series} workload series")
            out.append(Row("workloads growth", f"whole agent CPU, % of a core: {where} (utime+stime of every thread "
                           f"over {window:.0f} s, median of {rounds} alternating rounds; {_fmt(on)})",
                           round(statistics.median(on) * 100, 2), "%",
                           f"<= {target * 100:g}" if target else "", "the same agent and host, no listed process "
                           f"({_fmt(base)})", round(statistics.median(base) * 100, 2),
                           statistics.median(on) <= target if target else None))
            out.append(Row("workloads growth", f"whole agent RSS at the window's end, {n} workloads "
                           f"({_fmt(rss_on, 1.0)})", round(statistics.median(rss_on), 1), "MB", "",
                           f"no listed process ({_fmt(rss_b, 1.0)})", round(statistics.median(rss_b), 1)))
    return out


if __name__ == "__main__":
    args = [int(a) for a in sys.argv[1:] if a.isdigit()]
    for row in run("--quick" in sys.argv, tuple(args) or (8, 64, 256)):
        print(row)
