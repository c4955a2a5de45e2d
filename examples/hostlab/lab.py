"""The host lab: the production-like classes of the verdict on this machine's real kernel, the GPU simulated.

    sudo .venv/bin/python -m examples.hostlab.lab --node cpu-lab-3        # ~5 minutes, into examples/hostlab/traces
    sudo .venv/bin/python -m examples.hostlab.lab --node cpu-lab-4 --set fourth --hold 50   # the fourth set (fourth.py)
    sudo .venv/bin/python -m examples.hostlab.lab --node cpu-lab-N --set fifth --hold 45    # the fifth set (fifth.py)

No GPU is needed, and only the GPU is stood in for.  Two stand-in services (``service.py``: a real
DataLoader-style host side, worker processes that decode on the CPU, payloads fetched over TCP;
a sleep per batch for the GPU's work) share "GPU 0".  Service ``a`` is the heavier one on the GPU and
always healthy; ``b`` is the lighter one and carries each scenario's fault, so a verdict that names
the larger SM share names the wrong one.  The faults are real: too few loader workers for the
decode work, a CFS CPU limit on b's cgroup (cgroup v1 ``cpu.cfs_quota_us`` here; the kernel
throttles it), packets of b's own connection dropped by nftables (``numgen random``), and a non-GPU
process whose own stream loses 20 % of its packets beside two healthy services.

The agent's real collectors run (host CPU, PSI, TCP, the workloads collector with its process
sets, cgroup CPU limit and per-workload TCP); the lab stands in for NVML only: the two service PIDs
listed on GPU 0 with their busy shares as SM shares, GPU 0's SM activity their sum (capped at 1),
and the link facts of a Gen5 x16 link.  The ticks go into a SQLite store and out as a trace
(``<node>.jsonl.gz``) with its timeline (``<node>.timeline.jsonl``), which ``acceptance.py`` replays.

**The expectations are in ``SCENARIOS`` below, written before a recording is made and never edited
after it.**  Needs root (cgroups, nftables), Debian's ``nftables`` package and a cgroup v1 ``cpu``
hierarchy or a cgroup v2 one with the ``cpu`` controller.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
HEALTHY = ("demand-limited", "idle", "balanced", "compute-bound")
A_PORT, B_PORT, U_PORT = 47811, 47812, 47813
NFT_TABLE = "triscope_lab"


@dataclass(frozen=True)
class Service:
    workers: int = 2
    item_ms: float = 3.0
    gpu_ms: float = 15.0
    batch: int = 1
    rate: float = 30.0
    fetch: int = 0                     # blob server port (0: no fetch)
    fetch_bytes: int = 16384

    def argv(self) -> list[str]:
        out = ["--workers", str(self.workers), "--item-ms", str(self.item_ms), "--gpu-ms", str(self.gpu_ms),
               "--batch", str(self.batch), "--rate", str(self.rate), "--fetch-bytes", str(self.fetch_bytes)]
        if self.fetch:
            out += ["--fetch", f"127.0.0.1:{self.fetch}"]
        return out


A_HEALTHY = Service(workers=2, item_ms=3, gpu_ms=15, batch=1, rate=30, fetch=A_PORT)
B_LIGHT = Service(workers=2, item_ms=3, gpu_ms=10, batch=1, rate=5, fetch=B_PORT)


@dataclass(frozen=True)
class Scenario:
    name: str
    title: str
    a: Service
    b: Service
    expect: tuple[str, ...]            # the accelerator's expected states
    faulty: bool                       # b carries a fault: an I/O verdict must name b
    b_cpu_limit: float | None = None   # cores
    b_loss: float | None = None        # share of b's connection's packets dropped
    unrelated_loss: float | None = None
    note: str = ""
    knobs: dict[str, Any] = field(default_factory=dict)


SCENARIOS: tuple[Scenario, ...] = (
    Scenario("healthy", "a at its load, b light; every host side quiet", A_HEALTHY, B_LIGHT, HEALTHY, False,
             note="nothing limits either: never an I/O state"),
    Scenario("loader_few_workers", "b: one loader worker for 60 ms of decode per item, pipeline kept full",
             A_HEALTHY, Service(workers=1, item_ms=60, gpu_ms=5, batch=4, rate=0, fetch=B_PORT),
             ("staging-bound",), True, knobs={"workers": 1},
             note="b's worker pegged at a core while its GPU work waits; b has the smaller SM share"),
    Scenario("loader_throttled", "b's cgroup limited to 0.25 CPU (CFS), two workers, pipeline kept full",
             A_HEALTHY, Service(workers=2, item_ms=20, gpu_ms=5, batch=4, rate=0, fetch=B_PORT),
             ("staging-bound",), True, b_cpu_limit=0.25, knobs={"cpu_limit": 0.25},
             note="throttled in nearly every CFS period; no thread of b reaches a core"),
    Scenario("own_lossy_connection", "b's own payload connection loses 10 % of its packets, 8 requests/s",
             A_HEALTHY, Service(workers=2, item_ms=3, gpu_ms=10, batch=1, rate=8, fetch=B_PORT, fetch_bytes=200_000),
             ("network-bound",), True, b_loss=0.10, knobs={"net_drop": 0.10},
             note="a low-rate service: a few retransmits a second, far under any node-wide bar"),
    Scenario("unrelated_retransmits", "a process with no GPU streams over a connection losing 20 %; a and b healthy",
             A_HEALTHY, B_LIGHT, HEALTHY, False, unrelated_loss=0.20,
             note="the node retransmits a lot, none of it a GPU service's: no network-bound"),
    Scenario("compute", "a at twice its load: the GPU busy", Service(workers=2, item_ms=2, gpu_ms=15, batch=1, rate=60,
                                                                       fetch=A_PORT), B_LIGHT,
             ("compute-bound", "balanced"), False, note="the GPU is the limit"),
)


BLOB = r"""
import socket, sys, threading
def serve(port):
    lst = socket.socket(); lst.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    lst.bind(("127.0.0.1", port)); lst.listen(64)
    while True:
        c, _ = lst.accept()
        threading.Thread(target=conn, args=(c,), daemon=True).start()
