"""Kubernetes-style pods without a kubelet: the cgroups and log directories a kubelet would make.

    pod = Pod("lab-b", namespace="lab")                 # the pod's cgroup and /var/log/pods/lab_lab-b_<uid>/
    gpu = pod.container("lab-b")                        # .../cri-containerd-<64 hex>.scope and its log dir
    prep = pod.container("lab-b-prep", cpu_max=0.5)     # a container with a CPU limit
    gpu.put([pid])                                      # a process (and, with family=True, its children) in it
    pod.set_weight(4)                                   # the pod's cpu.weight (v2) / cpu.shares (v1)
    pod.remove()                                        # processes back to the root, cgroups and log dirs gone

The agent names a process's pod from its cgroup path (``agent/workloads/cgroups.py``) and the pod's
namespace, name and containers from ``/var/log/pods/<namespace>_<pod>_<uid>/<container>/``
(``attribution.read_pod_dirs``): this module makes both the way the kubelet's systemd cgroup driver
with containerd does, so the agent cannot tell them from a kubelet's:

* cgroup v2 (the GPU machine): ``/sys/fs/cgroup/kubepods.slice/kubepods-<qos>.slice/
  kubepods-<qos>-pod<uid_with_underscores>.slice/cri-containerd-<id>.scope``, the ``cpu``
  controller enabled down the path; ``cpu.max`` on a container, ``cpu.weight`` on a pod.
* cgroup v1 (the CPU machines): the same path under each hierarchy the kubelet and systemd keep in
  step (``cpu``, ``cpuacct``, ``pids``, ``name=systemd``, and the hybrid host's ``unified`` v2 tree
  when mounted); ``cpu.cfs_quota_us``/``cpu.cfs_period_us`` on a container, ``cpu.shares`` on a pod
  (the kubelet's conversion from ``cpu.weight``).

``kubepods.slice`` gets the node's allocatable CPU as its weight, as the kubelet sets it.  Guaranteed
pods (``qos="guaranteed"``) sit directly under ``kubepods.slice``.  Needs root.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import time
import uuid
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
PODS_LOG_DIR = Path("/var/log/pods")
# the v1 hierarchies a pod's path is made in (memory and cpuset left alone: moving a process out of
# its memory cgroup would escape the host's own accounting; a cpuset child starts with no CPUs)
V1_HIERARCHIES = ("cpu", "cpu,cpuacct", "cpuacct", "pids", "systemd", "unified")


def weight_to_shares(weight: int) -> int:
    """cgroup v2 ``cpu.weight`` -> v1 ``cpu.shares``: the inverse of the kubelet's
    ``weight = 1 + (shares - 2) * 9999 / 262142``."""
    return max(2, round(2 + (weight - 1) * 262142 / 9999))


def shares_to_weight(shares: int) -> int:
    """The kubelet's conversion (``cpuSharesToCPUWeight``)."""
    return max(1, min(10000, 1 + ((shares - 2) * 9999) // 262142))


def layout(root: Path = CGROUP_ROOT) -> tuple[str, list[Path]]:
    """``("v2", [root])`` on a host with the unified hierarchy and its cpu controller at ``root``
    (``/sys/fs/cgroup``), else ``("v1", [each v1 hierarchy under root a pod's path goes in])``."""
    ctrl = root / "cgroup.controllers"
    if ctrl.exists() and "cpu" in ctrl.read_text().split():
        return "v2", [root]
    dirs = [root / h for h in V1_HIERARCHIES if (root / h / "cgroup.procs").exists()]
    if not any((d / "cpu.shares").exists() for d in dirs):
        raise RuntimeError("pods: no cgroup v2 cpu controller and no cgroup v1 cpu hierarchy here")
    return "v1", dirs


def _write(path: Path, value: str) -> None:
    path.write_text(value)


def _enable_cpu(v2_dir: Path) -> None:
    """The cpu controller for ``v2_dir``'s children (cgroup v2), as the kubelet has it."""
    with contextlib.suppress(OSError):
        _write(v2_dir / "cgroup.subtree_control", "+cpu")


class Container:
    """One container's cgroup (a ``cri-containerd-<id>.scope`` in every hierarchy) and log directory."""

    def __init__(self, pod: Pod, name: str) -> None:
        self.pod, self.name = pod, name
        self.id = secrets.token_hex(32)
        self.scope = f"cri-containerd-{self.id}.scope"
        self.dirs = [d / self.scope for d in pod.dirs]
        for d in self.dirs:
            d.mkdir(exist_ok=True)
        self.log_dir = pod.log_dir / name
        self.log_dir.mkdir(parents=True, exist_ok=True)
        (self.log_dir / "0.log").touch()
        # the kubelet's link /var/log/containers/<pod>_<namespace>_<container>-<id>.log: which
        # container of the pod a runtime ID (the cgroup's scope) is
        self.link = pod.log_dir.parent.parent / "containers" / f"{pod.name}_{pod.namespace}_{name}-{self.id}.log"
        with contextlib.suppress(OSError):
            self.link.parent.mkdir(parents=True, exist_ok=True)
            self.link.unlink(missing_ok=True)
            self.link.symlink_to(self.log_dir / "0.log")

    @property
    def path(self) -> str:
        """The cgroup path ``/proc/PID/cgroup`` shows for a process in it."""
        return f"{self.pod.path}/{self.scope}"

    def put(self, pids: list[int], family: bool = False) -> None:
        """Move ``pids`` (with ``family``, every descendant found now as well) into this container."""
        todo = descendants(pids) if family else list(pids)
        for d in self.dirs:
            for pid in todo:
                with contextlib.suppress(OSError):      # gone already
                    _write(d / "cgroup.procs", str(pid))

    def set_cpu_max(self, cores: float | None) -> None:
        """A CFS limit of ``cores`` CPUs (100 ms period), ``None`` for none."""
        self.pod.set_cpu_max(cores, self)

    def members(self) -> list[int]:
        return [int(p) for p in (self.dirs[0] / "cgroup.procs").read_text().split()]


class Pod:
    """A pod's cgroup and log directory, and its containers."""

    def __init__(self, name: str, namespace: str = "lab", qos: str = "burstable", uid: str | None = None,
                 logs: Path | str = PODS_LOG_DIR, cgroup_root: Path | str = CGROUP_ROOT) -> None:
        self.name, self.namespace, self.qos = name, namespace, qos
        self.uid = uid or str(uuid.uuid4())
        self.kind, roots = layout(Path(cgroup_root))
        self.roots = roots
        u = self.uid.replace("-", "_")
        rel = ["kubepods.slice"]
        if qos == "guaranteed":
            rel.append(f"kubepods-pod{u}.slice")
        else:
            rel += [f"kubepods-{qos}.slice", f"kubepods-{qos}-pod{u}.slice"]
        self.rel = rel
        self.path = "/" + "/".join(rel)
        self.dirs: list[Path] = []
        for root in roots:
            d = root
            for seg in rel:
                if self.kind == "v2":
                    _enable_cpu(d)
                d = d / seg
                fresh = not d.exists()
                d.mkdir(exist_ok=True)
                if fresh and seg == "kubepods.slice":
                    self._node_weight(d)
            if self.kind == "v2":
                _enable_cpu(d)
            self.dirs.append(d)
        self.log_dir = Path(logs) / f"{namespace}_{name}_{self.uid}"
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.containers: dict[str, Container] = {}

    def _node_weight(self, d: Path) -> None:
        """``kubepods.slice`` at the node's allocatable CPU, as the kubelet sets it."""
        shares = 1024 * (os.cpu_count() or 1)
        with contextlib.suppress(OSError):
            if self.kind == "v2":
                _write(d / "cpu.weight", str(shares_to_weight(shares)))
            elif (d / "cpu.shares").exists():
                _write(d / "cpu.shares", str(shares))

    def container(self, name: str, cpu_max: float | None = None) -> Container:
        c = self.containers.get(name)
        if c is None:
            c = self.containers[name] = Container(self, name)
        if cpu_max is not None:
            c.set_cpu_max(cpu_max)
        return c

    def _cpu_dirs(self, c: Container | None) -> list[Path]:
        """Where the cpu controller's files are: the one v2 directory (a write there fails loudly when
        the controller is not enabled), the v1 ``cpu`` hierarchy's."""
        dirs = c.dirs if c is not None else self.dirs
        return list(dirs) if self.kind == "v2" else [d for d in dirs if (d / "cpu.shares").exists()]

    def set_cpu_max(self, cores: float | None, c: Container | None = None) -> None:
        """A CFS limit on the pod (``c`` None) or one of its containers."""
        for d in self._cpu_dirs(c):
            if self.kind == "v2":
                _write(d / "cpu.max", "max 100000" if cores is None else f"{max(1000, int(cores * 100000))} 100000")
            else:
                _write(d / "cpu.cfs_period_us", "100000")
                _write(d / "cpu.cfs_quota_us", "-1" if cores is None else str(max(1000, int(cores * 100000))))

    def set_weight(self, weight: int | None) -> None:
        """The pod's ``cpu.weight`` (v2) or the matching ``cpu.shares`` (v1); None: the default (100 / 1024)."""
        for d in self._cpu_dirs(None):
            if self.kind == "v2":
                _write(d / "cpu.weight", str(weight or 100))
            else:
                _write(d / "cpu.shares", str(weight_to_shares(weight) if weight else 1024))

    def cgroup_dir(self, hierarchy: str = "cpu") -> Path:
        """The pod's directory in one hierarchy (v2: the only one)."""
        if self.kind == "v2":
            return self.dirs[0]
        return next(d for d, r in zip(self.dirs, self.roots, strict=True) if r.name in (hierarchy, "cpu,cpuacct"))

    def remove(self, wait: float = 15.0) -> None:
        """Every process left in the pod back to the root cgroup, the containers' and the pod's
        cgroups removed (a killed process leaves once it is reaped: retried for ``wait`` s), the log
        directory removed.  The shared parents (``kubepods.slice``...) stay, as a kubelet keeps them."""
        for c in self.containers.values():
            for d, root in zip(c.dirs, self.roots, strict=True):
                _evict(d, root)
        for d, root in zip(self.dirs, self.roots, strict=True):
            _evict(d, root)
        end = time.monotonic() + wait
        for d in [x for c in self.containers.values() for x in c.dirs] + self.dirs:
            while d.exists():
                try:
                    d.rmdir()
                except OSError:
                    if time.monotonic() > end:
                        break
                    time.sleep(0.1)
        shutil.rmtree(self.log_dir, ignore_errors=True)
        for c in self.containers.values():
            with contextlib.suppress(OSError):
                c.link.unlink(missing_ok=True)
        self.containers.clear()

    def __enter__(self) -> Pod:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


def _evict(d: Path, root: Path) -> None:
    try:
        pids = (d / "cgroup.procs").read_text().split()
    except OSError:
        return
    for pid in pids:
        with contextlib.suppress(OSError):
            _write(root / "cgroup.procs", pid)


def descendants(pids: list[int]) -> list[int]:
    """``pids`` and every process below them now (parents from ``/proc/PID/stat``)."""
    parent: dict[int, int] = {}
    for p in os.listdir("/proc"):
        if p.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                data = Path(f"/proc/{p}/stat").read_bytes()
                parent[int(p)] = int(data[data.rindex(b")") + 2:].split(b" ", 2)[1])
    out = list(dict.fromkeys(pids))
    seen = set(out)
    i = 0
    while i < len(out):
        for child, ppid in parent.items():
            if ppid == out[i] and child not in seen:
                seen.add(child)
                out.append(child)
        i += 1
    return out


def remove_parents(cgroup_root: Path | str = CGROUP_ROOT) -> None:
    """``kubepods.slice`` and its QoS slices removed where no pod is left in them (a host with a real
    kubelet keeps its own: they are not empty)."""
    with contextlib.suppress(RuntimeError):
        _, roots = layout(Path(cgroup_root))
        for root in roots:
            top = root / "kubepods.slice"
            for d in [top / "kubepods-burstable.slice", top / "kubepods-besteffort.slice", top]:
                with contextlib.suppress(OSError):
                    d.rmdir()
