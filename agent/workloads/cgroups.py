"""Which pod, container or systemd unit a process runs in, from ``/proc/PID/cgroup``.

``/proc/PID/cgroup`` has one line per hierarchy: ``0::/path`` for cgroup v2 (the only line on a
pure v2 host), ``N:controllers:/path`` for each v1 hierarchy (hybrid hosts have both).  The path
names the owner in every layout the kubelet, the container runtimes and systemd use:

==========================================  ====================================================================
layout                                      path (one segment per level)
==========================================  ====================================================================
kubelet, systemd driver (containerd)        ``/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid_with_underscores>.slice/cri-containerd-<id>.scope``
kubelet, systemd driver, Guaranteed QoS     ``/kubepods.slice/kubepods-pod<uid>.slice/cri-containerd-<id>.scope``
kubelet, systemd driver, CRI-O              ``.../kubepods-besteffort-pod<uid>.slice/crio-<id>.scope``
kubelet, systemd driver, Docker             ``.../kubepods-burstable-pod<uid>.slice/docker-<id>.scope``
containerd's v1 systemd form (kind, k3s)    ``/system.slice/containerd.service/kubepods-burstable-pod<uid>.slice:cri-containerd:<id>``
kubelet, cgroupfs driver                    ``/kubepods/burstable/pod<uid>/<id>`` (``/kubepods/pod<uid>/<id>`` for Guaranteed)
Docker alone                                ``/system.slice/docker-<id>.scope``, ``/docker/<id>``
a systemd service                           ``/system.slice/foo.service`` -> ``unit:foo.service``
a login session or user manager             ``/user.slice/user-1000.slice/session-3.scope`` -> not a unit
==========================================  ====================================================================

A pod UID appears with dashes (cgroupfs) or underscores (systemd escapes ``-``); it is returned
with dashes, as the API server writes it.  Static pods have a 32-hex UID (a hash), also matched.

When the agent runs in its own cgroup namespace (a container on a cgroup v2 host), the paths of
processes outside it start with ``/..``: the owner is still read from the segments, and
``resolve_v2_dir`` finds the directory under the host's cgroup mount (``cpu.pressure``).
"""

from __future__ import annotations

import glob
import os
import re
from dataclasses import dataclass

# a pod segment: "pod<uid>" (cgroupfs) or "...-pod<uid_with_underscores>.slice" (systemd); a
# static pod's UID is a 32-hex hash, an API pod's a 36-character UUID
_POD = re.compile(r"(?:^|-)pod([0-9a-fA-F]{8}[-_]?[0-9a-fA-F]{4}[-_]?[0-9a-fA-F]{4}[-_]?[0-9a-fA-F]{4}[-_]?"
                  r"[0-9a-fA-F]{12})(?:\.slice)?$")
_QOS = re.compile(r"(?:^|kubepods-)(burstable|besteffort)(?:\.slice)?$")
_HEX_ID = re.compile(r"^[0-9a-f]{64}$")
# runtime prefixes of a container's scope: cri-containerd-<id>.scope, crio-<id>.scope, docker-<id>.scope
_SCOPE = re.compile(r"^(cri-containerd|crio|docker|libpod)-([0-9a-f]{64})\.scope$")
_COLON = re.compile(r"^(?P<pod>[^:]+):(?P<rt>cri-containerd|crio|docker):(?P<id>[0-9a-f]{64})$")
RUNTIMES = {"cri-containerd": "containerd", "crio": "cri-o", "docker": "docker", "libpod": "podman"}
# v1 hierarchies in the order their paths are trusted when the v2 line says nothing
_V1_ORDER = ("name=systemd", "cpu", "cpuacct", "cpu,cpuacct", "memory", "pids", "devices")


@dataclass(frozen=True, slots=True)
class CgroupOwner:
    """What a process's cgroup path says about it.  Empty strings where it says nothing."""

    path: str = ""            # the path the owner was read from
    v2_path: str = ""         # the cgroup v2 path ("" on a v1-only host), for cpu.pressure
    pod_uid: str = ""         # with dashes
    container_id: str = ""    # 64 hex
    runtime: str = ""         # containerd, cri-o, docker, podman ("" when the layout does not say)
    qos: str = ""             # burstable, besteffort, guaranteed ("" off Kubernetes)
    unit: str = ""            # a systemd service (foo.service), off Kubernetes
    kubepods: bool = False    # the path is under the kubelet's tree, even when no pod UID was read


