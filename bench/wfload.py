"""The load and the tools of ``bench_waitfor``: context-switch generators (C, compiled with gcc
here), the wait-for programs loaded once and attached and detached again without bcc (so that a
measurement can alternate between "attached" and "detached" every few hundred milliseconds), a
scratch copy of ``waitfor.bpf.c`` with the alternatives measured beside it, and per-process
figures from ``/proc``.

``agent/ebpf/waitfor.bpf.c`` itself is never changed: the prototypes (raw-tracepoint versions of
``on_wf_switch``/``on_wf_waking``, a ``raw_syscalls`` filter) are built at run time from its text
(the two functions' bodies are taken as they are), so they follow the real program.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import struct
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

GEN_C = Path(__file__).with_name("wfgen.c")


def build_gen(tmp: Path) -> Path:
    exe = tmp / "wfgen"
    subprocess.run(["gcc", "-O2", "-pthread", "-o", str(exe), str(GEN_C)], check=True, capture_output=True, text=True)
    return exe


class Gen:
    """A generator process (``wfgen procs|threads ...``) until ``close()``; ``pids``: what it printed."""

    def __init__(self, exe: Path, *args: str | int) -> None:
        self.proc = subprocess.Popen([str(exe), *map(str, args)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, start_new_session=True)
        assert self.proc.stdout is not None
        words = self.proc.stdout.readline().split()
        if not words or words[0] != "ready":
            self.close()
            raise RuntimeError(f"wfgen {args} did not start")
        self.pids = [int(w) for w in words[1:]]

    def close(self) -> None:
        with contextlib.suppress(Exception):
            assert self.proc.stdin is not None
            self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, 9)
            self.proc.wait(10)


class Rtt:
    """``wfgen rtt N`` pinned to one CPU (real-time priority where allowed): ``rep()`` -> (wall ns,
    CPU ns) per round trip."""

    def __init__(self, exe: Path, n: int, cpu: int, fifo: bool = True) -> None:
        # SCHED_FIFO (root): the pair runs its hand-offs back to back on its CPU whatever else the
        # machine runs there (each rep is a few tens of ms; the kernel's fair server still gives the
        # other tasks their 5 %)
        rt = ["chrt", "-f", "1"] if fifo and os.geteuid() == 0 and shutil.which("chrt") else []
        self.fifo = bool(rt)
        self.proc = subprocess.Popen([*rt, "taskset", "-c", str(cpu), str(exe), "rtt", str(n)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        if not self.proc.stdout.readline().startswith("ready"):
            raise RuntimeError("wfgen rtt did not start")

    def child_pids(self) -> list[int]:
        with open(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children") as f:
            return [int(x) for x in f.read().split()]

    def rep(self) -> tuple[float, float]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        wall, cpu = self.proc.stdout.readline().split()
        return float(wall), float(cpu)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            assert self.proc.stdin is not None
            self.proc.stdin.close()
        self.proc.wait(10)


# ------------------------------------------------------------------------------------ /proc figures
def node_switches() -> int:
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith("ctxt "):
                return int(line.split()[1])
    return 0


def _tasks(pid: int) -> list[str]:
    try:
        return os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []


def _per_thread(pids: Iterable[int], name: str, value: Callable[[str], int]) -> int:
    """The sum over every thread of these processes of ``value(text of /proc/PID/task/TID/<name>)``
    (a thread gone meanwhile counts 0)."""
    total = 0
    for pid in pids:
        for tid in _tasks(pid):
            with contextlib.suppress(OSError, ValueError, IndexError), open(f"/proc/{pid}/task/{tid}/{name}") as f:
                total += value(f.read())
    return total


def process_cpu_ns(pids: Iterable[int]) -> int:
    """CPU time of every thread of these processes, ns (``schedstat``)."""
    return _per_thread(pids, "schedstat", lambda text: int(text.split()[0]))


def process_switches(pids: Iterable[int]) -> int:
    """Context switches (voluntary + involuntary) of every thread of these processes (``status``)."""
    return _per_thread(pids, "status", lambda text: sum(int(line.split()[-1]) for line in text.splitlines()
                                                         if "ctxt_switches:" in line))


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


# ------------------------------------------------------------- attaching loaded programs again
_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
_libc.ioctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong]
NR_PERF_EVENT_OPEN = 298            # x86_64
PERF_TYPE_TRACEPOINT = 2
PERF_FLAG_FD_CLOEXEC = 8
PERF_EVENT_IOC_ENABLE = 0x2400
PERF_EVENT_IOC_SET_BPF = 0x40042408
BPF_RAW_TRACEPOINT_OPEN = 17


def _tracefs() -> str:
    for d in ("/sys/kernel/tracing", "/sys/kernel/debug/tracing"):
        if os.path.isdir(f"{d}/events"):
            return d
    raise OSError("no tracefs")


def attach_tracepoint(prog_fd: int, tp: str) -> int:
    """A classic tracepoint's perf event carrying ``prog_fd`` (as bcc attaches it: CPU 0, any task;
    the program runs on every CPU).  Closing the returned fd detaches it."""
    cat, name = tp.split(":", 1)
    with open(f"{_tracefs()}/events/{cat}/{name}/id") as f:
        tp_id = int(f.read())
    attr = ctypes.create_string_buffer(112)
    struct.pack_into("<IIQQ", attr, 0, PERF_TYPE_TRACEPOINT, 112, tp_id, 1)
    struct.pack_into("<I", attr, 48, 1)                      # wakeup_events
    fd = _libc.syscall(NR_PERF_EVENT_OPEN, attr, -1, 0, -1, PERF_FLAG_FD_CLOEXEC)
    if fd < 0:
        e = ctypes.get_errno()
        raise OSError(e, f"perf_event_open({tp}): {os.strerror(e)}")
    for req, arg in ((PERF_EVENT_IOC_SET_BPF, prog_fd), (PERF_EVENT_IOC_ENABLE, 0)):
        if _libc.ioctl(fd, req, arg) < 0:
            e = ctypes.get_errno()
            os.close(fd)
            raise OSError(e, f"ioctl({tp}): {os.strerror(e)}")
    return int(fd)


def attach_raw(prog_fd: int, tp: str) -> int:
    """A raw tracepoint carrying ``prog_fd``; closing the fd detaches it."""
    from triscope.agent.ebpf.bpfsys import bpf

    name = ctypes.create_string_buffer(tp.split(":", 1)[1].encode())

    class Attr(ctypes.Structure):
        _fields_ = [("name", ctypes.c_uint64), ("prog_fd", ctypes.c_uint32), ("pad", ctypes.c_uint32),
                    ("cookie", ctypes.c_uint64)]

    return bpf(BPF_RAW_TRACEPOINT_OPEN, Attr(name=ctypes.addressof(name), prog_fd=prog_fd))


# -------------------------------------------------------------------------- the scratch program
def btf_member_offset(struct_name: str, member: str) -> int | None:
    """Byte offset of ``struct_name.member`` in the running kernel (its BTF), or None."""
    from triscope.agent.ebpf.btfoffsets import member_offset

    return member_offset(struct_name, member)


def _body(text: str, signature: str) -> str:
    """The body of a function of ``waitfor.bpf.c`` (from its signature line to the ``}`` that
    closes it at the start of a line)."""
    start = text.index(signature) + len(signature)
    end = text.index("\n}\n", start)
    return text[start:end]


BENCH_EXTRA = r"""
/* ---- bench_waitfor: baselines and prototypes, appended to a scratch copy (never shipped) ---- */
int bench_empty_switch(void *args) { return 0; }
int bench_empty_waking(void *args) { return 0; }
int bench_empty_switch_raw(struct bpf_raw_tracepoint_args *ctx) { return 0; }
int bench_empty_waking_raw(struct bpf_raw_tracepoint_args *ctx) { return 0; }

