"""Wait-for evidence on this machine's real kernel: real threads and processes wait on each other,
the agent's probes (sched_switch, sched_waking, the interrupt-context markers) and its chain say
who waited on what, and for how long.

Each test asserts the waker, the wait class (the state the driving thread blocked in) and the
shares; each reads only what the probes recorded, so each fails with the probes detached
(``test_nothing_without_the_probes`` shows the reading is then empty).
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.waitfor_helpers import PRELUDE, start, stop, trace
from triscope.agent.collectors.ebpf import EbpfCollector

pytestmark = pytest.mark.ebpf

NCPU = os.cpu_count() or 1


@pytest.fixture(scope="module")
def probes() -> Iterator[EbpfCollector]:
    c = EbpfCollector(probes=["waitfor", "waitfor_irq"])
    assert c.attached["waitfor"], c.reasons["waitfor"]
    assert c.waitfor is not None
    yield c
    c.close()


CONSUMER_PIPE = r"""
name("gpu-consumer")
r = int(sys.argv[1])
print("ready", flush=True)
while True:
    os.read(r, 64)
    burn(0.003)
"""
PRODUCER_PIPE = r"""
name("prep-producer")
w = int(sys.argv[1])
print("ready", flush=True)
while True:
    burn(0.03)
    os.write(w, b"x" * 64)
"""


def _cpu_controller() -> bool:
    """A cgroup cpu controller to make a pod's containers in (v2, or v1's cpu hierarchy): the host's
    /sys/fs/cgroup; a chroot that binds /sys without its submounts has none."""
    v2 = Path("/sys/fs/cgroup/cgroup.controllers")
    return (v2.exists() and "cpu" in v2.read_text().split()) or any(
        Path(p, "cpu.shares").exists() for p in ("/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpu,cpuacct"))


@pytest.mark.skipif(os.geteuid() != 0 or not _cpu_controller(),
                    reason="needs root and a cgroup cpu controller (v1 or v2) for the pod's containers")
def test_pipe_consumer_waits_on_a_producer_in_another_pod_container(probes: EbpfCollector) -> None:
    """The GPU process reads batches from a pipe; a producer in another container of its pod (its
    own cgroup) writes them after 30 ms of work each.  The consumer's time goes to IPC, each wait
    ended by the producer, which was working on a CPU: the chain ends on the producer's CPU work,
    the producer named with its pod and container, relation ``pod``."""
    from examples.hostlab.pods import Pod

    r, w = os.pipe()
    pod = Pod("wf-pod", namespace="wftest")
    procs: list[subprocess.Popen[str]] = []
    try:
        cons = start(CONSUMER_PIPE, str(r), pass_fds=(r,))
        procs.append(cons)
        prod = start(PRODUCER_PIPE, str(w), pass_fds=(w,))
        procs.append(prod)
        pod.container("gpu").put([cons.pid])
        pod.container("prep").put([prod.pid])
        got = trace(probes.waitfor, [cons.pid], [cons.pid])
    finally:
        stop(*procs)
        pod.remove()
        os.close(r)
        os.close(w)
    assert got.found_by == "main_thread"
    assert got.blocked_share("ipc") > 0.8, got.states
    # the producer's time: working, or waiting for a CPU to work on (this machine may be busy)
    prod = got.chain_share(lambda cause, rel, culprit, *_: cause in ("cpu", "cpu_wait") and culprit == "prep-producer")
    assert prod > 0.5, got.chain
    key = next(k for k in got.chain if k[0] == "cpu" and k[2] == "prep-producer")
    assert key[1] == "pod" and key[3:6] == ("wftest", "wf-pod", "prep"), key
    own = got.chain_share(lambda cause, rel, *_: cause == "cpu" and rel == "self")
    assert own < 0.3, got.chain


FUTEX = r"""
name("futex-main")
cv = threading.Condition()
items = []
def producer():
    name("futex-worker")
    while True:
        burn(0.02)
        with cv:
            items.append(1)
            cv.notify()
threading.Thread(target=producer, daemon=True).start()
print("ready", flush=True)
while True:
    with cv:
        while not items:
            cv.wait()
        items.clear()
