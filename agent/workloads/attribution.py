"""Whose is a process on an accelerator: namespace, pod, container, or a unit or command off Kubernetes.

``attribute(process, owners, pods)`` follows docs/workloads.md section 1:

1. ``owners``: the containers the kubelet's pod-resources API says were given this device.
   * One owner: the process is that container's — unless its cgroup says otherwise: a process in
     another pod the agent can name (``/var/log/pods``) is labelled with that pod (it uses a device
     it was not given), and a process outside the kubelet's cgroup tree (a host process, e.g. a
     benchmark run by hand) is named by its unit or command.
   * Several owners (time-slicing, MPS): the process's pod UID (from its cgroup) names its pod
     through ``/var/log/pods/<namespace>_<pod>_<uid>/``; among that pod's owner containers, the one
     (several containers of one pod on one device: the pod, container left empty).  Without a
     readable ``/var/log/pods`` or a pod UID: ``workload="shared"`` and empty pod labels.
2. No owner (no pod-resources socket, a device the plugin does not name, MIG, DRA drivers not
   recognised): the pod UID through ``/var/log/pods`` (the container named when the pod has one
   container directory), else
3. ``unit:<name>.service`` (a systemd service; session scopes and user slices are not units) or
   ``cmd:<comm>``.

On Kubernetes ``workload`` is ``""``: the owning Deployment / StatefulSet / ... is resolved by the
remediation engine from ownerReferences.  Every label is a string, ``""`` when unknown.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from triscope.agent.workloads.cgroups import CgroupOwner, owner_of, parse_proc_cgroup
from triscope.agent.workloads.podresources import DeviceOwner
from triscope.core.textsafe import label_text
from triscope.core.vocabulary import WORKLOAD_LABELS  # noqa: F401 - re-exported for the collector

Workload = tuple[str, str, str, str]     # namespace, pod, container, workload
SHARED: Workload = ("", "", "", "shared")
OTHER: Workload = ("", "", "", "other")
DEFAULT_PODS_LOG_DIR = "/var/log/pods"


@dataclass(frozen=True, slots=True)
class PodDir:
    namespace: str
    pod: str
    containers: tuple[str, ...]
    by_id: tuple[tuple[str, str], ...] = ()     # (container ID, container name), from /var/log/containers

    def container_named(self, container_id: str) -> str:
        """The name of this pod's container with that runtime ID ("" when not known)."""
        return next((n for i, n in self.by_id if i == container_id), "")


@dataclass(frozen=True, slots=True)
class ProcessInfo:
    pid: int
    comm: str
    owner: CgroupOwner | None      # None: /proc/PID/cgroup could not be read
    cgroups: tuple[tuple[str, str], ...] = ()   # its /proc/PID/cgroup: (hierarchy, path), "" the v2 one


def read_pod_dirs(path: str = DEFAULT_PODS_LOG_DIR) -> dict[str, PodDir] | None:
    """{pod UID: namespace, pod, container directories} from the kubelet's log tree
    (``<namespace>_<pod>_<uid>/<container>/``); None when it cannot be read.  Neither a namespace
    nor a pod name can hold ``_``, so the split is exact."""
    try:
        entries = os.listdir(path)
    except OSError:
        return None
    ids = read_container_ids(os.path.join(os.path.dirname(path.rstrip("/")) or "/", "containers"))
    out: dict[str, PodDir] = {}
    for e in entries:
        parts = e.split("_")
        if len(parts) != 3 or not all(parts):
            continue
        try:
            containers = tuple(sorted(c for c in os.listdir(os.path.join(path, e))
                                      if os.path.isdir(os.path.join(path, e, c))))
        except OSError:
            containers = ()
        ns, pod = clean(parts[0], 253), clean(parts[1], 253)
        out[parts[2].lower()] = PodDir(ns, pod, tuple(clean(c) for c in containers),
                                       tuple(sorted((cid, name) for cid, (n, p, name) in ids.items() if (n, p) == (ns, pod))))
    return out


def read_container_ids(path: str = "/var/log/containers") -> dict[str, tuple[str, str, str]]:
    """{container ID: (namespace, pod, container)} from the kubelet's log links
    (``<pod>_<namespace>_<container>-<64 hex id>.log``): which container of a pod a process's
    cgroup (its container ID) is.  Empty when the directory cannot be read."""
    try:
        names = os.listdir(path)
    except OSError:
        return {}
    out: dict[str, tuple[str, str, str]] = {}
    for n in names:
        if not n.endswith(".log") or len(n) < 70:
            continue
        stem, cid = n[:-4].rsplit("-", 1) if "-" in n else ("", "")
        parts = stem.split("_")
        if len(cid) != 64 or len(parts) != 3 or not all(parts):
            continue
        out[cid] = (clean(parts[1], 253), clean(parts[0], 253), clean(parts[2]))
    return out


def read_process(proc: str, pid: int) -> ProcessInfo | None:
    """comm and cgroup of a process; None when it is gone (or its comm cannot be read)."""
    try:
        with open(f"{proc}/{pid}/comm", "rb") as f:
            comm = clean(f.read().decode("utf-8", "replace").strip())
    except OSError:
        return None
    try:
        with open(f"{proc}/{pid}/cgroup", "rb") as f:
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return ProcessInfo(pid, comm, None)
    return ProcessInfo(pid, comm, owner_of(text), tuple(parse_proc_cgroup(text).items()))


def clean(text: str, limit: int = 64) -> str:
    """A label value from a process's own bytes or a directory's name: printable, bounded."""
    return label_text(text, limit)


def host_workload(info: ProcessInfo) -> Workload:
    """Off Kubernetes: ``unit:<name>.service``, else ``cmd:<comm>``."""
    if info.owner is not None and info.owner.unit:
        return ("", "", "", f"unit:{clean(info.owner.unit, 128)}")
    return ("", "", "", f"cmd:{info.comm}")


def attribute(info: ProcessInfo | None, owners: Sequence[DeviceOwner], pods: Mapping[str, PodDir] | None) -> Workload:
    """The workload labels of one process on one device (see the module docstring)."""
    owner = info.owner if info is not None else None
    uid = owner.pod_uid if owner is not None else ""
    pod = pods.get(uid) if (pods and uid) else None
    distinct = sorted({(o.namespace, o.pod, o.container) for o in owners})
    if distinct:
        if owner is not None and not owner.kubepods and not owner.pod_uid and info is not None:
            return host_workload(info)        # positively outside every pod
        if pod is not None:
            mine = [c for c in distinct if (c[0], c[1]) == (pod.namespace, pod.pod)]
            if len(mine) == 1:
                return (*mine[0], "")
            if mine:
                return (pod.namespace, pod.pod, "", "")
            return _pod_labels(pod, owner.container_id if owner is not None else "")   # in a pod not given this device
        if len(distinct) == 1:
            return (*distinct[0], "")
        return SHARED
    if pod is not None:
        return _pod_labels(pod, owner.container_id if owner is not None else "")
    if info is None:
        return ("", "", "", "")
    return host_workload(info)


def _pod_labels(pod: PodDir, container_id: str = "") -> Workload:
    """A pod's labels; its container named by the runtime ID where the kubelet's log links say which,
    else when the pod has one container."""
    name = pod.container_named(container_id) if container_id else ""
    return (pod.namespace, pod.pod, name or (pod.containers[0] if len(pod.containers) == 1 else ""), "")
