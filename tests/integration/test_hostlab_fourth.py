"""The fourth set's serving code and pods, with real processes on this machine (examples/hostlab/
fourth.py): each CPU-lab service starts, prints ready and does what its class says, through the
stand-in CUDA driver (fakecuda.py's libcuda.so.1, loaded with ctypes) where it drives the "GPU".

* a decode sidecar feeds a GPU process over shared memory + a Unix socket, or over loopback TCP, and
  the GPU process waits on it (a stopped sidecar stops its GPU work);
* a spin-polling GPU worker really holds a core while its client sends 2 requests/s;
* an upstream losing 5 % of its packets (nftables, in a private network namespace) makes TCP
  retransmit under the handlers' fetches;
* the launch loop keeps its thread busy and the simulated GPU partly busy;
* the pod helper's cgroups (v1 here) carry the labels the agent reads, its limits and weights bite,
  and a whole fourth-set scenario starts, names its pods and cleans up.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from examples.hostlab.fakecuda import build  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def _v1_cpu() -> bool:
    return any(Path(p, "cpu.shares").exists() for p in ("/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpu,cpuacct"))


def _v2_cpu() -> bool:
    p = Path("/sys/fs/cgroup/cgroup.controllers")
    return p.exists() and "cpu" in p.read_text().split()


needs_cgroups = pytest.mark.skipif(os.geteuid() != 0 or not (_v1_cpu() or _v2_cpu()),
                                   reason="needs root and a cgroup cpu controller (v1 or v2)")


@pytest.fixture(scope="module")
def libcuda(tmp_path_factory: pytest.TempPathFactory) -> str:
    if shutil.which("gcc") is None:
        pytest.skip("gcc is needed to build the stand-in libcuda.so.1")
    return str(build(tmp_path_factory.mktemp("fakecuda")))


class Procs:
    """Processes started for one test, killed by process group at its end."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.procs: list[subprocess.Popen[str]] = []

    def start(self, module: str, *args: str, ready: bool = True, **kw: object) -> subprocess.Popen[str]:
        log = open(self.tmp / f"{module}-{len(self.procs)}.log", "w")  # noqa: SIM115 - the child's stderr
        p = subprocess.Popen([sys.executable, "-m", f"examples.hostlab.{module}", *args], cwd=REPO,
                             stdout=subprocess.PIPE, stderr=log, text=True, start_new_session=True, **kw)  # type: ignore[call-overload]
        log.close()
        self.procs.append(p)
        if ready:
            assert p.stdout is not None
            line = p.stdout.readline().strip()
            assert line == "ready", (module, line, self.logs())
        return p

    def logs(self) -> str:
        return "\n".join(f"{f.name}: {f.read_text()[-800:]}" for f in sorted(self.tmp.glob("*.log")))

    def stop(self) -> None:
        for p in self.procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
        for p in self.procs:
            with contextlib.suppress(Exception):
                p.wait(10)


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Procs]:
    ps = Procs(tmp_path)
    try:
        yield ps
    finally:
        ps.stop()


def cpu_seconds(pid: int, tid: int | None = None) -> float:
    path = f"/proc/{pid}/stat" if tid is None else f"/proc/{pid}/task/{tid}/stat"
    data = Path(path).read_bytes()
    f = data[data.rindex(b")") + 2:].split()
    return (int(f[11]) + int(f[12])) / TICK


def thread_cpu(pid: int) -> dict[int, float]:
    out = {}
    for t in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError):
            out[int(t)] = cpu_seconds(pid, int(t))
    return out


def busy(path: Path) -> float:
    try:
        return float(path.read_text())
    except (OSError, ValueError):
        return 0.0