/* raw tracepoints: the same bodies, the two fields read from the task_structs (6.18: sched_switch
   is (preempt, prev, next, prev_state), sched_waking (p)) */
int proto_wf_switch_raw(struct bpf_raw_tracepoint_args *ctx) {
    struct { long prev_state; u32 next_pid; } a_ = {.prev_state = (long)ctx->args[3]}, *args = &a_;
    bpf_probe_read_kernel(&a_.next_pid, sizeof(a_.next_pid), (void *)ctx->args[2] + TASK_PID_OFF);
@SWITCH_BODY@
}
int proto_wf_waking_raw(struct bpf_raw_tracepoint_args *ctx) {
    struct { u32 pid; } a_ = {}, *args = &a_;
    bpf_probe_read_kernel(&a_.pid, sizeof(a_.pid), (void *)ctx->args[0] + TASK_PID_OFF);
@WAKING_BODY@
}

/* the interrupt markers on classic tracepoints, as they were before (the same bodies) */
int bench_tp_softirq_entry(struct tracepoint__irq__softirq_entry *args) {
    wf_push((WF_CTX_SOFTIRQ << 24) | (args->vec & 0xffffff));
    return 0;
}
int bench_tp_softirq_exit(struct tracepoint__irq__softirq_exit *args) { wf_pop(); return 0; }
int bench_tp_irq_entry(struct tracepoint__irq__irq_handler_entry *args) {
    wf_push((WF_CTX_HARDIRQ << 24) | ((u32)args->irq & 0xffffff));
    return 0;
}
int bench_tp_irq_exit(struct tracepoint__irq__irq_handler_exit *args) { wf_pop(); return 0; }
int bench_tp_hrtimer_entry(struct tracepoint__timer__hrtimer_expire_entry *args) { wf_push(WF_CTX_HRTIMER << 24); return 0; }
int bench_tp_hrtimer_exit(struct tracepoint__timer__hrtimer_expire_exit *args) { wf_pop(); return 0; }

