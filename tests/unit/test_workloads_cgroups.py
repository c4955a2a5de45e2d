"""PID -> cgroup -> pod/container or unit: the parser on real-shaped /proc/PID/cgroup text for every
layout (kubelet systemd and cgroupfs drivers, containerd, CRI-O, Docker, systemd units, sessions),
and the cgroup v2 directory lookup from inside a cgroup namespace on a real directory tree."""

from __future__ import annotations

from pathlib import Path

import pytest

from triscope.agent.workloads.cgroups import (
    classify,
    owner_of,
    parse_proc_cgroup,
    resolve_v2_dir,
    unified_root,
)

UID = "0f3c6b9e-8d2a-4e51-9a7b-2c4d6e8f0a1b"
UID_ = UID.replace("-", "_")
CID = "4f1e2d3c" * 8           # 64 hex
CID2 = "a1b2c3d4" * 8


def test_v2_systemd_driver_containerd() -> None:
    text = (f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/"
            f"cri-containerd-{CID}.scope\n")
    o = owner_of(text)
    assert (o.pod_uid, o.container_id, o.runtime, o.qos, o.unit) == (UID, CID, "containerd", "burstable", "")
    assert o.v2_path.endswith(f"cri-containerd-{CID}.scope") and o.kubepods


def test_v2_guaranteed_besteffort_crio_docker() -> None:
    g = owner_of(f"0::/kubepods.slice/kubepods-pod{UID_}.slice/crio-{CID}.scope\n")
    assert (g.pod_uid, g.container_id, g.runtime, g.qos) == (UID, CID, "cri-o", "guaranteed")
    b = owner_of(f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice/"
                 f"docker-{CID}.scope\n")
    assert (b.pod_uid, b.container_id, b.runtime, b.qos) == (UID, CID, "docker", "besteffort")
    # CRI-O's conmon scope is not the container
    c = owner_of(f"0::/kubepods.slice/kubepods-pod{UID_}.slice/crio-conmon-{CID}.scope\n")
    assert c.pod_uid == UID and c.container_id == ""


def test_v2_nested_cgroup_inside_the_container() -> None:
    # a process that made sub-cgroups of its own (systemd in a container): still that container
    o = owner_of(f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/"
                 f"cri-containerd-{CID}.scope/init.scope\n")
    assert (o.pod_uid, o.container_id) == (UID, CID) and o.unit == ""


def test_v1_cgroupfs_driver_and_hybrid_host() -> None:
    text = (f"12:memory:/kubepods/burstable/pod{UID}/{CID}\n"
            f"11:cpu,cpuacct:/kubepods/burstable/pod{UID}/{CID}\n"
            f"1:name=systemd:/kubepods/burstable/pod{UID}/{CID}\n"
            "0::/\n")
    o = owner_of(text)
    assert (o.pod_uid, o.container_id, o.qos, o.runtime) == (UID, CID, "burstable", "")
    assert o.v2_path == "/"          # the v2 line of a hybrid host: the root, not the container's own
    guaranteed = owner_of(f"4:cpu,cpuacct:/kubepods/pod{UID}/{CID2}\n")
    assert (guaranteed.pod_uid, guaranteed.container_id, guaranteed.qos) == (UID, CID2, "guaranteed")
    crio = owner_of(f"4:pids:/kubepods/besteffort/pod{UID}/crio-{CID}\n")
    assert (crio.container_id, crio.runtime, crio.qos) == (CID, "cri-o", "besteffort")


def test_v1_containerd_systemd_colon_form_and_kind_nesting() -> None:
    # containerd with the systemd cgroup driver on a v1 host (kind, k3s)
    o = owner_of(f"5:cpu,cpuacct:/system.slice/containerd.service/kubepods-burstable-pod{UID_}.slice:"
                 f"cri-containerd:{CID}\n")
    assert (o.pod_uid, o.container_id, o.runtime, o.qos) == (UID, CID, "containerd", "burstable")
    # a kind node (Docker container) running the kubelet's tree inside it
    k = owner_of(f"0::/docker/{CID2}/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/"
                 f"kubelet-kubepods-besteffort-pod{UID_}.slice/cri-containerd-{CID}.scope\n")
    assert (k.pod_uid, k.container_id, k.qos) == (UID, CID, "besteffort")


