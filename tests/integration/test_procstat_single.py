"""A single-threaded process is read through its own schedstat between stat reads (issue 42 item 4):
its CPU stays exact over time, including the CPU of a thread it started and ended between two stat
reads, which only the stat read sees (a real process on this kernel's procfs)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from triscope.agent.workloads.procstat import CLK_TCK, ProcStats

CHILD = r"""
import sys, threading, time
def spin(s):
    t0 = time.thread_time()
    while time.thread_time() - t0 < s:
        pass
for line in sys.stdin:
    if line.startswith("main"):
        spin(0.2)
    else:
        t = threading.Thread(target=spin, args=(0.3,))
        t.start()
        t.join()
    print("done", flush=True)
"""


def _stat_cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat", "rb") as f:
        data = f.read()
    fields = data[data.rindex(b")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def _until_single(pid: int, timeout: float = 5.0) -> None:
    """Until the process has one thread again: a joined thread's task can outlive join() for some
    milliseconds on a busy machine (it still has to run its exit), and the reads here come back to
    back, not a second apart as the agent's do."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        with open(f"/proc/{pid}/status") as f:
            if "\nThreads:\t1\n" in f.read():
                return
        time.sleep(0.005)
    raise AssertionError(f"process {pid} still has more than one thread after {timeout} s")


@pytest.mark.skipif(not os.path.exists("/proc/self/schedstat"), reason="no schedstat files (CONFIG_SCHED_INFO)")
def test_a_single_threaded_process_is_read_through_schedstat_and_its_counter_stays_exact() -> None:
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert child.stdin is not None and child.stdout is not None
    try:
        time.sleep(0.3)
        stats = ProcStats(quiet_every=1, stat_every=5)
        stats.follow([child.pid])
        stats.sample()                              # the baseline (a stat read)
        start = _stat_cpu(child.pid)
        total = 0.0
        single_reads = 0
        for i in range(12):
            cmd = "main" if i == 1 else ("thread" if i == 2 else "")
            if cmd:
                child.stdin.write(cmd + "\n")
                child.stdin.flush()
                assert child.stdout.readline().strip() == "done"
                _until_single(child.pid)
            p = stats._procs[child.pid]
            before = p.since_stat
            got = stats.sample()[child.pid]
            single_reads += p.since_stat == before + 1
            total += got.cpu
        end = _stat_cpu(child.pid)
        assert single_reads >= 6                    # most reads were the schedstat's alone
        # the thread's 0.3 s came in at the next stat read: the sum is stat's delta within its grain
        assert abs(total - (end - start)) <= 3 / CLK_TCK + 0.005, (total, start, end)
        assert total >= 0.45
    finally:
        child.stdin.close()
        child.wait(10)