/* what a raw_syscalls probe would cost an untracked syscall: the process-bit filter, and for a
   tracked thread the syscall noted in its entry */
int proto_wf_sys_enter(struct tracepoint__raw_syscalls__sys_enter *args) {
    u64 pt = bpf_get_current_pid_tgid();
    u32 tgid = pt >> 32, tid = (u32)pt;
    u64 *w = wf_tgid_word(tgid);
    if (!WF_BIT(w, tgid))
        return 0;
    struct wf_cur *c = wf_cur.lookup(&tid);
    if (c)
        c->nr = (s32)args->id;
    return 0;
}
int proto_wf_sys_enter_raw(struct bpf_raw_tracepoint_args *ctx) {
    u64 pt = bpf_get_current_pid_tgid();
    u32 tgid = pt >> 32, tid = (u32)pt;
    u64 *w = wf_tgid_word(tgid);
    if (!WF_BIT(w, tgid))
        return 0;
    struct wf_cur *c = wf_cur.lookup(&tid);
    if (c)
        c->nr = (s32)ctx->args[1];
    return 0;
}
"""

SWITCH_SIG = "int on_wf_switch(struct tracepoint__sched__sched_switch *args) {"
WAKING_SIG = "int on_wf_waking(struct tracepoint__sched__sched_waking *args) {"

# name -> [(tracepoint, kind, function)]
def _irq_markers() -> list[tuple[str, str, str]]:
    """The interrupt-context markers in the agent's own order (layout.py: exits attached first)."""
    from triscope.agent.ebpf import layout as L

    spec = L.PROBE_BY_NAME["waitfor_irq"]
    return [(tp, spec.kind, fn) for tp, fn in zip(spec.tracepoints, spec.fns, strict=True)]


