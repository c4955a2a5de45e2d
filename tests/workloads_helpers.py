"""Real processes in real cgroups for the workload-attribution tests (tests/*/test_workloads_*.py).

``Cgroups(root)`` creates cgroup directories under this machine's cgroup v2 hierarchy (the kubelet's
and systemd's layouts), moves real processes into them through ``cgroup.procs`` and removes what it
created afterwards.  ``spawn(threads, spinners)`` starts a Python process with that many sleeping
threads and that many threads burning CPU outside the GIL (sha256 over 1 MiB releases it), so
several spinners of one process compete for CPUs like native threads do.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

from triscope.agent.workloads.cgroups import unified_root

CHILD = r"""
import hashlib, sys, threading, time
sleepers, spinners, leader = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
ev = threading.Event()
for _ in range(sleepers):
    threading.Thread(target=ev.wait, daemon=True).start()
buf = b"x" * (1 << 20)
def spin():
    while True:
        hashlib.sha256(buf).digest()
for _ in range(spinners):
    threading.Thread(target=spin, daemon=True).start()
print("ready", flush=True)
if leader == "spin":
    while True:
        pass
ev.wait()
"""


def spawn(sleepers: int = 0, spinners: int = 0, leader: str = "sleep", cpus: set[int] | None = None) -> subprocess.Popen[str]:
    """A Python process with ``sleepers`` idle threads and ``spinners`` busy ones (``leader="spin"``:
    the main thread spins too, holding the GIL), pinned to ``cpus`` when given."""
    p = subprocess.Popen([sys.executable, "-c", CHILD, str(sleepers), str(spinners), leader],
                         stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    if cpus is not None:
        for tid in os.listdir(f"/proc/{p.pid}/task"):
            os.sched_setaffinity(int(tid), cpus)
    return p


def stop(*procs: subprocess.Popen[str]) -> None:
    for p in procs:
        with contextlib.suppress(ProcessLookupError):
            p.kill()
    for p in procs:
        with contextlib.suppress(Exception):
            p.wait(10)


def writable_cgroup_root() -> str | None:
    """This machine's cgroup v2 mount when we may create cgroups there (root, not read-only), else None."""
    root = unified_root("/sys")
    if root is None or os.geteuid() != 0:
        return None
    probe = Path(root, f"triscope-probe-{uuid.uuid4().hex[:8]}")
    try:
        probe.mkdir()
        probe.rmdir()
    except OSError:
        return None
    return root


def cgroup_skip_reason() -> str:
    if os.geteuid() != 0:
        return "needs root to create cgroups"
    if unified_root("/sys") is None:
        return "no cgroup v2 hierarchy mounted here (v1 only)"
    return "the cgroup v2 hierarchy is read-only here (a container?)"


class Cgroups:
    """cgroup directories made for a test, removed (deepest first) by ``cleanup()``."""

    def __init__(self, root: str) -> None:
        self.root = Path(root)
        self.made: list[Path] = []

    def put(self, rel: str, pid: int) -> Path:
        d = self.root / rel.strip("/")
        missing = []
        p = d
        while not p.exists():
            missing.append(p)
            p = p.parent
        for m in reversed(missing):
            m.mkdir()
            self.made.append(m)
        (d / "cgroup.procs").write_text(str(pid))
        return d

    def cleanup(self) -> None:
        for d in sorted(self.made, key=lambda p: len(p.parts), reverse=True):
            for _ in range(50):     # a killed process leaves its cgroup when it is reaped
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.05)
        self.made.clear()


def kube_path(uid: str, container_id: str, qos: str = "burstable", driver: str = "systemd") -> str:
    """The kubelet's cgroup path of a container (systemd or cgroupfs driver, containerd)."""
    if driver == "cgroupfs":
        return f"kubepods/{qos}/pod{uid}/{container_id}"
    u = uid.replace("-", "_")
    return (f"kubepods.slice/kubepods-{qos}.slice/kubepods-{qos}-pod{u}.slice/"
            f"cri-containerd-{container_id}.scope")