def parse_proc_cgroup(text: str) -> dict[str, str]:
    """``/proc/PID/cgroup`` -> {hierarchy: path}; the v2 line's key is ``""``, v1 keys are the
    controller list (``cpu,cpuacct``) or ``name=systemd``.  Malformed lines are skipped."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3 or not parts[2].startswith("/"):
            continue
        hid, ctrl, path = parts
        if hid == "0" and ctrl == "":
            out[""] = path
        elif ctrl:
            out[ctrl] = path
    return out


def classify(path: str) -> CgroupOwner:
    """The owner one cgroup path names (see the module docstring for the layouts)."""
    segs = [s for s in path.split("/") if s and s != ".."]
    pod_uid = qos = unit = ""
    kubepods = any(s.startswith("kubepods") or s.startswith("kubelet-kubepods") for s in segs)
    pod_at = -1
    found: list[tuple[int, str, str]] = []     # (segment index, container id, runtime)
    for i, seg in enumerate(segs):
        m = _COLON.match(seg)
        if m:   # kubepods-burstable-pod<uid>.slice:cri-containerd:<id>
            kubepods = True
            pm = _POD.search(m.group("pod"))
            if pm:
                pod_uid, pod_at = _uid(pm.group(1)), i
            found.append((i, m.group("id"), RUNTIMES[m.group("rt")]))
            qm = re.search(r"kubepods-(burstable|besteffort)-pod", m.group("pod"))
            qos = qm.group(1) if qm else "guaranteed"
            continue
        pm = _POD.search(seg)
        if pm and (kubepods or seg.startswith("pod")):
            pod_uid, pod_at = _uid(pm.group(1)), i
            if not qos:
                qm = re.search(r"kubepods-(burstable|besteffort)-pod", seg)
                qos = qm.group(1) if qm else ("guaranteed" if kubepods else "")
            continue
        qm = _QOS.search(seg)
        if qm and kubepods and not pod_uid:
            qos = qm.group(1)
            continue
        sm = _SCOPE.match(seg)
        if sm:
            found.append((i, sm.group(2), RUNTIMES[sm.group(1)]))
        elif _HEX_ID.match(seg) and (pod_at >= 0 or (i > 0 and segs[i - 1] == "docker")):
            found.append((i, seg, "docker" if pod_at < 0 else ""))
        elif seg.startswith("crio-") and _HEX_ID.match(seg[5:]):   # cgroupfs CRI-O
            found.append((i, seg[5:], "cri-o"))
    # the container is the first one inside the pod (an outer one is the node's own, e.g. a kind
    # node; the colon form holds the pod and the container in one segment); without a pod, the innermost
    inside = [f for f in found if f[0] >= pod_at] if pod_at >= 0 else found[-1:]
    container_id, runtime = (inside[0][1], inside[0][2]) if inside else ("", "")
    if pod_uid and qos == "" and kubepods:
        qos = "guaranteed"
    if not pod_uid and not container_id and segs and segs[0] != "user.slice":
        # the deepest service: /system.slice/foo.service, or a service's own sub-cgroups
        for seg in reversed(segs):
            if seg.endswith(".service") and len(seg) > len(".service") and not seg.startswith("user@"):
                unit = seg
                break
    return CgroupOwner(path=path, pod_uid=pod_uid, container_id=container_id, runtime=runtime,
                       qos=qos if pod_uid else "", unit=unit, kubepods=kubepods)


def _uid(raw: str) -> str:
    """A pod UID as the API server writes it: systemd's ``_`` back to ``-``, lower case."""
    return raw.replace("_", "-").lower()


def _rank(o: CgroupOwner) -> int:
    return 3 if o.pod_uid else 2 if o.container_id else 1 if o.unit else 0


def owner_of(text: str) -> CgroupOwner:
    """The owner ``/proc/PID/cgroup`` names: the most specific of its paths (a pod beats a bare
    container beats a unit), the v2 line first, then the v1 hierarchies systemd and the kubelet
    keep in step (``name=systemd``, ``cpu``, ``memory``, ...).  ``v2_path`` is the v2 line's path."""
    paths = parse_proc_cgroup(text)
    order = [""] + [k for k in _V1_ORDER if k in paths] + sorted(k for k in paths if k and k not in _V1_ORDER)
    best: CgroupOwner | None = None
    kubepods = False
    for key in order:
        path = paths.get(key)
        if path is None:
            continue
        o = classify(path)
        kubepods = kubepods or o.kubepods
        if best is None or _rank(o) > _rank(best):
            best = o
    if best is None:
        return CgroupOwner()
    return CgroupOwner(path=best.path, v2_path=paths.get("", ""), pod_uid=best.pod_uid,
                       container_id=best.container_id, runtime=best.runtime, qos=best.qos, unit=best.unit,
                       kubepods=kubepods)


def unified_root(sys: str = "/sys") -> str | None:
    """Where the cgroup v2 hierarchy is mounted under ``sys``: ``fs/cgroup`` (a v2 host) or
    ``fs/cgroup/unified`` (a hybrid host, systemd's layout); None on a v1-only host."""
    for cand in (os.path.join(sys, "fs", "cgroup"), os.path.join(sys, "fs", "cgroup", "unified")):
        if os.path.exists(os.path.join(cand, "cgroup.controllers")):
            return cand
    return None


def resolve_v2_dir(root: str, path: str, max_depth: int = 6) -> str | None:
    """The directory of a v2 cgroup path under ``root`` (the host's cgroup v2 mount).

    A path seen from inside a cgroup namespace starts with ``/..`` once per level between the
    reader's namespace root and the common ancestor: the rest (the tail) is then looked for at
    each depth under ``root`` until exactly one directory matches.  None when the path is the
    root itself (``/``: node-wide, not the process's own), missing or ambiguous.
    """
    segs = [s for s in path.split("/") if s]
    ups = 0
    while ups < len(segs) and segs[ups] == "..":
        ups += 1
    tail = segs[ups:]
    if not tail or any(s in ("..", ".") for s in tail):
        return None
    if ups == 0:
        d = os.path.join(root, *tail)
        return d if os.path.isdir(d) else None
    rel = "/".join(glob.escape(s) for s in tail)
    for depth in range(max_depth + 1):
        found = [p for p in glob.glob(os.path.join(glob.escape(root), *(["*"] * depth), rel)) if os.path.isdir(p)]
        if len(found) == 1:
            return found[0]
        if len(found) > 1:
            return None
    return None