"""


def test_futex_wait_ended_by_another_thread_of_the_process(probes: EbpfCollector) -> None:
    """The main thread waits on a condition variable (a futex); a worker thread of the same process
    notifies it after 20 ms of work: class ``lock``, the chain ends on the worker's CPU, relation
    ``process`` (another thread of the driving process)."""
    p = start(FUTEX)
    try:
        got = trace(probes.waitfor, [p.pid], [p.pid])
    finally:
        stop(p)
    assert got.blocked_share("lock") > 0.8, got.states
    worker = got.chain_share(lambda cause, rel, culprit, *_: cause in ("cpu", "cpu_wait") and culprit == "futex-worker"
                             and rel == "process")
    assert worker > 0.5, got.chain


SPIN_SERVICE = r"""
name("spin-svc")
import queue
q = queue.Queue()
done = threading.Event()
port = int(sys.argv[1])
def worker():                      # the GPU worker: spins on an empty queue
    name("spin-worker")
    while True:
        try:
            item = q.get_nowait()
        except queue.Empty:
            continue
        burn(0.002)
        item.set()
def intake(conn):
    name("spin-intake")
    f = conn.makefile("rb")
    for line in f:
        ev = threading.Event()
        q.put(ev)
        ev.wait()
        conn.sendall(b"ok\n")
lst = socket.socket(); lst.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
lst.bind(("127.0.0.1", port)); lst.listen(8)
threading.Thread(target=worker, daemon=True).start()
print("ready", flush=True)
while True:
    c, _ = lst.accept()
    threading.Thread(target=intake, args=(c,), daemon=True).start()
"""
CLIENT = r"""
name("wf-client")
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
f = s.makefile("rb")
rate = float(sys.argv[2])
print("ready", flush=True)
while True:
    s.sendall(b"req\n")
    f.readline()
    time.sleep(1.0 / rate)
