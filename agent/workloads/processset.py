"""A workload is its whole process set, and its cgroup's CPU limit (docs/workloads.md section 1).

The processes NVML (or npu-smi) lists hold a CUDA context; the processes that feed them often do
not: a ``torch.utils.data.DataLoader``'s workers, a tokenizer pool, a decoder subprocess.  They
belong to the same workload, found two ways (``process_set``):

* **its cgroup**: a process in a container (Kubernetes, Docker) or a systemd service shares that
  cgroup with every other process of it (``cgroup.procs`` of its cgroup v2 directory, or of its v1
  ``cpu`` / ``pids`` / ``name=systemd`` hierarchy).  A login session or the root cgroup is no
  workload's own, so it is not read there.
* **its descendants**: its children, theirs, and so on (``ProcessTree``: parent PIDs from
  ``/proc/PID/stat``, each PID read once when it first appears; kernels with
  ``CONFIG_PROC_CHILDREN`` are not required).

``CgroupCpu`` reads the workload's cgroup's CFS bandwidth control: ``cpu.stat`` (``nr_periods``,
``nr_throttled``, and ``throttled_usec`` on v2 / ``throttled_time`` ns on v1) and the limit
(``cpu.max`` on v2, ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` on v1).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from triscope.agent.workloads.cgroups import CgroupOwner, resolve_v2_dir

V1_CPU_HIERARCHIES = ("cpu,cpuacct", "cpu", "cpuacct,cpu")
V1_MEMBER_HIERARCHIES = (*V1_CPU_HIERARCHIES, "pids", "name=systemd")
_V1_DIR = {"cpu,cpuacct": ("cpu,cpuacct", "cpu"), "cpuacct,cpu": ("cpu,cpuacct", "cpu"), "cpu": ("cpu", "cpu,cpuacct"),
           "pids": ("pids",), "name=systemd": ("systemd",)}


def own_cgroup(owner: CgroupOwner | None) -> bool:
    """Is this process's cgroup a workload's own (a container, a pod, a systemd service)?"""
    return owner is not None and bool(owner.container_id or owner.pod_uid or owner.unit)


class ProcessTree:
    """Parent of every process on the host, kept up to date by ``refresh`` (one ``listdir`` of
    ``/proc``; ``/proc/PID/stat`` only for PIDs not seen before)."""

    def __init__(self, proc: str = "/proc") -> None:
        self.proc = proc
        self._parent: dict[int, int] = {}
        self._children: dict[int, list[int]] | None = None
        self.read = 0          # stat files read by the last refresh (tests, the benchmark)

    def refresh(self) -> None:
        try:
            pids = {int(p) for p in os.listdir(self.proc) if p.isdigit()}
        except OSError:
            return
        parent = self._parent
        for gone in [p for p in parent if p not in pids]:
            del parent[gone]
        self.read = 0
        for pid in pids:
            if pid in parent:
                continue
            self.read += 1
            try:
                with open(f"{self.proc}/{pid}/stat", "rb") as f:
                    data = f.read(512)
                parent[pid] = int(data[data.rindex(b")") + 2:].split(b" ", 2)[1])
            except (OSError, ValueError, IndexError):
                continue
        self._children = None

    def descendants(self, pid: int, limit: int = 256) -> list[int]:
        """Its children, theirs, ... (breadth first, at most ``limit``)."""
        if self._children is None:
            kids: dict[int, list[int]] = {}
            for p, pp in self._parent.items():
                kids.setdefault(pp, []).append(p)
            self._children = kids
        out: list[int] = []
        todo = list(self._children.get(pid, ()))
        seen = {pid}
        while todo and len(out) < limit:
            p = todo.pop(0)
            if p in seen:
                continue
            seen.add(p)
            out.append(p)
            todo.extend(self._children.get(p, ()))
        return out


@dataclass(frozen=True, slots=True)
class CgroupDirs:
    """Where a process's cgroup lives: its v2 directory and its v1 ``cpu`` directory (either may be
    absent), and the directory whose ``cgroup.procs`` lists its fellow members."""

    v2: str | None = None
    v1_cpu: str | None = None
    members: str | None = None

    @property
    def cpu_stat(self) -> tuple[str, str] | None:
        """(path of cpu.stat, "v2" | "v1"): v2 when the cpu controller is enabled there."""
        if self.v2 and os.path.exists(f"{self.v2}/cpu.max"):
            return f"{self.v2}/cpu.stat", "v2"
        if self.v1_cpu and os.path.exists(f"{self.v1_cpu}/cpu.cfs_quota_us"):
            return f"{self.v1_cpu}/cpu.stat", "v1"
        return None


def cgroup_dirs(sys: str, hierarchies: Mapping[str, str], v2_root: str | None) -> CgroupDirs:
    """The directories of a process's cgroups (``/proc/PID/cgroup`` as ``parse_proc_cgroup`` reads
    it: hierarchy -> path, ``""`` the v2 one), on a v2, v1 or hybrid host."""
    paths = hierarchies
    v2 = None
    v2_path = paths.get("")
    if v2_root and v2_path and v2_path != "/":
        v2 = resolve_v2_dir(v2_root, v2_path)
    v1_cpu = None
    members = None
    base = os.path.join(sys, "fs", "cgroup")
    for h in V1_MEMBER_HIERARCHIES:
        path = paths.get(h)
        if path is None or path == "/":
            continue
        for d in _V1_DIR[h]:
            cand = os.path.join(base, d, path.lstrip("/"))
            if os.path.isdir(cand):
                if h in V1_CPU_HIERARCHIES and v1_cpu is None:
                    v1_cpu = cand
                if members is None:
                    members = cand
                break
    if v2 is not None:
        members = v2
    return CgroupDirs(v2, v1_cpu, members)


def cgroup_members(dirs: CgroupDirs, limit: int = 256) -> list[int]:
    """The processes in a cgroup (``cgroup.procs``), at most ``limit``."""
    if dirs.members is None:
        return []
    try:
        with open(f"{dirs.members}/cgroup.procs", "rb") as f:
            data = f.read(limit * 12)
    except OSError:
        return []
    out: list[int] = []
    for ln in data.split(b"\n"):
        if ln.strip().isdigit():
            out.append(int(ln))
            if len(out) >= limit:
                break
    return out


def process_set(pid: int, owner: CgroupOwner | None, dirs: CgroupDirs | None, tree: ProcessTree,
                limit: int = 64) -> list[int]:
    """A GPU process and the processes of its workload: its cgroup's members when that cgroup is
    the workload's own (``own_cgroup``), and its descendants; itself first, at most ``limit``."""
    out = [pid]
    seen = {pid}

    def add(pids: Iterable[int]) -> None:
        for p in pids:
            if p not in seen and len(out) < limit:
                seen.add(p)
                out.append(p)

    if dirs is not None and own_cgroup(owner):
        add(cgroup_members(dirs, limit * 4))
    add(tree.descendants(pid, limit * 4))
    return out


