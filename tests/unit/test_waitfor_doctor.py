"""``triscope doctor`` says which path the wait-for programs take: the scheduler's structures read
through offsets from the kernel's BTF, or the slower fallback without them."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from triscope.agent.ebpf import btfoffsets
from triscope.agent.ebpf.doctor import WAITFOR_PATH_ROW, ebpf_doctor, waitfor_path_row


def _btf(path: Path, members: dict[str, int]) -> str:
    """A minimal BTF file: ``int`` and ``struct task_struct`` with these int members (name -> byte offset)."""
    names = b"\0int\0task_struct\0" + b"".join(n.encode() + b"\0" for n in members)
    off = {"int": 1, "task_struct": 5}
    pos = 5 + len("task_struct") + 1
    for n in members:
        off[n] = pos
        pos += len(n) + 1
    types = struct.pack("<IIII", off["int"], 1 << 24, 4, 32)                       # INT, 4 bytes, 32 bits
    types += struct.pack("<III", off["task_struct"], (4 << 24) | len(members), 64)  # STRUCT
    for n, o in members.items():
        types += struct.pack("<III", off[n], 1, o * 8)
    hdr = struct.pack("<HBBIIIII", 0xEB9F, 1, 0, 24, 0, len(types), len(types), len(names))
    path.write_bytes(hdr + types + names)
    return str(path)


def test_fallback_when_the_kernel_has_no_btf(tmp_path: Path) -> None:
    name, ok, reason, hint = waitfor_path_row(str(tmp_path / "absent"))
    assert name == WAITFOR_PATH_ROW and not ok
    assert "fallback" in reason and "no kernel BTF" in reason
    assert "CONFIG_DEBUG_INFO_BTF" in hint


def test_fallback_names_the_members_the_kernel_lacks(tmp_path: Path) -> None:
    btf = _btf(tmp_path / "vmlinux", {"pid": 8, "prio": 12})
    assert btfoffsets.member_offset("task_struct", "pid", btf) == 8     # the blob is read as BTF
    _name, ok, reason, _hint = waitfor_path_row(btf)
    assert not ok and "fallback" in reason
    assert "task_struct.sched_info.run_delay" in reason and "rq.clock" in reason
    assert "task_struct.pid" not in reason                              # found, so not named missing


@pytest.mark.skipif(not Path(btfoffsets.BTF_VMLINUX).exists(), reason="this kernel has no BTF")
def test_this_kernel_takes_the_scheduler_path_and_doctor_says_so() -> None:
    from triscope.agent.ebpf.discover import defines_for, find_tracefs, plan_probes

    name, ok, reason, hint = waitfor_path_row()
    defines = defines_for(plan_probes(find_tracefs(), {"waitfor"}))
    assert ok == ("WF_SCHED" in defines)          # what the loader gives the program, the same answer
    if not ok:
        pytest.skip(f"this kernel's BTF lacks the scheduler's members: {reason}")
    off = btfoffsets.member_offset("task_struct", "sched_info.run_delay")
    assert f"WF_OFF_RUN_DELAY={off}" in reason and hint == ""
    rows = ebpf_doctor(attach=False)
    names = [r[0] for r in rows]
    assert names.index(WAITFOR_PATH_ROW) == names.index("waitfor") + 1
    assert rows[names.index(WAITFOR_PATH_ROW)][1] is True


def test_no_path_in_use_when_the_waitfor_probe_is_off() -> None:
    rows = {r[0]: r for r in ebpf_doctor(attach=False, bcc_path="/nonexistent")}
    assert rows["waitfor"][1] is False
    assert rows[WAITFOR_PATH_ROW][1] is False and "waitfor probe is off" in rows[WAITFOR_PATH_ROW][2]