IRQ_MARKERS = _irq_markers()
VARIANTS: dict[str, list[tuple[str, str, str]]] = {
    "waitfor": [("sched:sched_switch", "tracepoint", "on_wf_switch"),
                ("sched:sched_waking", "tracepoint", "on_wf_waking"), *IRQ_MARKERS],
    "empty": [("sched:sched_switch", "tracepoint", "bench_empty_switch"),
              ("sched:sched_waking", "tracepoint", "bench_empty_waking")],
    "empty_raw": [("sched:sched_switch", "raw", "bench_empty_switch_raw"),
                  ("sched:sched_waking", "raw", "bench_empty_waking_raw")],
    "proto_raw": [("sched:sched_switch", "raw", "proto_wf_switch_raw"),
                  ("sched:sched_waking", "raw", "proto_wf_waking_raw"), *IRQ_MARKERS],
    "irq_raw": IRQ_MARKERS,
    "irq_classic": [(tp, "tracepoint", fn.replace("on_wf_", "bench_tp_")) for tp, _k, fn in IRQ_MARKERS],
    "sys_filter": [("raw_syscalls:sys_enter", "tracepoint", "proto_wf_sys_enter")],
    "sys_filter_raw": [("raw_syscalls:sys_enter", "raw", "proto_wf_sys_enter_raw")],
}


def scratch_source(tmp: Path, edit: Callable[[str], str] | None = None) -> tuple[Path, list[str]]:
    """probes.bpf.c + waitfor.bpf.c (``edit``: changed by it) + the bench's programs, as one file,
    and the extra defines."""
    from triscope.agent.ebpf.loader import EXTRA_SOURCES, SOURCE

    wf = EXTRA_SOURCES[0].read_text()
    if edit is not None:
        wf = edit(wf)
    off = btf_member_offset("task_struct", "pid")
    if off is None:
        raise RuntimeError("no task_struct.pid in the kernel's BTF: the raw-tracepoint prototype needs it")
    extra = BENCH_EXTRA.replace("@SWITCH_BODY@", _body(wf, SWITCH_SIG)).replace("@WAKING_BODY@", _body(wf, WAKING_SIG))
    src = tmp / "waitfor_scratch.bpf.c"
    # the extra programs use the wait-for maps and helpers: inside its #ifdef, before its #endif
    head, endif = wf.rstrip().rsplit("#endif", 1)
    src.write_text(SOURCE.read_text() + "\n" + head + extra + "\n#endif" + endif + "\n")
    return src, [f"TASK_PID_OFF={off}"]


def _replace(text: str, old: str, new: str) -> str:
    if old not in text:
        raise RuntimeError(f"waitfor.bpf.c changed: the prototype's edit does not apply ({old.strip()[:60]!r})")
    return text.replace(old, new)


def _edit_no_regs(text: str) -> str:
    return "#define WF_NO_REGS\n" + text


def _edit_fallback(text: str) -> str:
    return _replace("#undef WF_SCHED\n" + text, "#ifdef WF_SCHED\nBPF_ARRAY(wf_woke, struct wf_woke, WF_WOKE_SLOTS);\n",
                    "BPF_ARRAY(wf_woke, struct wf_woke, WF_WOKE_SLOTS);   /* bench: the prototypes' bodies use it */\n"
                    "#ifdef WF_SCHED\n")


def _edit_no_last_wait(text: str) -> str:
    return _replace(text, "    if (c->c_count && c->c_nr == nr && c->c_fd == fd",
                    "    if (0 && c->c_count && c->c_nr == nr && c->c_fd == fd")


_HASH_GET_OR_MAKE = """        struct wf_cur *c = wf_cur.lookup(&tid);
        if (!c) {
            struct wf_cur z = {.tgid = tgid, .nr = -1, .fd = -1, .clk = WF_CLK};
            if (wf_cur.insert(&tid, &z) != 0)
                count(C_WF_LOST, 1);
            c = wf_cur.lookup(&tid);
        }"""


def _edit_hash(text: str) -> str:
    """Every entry in the wf_cur hash (as before the slots)."""
    text = _replace(text, "        struct wf_cur *c = wf_get_or_make(tid, tgid);", _HASH_GET_OR_MAKE)
    text = _replace(text, "                wf_drop(tid);", "                wf_cur.delete(&tid);")
    return _replace(text, "        struct wf_cur *n = wf_get(ntid);", "        struct wf_cur *n = wf_cur.lookup(&ntid);")


