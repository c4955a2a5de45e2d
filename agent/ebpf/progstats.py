"""The kernel time of BPF programs, read without bcc: ``run_time_ns`` and ``run_cnt`` per program.

A BPF program's run time is charged to whichever task it runs in (the task that switches, the
one that wakes another), not to the agent that loaded it, so the agent's own CPU figures never
show it.  The kernel counts it itself while run-time statistics are on
(``kernel.bpf_stats_enabled``, or a ``BPF_ENABLE_STATS`` file descriptor held open):
``bpf_prog_info.run_time_ns`` / ``run_cnt`` per program.  They cost every BPF program of the node
two clock reads per run while on, so they are on only around a measurement (``stats_enabled()``).

* ``programs()`` walks the loaded programs (``BPF_PROG_GET_NEXT_ID``, ``BPF_PROG_GET_FD_BY_ID``,
  ``BPF_OBJ_GET_INFO_BY_FD``);
* ``snapshot(prefixes)`` -> ``{name: (run_time_ns, run_cnt)}`` for the programs whose name is one
  of our function names (the kernel keeps 15 characters of a name: ``on_wf_softirq_entry`` loads
  as ``on_wf_softirq_e``, like ``on_wf_softirq_exit``; such names are told apart by the
  program's BTF where it has one, else summed under both names joined by ``|``);
  ``delta(a, b)`` the difference of two snapshots, ``per_run(d)`` ns per run;
* ``attached_programs(fds)``: the program behind each of our own attachments (a tracepoint's
  perf-event fd, ``BPF_TASK_FD_QUERY``), so that a benchmark counts its own programs and not
  another agent's of the same name;
* ``stats_enabled()``: a context manager switching the statistics on and back to what they were.

For the GPU-lab recorder::

    from triscope.agent.ebpf import progstats
    with progstats.stats_enabled():
        a = progstats.snapshot()            # the wait-for programs by default
        ...                                 # the run
        d = progstats.delta(a, progstats.snapshot())
    # d: {"on_wf_switch": (run_time_ns, run_cnt), ...}; progstats.per_run(d): ns per run
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import struct
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

from triscope.agent.ebpf.bpfsys import BPF_OBJ_GET_INFO_BY_FD, BpfError, bpf

BPF_PROG_GET_NEXT_ID = 11
BPF_PROG_GET_FD_BY_ID = 13
BPF_BTF_GET_FD_BY_ID = 19
BPF_TASK_FD_QUERY = 20
BPF_ENABLE_STATS = 32
BPF_STATS_RUN_TIME = 0
NAME_LEN = 15                       # BPF_OBJ_NAME_LEN - 1: what the kernel keeps of a program's name
SYSCTL = "/proc/sys/kernel/bpf_stats_enabled"

# the wait-for programs (agent/ebpf/waitfor.bpf.c): the default of snapshot()
WAITFOR_FNS = ("on_wf_switch", "on_wf_waking", "on_wf_softirq_entry", "on_wf_softirq_exit", "on_wf_irq_entry",
               "on_wf_irq_exit", "on_wf_hrtimer_entry", "on_wf_hrtimer_exit")

# struct bpf_prog_info (include/uapi/linux/bpf.h): the offsets read here
_INFO_SIZE = 232
_OFF_TYPE, _OFF_ID, _OFF_NAME = 0, 4, 64
_OFF_BTF_ID, _OFF_FUNC_INFO_REC, _OFF_FUNC_INFO, _OFF_NR_FUNC_INFO = 128, 132, 136, 144
_OFF_RUN_TIME, _OFF_RUN_CNT, _OFF_MISSES = 192, 200, 208
_BTF_INFO_SIZE = 32                 # struct bpf_btf_info: btf, btf_size, id, name, name_len, kernel_btf


class _IdAttr(ctypes.Structure):
    _fields_ = [("id", ctypes.c_uint32), ("next_id", ctypes.c_uint32), ("open_flags", ctypes.c_uint32)]


class _InfoAttr(ctypes.Structure):
    _fields_ = [("bpf_fd", ctypes.c_uint32), ("info_len", ctypes.c_uint32), ("info", ctypes.c_uint64)]


class _TaskFdQueryAttr(ctypes.Structure):
    _fields_ = [("pid", ctypes.c_uint32), ("fd", ctypes.c_uint32), ("flags", ctypes.c_uint32),
                ("buf_len", ctypes.c_uint32), ("buf", ctypes.c_uint64), ("prog_id", ctypes.c_uint32),
                ("fd_type", ctypes.c_uint32), ("probe_offset", ctypes.c_uint64), ("probe_addr", ctypes.c_uint64)]


class _EnableStatsAttr(ctypes.Structure):
    _fields_ = [("type", ctypes.c_uint32)]


@dataclass(frozen=True, slots=True)
class ProgStat:
    id: int
    name: str                       # as the kernel keeps it (15 characters at most)
    type: int
    run_time_ns: int
    run_cnt: int
    recursion_misses: int           # runs skipped: the program was already running on that CPU (5.12+)
    func: str = ""                  # its function's full name, from its BTF ("" when it has none)


# ------------------------------------------------------------------------------------------- walking
def _ids() -> Iterator[int]:
    cur = 0
    while True:
        attr = _IdAttr(id=cur)
        try:
            bpf(BPF_PROG_GET_NEXT_ID, attr)
        except BpfError as e:
            if e.errno == errno.ENOENT:
                return
            raise
        cur = attr.next_id
        yield cur


def _info(fd: int, size: int = _INFO_SIZE) -> tuple[bytes, int]:
    buf = ctypes.create_string_buffer(size)
    attr = _InfoAttr(bpf_fd=fd, info_len=size, info=ctypes.addressof(buf))
    bpf(BPF_OBJ_GET_INFO_BY_FD, attr)
    return buf.raw, attr.info_len


def _u32(raw: bytes, off: int) -> int:
    return struct.unpack_from("<I", raw, off)[0]


def _u64(raw: bytes, off: int) -> int:
    return struct.unpack_from("<Q", raw, off)[0]


def _prog_stat(fd: int, want_func: bool, btf_cache: dict[int, bytes | None]) -> ProgStat:
    raw, got = _info(fd)
    if got < _OFF_RUN_CNT + 8:
        raise BpfError(errno.ENOTSUP, "this kernel's bpf_prog_info has no run_time_ns/run_cnt (Linux 5.1+)")
    name = raw[_OFF_NAME:_OFF_NAME + 16].split(b"\0", 1)[0].decode(errors="replace")
    func = _func_name(fd, raw, btf_cache) if want_func else ""
    return ProgStat(_u32(raw, _OFF_ID), name, _u32(raw, _OFF_TYPE), _u64(raw, _OFF_RUN_TIME), _u64(raw, _OFF_RUN_CNT),
                    _u64(raw, _OFF_MISSES) if got >= _OFF_MISSES + 8 else 0, func)


def programs(prefixes: Iterable[str] | None = None, ids: Iterable[int] | None = None) -> list[ProgStat]:
    """Every loaded program (``ids``: only these) whose name matches one of ``prefixes`` (function
    names: a program matches when its name is the function's name as the kernel keeps it).  A
    program unloaded while it is walked is skipped.  Needs CAP_SYS_ADMIN (root)."""
    names = _truncated(prefixes) if prefixes is not None else None
    only = set(ids) if ids is not None else None
    out: list[ProgStat] = []
    btf_cache: dict[int, bytes | None] = {}
    for pid in (sorted(only) if only is not None else _ids()):
        try:
            fd = bpf(BPF_PROG_GET_FD_BY_ID, _IdAttr(id=pid))
        except BpfError as e:
            if e.errno == errno.ENOENT:        # unloaded meanwhile
                continue
            raise
        try:
            if names is not None:
                raw, _got = _info(fd, _OFF_NAME + 16)
                kname = raw[_OFF_NAME:_OFF_NAME + 16].split(b"\0", 1)[0].decode(errors="replace")
                if kname not in names:
                    continue
                out.append(_prog_stat(fd, len(names[kname]) > 1, btf_cache))
            else:
                out.append(_prog_stat(fd, False, btf_cache))
        finally:
            os.close(fd)
    return out


def _truncated(fns: Iterable[str]) -> dict[str, list[str]]:
    """The kernel's name of each function -> the functions that load under it."""
    out: dict[str, list[str]] = {}
    for f in fns:
        out.setdefault(f[:NAME_LEN], []).append(f)
    return out


# ------------------------------------------------------------------------------------ snapshots
def snapshot(prefixes: Iterable[str] = WAITFOR_FNS, *, ids: Mapping[int, str] | None = None) -> dict[str, tuple[int, int]]:
    """``{name: (run_time_ns, run_cnt)}``, summed over the programs of each name.

    Without ``ids``: every loaded program named after one of ``prefixes`` (function names), keyed
    by that function's name; two functions whose names the kernel truncates to the same 15
    characters are told apart by the program's BTF, else summed under ``"a|b"``.  With ``ids``
    (program id -> key, e.g. from ``attached_programs``): exactly those programs, by their key."""
    out: dict[str, tuple[int, int]] = {}
    if ids is not None:
        for p in programs(ids=ids):
            _add(out, ids[p.id], p)
        return out
    fns = list(prefixes)
    names = _truncated(fns)
    for p in programs(fns):
        cands = names.get(p.name, [p.name])
        key = p.func if p.func in cands else "|".join(cands)
        _add(out, key, p)
    return out


def _add(out: dict[str, tuple[int, int]], key: str, p: ProgStat) -> None:
    t, n = out.get(key, (0, 0))
    out[key] = (t + p.run_time_ns, n + p.run_cnt)


def delta(a: Mapping[str, tuple[int, int]], b: Mapping[str, tuple[int, int]]) -> dict[str, tuple[int, int]]:
    """What ran between snapshot ``a`` and the later ``b``, per name (a program present in ``b``
    only counts from 0; one gone from ``b`` is left out)."""
    out: dict[str, tuple[int, int]] = {}
    for k, (t, n) in b.items():
        t0, n0 = a.get(k, (0, 0))
        out[k] = (max(0, t - t0), max(0, n - n0))
    return out


def per_run(d: Mapping[str, tuple[int, int]]) -> dict[str, float]:
    """ns per run of each name of a ``delta`` (NaN where it did not run)."""
    return {k: (t / n if n else float("nan")) for k, (t, n) in d.items()}


def total(d: Mapping[str, tuple[int, int]]) -> tuple[int, int]:
    """(run_time_ns, run_cnt) summed over every name of a snapshot or delta."""
    return sum(t for t, _ in d.values()), sum(n for _, n in d.values())


# ------------------------------------------------------------------------------- our attachments
def attached_program(fd: int, pid: int | None = None) -> int:
    """The id of the BPF program attached through ``fd`` (a tracepoint's or probe's perf-event
    fd, a raw tracepoint's fd) held by process ``pid`` (default this one)."""
    attr = _TaskFdQueryAttr(pid=os.getpid() if pid is None else pid, fd=fd)
    bpf(BPF_TASK_FD_QUERY, attr)
    return int(attr.prog_id)


def attached_programs(fds: Mapping[int, str], pid: int | None = None) -> dict[int, str]:
    """``{fd: key}`` -> ``{program id: key}`` for ``snapshot(ids=...)``; fds that carry no
    program (closed, detached) are left out."""
    out: dict[int, str] = {}
    for fd, key in fds.items():
        with contextlib.suppress(BpfError):
            out[attached_program(fd, pid)] = key
    return out


# -------------------------------------------------------------------- names past 15 characters (BTF)
def _func_name(prog_fd: int, info: bytes, cache: dict[int, bytes | None]) -> str:
    """The program's main function's name from its BTF (func_info record 0), or ""."""
    btf_id = _u32(info, _OFF_BTF_ID)
    if not btf_id or not _u32(info, _OFF_NR_FUNC_INFO):
        return ""
    rec = _u32(info, _OFF_FUNC_INFO_REC) or 8
    fi = ctypes.create_string_buffer(rec)
    req = ctypes.create_string_buffer(_INFO_SIZE)
    struct.pack_into("<I", req, _OFF_FUNC_INFO_REC, rec)
    struct.pack_into("<Q", req, _OFF_FUNC_INFO, ctypes.addressof(fi))
    struct.pack_into("<I", req, _OFF_NR_FUNC_INFO, 1)
    try:
        bpf(BPF_OBJ_GET_INFO_BY_FD, _InfoAttr(bpf_fd=prog_fd, info_len=_INFO_SIZE, info=ctypes.addressof(req)))
    except BpfError:
        return ""
    type_id = struct.unpack_from("<I", fi.raw, 4)[0]      # struct bpf_func_info: insn_off, type_id
    if btf_id not in cache:
        cache[btf_id] = _btf_blob(btf_id)
    blob = cache[btf_id]
    return _btf_type_name(blob, type_id) if blob else ""


def _btf_blob(btf_id: int) -> bytes | None:
    try:
        fd = bpf(BPF_BTF_GET_FD_BY_ID, _IdAttr(id=btf_id))
    except BpfError:
        return None
    try:
        info = ctypes.create_string_buffer(_BTF_INFO_SIZE)
        bpf(BPF_OBJ_GET_INFO_BY_FD, _InfoAttr(bpf_fd=fd, info_len=_BTF_INFO_SIZE, info=ctypes.addressof(info)))
        size = struct.unpack_from("<I", info.raw, 8)[0]
        data = ctypes.create_string_buffer(size)
        info = ctypes.create_string_buffer(_BTF_INFO_SIZE)
        struct.pack_into("<QI", info, 0, ctypes.addressof(data), size)
        bpf(BPF_OBJ_GET_INFO_BY_FD, _InfoAttr(bpf_fd=fd, info_len=_BTF_INFO_SIZE, info=ctypes.addressof(info)))
        return data.raw
    except BpfError:
        return None
    finally:
        os.close(fd)


# bytes after each BTF type's 12-byte header: fixed, and per vlen entry (kinds 1..19)
_BTF_EXTRA = {1: (4, 0), 3: (12, 0), 4: (0, 12), 5: (0, 12), 6: (0, 8), 13: (0, 8), 14: (4, 0), 15: (0, 12),
              17: (4, 0), 19: (0, 12)}


def _btf_type_name(blob: bytes, want: int) -> str:
    """The name of type ``want`` in a raw BTF blob (little-endian), or ""."""
    if len(blob) < 24 or struct.unpack_from("<H", blob, 0)[0] != 0xEB9F:
        return ""
    hdr_len, type_off, type_len, str_off, str_len = struct.unpack_from("<5I", blob, 4)
    types, strs = hdr_len + type_off, hdr_len + str_off
    pos, tid, end = types, 1, types + type_len
    while pos + 12 <= end:
        name_off, info = struct.unpack_from("<II", blob, pos)
        if tid == want:
            if name_off >= str_len:
                return ""
            s = blob[strs + name_off:strs + str_len]
            return s.split(b"\0", 1)[0].decode(errors="replace")
        kind, vlen = (info >> 24) & 0x1F, info & 0xFFFF
        fixed, each = _BTF_EXTRA.get(kind, (0, 0))
        pos += 12 + fixed + each * vlen
        tid += 1
    return ""


# -------------------------------------------------------------------------------- switching it on
def stats_sysctl() -> int | None:
    """``kernel.bpf_stats_enabled`` as the sysctl shows it (None where it does not exist).  Stats
    switched on through a ``BPF_ENABLE_STATS`` fd do not show here."""
    try:
        with open(SYSCTL) as f:
            return int(f.read().strip() or 0)
    except (OSError, ValueError):
        return None


def set_stats_sysctl(value: int) -> None:
    with open(SYSCTL, "w") as f:
        f.write(f"{int(value)}\n")


def enable_stats_fd() -> int:
    """Run-time statistics on for as long as the returned fd stays open (Linux 5.8+): counted by
    the kernel, so it composes with other users and goes back by itself if this process dies."""
    return bpf(BPF_ENABLE_STATS, _EnableStatsAttr(type=BPF_STATS_RUN_TIME))


@contextlib.contextmanager
def stats_enabled(how: str = "auto") -> Iterator[str]:
    """Run-time statistics on inside the block, back to what they were after it.  ``how``:
    ``"fd"`` (a ``BPF_ENABLE_STATS`` fd held for the block), ``"sysctl"`` (``kernel.bpf_stats_enabled``
    written 1, then its earlier value written back), ``"auto"`` (the fd, else the sysctl).
    Yields the way used."""
    if how not in ("auto", "fd", "sysctl"):
        raise ValueError(f"how: auto, fd or sysctl, not {how!r}")
    fd = -1
    if how in ("auto", "fd"):
        try:
            fd = enable_stats_fd()
        except BpfError:
            if how == "fd":
                raise
    if fd >= 0:
        try:
            yield "fd"
        finally:
            os.close(fd)
        return
    before = stats_sysctl()
    if before is None:
        raise BpfError(errno.ENOTSUP, f"no {SYSCTL}: this kernel has no BPF run-time statistics")
    if not before:
        set_stats_sysctl(1)
    try:
        yield "sysctl"
    finally:
        if not before:
            set_stats_sysctl(before)