def test_the_sidecar_feeds_the_gpu_process_over_shared_memory_and_a_unix_socket(
        procs: Procs, libcuda: str, tmp_path: Path) -> None:
    sock, busy_file = tmp_path / "feed.sock", tmp_path / "b.busy"
    feeder = procs.start("feeder", "--name", "lab-b-prep", "--transport", "unix", "--socket", str(sock),
                         "--batch", "8", "--image", "384")
    gpu = procs.start("fed_service", "--name", "lab-b", "--transport", "unix", "--socket", str(sock), "--batch", "8",
                      "--backend", "sim", "--busy-file", str(busy_file), "--libcuda", libcuda)
    time.sleep(3.0)
    maps = Path(f"/proc/{gpu.pid}/maps").read_text()
    assert f"/dev/shm/lab-feed-{feeder.pid}" in maps                  # the sidecar's ring, mapped
    assert "libcuda.so.1" in maps                                      # the driver it drives the GPU through
    assert Path(f"/proc/{gpu.pid}/comm").read_text().strip() == "lab-b"
    assert Path(f"/proc/{feeder.pid}/comm").read_text().strip() == "lab-b-prep"
    assert busy(busy_file) > 0.01
    # the GPU process waits on its sidecar: the sidecar stopped, its GPU work stops and it sleeps in a read
    os.kill(feeder.pid, signal.SIGSTOP)
    try:
        time.sleep(2.0)
        assert busy(busy_file) == 0.0
        c0 = cpu_seconds(gpu.pid)
        time.sleep(1.0)
        assert cpu_seconds(gpu.pid) - c0 < 0.1
        wchan = Path(f"/proc/{gpu.pid}/task/{gpu.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        assert wchan == "S"
    finally:
        os.kill(feeder.pid, signal.SIGCONT)
    time.sleep(1.5)
    assert busy(busy_file) > 0.01
    os.killpg(feeder.pid, signal.SIGTERM)                               # a sidecar stopped cleanly unlinks its ring
    feeder.wait(10)
    assert not Path(f"/dev/shm/lab-feed-{feeder.pid}").exists()


def test_the_tcp_sidecar_streams_batches_to_the_gpu_process(procs: Procs, libcuda: str, tmp_path: Path) -> None:
    from conftest import free_port

    port, busy_file = free_port(), tmp_path / "b.busy"
    procs.start("feeder", "--name", "lab-b-prep", "--transport", "tcp", "--port", str(port), "--batch", "4",
                "--image", "320")
    gpu = procs.start("fed_service", "--name", "lab-b", "--transport", "tcp", "--connect", f"127.0.0.1:{port}",
                      "--batch", "4", "--backend", "sim", "--busy-file", str(busy_file), "--libcuda", libcuda)
    time.sleep(3.0)
    assert busy(busy_file) > 0.01
    conns = subprocess.run(["ss", "-tnpH", "state", "established", f"( dport = :{port} )"], capture_output=True,
                           text=True).stdout if shutil.which("ss") else f"pid={gpu.pid}"
    assert f"pid={gpu.pid}" in conns


def test_the_spin_polling_worker_holds_a_core_at_two_requests_a_second(procs: Procs, libcuda: str,
                                                                       tmp_path: Path) -> None:
    from conftest import free_port

    port, busy_file = free_port(), tmp_path / "b.busy"
    svc = procs.start("service_http", "--name", "lab-b", "--port", str(port), "--batch", "4", "--poll", "spin",
                      "--backend", "sim", "--busy-file", str(busy_file), "--libcuda", libcuda,
                      "--sim-batch-us", "3000", "--sim-item-us", "1000")
    client = procs.start("loadclient", "--name", "lab-b-load", "--port", str(port), "--rate", "2", "--image", "256")
    t0, c0 = thread_cpu(svc.pid), time.monotonic()
    time.sleep(11.0)                                   # the client's first report comes at 10 s
    t1, dt = thread_cpu(svc.pid), time.monotonic() - c0
    per = sorted(((t1[t] - t0.get(t, 0.0)) / dt for t in t1), reverse=True)
    assert per[0] >= 0.6, per                          # one thread of the service spins on an empty queue
    assert sum(per[1:]) < 0.3, per                     # and the rest of it is nearly idle
    log = next(iter(sorted(tmp_path.glob("loadclient-*.log")))).read_text()
    m = re.search(r"sent (\d+) ok (\d+) failed (\d+)", log)
    assert m is not None, log
    sent, ok, failed = map(int, m.groups())
    assert 16 <= ok <= 24 and failed == 0, log         # ~2 requests/s over its first 10 s, all answered
    assert client.poll() is None


LO_UP = """
import fcntl, socket, struct, sys
with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as _s:
    _req = struct.pack("16sH", b"lo", 0)
    _flags = struct.unpack("16sH", fcntl.ioctl(_s.fileno(), 0x8913, _req)[:18])[1]
    fcntl.ioctl(_s.fileno(), 0x8914, struct.pack("16sH", b"lo", _flags | 0x1))
"""

UPSTREAM = """
import json, os, signal, subprocess, sys, time
from pathlib import Path
sys.path.insert(0, REPO)
from examples.hostlab import lab
from examples.hostlab.lab import B_PORT, NFT_TABLE, drop, nft

def retrans():
    lines = Path("/proc/net/snmp").read_text().splitlines()
    head, vals = [ln.split() for ln in lines if ln.startswith("Tcp:")][:2]
    return int(vals[head.index("RetransSegs")])

def ooo():
    lines = Path("/proc/net/netstat").read_text().splitlines()
    head, vals = [ln.split() for ln in lines if ln.startswith("TcpExt:")][:2]
    return int(vals[head.index("TCPOFOQueue")])

blob = subprocess.Popen([sys.executable, "-c", lab.BLOB, str(B_PORT)], stdout=subprocess.PIPE, text=True,
                        start_new_session=True)
assert blob.stdout.readline().strip() == "ready"
nft("add", "table", "inet", NFT_TABLE)
nft("add", "chain", "inet", NFT_TABLE, "in", "{ type filter hook input priority 0; }")
procs = [blob]
def start(*argv):
    p = subprocess.Popen([sys.executable, "-m", *argv], cwd=REPO, stdout=subprocess.PIPE, text=True,
                         stderr=subprocess.DEVNULL, start_new_session=True)
    procs.append(p)
    assert p.stdout.readline().strip() == "ready"
    return p
out = {}
try:
    start("examples.hostlab.service_http", "--name", "lab-b", "--port", "47842", "--batch", "8",
          "--upstream", f"127.0.0.1:{B_PORT}", "--fetch-bytes", "65536", "--backend", "sim",
          "--libcuda", LIBCUDA, "--sim-batch-us", "3000", "--sim-item-us", "1000")
    start("examples.hostlab.loadclient", "--name", "lab-b-load", "--port", "47842", "--rate", "8",
          "--conns", "4", "--image", "256")
    r0, o0 = retrans(), ooo()
    time.sleep(4.0)
    out["clean"] = retrans() - r0
    drop(B_PORT, 0.05)
    r0, o0 = retrans(), ooo()
    time.sleep(8.0)
    out["lossy"], out["ooo"] = retrans() - r0, ooo() - o0
finally:
    for p in procs:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
print(json.dumps(out))
"""


def test_the_upstream_losing_5_percent_makes_the_handlers_fetches_retransmit(libcuda: str) -> None:
    if os.geteuid() != 0 or shutil.which("nft") is None or shutil.which("unshare") is None:
        pytest.skip("needs root, nftables and unshare (a private network namespace)")
    probe = subprocess.run(["unshare", "-n", sys.executable, "-c", LO_UP], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"no network namespace here: {probe.stderr.strip()[-200:]}")
    script = LO_UP + f"REPO = {str(REPO)!r}\nLIBCUDA = {libcuda!r}\n" + textwrap.dedent(UPSTREAM)
    p = subprocess.run(["unshare", "-n", sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                       cwd=REPO)
    assert p.returncode == 0, p.stderr[-3000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert got["clean"] <= 1, got                      # no loss, no retransmits
    assert got["lossy"] >= 3, got                      # 5 % of 64 kB fetches at 8/s: the senders retransmit


def test_the_launch_loop_keeps_its_thread_busy_and_the_gpu_partly_busy(procs: Procs, libcuda: str,
                                                                        tmp_path: Path) -> None:
    busy_file = tmp_path / "b.busy"
    p = procs.start("launchloop", "--name", "lab-b", "--backend", "sim", "--busy-file", str(busy_file),
                    "--libcuda", libcuda, "--launches", "150", "--kernel-us", "4", "--host-us", "10")
    c0, t0 = cpu_seconds(p.pid), time.monotonic()
    time.sleep(3.0)
    share = (cpu_seconds(p.pid) - c0) / (time.monotonic() - t0)
    assert share >= 0.6, share                          # launching and syncing, never blocked
    assert 0.08 <= busy(busy_file) <= 0.8, busy(busy_file)
    assert "libcuda.so.1" in Path(f"/proc/{p.pid}/maps").read_text()


@needs_cgroups
def test_pods_carry_the_labels_the_agent_reads_and_their_weights_bite(procs: Procs, tmp_path: Path) -> None:
    from examples.hostlab.pods import Pod
    from triscope.agent.workloads.attribution import attribute, read_pod_dirs, read_process

    logs = tmp_path / "pods"
    victim_pod, hog_pod = Pod("lab-a", logs=logs), Pod("lab-hog", logs=logs)
    try:
        victim_pod.container("lab-a")
        hog_pod.container("lab-hog")
        victim_pod.set_weight(4)
        hog_pod.set_weight(590)
        ncpu = len(os.sched_getaffinity(0))
        victim = procs.start("burner", "--name", "lab-a", "--procs", "1")
        alone = cpu_seconds(victim.pid)
        time.sleep(1.5)
        alone = (cpu_seconds(victim.pid) - alone) / 1.5
        victim_pod.containers["lab-a"].put([victim.pid])
        hog_dirs = [str(d) for d in hog_pod.containers["lab-hog"].dirs]

        def enter() -> None:
            for d in hog_dirs:
                Path(d, "cgroup.procs").write_text(str(os.getpid()))

        hog = procs.start("burner", "--name", "lab-hog", "--procs", str(ncpu), preexec_fn=enter)
        info = read_process("/proc", victim.pid)
        assert info is not None and info.owner is not None and info.owner.pod_uid == victim_pod.uid
        pods = read_pod_dirs(str(logs))
        assert attribute(info, [], pods) == ("lab", "lab-a", "lab-a", "")
        hinfo = read_process("/proc", hog.pid)
        assert attribute(hinfo, [], pods) == ("lab", "lab-hog", "lab-hog", "")
        assert len(hog_pod.containers["lab-hog"].members()) == ncpu        # the forked burners stayed in it
        time.sleep(1.0)
        c0 = cpu_seconds(victim.pid)
        time.sleep(3.0)
        squeezed = (cpu_seconds(victim.pid) - c0) / 3.0
        assert alone >= 0.5 and squeezed < 0.15 * alone, (alone, squeezed)   # weight 4 against 590
    finally:
        procs.stop()
        victim_pod.remove()
        hog_pod.remove()
    assert not victim_pod.dirs[0].exists() and not victim_pod.log_dir.exists()


@needs_cgroups
def test_a_container_cpu_limit_throttles_the_sidecar(procs: Procs, tmp_path: Path) -> None:
    from examples.hostlab.pods import Pod

    pod = Pod("lab-b", logs=tmp_path / "pods")
    try:
        prep = pod.container("lab-b-prep", cpu_max=0.25)
        dirs = [str(d) for d in prep.dirs]

        def enter() -> None:
            for d in dirs:
                Path(d, "cgroup.procs").write_text(str(os.getpid()))

        p = procs.start("burner", "--name", "lab-b-prep", "--procs", "2", preexec_fn=enter)
        time.sleep(0.5)
        c0 = sum(cpu_seconds(q) for q in prep.members())
        time.sleep(3.0)
        used = (sum(cpu_seconds(q) for q in prep.members()) - c0) / 3.0
        assert used <= 0.35, used
        assert p.poll() is None
    finally:
        procs.stop()
        pod.remove()


@needs_cgroups
def test_a_fourth_set_scenario_starts_in_its_pods_and_cleans_up(libcuda: str, tmp_path: Path) -> None:
    if shutil.which("nft") is None:
        pytest.skip("the lab's network needs nftables")
    from examples.hostlab import fourth
    from examples.hostlab.lab import NFT_TABLE, lab_network, nft
    from triscope.agent.workloads.attribution import attribute, read_pod_dirs, read_process

    blob, limit = lab_network()
    r = fourth.Runner(tmp_path / "logs", tmp_path / "run", pods_log_dir=tmp_path / "pods", libcuda=libcuda)
    sc = fourth.CPU_BY_NAME["sidecar_shm"]
    try:
        r.prepare([sc])
        r.start(sc, timeout=60)
        pods = read_pod_dirs(str(tmp_path / "pods"))
        labels = {w: attribute(read_process("/proc", p.pid), [], pods) for w, p in r.gpu.items()}
        assert labels["a"] == ("lab", "lab-a", "lab-a", "")
        assert labels["b"] in (("lab", "lab-b", "", ""), ("lab", "lab-b", "lab-b", ""))   # named by its log link
        b_pod = r.pods[("sidecar_shm", "b")]
        assert len(b_pod.containers["lab-b-prep"].members()) >= 1
        time.sleep(3.0)
        assert busy(r.busy_file("a")) > busy(r.busy_file("b")) > 0.0      # a the heavier on the GPU
        lines = r.lines(sc, 0.0, 1.0)
        assert [ln["accept"] for ln in lines] == [["lab-a"], ["lab-b", "lab-b-prep"]]
        assert lines[1]["pod"]["uid"] == b_pod.uid and lines[1]["faulty"] and not lines[0]["faulty"]
    finally:
        r.close()
        os.killpg(blob.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.CalledProcessError):
            nft("delete", "table", "inet", NFT_TABLE)
        limit.remove()
    assert not list((tmp_path / "pods").iterdir()) and not list((tmp_path / "containers").iterdir())
    assert not list(Path("/dev/shm").glob("lab-feed-*"))
    assert not any(Path(d).exists() for p in (b_pod,) for d in p.dirs)