def _edit_ktime(text: str) -> str:
    """bpf_ktime_get_ns for the times, not the run queue's clock (as before)."""
    text = _replace(text, "#define WF_CLK WF_CLK_RQ\n", "#define WF_CLK WF_CLK_MONO\n")
    text = _replace(text, """            now = wf_now(prev);
            wf_own_clock(c, now);
            if ((c->switches & 63) == 0)
                wf_clk_pair(now);""", "            now = bpf_ktime_get_ns();")
    return _replace(text, """                now = wf_now(prev);
            wf_own_clock(n, now);""", """                now = bpf_ktime_get_ns();""")


def _edit_before(text: str) -> str:
    return _edit_ktime(_edit_hash(text))


# the tracked path as it is against its parts as they were before (issue 41 point 7: the thread's entry
# in an array slot, the run queue's clock), measured by ``bench_waitfor.prototypes``
PROTOTYPES: dict[str, Callable[[str], str] | None] = {
    "as_is": None,
    "hash": _edit_hash,                       # entries in the hash, not array slots
    "ktime": _edit_ktime,                     # bpf_ktime_get_ns, not the run queue's clock
    "before": _edit_before,                   # both, as the program was before
}


# the tracked path's cost centres, as edits of a scratch copy of waitfor.bpf.c
EDITS: dict[str, Callable[[str], str] | None] = {
    "as_is": None,
    "no_regs": _edit_no_regs,                 # the blocked syscall not read (WF_NO_REGS): what reading it costs
    "fallback": _edit_fallback,               # without the scheduler's BTF (WF_SCHED off): each wakeup looks up the
                                              # thread's entry, reads the clock and closes its wait there
    "no_last_wait": _edit_no_last_wait,       # every wait to the wf_wait hash (the last wait not kept in the entry)
}


