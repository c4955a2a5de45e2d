"""Where a workload really runs, against its accelerator's NUMA node (off the tick).

For each (accelerator, workload) whose accelerator's PCI address is known:

* **CPU**: every ``every`` seconds (10), each process of the set, ``/proc/PID/stat``: its CPU time
  (``utime + stime``) since the previous read, counted as local when the CPU it last ran on
  (``processor``) is one of the accelerator's ``local_cpulist``.  A multi-threaded process that
  used at least ``busy_cores`` has its threads read (``/proc/PID/task/TID/stat``), those with the
  most CPU last time first, until 90 % of its CPU is placed thread by thread; the rest counts where
  its main thread ran.  ``cpu_local`` is the local share of the set's CPU time over the interval; a
  set that used less than ``min_cpu_s`` keeps its last share for ``QUIET_ROUNDS`` rounds, then says
  nothing.  A process in several sets (one pod's processes on each of its GPUs) is read once a round.  A
  thread is sampled where it was at the read, weighted by what it ran since: a thread that moves
  often is counted where it is caught.
* **Affinity**: the CPUs its processes may run on (``sched_getaffinity``, which the kernel keeps
  within the cgroup's ``cpuset.cpus.effective``): ``allowed_local`` is the share of them that are
  local — 0 when the workload is pinned (by ``taskset``, a cpuset, the kubelet's CPU Manager) to
  another node's CPUs, the reason it runs there.
* **Memory**: every ``mem_every`` seconds (60: the kernel walks the page tables for it),
  ``/proc/PID/numa_maps``: the pages of the anonymous mappings (the heap, pinned host buffers a
  framework allocates itself) and of the NVIDIA driver's mappings (``cudaHostAlloc`` memory), per
  NUMA node (``N<node>=<pages>`` x ``kernelpagesize_kB``).  ``mem_local`` is the share on the
  accelerator's own node (``None`` when its node is unknown: ``numa_node`` -1).

The accelerator's local CPUs and node come from ``/sys/bus/pci/devices/BUS/{local_cpulist,numa_node}``
(read once per bus).  Where they are every CPU the host has online (``/sys/devices/system/cpu/online``:
a one-socket machine, as the H200 machine is) nothing is read for the CPU side: ``cpu_local`` and
``allowed_local`` are 1 by definition.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass

from triscope.agent.collectors.topology import device_locality
from triscope.core.cpulist import parse_cpulist

QUIET_ROUNDS = 3     # a quiet set keeps its last cpu_local this many rounds (30 s), then says nothing
CLK_TCK = float(os.sysconf("SC_CLK_TCK")) if hasattr(os, "sysconf") else 100.0
_NODE_RE = re.compile(rb"\bN(\d+)=(\d+)")
_PAGE_RE = re.compile(rb"\bkernelpagesize_kB=(\d+)")


@dataclass(frozen=True, slots=True)
class Locality:
    cpus: frozenset[int]      # the accelerator's local CPUs (empty: unknown)
    node: int | None          # its NUMA node (None: unknown)


@dataclass(slots=True)
class Placed:
    cpu_local: float | None = None
    mem_local: float | None = None
    allowed_local: float | None = None    # share of the CPUs its processes may run on that are local
    quiet: int = 0                        # rounds in a row the set used less than min_cpu_s


def allowed_cpus(pids: Sequence[int]) -> set[int]:
    """The union of the processes' CPU affinity (``sched_getaffinity``: already within their cgroup's
    ``cpuset.cpus.effective``); empty when none can be read (every one exited, or another namespace)."""
    out: set[int] = set()
    for pid in pids:
        try:
            out |= os.sched_getaffinity(pid)
        except OSError:
            continue
    return out


class WorkloadPlacement:
    """``read(groups)`` with ``groups``: key -> (the accelerator's PCI address, the set's processes);
    ``get(key)`` -> ``Placed``.  Runs on the workloads worker, never on the tick."""

    def __init__(self, proc: str = "/proc", sys: str = "/sys", *, every: float = 10.0, mem_every: float = 60.0,
                 min_cpu_s: float = 0.2, busy_cores: float = 0.5, clock: Callable[[], float] = time.monotonic) -> None:
        self.proc, self.sys = proc, sys
        self.every, self.mem_every, self.min_cpu_s, self.busy_cores = every, mem_every, min_cpu_s, busy_cores
        self.clock = clock
        self.next_due = 0.0
        self._next_mem = 0.0
        self._local: dict[str, Locality] = {}
        self._ticks: dict[int, int] = {}                   # pid -> utime + stime at its last read
        self._threads: dict[int, dict[int, tuple[int, int]]] = {}   # pid -> tid -> (ticks at its last read, over it)
        self._at: dict[int, float] = {}                    # pid -> when its stat was last read
        self._placed: dict[Hashable, Placed] = {}
        self._online: frozenset[int] | None = None
        self.threads_read = 0

    def due(self) -> bool:
        return self.clock() >= self.next_due

    def get(self, key: Hashable) -> Placed | None:
        return self._placed.get(key)

    def locality(self, bus: str) -> Locality:
        got = self._local.get(bus)
        if got is None:
            node, cpus = device_locality(os.path.join(self.sys, "bus/pci/devices", bus))
            got = self._local[bus] = Locality(frozenset(parse_cpulist(cpus)), node)
        return got

    def online(self) -> frozenset[int]:
        """The host's online CPUs (read once; empty when unreadable)."""
        if self._online is None:
            try:
                with open(os.path.join(self.sys, "devices/system/cpu/online")) as f:
                    self._online = frozenset(parse_cpulist(f.read().strip()))
            except (OSError, ValueError):
                self._online = frozenset()
        return self._online

    def read(self, groups: Mapping[Hashable, tuple[str, Sequence[int]]]) -> None:
        now = self.clock()
        self.next_due = now + self.every
        mem = now >= self._next_mem
        if mem:
            self._next_mem = now + self.mem_every
        self.threads_read = 0
        alive: set[int] = set()
        cpu_of: dict[int, list[tuple[int, int]]] = {}     # pid -> (clock ticks, CPU) since its last read: once a round
        pages_of: dict[int, dict[int, int]] = {}          # pid -> bytes per node: once a round
        placed: dict[Hashable, Placed] = {}
        for key, (bus, pids) in groups.items():
            if not bus:
                continue
            loc = self.locality(bus)
            old = self._placed.get(key)
            p = placed[key] = Placed(None, old.mem_local if old is not None and not mem else None)
            online = self.online()
            if loc.cpus and online and online <= loc.cpus:
                p.cpu_local = p.allowed_local = 1.0     # every CPU is local: nothing to read
            elif loc.cpus:
                self._place_cpu(p, old, loc.cpus, pids, cpu_of, alive)
            if mem and loc.node is not None:
                p.mem_local = self._mem_local(loc.node, pids, pages_of)
        # forget processes not followed any more (their exited threads go when the process is read)
        for pid in [pid for pid in self._ticks if pid not in alive]:
            del self._ticks[pid]
            self._at.pop(pid, None)
            self._threads.pop(pid, None)
        self._placed = placed

    def _place_cpu(self, p: Placed, old: Placed | None, local_cpus: frozenset[int], pids: Sequence[int],
                   cpu_of: dict[int, list[tuple[int, int]]], alive: set[int]) -> None:
        """The group's CPU time on the device's local CPUs (kept a few quiet rounds) and the share of
        its allowed CPUs that are local.  ``cpu_of``: each process read once a round."""
        local = total = 0
        for pid in pids:
            got = cpu_of.get(pid)
            if got is None:
                got = cpu_of[pid] = self._cpu(pid, alive)
            for d, cpu in got:
                total += d
                if cpu in local_cpus:
                    local += d
        if total > 0 and total / CLK_TCK >= self.min_cpu_s:
            p.cpu_local, p.quiet = local / total, 0
        elif old is not None and old.quiet + 1 < QUIET_ROUNDS:
            # a quiet interval keeps what was last seen, for a few rounds: then nothing is said
            p.cpu_local, p.quiet = old.cpu_local, old.quiet + 1
        allowed = allowed_cpus(pids) if self.proc == "/proc" else set()
        if allowed:
            p.allowed_local = len(allowed & local_cpus) / len(allowed)

    def _mem_local(self, node: int, pids: Sequence[int], pages_of: dict[int, dict[int, int]]) -> float | None:
        """The share of the group's resident pages on NUMA node ``node``; ``pages_of``: each process
        read once a round."""
        on = every = 0
        for pid in pids:
            by = pages_of.get(pid)
            if by is None:
                by = pages_of[pid] = numa_pages(self.proc, pid)
            on += by.get(node, 0)
            every += sum(by.values())
        return on / every if every else None

    def _cpu(self, pid: int, alive: set[int]) -> list[tuple[int, int]]:
        """(clock ticks, the CPU they count on) of the process since its previous read.  ``/proc/PID/stat``
        gives its CPU and where its main thread last ran: a process below ``busy_cores`` (a loader
        worker does its work on its main thread) counts there whole.  A busier multi-threaded one has
        its threads read, those with the most CPU last time first, until 90 % of its CPU is placed;
        the rest counts where its main thread is (a pegged feeder among 63 sleepers: one or two reads)."""
        try:
            with open(f"{self.proc}/{pid}/stat", "rb") as f:
                data = f.read(1024)
            fl = data[data.rindex(b")") + 2:].split(b" ", 38)
            ticks, nthreads, main_cpu = int(fl[11]) + int(fl[12]), int(fl[17]), int(fl[36])
        except (OSError, ValueError, IndexError):
            return []
        alive.add(pid)
        now = self.clock()
        prev, prev_t = self._ticks.get(pid), self._at.get(pid)
        self._ticks[pid], self._at[pid] = ticks, now
        first = prev is None or prev_t is None or ticks < prev
        delta = 0 if first or prev is None else ticks - prev
        busy = nthreads > 1 and (first or prev_t is None
                                 or delta / CLK_TCK / max(1e-9, now - prev_t) >= self.busy_cores)
        out: list[tuple[int, int]] = []
        placed = 0
        if busy:
            try:
                tids = [int(t) for t in os.listdir(f"{self.proc}/{pid}/task") if t.isdigit()]
            except OSError:
                tids = []
            known = self._threads.get(pid, {})
            live = set(tids)
            threads = self._threads[pid] = {t: v for t, v in known.items() if t in live}   # exited ones go
            tids.sort(key=lambda t: -threads[t][1] if t in threads else 1)
            for tid in tids:
                if not first and placed >= 0.9 * delta:
                    break            # the rest hold too little CPU to move the share
                try:
                    with open(f"{self.proc}/{pid}/task/{tid}/stat", "rb") as f:
                        data = f.read(1024)
                    tf = data[data.rindex(b")") + 2:].split(b" ", 38)
                    tt, cpu = int(tf[11]) + int(tf[12]), int(tf[36])
                except (OSError, ValueError, IndexError):
                    continue
                self.threads_read += 1
                tp = threads.get(tid)
                d = 0 if tp is None or tt < tp[0] else tt - tp[0]
                threads[tid] = (tt, d)
                if first:
                    continue
                d = min(d, delta - placed)
                placed += d
                out.append((d, cpu))
        if not first and delta > placed:
            out.append((delta - placed, main_cpu))
        return out


def numa_pages(proc: str, pid: int) -> dict[int, int]:
    """Bytes per NUMA node of a process's anonymous and NVIDIA-driver mappings (``numa_maps``)."""
    try:
        with open(f"{proc}/{pid}/numa_maps", "rb") as f:
            text = f.read()
    except OSError:
        return {}
    out: dict[int, int] = {}
    for line in text.splitlines():
        if b" anon=" not in line and b"/dev/nvidia" not in line:
            continue
        m = _PAGE_RE.search(line)
        page = int(m.group(1)) * 1024 if m else 4096
        for node, pages in _NODE_RE.findall(line):
            n = int(node)
            out[n] = out.get(n, 0) + int(pages) * page
    return out
