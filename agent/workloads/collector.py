"""Workloads on each accelerator and what the host does for them (docs/workloads.md section 1).

Two halves, on two threads:

* **Attribution, off the tick** (the collector's refresh worker): every ``process_every`` seconds
  (5) the sources list the processes on each accelerator (NVML, the npu-smi process table —
  ``accelprocs.py``), each process's cgroup names its pod, container or unit (``cgroups.py``), and
  the kubelet's pod-resources answer (refreshed every ``pod_resources_every`` seconds, 30) with
  ``/var/log/pods`` names its pod and container (``attribution.py``); its threads are listed.
  Every ``share_every`` seconds (5, and at once when the process list changed) the sources'
  per-process SM shares are read: NVML's ``nvmlDeviceGetProcessUtilization`` took 2 ms of the
  agent's CPU a call on the H100 machine (py-spy, h200-lab-3), a third of all it spent when read
  every second; the driver keeps the samples, so a read every 5 s averages the same time.  The
  result is one immutable plan the tick picks up.
* **Evidence, per tick** (``collect``): each process's CPU over the tick, its busiest thread and
  its threads' run-queue wait (``procstat.py``: kept-open descriptors, ``pread``; threads only for
  processes at ``busy_cores`` or more), summed per (accelerator, workload).  Each process's cgroup
  ``cpu.pressure`` is read by the worker every 2 s (PSI recomputes its 10 s average that often;
  it is not the tick's to wait for) and the tick uses the latest.

Series (labels: ``gpu`` or ``npu``+``chip``, and ``namespace``, ``pod``, ``container``,
``workload``; every one present, ``""`` when unknown): ``triscope_accelerator_workload_info``
(+ ``uuid``), ``triscope_workload_processes``, ``triscope_workload_sm_ratio`` (GPUs whose driver
gives per-process samples), ``triscope_workload_cpu_seconds_total`` (the deltas of its processes
since the agent started following them: a new process starts at its baseline, so a counter never
jumps by a process's past), ``triscope_workload_feeder_busy_ratio`` (the busiest thread's share of
a core; for a process below ``busy_cores`` and not read per thread, its own share, an upper bound),
``triscope_workload_cpu_wait_ratio`` (over the threads read this tick; absent when none was),
``triscope_workload_cpu_pressure_ratio`` (cgroup v2, absent elsewhere).  At most
``max_workloads_per_accelerator`` workloads per accelerator — by SM share, then processes, then
CPU — the rest summed as ``workload="other"``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import threading
import time
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from triscope.agent.collectors.base import Availability, BaseCollector
from triscope.agent.collectors.waitfor import WaitFor
from triscope.agent.workloads.accelprocs import AcceleratorProcess, ProcessSource, device_keys, owner_key
from triscope.agent.workloads.attribution import (
    DEFAULT_PODS_LOG_DIR,
    OTHER,
    WORKLOAD_LABELS,
    PodDir,
    ProcessInfo,
    Workload,
    attribute,
    read_pod_dirs,
    read_process,
)
from triscope.agent.workloads.cgroups import resolve_v2_dir, unified_root
from triscope.agent.workloads.placement import WorkloadPlacement
from triscope.agent.workloads.podresources import DEFAULT_SOCKET, DeviceOwner, PodResourcesWatch
from triscope.agent.workloads.processset import CgroupCpu, CgroupDirs, ProcessTree, cgroup_dirs, process_set
from triscope.agent.workloads.procstat import ProcSample, ProcStats
from triscope.agent.workloads.tcp import WorkloadTcp
from triscope.agent.workloads.waits import WorkloadWaits
from triscope.core.samples import EventRecord, Sample

log = logging.getLogger(__name__)

Labels = tuple[tuple[str, str], ...]
PSI_EVERY = 2.0     # the kernel recomputes PSI averages every 2 s


@dataclass(frozen=True)
class _Accel:
    labels: Labels
    uuid: str
    groups: tuple[tuple[Workload, tuple[int, ...]], ...]     # each workload on it and its whole process set
    cpu_stat: tuple[tuple[Workload, tuple[str, str]], ...] = ()   # each workload's cgroup cpu.stat (path, v1|v2)
    bus_id: str = ""          # its PCI address ("" unknown): where its local CPUs and NUMA node are read
    listed: tuple[tuple[Workload, tuple[int, ...]], ...] = ()    # each workload's processes the source lists on it


GroupTotals = tuple[int, float, float, float, int, int, int, int, float]
"""One workload on one accelerator this tick: (processes, SM share, CPU seconds, busiest thread,
busiest known, run ns, wait ns, wait known, the highest cgroup CPU pressure or -1)."""


def _group_totals(pids: Sequence[int], get: Callable[[int], ProcSample | None],
                  shares: dict[int, float] | None, pressure: dict[int, float]) -> GroupTotals | None:
    """A workload's processes summed for this tick; None when none of them was read."""
    n = known = waited = 0
    sm = cpu = best = 0.0
    run = wait = 0
    psi = -1.0
    for pid in pids:
        s = get(pid)
        if s is None:
            continue
        n += 1
        cpu += s.cpu
        if shares is not None:
            sm += shares.get(pid, 0.0)
        if not s.first:
            known = 1
            if s.busiest > best:
                best = s.busiest
            if s.waited:
                waited = 1
                run += s.run_ns
                wait += s.wait_ns
        p = pressure.get(pid)
        if p is not None and p > psi:
            psi = p
    return (n, sm, cpu, best, known, run, wait, waited, psi) if n else None