def conn(c):
    f = c.makefile("rb")
    buf = b"y" * 65536
    try:
        for line in f:
            n = int(line)
            while n > 0:
                k = min(n, len(buf)); c.sendall(buf[:k]); n -= k
    except (OSError, ValueError):
        pass
for p in sys.argv[1:]:
    threading.Thread(target=serve, args=(int(p),), daemon=True).start()
print("ready", flush=True)
threading.Event().wait()
"""

STREAMER = r"""
import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
print("ready", flush=True)
while True:
    s.sendall(b"65536\n")
    got = 0
    while got < 65536:
        got += len(s.recv(65536))
"""


def nft(*cmd: str) -> None:
    subprocess.run(["nft", *cmd], check=True, capture_output=True)


def drop(port: int, share: float) -> None:
    """Drop ``share`` of the packets to or from ``port`` on the **input** hook: the sender's segment
    has left (a drop on the output hook is returned to the sending socket as a local error and
    re-sent at once, never counted as a retransmission), so the sender retransmits it after a
    timeout as it would for a packet lost on the wire."""
    pct = int(round(share * 100))
    nft("add", "rule", "inet", NFT_TABLE, "in", "tcp", "dport", str(port), "numgen", "random", "mod", "100", "<",
        str(pct), "drop")
    nft("add", "rule", "inet", NFT_TABLE, "in", "tcp", "sport", str(port), "numgen", "random", "mod", "100", "<",
        str(pct), "drop")


class CpuLimit:
    """A cgroup with a CFS CPU limit: v1 ``cpu`` hierarchy, else v2 with the cpu controller."""

    def __init__(self, name: str) -> None:
        v1 = next((p for p in ("/sys/fs/cgroup/cpu,cpuacct", "/sys/fs/cgroup/cpu")
                   if os.path.exists(f"{p}/cpu.cfs_quota_us")), None)
        if v1 is not None:
            self.dir, self.v2, self.root = Path(v1, name), False, Path(v1)
        elif "cpu" in _read("/sys/fs/cgroup/cgroup.controllers").split():
            self.dir, self.v2, self.root = Path("/sys/fs/cgroup", name), True, Path("/sys/fs/cgroup")
            with contextlib.suppress(OSError):     # the cpu controller for the root's children
                Path("/sys/fs/cgroup/cgroup.subtree_control").write_text("+cpu")
        else:
            raise SystemExit("hostlab: no cgroup with the cpu controller here")
        self.dir.mkdir(exist_ok=True)

    def limit(self, cores: float | None) -> None:
        if self.v2:
            (self.dir / "cpu.max").write_text("max 100000" if cores is None else f"{int(cores * 100000)} 100000")
        else:
            (self.dir / "cpu.cfs_period_us").write_text("100000")
            (self.dir / "cpu.cfs_quota_us").write_text("-1" if cores is None else str(int(cores * 100000)))

    def put(self, pids: list[int]) -> None:
        for pid in pids:
            with contextlib.suppress(OSError):
                (self.dir / "cgroup.procs").write_text(str(pid))

    def remove(self) -> None:
        for pid in (self.dir / "cgroup.procs").read_text().split():
            with contextlib.suppress(OSError):
                (self.root / "cgroup.procs").write_text(pid)
        for _ in range(150):      # a killed process leaves its cgroup once it is reaped
            try:
                self.dir.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.1)


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def cpu_limit_available() -> bool:
    """A cgroup v1 ``cpu`` hierarchy, or cgroup v2 with the cpu controller, and root."""
    if os.geteuid() != 0:
        return False
    return any(os.path.exists(f"{p}/cpu.cfs_quota_us") for p in ("/sys/fs/cgroup/cpu,cpuacct", "/sys/fs/cgroup/cpu")) \
        or "cpu" in _read("/sys/fs/cgroup/cgroup.controllers").split()


def _family(pid: int) -> list[int]:
    out = [pid]
    for p in os.listdir("/proc"):
        if p.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                data = Path(f"/proc/{p}/stat").read_bytes()
                if int(data[data.rindex(b")") + 2:].split(b" ", 2)[1]) == pid:
                    out.append(int(p))
    return out


def lab_network() -> tuple[subprocess.Popen[str], CpuLimit]:
    """What every lab scenario runs on: the blob server (a, b and the unrelated streamer's ports), the
    nftables table whose input chain the losses go into, the cgroup a CPU limit goes on.  Needs root
    and nftables (said in one line otherwise)."""
    if os.geteuid() != 0 or shutil.which("nft") is None:
        raise SystemExit("hostlab: needs root and nftables (apt-get install nftables)")
    blob = subprocess.Popen([sys.executable, "-c", BLOB, str(A_PORT), str(B_PORT), str(U_PORT)],
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert blob.stdout is not None and blob.stdout.readline().strip() == "ready"
    with contextlib.suppress(subprocess.CalledProcessError):
        nft("delete", "table", "inet", NFT_TABLE)
    nft("add", "table", "inet", NFT_TABLE)
    nft("add", "chain", "inet", NFT_TABLE, "in", "{ type filter hook input priority 0; }")
    return blob, CpuLimit(f"triscope-lab-{os.getpid()}")


def apply_faults(sc: Any, b_pid: int, limit: CpuLimit) -> list[subprocess.Popen[str]]:
    """Scenario ``sc``'s faults on b (pid ``b_pid``): its CPU limit, its connection's loss, an unrelated
    lossy streamer; returns the processes started (to be stopped with the services)."""
    extra = []
    if sc.b_cpu_limit is not None:
        limit.limit(sc.b_cpu_limit)
        time.sleep(0.3)
        limit.put(_family(b_pid))
    if sc.b_loss is not None:
        drop(B_PORT, sc.b_loss)
    if sc.unrelated_loss is not None:
        drop(U_PORT, sc.unrelated_loss)
        s = subprocess.Popen([sys.executable, "-c", STREAMER, str(U_PORT)], stdout=subprocess.PIPE,
                             text=True, start_new_session=True)
        assert s.stdout is not None and s.stdout.readline().strip() == "ready"
        extra.append(s)
    return extra


def timeline_lines(sc: Any, t0: float, t1: float) -> list[dict[str, Any]]:
    """The timeline's two lines of scenario ``sc`` (held from ``t0`` to ``t1``): a and b, what was expected."""
    return [{"scenario": sc.name, "title": sc.title, "start": round(t0, 3), "end": round(t1, 3),
             "instance": who, "role": "faulty" if who == "b" and sc.faulty else "healthy",
             "workload": f"lab-{who}", "gpu": 0, "service": asdict(svc),
             "knobs": sc.knobs if who == "b" else {}, "faulty": sc.faulty and who == "b",
             "expected_state": list(sc.expect), "note": sc.note}
            for who, svc in (("a", sc.a), ("b", sc.b))]


class Lab:
    """The services, the GPU stand-in and the collectors of one recording."""

    def __init__(self, tmp: Path) -> None:
        from triscope.agent.workloads.accelprocs import ListedProcessSource

        self.tmp = tmp
        self.source = ListedProcessSource(name="nvml")
        self.busy_files = {"a": tmp / "a.busy", "b": tmp / "b.busy"}
        self.procs: dict[str, subprocess.Popen[str]] = {}
        self.extra: list[subprocess.Popen[str]] = []

    def busy(self, who: str) -> float:
        try:
            return float(self.busy_files[who].read_text())
        except (OSError, ValueError):
            return 0.0

    def start(self, who: str, svc: Service) -> subprocess.Popen[str]:
        self.busy_files[who].write_text("0\n")
        p = subprocess.Popen([sys.executable, "-m", "examples.hostlab.service", "--name", f"lab-{who}",
                              "--busy-file", str(self.busy_files[who]), *svc.argv()], cwd=REPO,
                             stdout=subprocess.PIPE, text=True, start_new_session=True)
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        self.procs[who] = p
        return p

    def rows(self) -> list[Any]:
        from triscope.agent.workloads.accelprocs import AcceleratorProcess, gpu_labels

        uuid = "GPU-1ab00000-0000-4000-8000-000000000000"
        return [AcceleratorProcess(gpu_labels(0), uuid, p.pid, "0", self.busy(w)) for w, p in self.procs.items()]

    def stop_all(self) -> None:
        for p in [*self.procs.values(), *self.extra]:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            with contextlib.suppress(Exception):
                p.wait(10)
        self.procs.clear()
        self.extra.clear()


class LabGpu:
    """GPU 0 as the lab simulates it: SM activity (and NVML utilisation) the services' summed busy
    shares, capped at 1; a Gen5 x16 link's facts; a little PCIe traffic with the work."""

    name = "nvml"

    def __init__(self, lab: Lab) -> None:
        self.lab = lab
        self.rx = 0.0
        self.last: float | None = None

    def check(self) -> Any:
        from triscope.agent.collectors.base import Availability

        return Availability(True, "the host lab's simulated GPU")

    def collect(self, now: float) -> list[Any]:
        from triscope.core.samples import Sample

        busy = min(1.0, sum(self.lab.busy(w) for w in self.lab.procs))
        if self.last is not None:
            self.rx += 2e8 * busy * (now - self.last)      # 0.2 GB/s at a busy GPU: 0.4 % of the link
        self.last = now
        g = {"gpu": "0"}
        self.lab.source.set(self.lab.rows())
        return [Sample("triscope_gpu_sm_active_ratio", busy, g), Sample("triscope_gpu_utilization_ratio", busy, g),
                Sample("triscope_gpu_memory_utilization_ratio", 0.3 * busy, g),
                Sample("triscope_gpu_pcie_rx_bytes_total", self.rx, g, "counter"),
                Sample("triscope_gpu_pcie_tx_bytes_total", self.rx / 10, g, "counter"),
                Sample("triscope_gpu_pcie_link_speed_gts", 32.0, {**g, "kind": "current"}),
                Sample("triscope_gpu_pcie_link_width", 16.0, {**g, "kind": "current"}),
                Sample("triscope_gpu_info", 1.0, {**g, "uuid": "GPU-1ab00000-0000-4000-8000-000000000000",
                                                  "name": "simulated (host lab)", "bus_id": ""})]

    def close(self) -> None:
        return None


def record(node: str, out: Path, hold: float) -> Path:
    from triscope.agent.registry import AgentOptions, build_collectors, split_available
    from triscope.agent.sampler import Sampler
    from triscope.agent.workloads.collector import WorkloadsCollector
    from triscope.analysis.online import MismatchTracker
    from triscope.core.samples import Tick
    from triscope.core.trace import export_trace
    from triscope.store import Store

    blob, limit = lab_network()
    tmp = Path(tempfile.mkdtemp(prefix="hostlab-"))
    lab = Lab(tmp)
    base, _ = split_available(build_collectors(AgentOptions(ebpf=False, nvml=False, npu=False, workloads=False)))
    wl = WorkloadsCollector([lab.source], pods_log_dir=str(tmp / "no-pods"), pod_resources_socket=str(tmp / "no.sock"))
    ticks: list[Tick] = []

    class Keep:
        def submit(self, tick: Tick) -> None:
            ticks.append(tick)

    sampler = Sampler([*base, LabGpu(lab), wl], [Keep()], interval=1.0, post=[MismatchTracker()])
    timeline: list[dict[str, Any]] = []
    done = threading.Event()

    def drive() -> None:
        try:
            for sc in SCENARIOS:
                lab.start("a", sc.a)
                b = lab.start("b", sc.b)
                lab.extra += apply_faults(sc, b.pid, limit)
                t0 = time.time()
                print(f"hostlab: {sc.name}: {sc.title}", file=sys.stderr, flush=True)
                time.sleep(hold)
                timeline.extend(timeline_lines(sc, t0, time.time()))
                lab.stop_all()
                nft("flush", "chain", "inet", NFT_TABLE, "in")
                limit.limit(None)
                time.sleep(3.0)          # the services gone before the next starts
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
        lab.stop_all()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(blob.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.CalledProcessError):
            nft("delete", "table", "inet", NFT_TABLE)
        limit.remove()
        wl.close()
    out.mkdir(parents=True, exist_ok=True)
    db = tmp / "lab.db"
    st = Store.open(f"sqlite:///{db}")
    st.upgrade()
    try:
        for i in range(0, len(ticks), 60):
            st.write_ticks(node, ticks[i:i + 60])
        trace = out / f"{node}.jsonl.gz"
        export_trace(st, node, trace, node_labels={"lab": "host lab, GPU simulated"})
    finally:
        st.close()
    (out / f"{node}.timeline.jsonl").write_text("".join(json.dumps(ln) + "\n" for ln in timeline))
    shutil.rmtree(tmp, ignore_errors=True)
    return trace


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m examples.hostlab.lab", description=__doc__.split("\n\n")[0])
    ap.add_argument("--node", required=True, help="the recording's node name (cpu-lab-N)")
    ap.add_argument("--out", type=Path, default=REPO / "examples" / "hostlab" / "traces")
    ap.add_argument("--hold", type=float, default=45.0, help="seconds per scenario (default 45)")
    ap.add_argument("--set", default="", help="'fourth' (or 'fourth-a', 'fourth-b', or comma-separated class names): "
                    "the fourth set's classes (fourth.py), pods and the stand-in CUDA driver; 'fifth', 'fifth-a', "
                    "'fifth-b' or fifth-set class names: the fifth set's (fifth.py); default: SCENARIOS")
    ap.add_argument("--no-ebpf", action="store_true", help="fourth set: without the eBPF probes (wait-for evidence)")
    args = ap.parse_args(argv)
    if args.set:
        from . import fifth, fourth, fourth_cpu

        names = list({**fourth.SETS, **fifth.SETS}.get(args.set, [n for n in args.set.split(",") if n]))
        known = fifth.CPU_BY_NAME if all(n in fifth.CPU_BY_NAME for n in names) else fourth.CPU_BY_NAME
        unknown = [n for n in names if n not in known]
        if unknown:
            ap.error(f"unknown classes (one set at a time, fourth or fifth): {', '.join(unknown)}")
        trace = fourth_cpu.record(args.node, args.out, args.hold, names, ebpf=not args.no_ebpf, by_name=known,
                                  runner_cls=fifth.Runner if known is fifth.CPU_BY_NAME else fourth.Runner)
        print(f"hostlab: wrote {trace} and its timeline", file=sys.stderr)
        return 0
    trace = record(args.node, args.out, args.hold)
    print(f"hostlab: wrote {trace} and its timeline", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
