"""The per-workload TCP read of a workload holding 10,000 sockets (issue 43, item 6): a real process
holding 5,000 loopback connections (both ends), read by ``WorkloadTcp`` as the workloads worker
does, on the real kernel's sock_diag and ``/proc/PID/fd``.  Each read's thread CPU over the time
until the next is due stays within the budget (it was 3.3-3.6 % of a core: a read of 170-240 ms
every 5 s), and the counters stay right: segments sent on one of those connections after the
baseline are counted."""

from __future__ import annotations

import resource
import statistics
import subprocess
import sys
import time

import pytest

from triscope.agent.workloads.tcp import WorkloadTcp

SOCKETS = 10_000
BUDGET = 0.002       # workloads.tcp.CPU_BUDGET: 0.2 % of a core (0.4 % before issue 46)

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
for line in sys.stdin:
    keep[0].sendall(b"x" * 200_000)      # one connection sends: its segments are counted
    got = 0
    while got < 200_000:
        got += len(keep[1].recv(1 << 16))
    print("sent", flush=True)
"""


@pytest.mark.skipif(resource.getrlimit(resource.RLIMIT_NOFILE)[1] < SOCKETS + 256,
                    reason="needs a descriptor limit of 10,256")
def test_a_workload_of_10000_sockets_is_read_within_the_cpu_budget() -> None:
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(SOCKETS)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdin is not None
    try:
        assert holder.stdout.readline().strip() == "ready"
        now = [0.0]
        tcp = WorkloadTcp(clock=lambda: now[0])
        groups = {"w": [holder.pid]}
        costs, gaps = [], []
        for i in range(8):
            if i == 5:        # after the baseline: one connection sends 200 kB
                holder.stdin.write("send\n")
                holder.stdin.flush()
                assert holder.stdout.readline().strip() == "sent"
                before = tcp.counters("w")
            c0 = time.thread_time()
            tcp.read(groups)
            costs.append(time.thread_time() - c0)
            gaps.append(tcp.next_due - now[0])
            now[0] = tcp.next_due           # the worker reads again when due
        after = tcp.counters("w")
    finally:
        holder.stdin.close()
        holder.wait(30)
    share = sum(costs[1:]) / sum(gaps[1:])
    print(f"reads {[round(c * 1000) for c in costs]} ms, every {[round(g, 1) for g in gaps]} s: "
          f"{share * 100:.2f} % of a core")
    assert tcp.problem == ""
    assert share <= 1.5 * BUDGET, (costs, gaps)        # 0.2 % (3.3-3.6 % before: every 5 s whatever the cost)
    assert statistics.median(gaps) <= 60, gaps             # less fresh, still read: every ~30-45 s here
    assert before is not None and after is not None
    assert after[1] - before[1] >= 3, (before, after)      # the segments that connection sent, counted
