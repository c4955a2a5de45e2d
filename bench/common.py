"""What every benchmark returns: rows of one table (``make bench`` prints them together)."""

from __future__ import annotations

import platform
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class Row:
    benchmark: str          # e.g. "ingest sqlite"
    figure: str             # what was measured, e.g. "samples/s (batched, agent tick)"
    value: float
    unit: str
    target: str = ""        # e.g. ">= 100000"
    baseline: str = ""      # named baseline measured in the same run, e.g. "naive ORM row-by-row"
    baseline_value: float | None = None
    ok: bool | None = None  # target met?


def machine() -> str:
    import os

    return f"{platform.node()} {platform.machine()} {os.cpu_count()} cpu, Python {platform.python_version()}, kernel {platform.release()}"


# -- a real agent process and its whole-process cost (one helper for every benchmark that starts one) ------
CLK_TCK = 0


def cpu_seconds(pid: int) -> float:
    """utime + stime of every thread of ``pid`` so far (``/proc/PID/stat``)."""
    global CLK_TCK
    import os

    if not CLK_TCK:
        CLK_TCK = os.sysconf("SC_CLK_TCK")
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def rss_mb(pid: int) -> float:
    """``VmRSS`` of ``pid`` in MB (NaN when the process has none left)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, timeout: float = 30.0) -> bool:
    import contextlib
    import socket
    import time

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
        time.sleep(0.1)
    return False


def get_metrics(port: int, timeout: float = 5.0) -> str:
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout) as r:
        return r.read().decode()


def listed_process_env(tmp: Path, rows: list, pods: Path, tag: str = "") -> dict[str, str]:
    """The environment of an agent whose workloads collector follows ``rows`` (gpu, uuid, pid, share)
    instead of NVML's process list (``bench_workloads.SITECUSTOMIZE``), pods named from ``pods``."""
    import json
    import os

    from bench.bench_workloads import SITECUSTOMIZE

    rows_file = tmp / f"rows{'-' + tag if tag else ''}.json"
    rows_file.write_text(json.dumps(rows))
    (tmp / "site").mkdir(exist_ok=True)
    (tmp / "site" / "sitecustomize.py").write_text(SITECUSTOMIZE)
    path = f"{tmp / 'site'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}".rstrip(os.pathsep)
    return {**os.environ, "PYTHONPATH": path, "TRISCOPE_BENCH_ROWS": str(rows_file), "TRISCOPE_BENCH_PODS": str(pods)}


@dataclass
class Cost:
    """One window of a process: its share of a core (all threads), its RSS (max over the window and at
    its end, MB), and the share of each process measured beside it (by pid)."""

    cpu: float
    rss_max: float
    rss_end: float
    beside: dict[int, float]


class AgentProcess:
    """``triscope agent`` as a user runs it, on a SQLite file of its own under ``tmp``: the schema
    upgraded first (``triscope db upgrade``), then the agent with ``--no-migrate``, ``/metrics`` on a free
    port, its log in ``tmp/agent-TAG.log``.  ``with AgentProcess(...) as a: a.cost(...)``."""

    def __init__(self, tmp: Path, tag: str, args: list[str], env: dict[str, str] | None = None,
                 duration: float = 120.0, module: bool = False) -> None:
        import os
        import sys

        self.tmp, self.tag, self.args = tmp, tag, list(args)
        self.env = env if env is not None else dict(os.environ)
        self.duration = duration
        script = Path(__file__).resolve().parents[1] / ".venv" / "bin" / "triscope"
        # module: ``python -m triscope`` (a PYTHONPATH in ``env`` then picks the tree that runs)
        self.cmd = [sys.executable, "-m", "triscope"] if module or not script.exists() else [str(script)]
        self.port = free_port()
        self.db = f"sqlite:///{tmp}/bench-{tag}.db"
        self.log_path = tmp / f"agent-{tag}.log"
        self.proc: Any = None

    def __enter__(self) -> AgentProcess:
        import subprocess

        res = subprocess.run([*self.cmd, "db", "upgrade", "--db", self.db], capture_output=True, text=True,
                             cwd=self.tmp, env=self.env)
        if res.returncode != 0:
            raise RuntimeError(f"triscope db upgrade failed: {res.stderr.strip()[-400:]}")
        argv = ["agent", "--db", self.db, "--interval", "1", "--spool", f"{self.tmp}/spool-{self.tag}", "--listen",
                f"127.0.0.1:{self.port}", "--duration", str(int(self.duration)), "--no-migrate", *self.args]
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen([*self.cmd, *argv], stdout=subprocess.DEVNULL, stderr=log, cwd=self.tmp,
                                         env=self.env)
        if not wait_port(self.port, 60):
            self.stop()
            raise RuntimeError(f"the agent did not serve /metrics: {self.log_tail()}")
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def pid(self) -> int:
        return int(self.proc.pid)

    def log_tail(self, n: int = 400) -> str:
        try:
            return self.log_path.read_text()[-n:]
        except OSError:
            return ""

    def metrics(self) -> str:
        return get_metrics(self.port, timeout=20.0)    # a loaded machine can hold a tick's render for seconds

    def cost(self, window: float, warm: float = 0.0, scrape: list[int] | None = None,
             beside: tuple[int, ...] = ()) -> Cost:
        """After ``warm`` seconds, the agent's CPU over ``window`` seconds (and that of the ``beside``
        pids); ``scrape``: the agent's /metrics and these other ports read once a second throughout, as
        Prometheus would (None: nothing reads it)."""
        import contextlib
        import time

        def read_all() -> None:
            for port in [self.port, *(scrape or [])]:
                with contextlib.suppress(OSError):
                    get_metrics(port)

        end = time.monotonic() + warm
        while time.monotonic() < end:
            if scrape is not None:
                read_all()
            time.sleep(max(0.0, min(1.0, end - time.monotonic())))
        ticks0 = self.ticks()
        c0, o0, t0 = cpu_seconds(self.pid), [cpu_seconds(p) for p in beside], time.monotonic()
        rss = [rss_mb(self.pid)]
        while time.monotonic() - t0 < window:
            if scrape is not None:
                read_all()
            rss.append(rss_mb(self.pid))
            time.sleep(max(0.0, min(1.0 - (time.monotonic() - t0) % 1.0, window - (time.monotonic() - t0))))
        dt = time.monotonic() - t0
        share = (cpu_seconds(self.pid) - c0) / dt
        others = {p: (cpu_seconds(p) - o) / dt for p, o in zip(beside, o0, strict=True)}
        end_rss = rss_mb(self.pid)
        ticked = self.ticks() - ticks0
        if ticked < 0.8 * dt - 2:   # a stalled agent (or one stopped from outside) costs nothing: no figure
            raise RuntimeError(f"the agent ticked {ticked:.0f} times in {dt:.0f} s: {self.log_tail(300)}")
        return Cost(share, max([*rss, end_rss]), end_rss, others)

    def ticks(self) -> float:
        """``triscope_ticks_total`` now (the sampler's ticks so far)."""
        for line in self.metrics().splitlines():
            if line.startswith("triscope_ticks_total "):
                return float(line.split()[1])
        raise RuntimeError("the agent's /metrics has no triscope_ticks_total")

    def stop(self) -> None:
        import contextlib
        import subprocess

        p = self.proc
        if p is None or p.poll() is not None:
            return
        p.terminate()
        try:
            p.wait(15)
        except subprocess.TimeoutExpired:
            p.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):   # killed; reaped when this process ends
                p.wait(60)
