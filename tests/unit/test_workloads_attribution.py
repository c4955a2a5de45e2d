"""The attribution rules of docs/workloads.md section 1 on real-shaped inputs: one owner, several
owners picked by pod UID through /var/log/pods, shared, a pod that was not given the device, a
host process on an owned device, off Kubernetes (unit or command), and the /var/log/pods reader."""

from __future__ import annotations

import os
from pathlib import Path

from triscope.agent.workloads.attribution import (
    SHARED,
    PodDir,
    ProcessInfo,
    attribute,
    clean,
    read_pod_dirs,
    read_process,
)
from triscope.agent.workloads.cgroups import owner_of
from triscope.agent.workloads.podresources import DeviceOwner

UA = "11111111-2222-4333-8444-555555555555"
UB = "aaaaaaaa-bbbb-4ccc-8ddd-eeeeeeeeeeee"
CID = "c0ffee00" * 8


def pod_proc(uid: str, comm: str = "python3", pid: int = 100) -> ProcessInfo:
    text = (f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid.replace('-', '_')}.slice/"
            f"cri-containerd-{CID}.scope\n")
    return ProcessInfo(pid, comm, owner_of(text))


def host_proc(cgroup: str = "0::/user.slice/user-0.slice/session-1.scope\n", comm: str = "bench") -> ProcessInfo:
    return ProcessInfo(7, comm, owner_of(cgroup))


VIT = DeviceOwner("inference", "vit-7f9c", "server", "nvidia.com/gpu", "GPU-a")
EMBED0 = DeviceOwner("batch", "embed-0", "worker", "nvidia.com/gpu", "GPU-b")
EMBED1 = DeviceOwner("batch", "embed-1", "worker", "nvidia.com/gpu", "GPU-b")
PODS = {UA: PodDir("batch", "embed-0", ("worker",)), UB: PodDir("batch", "embed-1", ("worker",))}


def test_one_owner_every_pod_process_is_its() -> None:
    assert attribute(pod_proc(UA), [VIT], None) == ("inference", "vit-7f9c", "server", "")
    # the owner's name comes from pod-resources even when /var/log/pods is not readable
    assert attribute(pod_proc(UB), [VIT], {}) == ("inference", "vit-7f9c", "server", "")
    # a process whose /proc the agent cannot read (no hostPID): still the owner's
    assert attribute(None, [VIT], None) == ("inference", "vit-7f9c", "server", "")
    assert attribute(ProcessInfo(5, "x", None), [VIT], None) == ("inference", "vit-7f9c", "server", "")


def test_several_owners_are_told_apart_by_pod_uid() -> None:
    owners = [EMBED0, EMBED1]
    assert attribute(pod_proc(UA), owners, PODS) == ("batch", "embed-0", "worker", "")
    assert attribute(pod_proc(UB), owners, PODS) == ("batch", "embed-1", "worker", "")
    # without /var/log/pods (or for a pod it does not list): shared, pod labels empty
    assert attribute(pod_proc(UA), owners, None) == SHARED == ("", "", "", "shared")
    assert attribute(pod_proc("99999999-2222-4333-8444-555555555555"), owners, PODS) == SHARED
    # two containers of one pod on one device: the pod, the container left empty
    two = [DeviceOwner("batch", "embed-0", "a", "nvidia.com/gpu", "GPU-b"),
           DeviceOwner("batch", "embed-0", "b", "nvidia.com/gpu", "GPU-b")]
    assert attribute(pod_proc(UA), two, PODS) == ("batch", "embed-0", "", "")


def test_a_pod_using_a_device_it_was_not_given_is_named() -> None:
    assert attribute(pod_proc(UB), [VIT], PODS) == ("batch", "embed-1", "worker", "")
    # no owner at all (no socket, MIG, a plugin we cannot match): the pod from its UID
    assert attribute(pod_proc(UA), [], PODS) == ("batch", "embed-0", "worker", "")
    multi = {UA: PodDir("batch", "embed-0", ("init", "worker"))}
    assert attribute(pod_proc(UA), [], multi) == ("batch", "embed-0", "", "")


def test_host_processes_are_named_by_unit_or_command() -> None:
    # a host process on a device a pod owns is not the pod's
    assert attribute(host_proc(), [VIT], PODS) == ("", "", "", "cmd:bench")
    svc = host_proc("0::/system.slice/triton.service\n", comm="tritonserver")
    assert attribute(svc, [], None) == ("", "", "", "unit:triton.service")
    assert attribute(svc, [VIT], None) == ("", "", "", "unit:triton.service")
    user = host_proc("0::/user.slice/user-1000.slice/user@1000.service/app.slice/jupyter.service\n", comm="python")
    assert attribute(user, [], None) == ("", "", "", "cmd:python")
    # a pod process with no owner and no /var/log/pods: its command (all that is known)
    assert attribute(pod_proc(UA, comm="vllm"), [], None) == ("", "", "", "cmd:vllm")
    assert attribute(None, [], None) == ("", "", "", "")


def test_pod_dirs_from_a_kubelet_log_tree(tmp_path: Path) -> None:
    (tmp_path / f"batch_embed-0_{UA}" / "worker").mkdir(parents=True)
    (tmp_path / f"batch_embed-0_{UA}" / "worker" / "0.log").write_text("")
    (tmp_path / f"kube-system_coredns-5d78c9869d-x2x7k_{UB}" / "coredns").mkdir(parents=True)
    (tmp_path / "not-a-pod").mkdir()
    (tmp_path / "a_b_c_d").mkdir()
    got = read_pod_dirs(str(tmp_path))
    assert got == {UA: PodDir("batch", "embed-0", ("worker",)),
                   UB: PodDir("kube-system", "coredns-5d78c9869d-x2x7k", ("coredns",))}
    assert read_pod_dirs(str(tmp_path / "absent")) is None


def test_read_process_of_this_process_and_a_gone_one() -> None:
    me = read_process("/proc", os.getpid())
    assert me is not None and me.comm and me.owner is not None
    assert read_process("/proc", 2 ** 22 + 12345) is None
    assert clean("py\x1b[31mthon\n") == "py?[31mthon?"


def test_names_from_outside_reach_no_page_with_bidi_or_control_characters(tmp_path: Path) -> None:
    """A directory under /var/log/pods, a scraped target's label, a kubelet's pod name: a right-to-left
    override (U+202E) or an escape would make the dashboard show a name reversed or coloured; each
    becomes '?' before it is a label."""
    from triscope.agent.collectors.scrape import ScrapeCollector
    from triscope.core.textsafe import label_text

    (tmp_path / f"batch_evil\u202egpj.exe_{UA}" / "w\x1b[31m").mkdir(parents=True)
    got = read_pod_dirs(str(tmp_path))
    assert got == {UA: PodDir("batch", "evil?gpj.exe", ("w?[31m",))}
    sc = ScrapeCollector("http://127.0.0.1:1/metrics")
    (s,) = sc.parse('req_total{route="/a\u202eb",code="2\u206600"} 3\n')
    assert s.labels["route"] == "/a?b" and s.labels["code"] == "2?00"
    assert label_text("plain-name") == "plain-name" and label_text("x" * 300) == "x" * 256