@dataclass
class Programs:
    """Every variant's programs loaded once (one bcc compile in the loader child); ``attach(name)``
    attaches a variant's programs and ``detach()`` takes them off again, each in microseconds.
    ``ids[name]``: program id -> function, for ``progstats.snapshot(ids=...)``; ``maps``: the
    wait-for maps (``BpfMap``), ``waitfor``: the agent's reader on them."""

    prog_fds: dict[str, int] = field(default_factory=dict)
    prog_ids: dict[str, int] = field(default_factory=dict)
    kinds: dict[str, str] = field(default_factory=dict)
    maps: dict = field(default_factory=dict)
    waitfor: object = None
    attached: list[int] = field(default_factory=list)
    current: str = ""

    @classmethod
    def load(cls, variants: Iterable[str] = tuple(VARIANTS), edit: Callable[[str], str] | None = None) -> Programs:
        from triscope.agent.collectors.waitfor import WaitFor
        from triscope.agent.ebpf import layout as L
        from triscope.agent.ebpf import progstats
        from triscope.agent.ebpf.bpfsys import BpfMap, bpf
        from triscope.agent.ebpf.discover import defines_for, ensure_tracefs, plan_probes
        from triscope.agent.ebpf.loader import run_loader

        tracefs, why = ensure_tracefs(True)
        plans = plan_probes(tracefs, {"waitfor", "waitfor_irq"})
        bad = [f"{p.spec.name}: {p.reason}" for p in plans if not p.ok]
        if bad:
            raise RuntimeError(f"wait-for probes cannot attach here: {'; '.join(bad)} ({why})")
        entries = {fn: (tp, kind) for v in variants for tp, kind, fn in VARIANTS[v]}
        # bcc attaches one raw program per tracepoint in one object: a load per such layer
        layers: list[dict[str, tuple[str, str]]] = []
        for fn, (tp, kind) in entries.items():
            layer = next((x for x in layers if kind != "raw" or all(t != tp or k != "raw" for t, k in x.values())), None)
            if layer is None:
                layer = {}
                layers.append(layer)
            layer[fn] = (tp, kind)
        out = cls()
        with tempfile.TemporaryDirectory() as td:
            src, extra = scratch_source(Path(td), edit)
            for i, layer in enumerate(layers):
                res = run_loader(defines_for(plans) + extra,
                                 [{"probe": "bench", "tp": tp, "kind": kind, "fn": fn} for fn, (tp, kind) in layer.items()],
                                 source=src, maps=[*L.WF_MAPS, *L.WF_MAPS_OPTIONAL] if i == 0 else [])
                if res.fatal:
                    out.close()
                    raise RuntimeError(f"scratch wait-for program did not load: {res.fatal}: {res.error[-800:]}")
                try:
                    failed = [f"{a.tracepoint}: {a.error}" for a in res.attachments if not a.ok]
                    if failed:
                        raise RuntimeError(f"scratch programs did not attach: {'; '.join(failed)}")
                    for a, fn in zip(res.attachments, layer, strict=True):
                        pid = progstats.attached_program(a.fd)
                        out.prog_ids[fn] = pid
                        out.prog_fds[fn] = bpf(progstats.BPF_PROG_GET_FD_BY_ID, progstats._IdAttr(id=pid))
                        out.kinds[fn] = a.kind
                except Exception:
                    res.close()
                    out.close()
                    raise
                for a in res.attachments:           # detached: attached again on demand
                    with contextlib.suppress(OSError):
                        os.close(a.fd)
                    a.fd = -1
                out.maps.update({name: BpfMap(fd) for name, fd in res.maps.items()})
                res.maps.clear()
        out.waitfor = WaitFor({m: out.maps[m] for m in (*L.WF_MAPS, *L.WF_MAPS_OPTIONAL) if m in out.maps})
        return out

    def ids(self, variant: str) -> dict[int, str]:
        return {self.prog_ids[fn]: fn for _tp, _k, fn in VARIANTS[variant]}

    def attach(self, *variants: str) -> None:
        """Attach these variants' programs (together: each program's statistics are its own)."""
        self.detach()
        done: set[str] = set()
        for variant in variants:
            for tp, kind, fn in VARIANTS[variant]:
                if fn in done:
                    continue
                done.add(fn)
                fd = self.prog_fds[fn]
                self.attached.append(attach_raw(fd, tp) if kind == "raw" else attach_tracepoint(fd, tp))
        self.current = "+".join(variants)

    def detach(self) -> None:
        for fd in self.attached:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.attached.clear()
        self.current = ""

    def close(self) -> None:
        self.detach()
        if self.waitfor is not None:
            with contextlib.suppress(Exception):
                self.waitfor.close()        # type: ignore[attr-defined]
        for fd in self.prog_fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self.prog_fds.clear()
        for m in self.maps.values():
            with contextlib.suppress(OSError):
                m.close()
        self.maps.clear()


def other_waitfor_programs(ours: Iterable[int]) -> int:
    """Wait-for programs loaded by someone else (another agent on this machine): they run on every
    switch too, in the baseline as in the measurement."""
    from triscope.agent.ebpf import progstats

    mine = set(ours)
    return sum(1 for p in progstats.programs(progstats.WAITFOR_FNS) if p.id not in mine)