"""


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_spinning_thread_nobody_waits_on_is_no_cause(probes: EbpfCollector) -> None:
    """A service at 2 requests/s whose GPU worker thread spin-polls an empty queue: the worker is
    busy all the time, but its intake waits for requests far longer than anyone waits on the worker.
    The spinner (the driving thread here: it is the listed process's busiest) shows as its own CPU;
    the demand counters say the workload waits for requests; the verdict's chain reads no I/O cause."""
    from triscope.analysis.config import MismatchThresholds
    from triscope.analysis.features import WaitEvidence, WorkloadEvidence
    from triscope.analysis.waitverdict import chain_finding

    port = _port()
    svc = start(SPIN_SERVICE, str(port))
    cli = start(CLIENT, str(port), "2")
    try:
        spinner = next(int(t) for t in os.listdir(f"/proc/{svc.pid}/task")
                       if _comm(svc.pid, int(t)) == "spin-worker")
        got = trace(probes.waitfor, [svc.pid], [svc.pid], api=_Driving({spinner}))
    finally:
        stop(cli, svc)
    assert got.found_by == "driver_calls"
    assert got.share("cpu") + got.share("cpu_wait") > 0.8, got.states      # spinning, or waiting for a CPU to spin on
    assert got.requests_wait > 2 * got.waited_on and got.requests_wait > 1.0, (got.requests_wait, got.waited_on)
    seconds = sum(got.states.values())
    ev = WaitEvidence(seconds, {k: v / seconds for k, v in got.states.items()},
                      {k: v / sum(got.chain.values()) for k, v in got.chain.items()},  # type: ignore[misc]
                      got.requests_wait / 4.0, got.waited_on / 4.0, got.found_by)
    f = chain_finding(WorkloadEvidence(("", "", "", "cmd:spin-svc"), wait=ev), engaged=0.02, th=MismatchThresholds())
    assert f is not None and f.state == "", ((f.state, f.groups) if f else None, got.states, got.chain)


LOOP_SERVICE = r"""
name("loop-svc")
import asyncio, threading
ring = []                          # the GPU worker's ring: the event loop puts, the worker polls
port = int(sys.argv[1])
def worker():                      # the GPU worker: polls the ring with sched_yield while it is empty
    name("loop-worker")
    while True:
        if not ring:
            os.sched_yield()
            continue
        fut, loop = ring.pop()
        burn(0.002)
        loop.call_soon_threadsafe(fut.set_result, b"ok\n")
async def handle(reader, writer):
    loop = asyncio.get_running_loop()
    while await reader.readline():
        fut = loop.create_future()
        ring.append((fut, loop))
        writer.write(await fut)
        await writer.drain()
async def main():
    srv = await asyncio.start_server(handle, "127.0.0.1", port)
    threading.Thread(target=worker, daemon=True).start()
    print("ready", flush=True)
    await srv.serve_forever()
asyncio.run(main())
"""


def test_an_event_loop_server_waits_for_requests_in_its_epoll_set(probes: EbpfCollector) -> None:
    """An asyncio service (one epoll set for its listener and its clients' connections, as uvicorn's
    or an aio gRPC server's) at 2 x 1 requests/s whose GPU worker polls an empty ring with
    sched_yield: the loop's waits in epoll_wait are waits for requests (its set watches the server's
    side only and its clients end them), so the demand counters say the workload waits for requests,
    nobody waits on the worker, and the verdict's chain reads no I/O cause.  Fails when an epoll
    wait is not read as one (the loop then reads as waiting on nothing identifiable: no demand)."""
    from triscope.analysis.config import MismatchThresholds
    from triscope.analysis.features import WaitEvidence, WorkloadEvidence
    from triscope.analysis.waitverdict import chain_finding

    port = _port()
    svc = start(LOOP_SERVICE, str(port))
    clients = [start(CLIENT, str(port), "1") for _ in range(2)]
    try:
        poller = next(int(t) for t in os.listdir(f"/proc/{svc.pid}/task")
                      if _comm(svc.pid, int(t)) == "loop-worker")
        got = trace(probes.waitfor, [svc.pid], [svc.pid], api=_Driving({poller}))
    finally:
        stop(*clients, svc)
    assert got.found_by == "driver_calls"
    assert got.share("cpu") + got.share("cpu_wait") > 0.8, got.states      # polling, or waiting for a CPU to poll on
    assert got.requests_wait > 2 * got.waited_on and got.requests_wait > 1.0, (got.requests_wait, got.waited_on)
    seconds = sum(got.states.values())
    ev = WaitEvidence(seconds, {k: v / seconds for k, v in got.states.items()},
                      {k: v / sum(got.chain.values()) for k, v in got.chain.items()},  # type: ignore[misc]
                      got.requests_wait / 4.0, got.waited_on / 4.0, got.found_by)
    f = chain_finding(WorkloadEvidence(("", "", "", "cmd:loop-svc"), wait=ev), engaged=0.02, th=MismatchThresholds())
    assert f is not None and f.state == "", ((f.state, f.groups) if f else None, got.states, got.chain)


def _comm(pid: int, tid: int) -> str:
    with open(f"/proc/{pid}/task/{tid}/comm") as f:
        return f.read().strip()


class _Driving:
    """Stands in for the CUDA driver probes' answer in a test without a GPU library: these threads
    called the driver (the API probes' own tests are tests/integration/test_cuda_uprobes.py)."""

    def __init__(self, tids: set[int]) -> None:
        self.tids = tids

    def track(self, tgids: object) -> None:
        return None

    def read(self) -> dict[int, object]:
        from types import SimpleNamespace
        return {t: SimpleNamespace(calls=1, sync_open=False, sync_seconds=0.0, h2d_pageable_seconds=0.0,
                                   h2d_pinned_seconds=0.0, d2h_seconds=0.0) for t in self.tids}

    def close(self) -> None:
        return None


TCP_READER = r"""
name("net-reader")
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
print("ready", flush=True)
while True:
    s.sendall(b"65536\n")
    got = 0
    while got < 65536:
        got += len(s.recv(65536))
"""
TCP_SERVER = r"""
name("net-sender")
lst = socket.socket(); lst.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
lst.bind(("127.0.0.1", int(sys.argv[1]))); lst.listen(4)
print("ready", flush=True)
c, _ = lst.accept()
f = c.makefile("rb")
buf = b"y" * 65536
for line in f:
    burn(float(sys.argv[2]))
    c.sendall(buf[:int(line)])
"""


@contextlib.contextmanager
def _lossy(port: int, pct: int) -> Iterator[None]:
    """Drop ``pct`` % of the packets to and from ``port`` on the input hook (the sender's segment has
    left: it retransmits after a timeout, as for a loss on the wire)."""
    from examples.hostlab.lab import NFT_TABLE, nft

    table = NFT_TABLE + "_wf"
    with contextlib.suppress(subprocess.CalledProcessError):
        nft("delete", "table", "inet", table)
    nft("add", "table", "inet", table)
    nft("add", "chain", "inet", table, "in", "{ type filter hook input priority 0; }")
    for d in ("dport", "sport"):
        nft("add", "rule", "inet", table, "in", "tcp", d, str(port), "numgen", "random", "mod", "100", "<", str(pct),
            "drop")
    try:
        yield
    finally:
        nft("delete", "table", "inet", table)


def test_socket_wait_on_a_lossy_loopback_connection(probes: EbpfCollector) -> None:
    """A process reads 64 KB answers from a loopback TCP connection that loses 10 % of its packets
    (nftables).  On loopback the receive softirq runs in the sender's context, so the waker is no
    answer; the wait class is the network socket, and the chain ends on that connection, named by
    its peer, whose counters show the loss — it is not followed to the sending process."""
    import shutil

    if shutil.which("nft") is None:
        pytest.skip("nftables is not installed (make test installs it)")
    port = _port()
    srv = start(TCP_SERVER, str(port), "0.0")
    with _lossy(port, 10):
        rd = start(TCP_READER, str(port))
        try:
            got = trace(probes.waitfor, [rd.pid], [rd.pid], seconds=5.0)
        finally:
            stop(rd, srv)
    assert got.blocked_share("network") > 0.8, got.states
    net = got.chain_share(lambda cause, rel, culprit, *_: cause == "network" and culprit == f"127.0.0.1:{port}")
    assert net > 0.5, got.chain
    conn = got.connections.get(f"127.0.0.1:{port}", {})
    assert conn.get("ooo_received", 0) + conn.get("retransmits", 0) > 0, conn
    assert "net-sender" not in got.culprits()


def test_lossless_loopback_peer_is_followed_to_the_producer(probes: EbpfCollector) -> None:
    """The same connection without loss, the sender working 20 ms before each answer (a feeder in
    another container speaking TCP to 127.0.0.1): the wait is followed to the process holding the
    other end, and ends on its CPU work."""
    port = _port()
    srv = start(TCP_SERVER, str(port), "0.02")
    rd = start(TCP_READER, str(port))
    try:
        got = trace(probes.waitfor, [rd.pid], [rd.pid])
    finally:
        stop(rd, srv)
    assert got.blocked_share("network") > 0.8, got.states
    sender = got.chain_share(lambda cause, rel, culprit, *_: cause in ("cpu", "cpu_wait") and culprit == "net-sender")
    assert sender > 0.4, got.chain


HOG = r"""
name("cpu-hog")
print("ready", flush=True)
while True:
    pass
"""
UDP_READER = r"""
name("udp-reader")
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("127.0.0.1", int(sys.argv[1])))
print("ready", flush=True)
while True:
    s.recv(2048)
"""
UDP_SENDER = r"""
name("udp-sender")
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
print("ready", flush=True)
while True:
    time.sleep(0.01)
    s.sendto(b"z" * 512, ("127.0.0.1", int(sys.argv[1])))
"""


@contextlib.contextmanager
def _rps(cpu: int) -> Iterator[None]:
    """Loopback's receive processing steered to ``cpu`` (RPS): the NET_RX softirq runs there,
    interrupting whatever runs on it."""
    path = "/sys/class/net/lo/queues/rx-0/rps_cpus"
    with open(path) as f:
        old = f.read().strip()
    with open(path, "w") as f:
        f.write(format(1 << cpu, "x"))
    try:
        yield
    finally:
        with open(path, "w") as f:
            f.write(old)


@pytest.mark.skipif(NCPU < 2, reason="needs two CPUs: the sender on one, the hog on the receiving one")
@pytest.mark.parametrize("hog_followed", [True, False], ids=["hog-followed", "hog-not-followed"])
def test_softirq_wakeups_are_the_network_not_the_task_they_interrupted(probes: EbpfCollector,
                                                                       hog_followed: bool) -> None:
    """A UDP reader is woken by packets whose receive softirq runs on CPU 1 (RPS) while a CPU hog
    runs there: each wakeup happens in the hog's context.  The waker is the network receive
    softirq; the hog is never named, followed or not (the markers cannot return at once where the
    interrupted task is not followed: the wakeup of a followed thread would then name it)."""
    if not os.path.exists("/sys/class/net/lo/queues/rx-0/rps_cpus"):
        pytest.skip("no RPS on this kernel")
    port = _port()
    with _rps(1):
        hog = start(HOG, cpus={1})
        rd = start(UDP_READER, str(port), cpus={0})
        snd = start(UDP_SENDER, str(port), cpus={0})
        try:
            waits = _raw_waits(probes, [rd.pid, hog.pid] if hog_followed else [rd.pid], seconds=3.0)
        finally:
            stop(snd, rd, hog)
    rd_waits = [w for w in waits if w.tid == rd.pid and w.kind == "blocked"]
    assert rd_waits, "the reader's waits were not seen"
    total = sum(w.seconds for w in rd_waits)
    net_rx = sum(w.seconds for w in rd_waits if w.ctx >> 24 == 1 and w.ctx & 0xFFFFFF == 3)
    assert net_rx > 0.8 * total, [(w.ctx, w.waker_tgid, round(w.seconds, 3)) for w in rd_waits]
    assert not any(w.waker_tgid == hog.pid for w in rd_waits), "the interrupted hog was named as the waker"


def _raw_waits(probes: EbpfCollector, pids: list[int], seconds: float) -> list:
    wf = probes.waitfor
    assert wf is not None
    wf.track(pids)
    try:
        wf.read()
        waits = []
        t_end = time.monotonic() + seconds
        while time.monotonic() < t_end:
            time.sleep(0.5)
            waits += wf.read().waits
        return waits
    finally:
        wf.track(())


TIMEOUT_POLLER = r"""
name("timeout-poll")
import select
r, w = os.pipe()
print("ready", flush=True)
while True:
    select.poll().poll(20)   # nothing ever arrives: each wait ends by its timeout
"""


@pytest.mark.skipif(NCPU < 2, reason="needs two CPUs")
def test_timer_wakeups_under_a_hog_are_the_timer(probes: EbpfCollector) -> None:
    """A thread polling with a 20 ms timeout on the same CPU as a hog: its timeouts fire in the
    hrtimer interrupt while the hog runs.  Its waits end by the timer, never by the hog."""
    hog = start(HOG, cpus={1})
    p = start(TIMEOUT_POLLER, cpus={1})
    try:
        waits = _raw_waits(probes, [p.pid, hog.pid], seconds=3.0)
    finally:
        stop(p, hog)
    mine = [w for w in waits if w.tid == p.pid and w.kind == "blocked"]
    assert mine
    total = sum(w.seconds for w in mine)
    timer = sum(w.seconds for w in mine if w.ctx >> 24 in (1, 3))    # hrtimer, or the timer softirq
    assert timer > 0.8 * total, [(w.ctx, w.waker_tgid) for w in mine]
    assert not any(w.waker_tgid == hog.pid for w in mine)


CONTENDED = r"""
name("contended")
print("ready", flush=True)
while True:
    burn(0.01)
    time.sleep(0.001)
"""


def test_cpu_contended_thread_waits_for_a_cpu(probes: EbpfCollector) -> None:
    """A thread pinned to one CPU with two CPU hogs on it: most of its time it is runnable without
    the CPU.  First hop ``cpu_wait``; the chain ends on its own wait for a CPU."""
    hogs = [start(HOG, cpus={0}), start(HOG, cpus={0})]
    p = start(CONTENDED, cpus={0})
    try:
        got = trace(probes.waitfor, [p.pid], [p.pid])
    finally:
        stop(p, *hogs)
    assert got.share("cpu_wait") > 0.4, got.states
    assert got.chain_share(lambda cause, rel, *_: cause == "cpu_wait" and rel == "self") > 0.4, got.chain
    assert "cpu-hog" not in got.culprits()


def test_nothing_without_the_probes() -> None:
    """With the wait-for programs detached, the same pipe consumer shows nothing: every other test
    here reads only what they recorded."""
    c = EbpfCollector(probes=["waitfor", "waitfor_irq"])
    try:
        assert c.waitfor is not None and c._load is not None
        for a in c._load.attachments:           # detach: close the perf events the programs hang on
            if a.fd >= 0:
                os.close(a.fd)
                a.fd = -1
        r, w = os.pipe()
        cons = start(CONSUMER_PIPE, str(r), pass_fds=(r,))
        prod = start(PRODUCER_PIPE, str(w), pass_fds=(w,))
        try:
            got = trace(c.waitfor, [cons.pid], [cons.pid], seconds=2.0, warmup=1.0)
        finally:
            stop(cons, prod)
            os.close(r)
            os.close(w)
        # what the agent read from /proc when it began following the consumer (blocked in a read)
        # stays open; no wait ends, so no producer is named and no CPU work is seen
        assert "prep-producer" not in got.culprits(), got.chain
        assert got.share("cpu") < 0.05, got.states
    finally:
        c.close()


ALTERNATING = r"""
name("alternating")
req_a, resp_a, req_b, resp_b, rounds = (int(x) for x in sys.argv[1:6])
print("ready", flush=True)
sys.stdin.readline()
import select
blocked = {resp_a: 0, resp_b: 0}     # answers not there yet when it read: each such read is one wait
for _ in range(rounds):
    for req, resp in ((req_a, resp_a), (req_b, resp_b)):
        os.write(req, b"?")
        blocked[resp] += not select.select([resp], [], [], 0)[0]
        os.read(resp, 1)
print("done", blocked[resp_a], blocked[resp_b], flush=True)
sys.stdin.readline()
"""
ANSWERING = r"""
name(sys.argv[3])
req, resp = int(sys.argv[1]), int(sys.argv[2])
print("ready", flush=True)
while True:
    os.read(req, 1)
    burn(0.002)
    os.write(resp, b"!")
"""


def test_alternating_waits_are_each_counted_once(probes: EbpfCollector) -> None:
    """A thread whose waits alternate between two producers (a request and a blocked read of the
    answer from A, then from B, 2 ms of work each): the kernel keeps a thread's last wait in its
    entry and moves it to the waits map only when another kind follows, here at every wait, while
    the agent reads every 0.2 s.  Each answer is one wait, ended by its producer, in the read of
    that producer's pipe: counted once (the thread counts the reads whose answer was not there
    yet), none twice."""
    rounds = 150
    pipes = [os.pipe() for _ in range(4)]        # req_a, resp_a, req_b, resp_b
    (ra, wa), (rra, wra), (rb, wb), (rrb, wrb) = pipes
    fds = tuple(fd for p in pipes for fd in p)
    a = start(ANSWERING, str(ra), str(wra), "answer-a", pass_fds=fds)
    b = start(ANSWERING, str(rb), str(wrb), "answer-b", pass_fds=fds)
    cons = subprocess.Popen([sys.executable, "-c", PRELUDE + ALTERNATING, str(wa), str(rra), str(wb), str(rrb),
                             str(rounds)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            pass_fds=fds, start_new_session=True)
    wf = probes.waitfor
    assert wf is not None and cons.stdin is not None and cons.stdout is not None
    try:
        assert cons.stdout.readline().strip() == "ready"
        wf.track([cons.pid])
        wf.read()
        cons.stdin.write("go\n")
        cons.stdin.flush()
        waits, expected = [], {}
        t_end = time.monotonic() + 60
        while time.monotonic() < t_end:           # reads while the waits alternate, until it says done
            done = select.select([cons.stdout], [], [], 0.2)[0]
            waits += wf.read().waits
            if done:
                words = cons.stdout.readline().split()
                assert words[0] == "done", words
                expected = {rra: int(words[1]), rrb: int(words[2])}
                break
        time.sleep(0.3)                           # it waits on its stdin now: its last answer's wait has ended
        waits += wf.read().waits
    finally:
        wf.track(())
        with contextlib.suppress(Exception):
            cons.stdin.close()
        stop(a, b)
        cons.wait(10)
        for fd in fds:
            os.close(fd)
    mine = [w for w in waits if w.tid == cons.pid and w.kind == "blocked" and w.nr == 0]
    for prod, resp in ((a, rra), (b, rrb)):
        got = [w for w in mine if w.fd == resp]
        # a read whose answer came while it was preempted between its check and its read does not block
        n, want = sum(w.waits for w in got), expected[resp]
        assert want >= 0.8 * rounds and want - 2 <= n <= want, (n, want, [(w.waker_tgid, w.waits) for w in got])
        assert all(w.waker_tgid == prod.pid for w in got), [(w.waker_tgid, w.ctx) for w in got]
        secs = sum(w.seconds for w in got)
        assert 0.8 * rounds * 0.002 < secs < rounds * 0.05, secs


SLEEPER = r"""
name("short-sleeps")
print("ready", flush=True)
while True:
    burn(0.002)
    time.sleep(0.013)
"""


def test_entries_in_their_slots_add_up_to_the_wall_clock_at_every_read(probes: EbpfCollector) -> None:
    """A followed thread's entry moves to the array slot its tid picks at its first switch out, and
    with the scheduler's BTF its times run on the run queue's clock, turned into the agent's with the
    pairs the program leaves: read every 40 ms (shorter than the intervals, so that an open
    interval's start matters), its time on a CPU, waiting for one and blocked adds up to the time
    between reads at each read, not only over the window."""
    from triscope.agent.collectors.waitfor import _Slots
    from triscope.agent.ebpf import layout as L

    wf = probes.waitfor
    assert wf is not None
    assert wf.slots._slot_mem is not None, "the slots are not mapped on this kernel"
    p = start(SLEEPER)
    try:
        wf.track([p.pid])
        time.sleep(0.3)
        wf.read()
        sums, walls = [], []
        for _ in range(40):
            t0 = time.monotonic()
            time.sleep(0.04)
            got = wf.read()
            walls.append(got.seconds)
            t = got.threads.get(p.pid)
            assert t is not None, "the thread's entry was not read"
            sums.append(t.cpu + t.runq + t.blocked)
            assert time.monotonic() - t0 < 1.0
        slots = dict(wf.slots.entries())
        hashed = {int.from_bytes(k[:4], "little") for k, _v in wf.cur.items()}
        # where the kernel refuses the mapping, the same slots read with syscalls
        by_syscall = _Slots(wf.slots.slots, wf.slots.bits)
        by_syscall.close()
        assert {tid for tid, _v in by_syscall.entries()} == {tid for tid, _v in wf.slots.entries()}
    finally:
        wf.track(())
        stop(p)
    assert p.pid in slots and p.pid not in hashed, "the entry did not move to its slot"
    if wf.clk is not None:             # the scheduler's BTF: the run queue's clock
        assert slots[p.pid][-1] == L.WF_CLK_RQ
        assert wf._clock_offset() is not None
    off = [abs(s - w) for s, w in zip(sums, walls, strict=True)]
    assert max(off) < 0.004, [round(x * 1000, 2) for x in off]


THREAD_CHURN = r"""
name("thread-churn")
def short():
    burn(0.002)
    time.sleep(0.003)
print("ready", flush=True)
while True:
    ts = [threading.Thread(target=short) for _ in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    time.sleep(0.01)
"""


def test_an_exiting_thread_lets_its_slot_go(probes: EbpfCollector) -> None:
    """Threads that come and go (a few hundred over the run): each new one gets an entry at its
    first switch out, and its slot is let go when it exits (its bit cleared, its tid gone), so the
    slots held are the live threads' only and the reader never shows a thread that has exited."""
    wf = probes.waitfor
    assert wf is not None
    p = start(THREAD_CHURN)
    try:
        wf.track([p.pid])
        seen: set[int] = set()
        for _ in range(40):
            time.sleep(0.025)
            seen |= {tid for tid, v in wf.slots.entries() if v[5] == p.pid}
            wf.read()
        held = {tid for tid, v in wf.slots.entries() if v[5] == p.pid}
        alive = {int(t) for t in os.listdir(f"/proc/{p.pid}/task")}
        hashed = {int.from_bytes(k[:4], "little") for k, v in wf.cur.items()}
    finally:
        wf.track(())
        stop(p)
    assert len(seen) > 20, f"only {len(seen)} threads seen in slots"
    # a thread between its exit and the read below may still hold its slot: a few, never the hundreds seen
    assert len(held - alive) <= 4, sorted(held - alive)
    assert not hashed & (seen - alive)