class CgroupCpu:
    """One cgroup's CFS bandwidth control, read with a kept-open descriptor (``pread``)."""

    def __init__(self, path: str, kind: str) -> None:
        self.path, self.kind = path, kind
        self.fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        self.limit = read_cpu_limit(os.path.dirname(path), kind)

    def read(self) -> tuple[int, int, float] | None:
        """(nr_periods, nr_throttled, throttled seconds); None when it cannot be read any more."""
        try:
            data = os.pread(self.fd, 1024, 0)
        except OSError:
            return None
        return parse_cpu_stat(data, self.kind)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)


def parse_cpu_stat(data: bytes, kind: str) -> tuple[int, int, float] | None:
    vals: dict[bytes, int] = {}
    for ln in data.split(b"\n"):
        k, _, v = ln.partition(b" ")
        if v:
            with contextlib.suppress(ValueError):
                vals[k] = int(v)
    if b"nr_periods" not in vals or b"nr_throttled" not in vals:
        return None
    if kind == "v2":
        secs = vals.get(b"throttled_usec", 0) / 1e6
    else:
        secs = vals.get(b"throttled_time", 0) / 1e9
    return vals[b"nr_periods"], vals[b"nr_throttled"], secs


def read_cpu_limit(d: str, kind: str) -> float | None:
    """The cgroup's CPU limit in cores (quota / period); None when unlimited or unreadable."""
    try:
        if kind == "v2":
            with open(f"{d}/cpu.max", "rb") as f:
                quota_s, _, period_s = f.read(64).strip().partition(b" ")
            if quota_s == b"max":
                return None
            quota, period = int(quota_s), int(period_s or b"100000")
        else:
            with open(f"{d}/cpu.cfs_quota_us", "rb") as f:
                quota = int(f.read(32).strip())
            with open(f"{d}/cpu.cfs_period_us", "rb") as f:
                period = int(f.read(32).strip())
            if quota < 0:
                return None
    except (OSError, ValueError):
        return None
    return quota / period if period > 0 else None