# ------------------------------------------------------------------------------------ agent side
def agent_side(mode: str, pids: list[int]) -> None:
    """The agent's wait-for side in a process of its own (``python -m bench.wfload agent MODE PID...``),
    as the workloads collector runs it: ``on``: the eBPF collector's wait-for probes and
    ``WorkloadWaits`` ticking once a second (``WaitFor.read()``, the chain, the series) over one
    workload of processes ``pids`` on "GPU 0"; ``off``: the same process and imports, the probes
    off (the workloads collector then has no wait-for part).  Prints one JSON line (the programs'
    ids, by function), then ticks until stdin closes."""
    import json
    import sys
    import threading
    from types import SimpleNamespace

    from triscope.agent.collectors.ebpf import EbpfCollector
    from triscope.agent.ebpf import layout as L
    from triscope.agent.ebpf import progstats
    from triscope.agent.workloads.waits import WorkloadWaits

    wl = ("", "", "", "cmd:wf-tracked")
    plan = [SimpleNamespace(labels=(("gpu", "0"),), groups=((wl, tuple(pids)),), listed=((wl, tuple(pids[:1])),))]
    ww = c = progs = None
    ids: dict[int, str] = {}
    if mode.startswith("on:"):                 # a prototype of the kernel side (EDITS), the same reader
        progs = Programs.load(["waitfor"], EDITS[mode[3:]])
        progs.attach("waitfor")
        ids = progs.ids("waitfor")
        ww = WorkloadWaits(progs.waitfor)      # type: ignore[arg-type]
    elif mode == "on":
        c = EbpfCollector(probes=["waitfor", "waitfor_irq"])
        if c.waitfor is None or c._load is None:
            print(json.dumps({"error": c.reasons.get("waitfor", "?")}), flush=True)
            return
        fns = {tp: fn for s in (L.PROBE_BY_NAME["waitfor"], L.PROBE_BY_NAME["waitfor_irq"])
               for tp, fn in zip(s.tracepoints, s.fns, strict=True)}
        ids = progstats.attached_programs({a.fd: fns[a.tracepoint] for a in c._load.attachments if a.ok})
        ww = WorkloadWaits(c.waitfor)
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    print(json.dumps({"ids": {str(k): v for k, v in ids.items()}}), flush=True)
    seen = {"ticks": 0, "waits": 0, "threads": 0}
    if ww is not None:
        reader = ww.waitfor.read

        def counted():  # type: ignore[no-untyped-def]
            got = reader()
            seen["waits"] += len(got.waits)
            seen["threads"] = len(got.threads)
            return got

        ww.waitfor.read = counted              # type: ignore[method-assign]
    nxt = time.monotonic()
    while not stop.is_set():
        if ww is not None:
            out: list = []
            ww.tick(plan, out)
        seen["ticks"] += 1
        nxt += 1.0
        stop.wait(max(0.0, nxt - time.monotonic()))
    print(json.dumps(seen), flush=True)
    if ww is not None:
        ww.close()
    if c is not None:
        c.close()
    if progs is not None:
        progs.close()


class AgentSide:
    """``agent_side`` in a child process: ``ids`` its programs, ``cpu_ns()`` / ``rss()`` its figures."""

    def __init__(self, mode: str, pids: list[int]) -> None:
        import json
        import sys

        root = Path(__file__).resolve().parents[1]
        env = {**os.environ, "PYTHONPATH": f"{root}{os.pathsep}{os.environ.get('PYTHONPATH', '')}".rstrip(os.pathsep)}
        self.proc = subprocess.Popen([sys.executable, "-m", "bench.wfload", "agent", mode, *map(str, pids)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=root, env=env)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        got = json.loads(line) if line.strip() else {"error": "agent side exited"}
        if "error" in got:
            self.close()
            raise RuntimeError(f"agent side ({mode}) did not start: {got['error']}")
        self.ids = {int(k): v for k, v in got["ids"].items()}

    def cpu_ns(self) -> int:
        return process_cpu_ns([self.proc.pid])

    def rss(self) -> float:
        return rss_mb(self.proc.pid)

    def close(self) -> dict[str, int]:
        """Stops it; what it saw: ticks, wait records read, threads (last tick)."""
        import json

        with contextlib.suppress(Exception):
            assert self.proc.stdin is not None
            self.proc.stdin.close()
        seen: dict[str, int] = {}
        with contextlib.suppress(Exception):
            assert self.proc.stdout is not None
            seen = json.loads(self.proc.stdout.readline())
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        return seen


if __name__ == "__main__":
    import sys

    if len(sys.argv) >= 3 and sys.argv[1] == "agent":
        agent_side(sys.argv[2], [int(x) for x in sys.argv[3:]])
    else:
        sys.exit("usage: python -m bench.wfload agent on|off|on:EDIT PID...")
