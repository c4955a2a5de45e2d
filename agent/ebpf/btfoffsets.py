"""Byte offsets of kernel structure members, from the running kernel's BTF.

BCC compiles against the installed kernel headers, which need not match the running kernel (the
machines here build with 6.1 headers and run 6.18), so a program that reads a kernel structure
through a BTF pointer (``bpf_get_current_task_btf()``) takes the offsets from
``/sys/kernel/btf/vmlinux`` at load time, as ``-D`` names: what CO-RE does in libbpf.

``member_offset("task_struct", "sched_info.run_delay")`` follows a dotted path through embedded
structures; members inside anonymous structures and unions are found as the compiler finds them.
None when the kernel has no BTF, no such structure or no such member.

``waitfor_defines()``: the offsets ``waitfor.bpf.c`` reads (``WF_SCHED`` and its ``WF_OFF_*``),
or ``[]`` with the reason, when one is missing.
"""

from __future__ import annotations

import struct
from array import array

BTF_VMLINUX = "/sys/kernel/btf/vmlinux"

_STRUCT, _UNION, _TYPEDEF, _VOLATILE, _CONST, _RESTRICT, _TYPE_TAG = 4, 5, 8, 9, 10, 11, 18
# kind -> (fixed bytes after the 12-byte header, bytes per vlen entry)
_EXTRA = {1: (4, 0), 3: (12, 0), 4: (0, 12), 5: (0, 12), 6: (0, 8), 13: (0, 8), 14: (4, 0), 15: (0, 12),
          17: (4, 0), 19: (0, 12)}


class _Btf:
    def __init__(self, blob: bytes) -> None:
        if len(blob) < 24 or struct.unpack_from("<H", blob, 0)[0] != 0xEB9F:
            raise ValueError("not BTF")
        hdr_len, type_off, type_len, str_off, _str_len = struct.unpack_from("<5I", blob, 4)
        self.blob, self.strs = blob, hdr_len + str_off
        self.pos = array("I", [0])              # type id -> offset of its header (id 0: void); compact
        pos, end = hdr_len + type_off, hdr_len + type_off + type_len
        while pos + 12 <= end:
            self.pos.append(pos)
            info = struct.unpack_from("<I", blob, pos + 4)[0]
            fixed, each = _EXTRA.get((info >> 24) & 0x1F, (0, 0))
            pos += 12 + fixed + each * (info & 0xFFFF)

    def name(self, off: int) -> str:
        end = self.blob.index(b"\0", self.strs + off)
        return self.blob[self.strs + off:end].decode()

    def head(self, tid: int) -> tuple[str, int, int, int, int]:
        """(name, kind, vlen, kflag, size_or_type)"""
        name_off, info, st = struct.unpack_from("<III", self.blob, self.pos[tid])
        return self.name(name_off), (info >> 24) & 0x1F, info & 0xFFFF, info >> 31, st

    def find(self, kind: int, name: str) -> int | None:
        want = name.encode() + b"\0"
        for tid in range(1, len(self.pos)):
            name_off, info = struct.unpack_from("<II", self.blob, self.pos[tid])
            if (info >> 24) & 0x1F == kind and info & 0xFFFF and \
                    self.blob[self.strs + name_off:self.strs + name_off + len(want)] == want:
                return tid
        return None

    def members(self, tid: int) -> list[tuple[str, int, int]]:
        """(name, type id, bit offset) of a struct or union's members."""
        _n, _k, vlen, kflag, _st = self.head(tid)
        out = []
        base = self.pos[tid] + 12
        for i in range(vlen):
            m_name, m_type, m_off = struct.unpack_from("<III", self.blob, base + 12 * i)
            out.append((self.name(m_name), m_type, (m_off & 0xFFFFFF) if kflag else m_off))
        return out

    def resolve(self, tid: int) -> int:
        """Through typedefs and qualifiers to the type itself."""
        for _ in range(32):
            _n, k, _v, _kf, st = self.head(tid)
            if k not in (_TYPEDEF, _VOLATILE, _CONST, _RESTRICT, _TYPE_TAG):
                return tid
            tid = st
        return tid

    def member(self, tid: int, name: str) -> tuple[int, int] | None:
        """(type id, bit offset) of member ``name``, looking inside anonymous members too."""
        for m_name, m_type, m_off in self.members(tid):
            if m_name == name:
                return m_type, m_off
            if not m_name:
                inner = self.resolve(m_type)
                if self.head(inner)[1] in (_STRUCT, _UNION):
                    got = self.member(inner, name)
                    if got is not None:
                        return got[0], m_off + got[1]
        return None


def _load(path: str) -> _Btf | None:
    """The kernel's BTF (a few MB), read for one question and let go: the agent keeps none of it."""
    try:
        with open(path, "rb") as f:
            return _Btf(f.read())
    except (OSError, ValueError, struct.error):
        return None


def member_offset(struct_name: str, path_: str, btf: str | _Btf = BTF_VMLINUX) -> int | None:
    """Byte offset of ``struct_name.a.b.c`` in the running kernel, or None."""
    b = _load(btf) if isinstance(btf, str) else btf
    if b is None:
        return None
    tid = b.find(_STRUCT, struct_name)
    off = 0
    for part in path_.split("."):
        if tid is None:
            return None
        got = b.member(tid, part)
        if got is None:
            return None
        m_type, bits = got
        if bits % 8:
            return None
        off += bits // 8
        tid = b.resolve(m_type)
    return off


# what waitfor.bpf.c reads from the scheduler's structures (WF_SCHED): the task switching in and
# the run-queue wait the kernel itself counted for it (sched_info, CONFIG_SCHED_INFO)
WAITFOR_MEMBERS = {
    "WF_OFF_TASK_CFS_RQ": ("task_struct", "se.cfs_rq"),
    "WF_OFF_CFS_RQ_RQ": ("cfs_rq", "rq"),
    "WF_OFF_RQ_CURR": ("rq", "curr"),
    "WF_OFF_RQ_CLOCK": ("rq", "clock"),
    "WF_OFF_TASK_PID": ("task_struct", "pid"),
    "WF_OFF_RUN_DELAY": ("task_struct", "sched_info.run_delay"),
    "WF_OFF_LAST_QUEUED": ("task_struct", "sched_info.last_queued"),
}


def waitfor_defines(btf: str = BTF_VMLINUX) -> tuple[list[str], str]:
    """(``-D`` names, "") when every member is found, else ([], what is missing)."""
    out, missing = [], []
    b = _load(btf)
    if b is None:
        return [], f"no kernel BTF readable at {btf}"
    for define, (s, m) in WAITFOR_MEMBERS.items():
        off = member_offset(s, m, b)
        if off is None:
            missing.append(f"{s}.{m}")
        else:
            out.append(f"{define}={off}")
    if missing:
        return [], "not in the kernel's BTF: " + ", ".join(missing)
    return ["WF_SCHED", *out], ""