def _fold_rest(groups: dict[Workload, GroupTotals], keep: int) -> dict[Workload, GroupTotals]:
    """The ``keep`` workloads with the most SM share (then processes, CPU), the rest summed as ``OTHER``."""
    ranked = sorted(groups.items(), key=lambda kv: (-kv[1][1], -kv[1][0], -kv[1][2], kv[0]))
    out = dict(ranked[:keep])
    rest = [g for _, g in ranked[keep:]]
    out[OTHER] = (sum(g[0] for g in rest), sum(g[1] for g in rest), sum(g[2] for g in rest),
                  max(g[3] for g in rest), max(g[4] for g in rest), sum(g[5] for g in rest),
                  sum(g[6] for g in rest), max(g[7] for g in rest), max(g[8] for g in rest))
    return out


def _own_dirs(accels: Iterable[_Accel], v2dirs: dict[int, str]) -> dict[int, str]:
    """Each process's cgroup, where that cgroup is one workload's own.  A cgroup that holds processes
    of two workloads (one container or VM cgroup for every service) is not either's own: its CPU
    pressure names no workload, so it is left out."""
    held: dict[str, set[Workload]] = {}
    for a in accels:
        for wl, ps in a.groups:
            for p in ps:
                d = v2dirs.get(p)
                if d is not None:
                    held.setdefault(d, set()).add(wl)
    return {p: d for p, d in v2dirs.items() if len(held.get(d, ())) <= 1}


@dataclass(frozen=True)
class Plan:
    """What the refresh worker hands the tick."""

    accels: tuple[_Accel, ...] = ()
    pids: frozenset[int] = frozenset()      # the processes whose CPU the tick reads
    shares: dict[Labels, dict[int, float]] = field(default_factory=dict)
    pressure: dict[int, float] = field(default_factory=dict)    # pid -> its cgroup's cpu.pressure
    problem: str = ""        # every source failed: why (the collector reports itself down)


