"""The lab's pod helper (examples/hostlab/pods.py) on a cgroup v2 fixture tree: the kubelet's systemd
layout, the cpu controller enabled down the path, ``cpu.max`` / ``cpu.weight`` written where the
kubelet writes them, and the agent's own attribution reading the pod, container and namespace back
(tests/integration/test_hostlab_fourth.py does the v1 path with real processes)."""

from __future__ import annotations

from pathlib import Path

from examples.hostlab.pods import Pod, remove_parents, shares_to_weight, weight_to_shares
from triscope.agent.workloads.attribution import ProcessInfo, attribute, read_pod_dirs
from triscope.agent.workloads.cgroups import owner_of, parse_proc_cgroup


def v2_root(tmp_path: Path) -> Path:
    root = tmp_path / "cgroup"
    root.mkdir()
    (root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    return root


def test_a_pod_on_cgroup_v2_is_named_by_the_agent(tmp_path: Path) -> None:
    root, logs = v2_root(tmp_path), tmp_path / "pods"
    pod = Pod("lab-b", namespace="lab", logs=logs, cgroup_root=root, uid="0f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b")
    gpu = pod.container("lab-b")
    prep = pod.container("lab-b-prep", cpu_max=0.5)
    pod.set_weight(4)
    slice_ = root / "kubepods.slice" / "kubepods-burstable.slice" / \
        "kubepods-burstable-pod0f1e2d3c_4b5a_6978_8a9b_0c1d2e3f4a5b.slice"
    assert pod.dirs == [slice_]
    assert (slice_ / "cpu.weight").read_text() == "4"
    assert (prep.dirs[0] / "cpu.max").read_text() == "50000 100000"
    assert prep.dirs[0].name == f"cri-containerd-{prep.id}.scope" and len(prep.id) == 64
    for d in (root, root / "kubepods.slice", slice_.parent, slice_):     # the controller for each level's children
        assert (d / "cgroup.subtree_control").read_text() == "+cpu"
    # kubepods.slice at the node's allocatable CPU, as the kubelet sets it
    assert 1 <= int((root / "kubepods.slice" / "cpu.weight").read_text()) <= 10000

    pods = read_pod_dirs(str(logs))
    assert pods is not None and pods[pod.uid].containers == ("lab-b", "lab-b-prep")
    for c in (gpu, prep):
        text = f"0::{c.path}\n"
        owner = owner_of(text)
        assert (owner.pod_uid, owner.container_id, owner.runtime, owner.qos) == \
            (pod.uid, c.id, "containerd", "burstable")
        info = ProcessInfo(4242, c.name, owner, tuple(parse_proc_cgroup(text).items()))
        ns, pod_name, ctr, wl = attribute(info, [], pods)
        # two containers: the pod, and the container where the kubelet's log link names it by its ID
        assert (ns, pod_name, wl) == ("lab", "lab-b", "") and ctr in ("", c.name)
        link = tmp_path / "containers" / f"lab-b_lab_{c.name}-{c.id}.log"
        assert link.is_symlink() and link.resolve() == (c.log_dir / "0.log").resolve()

    solo = Pod("lab-a", namespace="lab", logs=logs, cgroup_root=root)
    c = solo.container("lab-a")
    info = ProcessInfo(4343, "lab-a", owner_of(f"0::{c.path}\n"))
    assert attribute(info, [], read_pod_dirs(str(logs))) == ("lab", "lab-a", "lab-a", "")

    pod.remove(wait=0.1)       # a fixture tree's directories hold plain files: only the log directory goes
    assert not pod.log_dir.exists() and solo.log_dir.exists()
    assert [p.name for p in (tmp_path / "containers").iterdir()] == [solo.containers["lab-a"].link.name]
    remove_parents(root)       # not empty: kept, no error


def test_guaranteed_pods_sit_under_kubepods_slice(tmp_path: Path) -> None:
    pod = Pod("lab-g", logs=tmp_path / "pods", cgroup_root=v2_root(tmp_path), qos="guaranteed")
    c = pod.container("lab-g")
    owner = owner_of(f"0::{c.path}\n")
    assert c.path.startswith("/kubepods.slice/kubepods-pod") and owner.qos == "guaranteed" and owner.pod_uid == pod.uid


def test_weights_convert_as_the_kubelet_does() -> None:
    assert weight_to_shares(100) == 2 + round(99 * 262142 / 9999)
    for w in (1, 4, 79, 100, 157, 590, 10000):
        assert shares_to_weight(weight_to_shares(w)) in (w - 1, w)       # the kubelet rounds down
    assert shares_to_weight(1024 * 4) == 157 and shares_to_weight(102) == 4