def test_static_pod_uid_is_a_hash() -> None:
    h = "6c6d4f1a8a0b4f5b0d4b6e5e2a9f3c8d"
    o = owner_of(f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{h}.slice/"
                 f"cri-containerd-{CID}.scope\n")
    assert o.pod_uid == h


def test_docker_without_kubernetes() -> None:
    s = owner_of(f"0::/system.slice/docker-{CID}.scope\n")
    assert (s.container_id, s.runtime, s.pod_uid, s.unit) == (CID, "docker", "", "")
    f = owner_of(f"9:memory:/docker/{CID}\n3:cpu:/docker/{CID}\n")
    assert (f.container_id, f.runtime) == (CID, "docker")


def test_systemd_units_and_what_is_not_one() -> None:
    assert owner_of("0::/system.slice/vllm.service\n").unit == "vllm.service"
    # a service's own sub-cgroup is still that service
    assert owner_of("0::/system.slice/containerd.service/sub\n").unit == "containerd.service"
    assert owner_of("0::/system.slice/triton-server.service\n").pod_uid == ""
    for not_a_unit in ("0::/user.slice/user-1000.slice/session-3.scope\n",
                       "0::/user.slice/user-1000.slice/user@1000.service/app.slice/jupyter.service\n",
                       "0::/init.scope\n", "0::/\n", "0::/machine.slice/machine-qemu.scope\n"):
        o = owner_of(not_a_unit)
        assert o.unit == "" and o.pod_uid == "" and o.container_id == "", not_a_unit


def test_a_cgroup_namespace_shows_paths_from_its_root() -> None:
    # the agent in a container with its own cgroup namespace: other pods' paths start with /..
    o = owner_of(f"0::/../../kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice/"
                 f"cri-containerd-{CID}.scope\n")
    assert (o.pod_uid, o.container_id) == (UID, CID) and o.kubepods


def test_bad_input_never_raises() -> None:
    for text in ("", "garbage\n", "0::relative/path\n", "1:cpu\n", "\x00\xff:x:/y\n", "0::" + "/a" * 5000):
        o = owner_of(text)
        assert o.pod_uid == ""
    assert parse_proc_cgroup("2:cpu,cpuacct:/a\n0::/b\n1:name=systemd:/c\n") == {
        "cpu,cpuacct": "/a", "": "/b", "name=systemd": "/c"}
    assert classify("/kubepods/burstable/notapod/xyz").pod_uid == ""


def test_resolve_v2_dir_from_inside_a_namespace(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    tail = Path("kubepods-besteffort.slice") / f"kubepods-besteffort-pod{UID_}.slice" / f"cri-containerd-{CID}.scope"
    (root / "kubepods.slice" / tail).mkdir(parents=True)
    (root / "kubepods.slice" / "kubepods-burstable.slice" / "agent-pod.slice" / "agent.scope").mkdir(parents=True)
    (root / "cgroup.controllers").write_text("cpu io memory\n")
    direct = resolve_v2_dir(str(root), "/kubepods.slice/" + str(tail))
    assert direct == str(root / "kubepods.slice" / tail)
    # the agent's namespace root is kubepods.slice/kubepods-burstable.slice/agent-pod.slice/agent.scope
    seen = "/../../../" + str(tail)
    assert resolve_v2_dir(str(root), seen) == str(root / "kubepods.slice" / tail)
    assert resolve_v2_dir(str(root), "/") is None
    assert resolve_v2_dir(str(root), "/../nothing-here.scope") is None
    assert resolve_v2_dir(str(root), "/kubepods.slice/../../etc") is None
    assert unified_root(str(tmp_path / "nosys")) is None


def test_unified_root_on_this_machine() -> None:
    root = unified_root("/sys")
    if root is None:
        pytest.skip("no cgroup v2 hierarchy mounted on this machine (v1 only)")
    assert Path(root, "cgroup.procs").exists()