class WorkloadsCollector(BaseCollector):
    """``sources``: process sources (``NvmlProcessSource``, ``NpuProcessSource``, ...).
    ``pod_resources_socket``: the kubelet's pod-resources socket; ``pods_log_dir``: the kubelet's
    ``/var/log/pods``; ``proc`` / ``sys``: host paths.  ``busy_cores``: process CPU from which its
    threads are read.  ``background=False``: no worker (tests call ``refresh()`` themselves)."""

    name = "workloads"

    def __init__(self, sources: Sequence[ProcessSource], *, proc: str = "/proc", sys: str = "/sys",
                 pod_resources_socket: str = DEFAULT_SOCKET, pods_log_dir: str = DEFAULT_PODS_LOG_DIR,
                 max_workloads_per_accelerator: int = 8, busy_cores: float = 0.5,
                 process_every: float = 5.0, share_every: float = 5.0, pod_resources_every: float = 30.0,
                 max_processes_per_workload: int = 64, tcp_every: float = 5.0, placement_every: float = 10.0,
                 background: bool = True, clock: Callable[[], float] = time.monotonic,
                 waitfor: WaitFor | None = None, api: Any = None) -> None:
        if max_workloads_per_accelerator < 1:
            raise ValueError("max_workloads_per_accelerator must be >= 1")
        if max_processes_per_workload < 1:
            raise ValueError("max_processes_per_workload must be >= 1")
        self.sources = list(sources)
        self.proc = proc
        self.sys = sys
        self.pods_log_dir = pods_log_dir
        self.max_workloads = max_workloads_per_accelerator
        self.max_processes = max_processes_per_workload
        self.tree = ProcessTree(proc)
        self.tcp = WorkloadTcp(proc, every=tcp_every, clock=clock) if tcp_every > 0 else None
        self.placement = (WorkloadPlacement(proc, sys, every=placement_every, clock=clock)
                          if placement_every > 0 else None)
        self._placement_keys: object = None
        self._tcp_sets: dict[Workload, list[int]] | None = None     # the process sets of the last TCP read
        self._members: dict[int, list[int]] = {}     # a listed process -> its whole process set (itself first)
        self._cpu_stat: dict[str, CgroupCpu] = {}     # cpu.stat path -> kept-open reader
        self._cpu_prev: dict[tuple[Labels, Workload], tuple[int, int, float]] = {}
        self.process_every = process_every
        self.share_every = share_every
        self.background = background
        self.clock = clock
        self.pod_resources = PodResourcesWatch(pod_resources_socket, every=pod_resources_every, clock=clock)
        self.stats = ProcStats(proc, busy_cores=busy_cores, clock=clock)
        self.pods: dict[str, PodDir] | None = None
        self._plan: Plan | None = None
        self._applied: frozenset[int] | None = None     # the processes the tick follows
        self._rows: list[AcceleratorProcess] = []
        self._info: dict[int, ProcessInfo | None] = {}
        self._known = _Known(proc)
        self._hidden_said = False
        self._hidden_lists = 0      # process lists in a row in which no listed process was in our /proc
        self._owner_cache: dict[str, str | None] = {}
        self._source_down: dict[str, str] = {}
        self._next_procs = 0.0
        self._next_shares = 0.0
        self._events: list[EventRecord] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # per (accelerator, workload): [its labels, the info series' labels (+ uuid), CPU counter, last seen]
        self._state: dict[tuple[Labels, Workload], list] = {}
        self._dirs: dict[int, str] = {}          # pid -> its cgroup v2 directory
        self._psi_fds: dict[str, int] = {}
        self._next_psi = 0.0
        self._cg_root: str | None | bool = False    # False: not looked up yet
        self._dirs_cache: dict[tuple[tuple[str, str], ...], tuple[CgroupDirs, tuple[str, str] | None]] = {}
        self._dirs_until = 0.0
        # wait-for evidence (docs/waitfor.md): on when the eBPF collector loaded its probes
        self.waits = WorkloadWaits(waitfor, proc=proc, api=api, clock=clock,
                                   tcp_keys=lambda: self.tcp._keys if self.tcp is not None else {},
                                   pods=lambda: self.pods, cpu_stat=self._cpu_stat_of) if waitfor is not None else None

    # ------------------------------------------------------------------ protocol
    def check(self) -> Availability:
        if not self.sources:
            return Availability(False, "no accelerator process source (NVML and npu-smi both off)")
        found = []
        for s in self.sources:
            try:
                av = s.check()
            except Exception as e:  # noqa: BLE001 - a source that cannot even check is off
                av = Availability(False, f"check failed: {e}")
            found.append((s, av))
        if any(av.ok for _, av in found):
            # a source that cannot run here (no driver) is dropped: not asked again every round
            for s, av in found:
                if not av.ok:
                    log.info("workloads: no %s processes: %s", s.name, av.reason)
                    with contextlib.suppress(Exception):
                        s.close()
            self.sources = [s for s, av in found if av.ok]
            return Availability(True, "; ".join(f"{s.name}: {av.reason}" for s, av in found if av.ok))
        return Availability(False, "no accelerator to attribute: " + "; ".join(f"{s.name}: {av.reason}" for s, av in found),
                            next((av.hint for _, av in found if av.hint), ""))

    def collect(self, now: float) -> Iterable[Sample | EventRecord]:
        self._start()
        with self._lock:
            plan = self._plan
            events, self._events = self._events, []
        out: list[Sample | EventRecord] = list(events)
        for reason, n in list(self.pod_resources.refused.items()):
            out.append(Sample("triscope_pod_resources_refused_total", float(n), {"reason": reason}, "counter"))
        if plan is None:
            return out
        if plan.problem:
            raise RuntimeError(plan.problem)
        if plan.pids is not self._applied:
            self.stats.follow(plan.pids)
            self._applied = plan.pids
            self._forget_old()
        procs = self.stats.sample()
        for acc in plan.accels:
            self._accelerator(acc, plan, procs, out)
        if self.waits is not None:
            self.waits.tick(plan.accels, out)
        return out

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
            self._thread = None
        for s in self.sources:
            with contextlib.suppress(Exception):
                s.close()
        self.stats.close()
        self._known.close()
        for fd in self._psi_fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self._psi_fds.clear()
        for c in self._cpu_stat.values():
            c.close()
        self._cpu_stat.clear()
        if self.waits is not None:
            self.waits.close()

    # ------------------------------------------------------------------ refresh worker (off the tick)
    def _start(self) -> None:
        if self._thread is None and self.background and not self._stop.is_set():
            self._thread = threading.Thread(target=self._loop, name="workloads", daemon=True)
            self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.refresh()
            except Exception as e:  # noqa: BLE001 - the worker never dies; the next round tries again
                log.error("workload attribution failed: %s", e)
            nxt = min(self._next_procs, self._next_shares, self._next_psi,
                      self.tcp.next_due if self.tcp is not None else float("inf"))
            nxt = min(nxt, self.pod_resources.next_due)
            if self.placement is not None:
                nxt = min(nxt, self.placement.next_due)
            self._stop.wait(max(0.05, nxt - self.clock()))

    def refresh(self, force: bool = False) -> Plan:
        """One round of whatever is due (everything with ``force``); publishes and returns the plan."""
        now = self.clock()
        changed = False
        if force or self.pod_resources.due():
            for severity, message in self.pod_resources.refresh():
                self._event(severity, message)
            self.pods = read_pod_dirs(self.pods_log_dir)
            changed = True
        if force or now >= self._next_procs:
            self._next_procs = now + self.process_every
            self._list_processes()
            changed = True
        elif self._known.exited():
            # a process left between two lists: out of the plan now (the tick reads a quiet process
            # only every few ticks, so it would not notice by itself)
            self._rows = [r for r in self._rows if self._known.alive(r.pid)]
            self._info = {pid: i for pid, i in self._info.items() if self._known.alive(pid)}
            changed = True
        old = self._plan
        shares = old.shares if old is not None else {}
        if force or changed or now >= self._next_shares:
            self._next_shares = now + self.share_every
            shares = self._read_shares()
        plan = self._build(shares) if changed or old is None else Plan(old.accels, old.pids, shares, old.pressure,
                                                                         old.problem)
        if force or changed or now >= self._next_psi:
            # PSI's avg10 is the kernel's 10 s average, recomputed every 2 s: read here, off the tick
            self._next_psi = now + PSI_EVERY
            plan = Plan(plan.accels, plan.pids, plan.shares, self._pressure(), plan.problem)
        elif old is not None:
            plan = Plan(plan.accels, plan.pids, plan.shares, old.pressure, plan.problem)
        if self.tcp is not None and (force or changed or self.tcp.due()):
            groups: dict[Workload, dict[int, None]] = {}      # a workload on several accelerators: once
            for acc in plan.accels:
                for wl, pids in acc.groups:
                    groups.setdefault(wl, {}).update(dict.fromkeys(pids))
            sets = {wl: list(pids) for wl, pids in groups.items()}
            # on its own cadence (its CPU budget), or at once when the process sets changed
            if force or self.tcp.due() or sets != self._tcp_sets:
                self._tcp_sets = sets
                self.tcp.read(sets)
        if self.placement is not None:
            pgroups: dict[Hashable, tuple[str, Sequence[int]]] = {
                (a.labels, wl): (a.bus_id, pids) for a in plan.accels for wl, pids in a.groups}
            # on its own cadence, or at once when the sets changed (not at every process list)
            if force or self.placement.due() or pgroups.keys() != self._placement_keys:
                self._placement_keys = pgroups.keys()
                self.placement.read(pgroups)
        with self._lock:
            self._plan = plan
        return plan

    def _event(self, severity: str, message: str) -> None:
        with self._lock:
            self._events.append(EventRecord("collector", message, severity,  # type: ignore[arg-type]
                                            {"collector": self.name}))

    def _list_processes(self) -> None:
        rows: list[AcceleratorProcess] = []
        for s in self.sources:
            try:
                got = s.processes()
            except Exception as e:  # noqa: BLE001 - one source failing leaves the others
                reason = str(getattr(e, "reason", "") or e) or type(e).__name__
                if self._source_down.get(s.name) is None:
                    log.warning("workloads: %s cannot list processes: %s", s.name, reason)
                self._source_down[s.name] = reason
                continue
            if s.name in self._source_down:
                log.warning("workloads: %s lists processes again", s.name)
                del self._source_down[s.name]
            rows += got
        self._rows = rows
        self._info = self._known.get({r.pid for r in rows})
        self._members = self._process_sets()
        hidden = sum(1 for i in self._info.values() if i is None)
        # none of them in our /proc: either the PIDs are another namespace's, or they all just exited
        # (the driver lists a process for a moment after it died: services restarted at once, as the
        # H200 lab's are between scenarios); only a second list in a row says which
        self._hidden_lists = self._hidden_lists + 1 if rows and hidden == len(self._info) else 0
        if self._hidden_lists >= 2 and not self._hidden_said:
            self._hidden_said = True   # said once: the PIDs are the root namespace's, not ours
            log.warning("workloads: none of the %d processes on the accelerators is in %s (a PID namespace of "
                        "its own? the agent needs hostPID): no per-process CPU evidence, pods from "
                        "pod-resources only", hidden, self.proc)

    def _leader_dirs(self, pid: int) -> CgroupDirs | None:
        """A listed process's cgroup directories, from the /proc/PID/cgroup its info holds (read with
        it, again every minute: ``_Known``)."""
        info = self._info.get(pid)
        if info is None or not info.cgroups:
            return None
        return self._dirs_of(info.cgroups)[0]

    def _cpu_stat_of(self, info: ProcessInfo) -> tuple[str, str] | None:
        """A process's cgroup ``cpu.stat`` (path, v1|v2), for the wait-for chain's throttling."""
        if not info.cgroups:
            return None
        return self._dirs_of(info.cgroups)[1]

    def _dirs_of(self, cgroups: tuple[tuple[str, str], ...]) -> tuple[CgroupDirs, tuple[str, str] | None]:
        """A cgroup path set's directories and its ``cpu.stat``, looked up once a minute (a
        directory test per hierarchy and two ``exists`` each time: every process list, 5 s, for
        every listed process, a tenth of the worker's CPU with 64 workloads)."""
        now = self.clock()
        if now >= self._dirs_until or len(self._dirs_cache) > 4096:
            self._dirs_cache.clear()
            self._dirs_until = now + 60.0
        got = self._dirs_cache.get(cgroups)
        if got is None:
            if self._cg_root is False:
                self._cg_root = unified_root(self.sys)
            dirs = cgroup_dirs(self.sys, dict(cgroups), self._cg_root if isinstance(self._cg_root, str) else None)
            got = self._dirs_cache[cgroups] = (dirs, dirs.cpu_stat)
        return got

    def _process_sets(self) -> dict[int, list[int]]:
        """Each listed process's whole process set: its container's or service's cgroup members and
        its descendants (``processset.process_set``), the other listed processes left to their own."""
        listed = {r.pid for r in self._rows if self._info.get(r.pid) is not None}
        if not listed:
            return {}
        self.tree.refresh()
        out: dict[int, list[int]] = {}
        for pid in listed:
            info = self._info.get(pid)
            dirs = self._leader_dirs(pid)
            members = process_set(pid, info.owner if info is not None else None, dirs, self.tree,
                                  self.max_processes + len(listed))
            out[pid] = [p for p in members if p == pid or p not in listed][:self.max_processes]
        return out

    def _read_shares(self) -> dict[Labels, dict[int, float]]:
        out: dict[Labels, dict[int, float]] = {}
        for s in self.sources:
            if s.name in self._source_down:
                continue
            try:
                out.update(s.shares())
            except Exception as e:  # noqa: BLE001 - shares are optional evidence
                log.debug("workloads: %s shares: %s", s.name, e)
        return out

    def _build(self, shares: dict[Labels, dict[int, float]]) -> Plan:
        if self.sources and len(self._source_down) == len(self.sources):
            return Plan(problem="; ".join(f"{k}: {v}" for k, v in self._source_down.items()))
        owners_by_key = self._owners_by_key()
        by_accel: dict[Labels, tuple[str, dict[Workload, dict[int, None]]]] = {}
        bus_of: dict[Labels, str] = {}
        stat_of: dict[Labels, dict[Workload, tuple[str, str]]] = {}
        listed_of: dict[Labels, dict[Workload, dict[int, None]]] = {}
        for r in self._rows:
            info = self._info.get(r.pid)
            owners: list[DeviceOwner] = []
            for k in device_keys(r):
                owners += owners_by_key.get(k, ())
            wl = attribute(info, owners, self.pods)
            group = by_accel.setdefault(r.labels, (r.uuid, {}))[1].setdefault(wl, {})
            listed_of.setdefault(r.labels, {}).setdefault(wl, {})[r.pid] = None
            if r.bus_id:
                bus_of[r.labels] = r.bus_id
            for pid in self._members.get(r.pid, (r.pid,)):
                if len(group) < self.max_processes or pid == r.pid:
                    group[pid] = None
            if wl not in stat_of.get(r.labels, {}):
                info_r = self._info.get(r.pid)
                cs = self._dirs_of(info_r.cgroups)[1] if info_r is not None and info_r.cgroups else None
                if cs is not None:
                    stat_of.setdefault(r.labels, {})[wl] = cs
        accels = tuple(_Accel(labels, uuid, tuple((wl, tuple(pids)) for wl, pids in groups.items()),
                              tuple(sorted(stat_of.get(labels, {}).items())), bus_of.get(labels, ""),
                              tuple((wl, tuple(ps)) for wl, ps in listed_of.get(labels, {}).items()))
                       for labels, (uuid, groups) in sorted(by_accel.items()))
        # every process of every set; a listed one the agent cannot see (another PID namespace) is left out
        pids = frozenset(p for a in accels for _wl, ps in a.groups for p in ps
                         if p not in self._info or self._info[p] is not None)
        if self._plan is not None and self._plan.pids == pids:
            pids = self._plan.pids      # the same processes: the tick has nothing to open or close
        self._dirs = _own_dirs(accels, self._cgroup_dirs(pids))
        return Plan(accels, pids, shares)

    def _owners_by_key(self) -> dict[str, list[DeviceOwner]]:
        """The kubelet's device owners by the key a process's device is matched with."""
        out: dict[str, list[DeviceOwner]] = {}
        for dev, given in self.pod_resources.owners.items():
            for o in given:
                key = owner_key(o.resource, dev)
                if key is not None:
                    out.setdefault(key, []).append(o)
        return out

    def _cgroup_dirs(self, pids: Iterable[int]) -> dict[int, str]:
        """The cgroup v2 directory of each process (for cpu.pressure); cached by path."""
        if self._cg_root is False:
            self._cg_root = unified_root(self.sys)
        root = self._cg_root
        out: dict[int, str] = {}
        if not isinstance(root, str):
            return out
        for pid in pids:
            info = self._info.get(pid)
            path = info.owner.v2_path if info is not None and info.owner is not None else ""
            if not path or path == "/":
                continue        # the root is the node, not the process's own cgroup
            if path not in self._owner_cache:
                if len(self._owner_cache) > 4096:
                    self._owner_cache.clear()
                self._owner_cache[path] = resolve_v2_dir(root, path)
            d = self._owner_cache[path]
            if d is not None:
                out[pid] = d
        return out

    def _pressure(self) -> dict[int, float]:
        """cpu.pressure ``some avg10`` / 100 of each followed process's cgroup (kept-open descriptors)."""
        dirs = set(self._dirs.values())
        for d in [d for d in self._psi_fds if d not in dirs]:
            with contextlib.suppress(OSError):
                os.close(self._psi_fds.pop(d))
        psi: dict[str, float] = {}
        for d in dirs:
            fd = self._psi_fds.get(d)
            try:
                if fd is None:
                    fd = self._psi_fds[d] = os.open(d + "/cpu.pressure", os.O_RDONLY | os.O_CLOEXEC)
                line = os.pread(fd, 256, 0)
                # "some avg10=0.00 avg60=0.00 avg300=0.00 total=0"
                psi[d] = float(line.split(b" ", 2)[1][6:]) / 100.0
            except (OSError, ValueError, IndexError):
                old = self._psi_fds.pop(d, None)
                if old is not None:
                    with contextlib.suppress(OSError):
                        os.close(old)
        return {pid: psi[d] for pid, d in self._dirs.items() if d in psi}

    # ------------------------------------------------------------------ the tick
    def _accelerator(self, acc: _Accel, plan: Plan, procs: dict[int, ProcSample],
                     out: list[Sample | EventRecord]) -> None:
        shares = plan.shares.get(acc.labels)
        pressure = plan.pressure
        get = procs.get
        # per workload: (processes, sm, cpu, busiest, busiest known, run, wait, wait known, pressure)
        groups: dict[Workload, GroupTotals] = {}
        for wl, pids in acc.groups:
            got = _group_totals(pids, get, shares, pressure)
            if got is not None:
                groups[wl] = got
        if len(groups) > self.max_workloads:
            groups = _fold_rest(groups, self.max_workloads)
        now = self.clock()
        add = out.append
        state = self._state
        cfs = {wl: self._cfs(acc.labels, wl, where) for wl, where in acc.cpu_stat if wl in groups}
        for wl, (n, sm, cpu, best, known, run, wait, waited, psi) in groups.items():
            key = (acc.labels, wl)
            st = state.get(key)
            if st is None:
                base = {**dict(acc.labels), **dict(zip(WORKLOAD_LABELS, wl, strict=True))}
                st = state[key] = [base, {**base, "uuid": acc.uuid}, 0.0, now]
            labels = st[0]
            st[2] += cpu
            st[3] = now
            add(Sample("triscope_accelerator_workload_info", 1.0, st[1]))
            add(Sample("triscope_workload_processes", float(n), labels))
            if shares is not None:
                add(Sample("triscope_workload_sm_ratio", min(1.0, sm), labels))
            add(Sample("triscope_workload_cpu_seconds_total", st[2], labels, "counter"))
            if known:
                add(Sample("triscope_workload_feeder_busy_ratio", best, labels))
            if waited:
                add(Sample("triscope_workload_cpu_wait_ratio", wait / (run + wait) if run + wait else 0.0, labels))
            if psi >= 0:
                add(Sample("triscope_workload_cpu_pressure_ratio", psi, labels))
            self._context(acc.labels, wl, labels, cfs.get(wl), add)

    def _context(self, acc: Labels, wl: Workload, labels: dict[str, str],
                 c: tuple[int, int, float, float | None] | None, add: Callable[[Sample], None]) -> None:
        """A workload's surroundings: its cgroup's CPU limit and throttling, where it runs against
        the accelerator's NUMA node, its TCP counters."""
        tcp = self.tcp
        placement = self.placement
        if c is not None:
            periods, throttled, secs, limit = c
            add(Sample("triscope_workload_cpu_periods_total", float(periods), labels, "counter"))
            add(Sample("triscope_workload_cpu_throttled_periods_total", float(throttled), labels, "counter"))
            add(Sample("triscope_workload_cpu_throttled_seconds_total", secs, labels, "counter"))
            if limit is not None:
                add(Sample("triscope_workload_cpu_limit_cores", limit, labels))
        placed = placement.get((acc, wl)) if placement is not None else None
        if placed is not None:
            if placed.cpu_local is not None:
                add(Sample("triscope_workload_cpu_local_ratio", placed.cpu_local, labels))
            if placed.mem_local is not None:
                add(Sample("triscope_workload_memory_local_ratio", placed.mem_local, labels))
            if placed.allowed_local is not None:
                add(Sample("triscope_workload_cpus_allowed_local_ratio", placed.allowed_local, labels))
        if tcp is not None and not tcp.problem:
            got = tcp.counters(wl)
            if got is not None:
                add(Sample("triscope_workload_tcp_retransmits_total", float(got[0]), labels, "counter"))
                add(Sample("triscope_workload_tcp_segments_sent_total", float(got[1]), labels, "counter"))
                add(Sample("triscope_workload_tcp_out_of_order_received_total", float(got[2]), labels,
                           "counter"))
                add(Sample("triscope_workload_tcp_data_segments_received_total", float(got[3]), labels,
                           "counter"))

    def _cfs(self, acc: Labels, wl: Workload, where: tuple[str, str]) -> tuple[int, int, float, float | None] | None:
        """The workload's cgroup CFS counters since the agent began reading them (a baseline at
        the first read, so a counter never starts with the cgroup's past): (periods, throttled
        periods, throttled seconds, the limit in cores); None when the cgroup has no CPU limit
        (no enforcement periods) or cannot be read."""
        path, kind = where
        reader = self._cpu_stat.get(path)
        if reader is None:
            try:
                reader = self._cpu_stat[path] = CgroupCpu(path, kind)
            except OSError:
                return None
        got = reader.read()
        if got is None:
            reader.close()
            del self._cpu_stat[path]
            return None
        key = (acc, wl)
        base = self._cpu_prev.get(key)
        if base is None or got[0] < base[0]:        # first read, or another cgroup behind the path
            base = self._cpu_prev[key] = got
        if reader.limit is None and got[0] == base[0]:
            return None
        return got[0] - base[0], got[1] - base[1], got[2] - base[2], reader.limit

    def _forget_old(self, keep_s: float = 600.0) -> None:
        """Counters of workloads gone for ``keep_s`` are forgotten (a workload that comes back later
        starts again from 0: a counter reset, which rate() handles)."""
        now = self.clock()
        for key in [k for k, st in self._state.items() if now - st[3] > keep_s]:
            del self._state[key]
            self._cpu_prev.pop(key, None)
        accels = self._plan.accels if self._plan is not None else ()
        used = {path for a in accels for _wl, (path, _kind) in a.cpu_stat}
        for path in [p for p in self._cpu_stat if p not in used]:
            self._cpu_stat.pop(path).close()


class _Known:
    """comm and cgroup of each listed process, read when it is first listed and again every
    ``reread_s`` (a process moved to another cgroup); a pidfd per process says, in one ``poll``,
    which ones exited (so a reused PID is read afresh)."""

    def __init__(self, proc: str, reread_s: float = 60.0) -> None:
        self.proc = proc
        self.reread_s = reread_s
        self._info: dict[int, tuple[ProcessInfo | None, float]] = {}
        self._pidfd: dict[int, int] = {}
        self._by_fd: dict[int, int] = {}
        self._exits = select.poll()

    def exited(self) -> list[int]:
        """The processes that exited since the last call (forgotten here)."""
        gone = []
        if self._by_fd:
            for fd, _ev in self._exits.poll(0):
                pid = self._by_fd.get(fd)
                if pid is not None:
                    gone.append(pid)
                    self._forget(pid)
        return gone

    def alive(self, pid: int) -> bool:
        return pid in self._info

    def get(self, pids: set[int]) -> dict[int, ProcessInfo | None]:
        self.exited()
        for pid in [p for p in self._info if p not in pids]:
            self._forget(pid)
        now = time.monotonic()
        out: dict[int, ProcessInfo | None] = {}
        for pid in pids:
            got = self._info.get(pid)
            if got is None or now - got[1] > self.reread_s or (got[0] is not None and pid not in self._pidfd):
                got = (read_process(self.proc, pid), now)
                self._info[pid] = got
                if got[0] is not None and pid not in self._pidfd and self.proc == "/proc" and hasattr(os, "pidfd_open"):
                    with contextlib.suppress(OSError):
                        fd = os.pidfd_open(pid)
                        self._exits.register(fd, select.POLLIN)
                        self._pidfd[pid], self._by_fd[fd] = fd, pid
            out[pid] = got[0]
        return out

    def _forget(self, pid: int) -> None:
        self._info.pop(pid, None)
        fd = self._pidfd.pop(pid, None)
        if fd is not None:
            self._by_fd.pop(fd, None)
            with contextlib.suppress(KeyError, OSError):
                self._exits.unregister(fd)
            with contextlib.suppress(OSError):
                os.close(fd)

    def close(self) -> None:
        for pid in list(self._info):
            self._forget(pid)
