"""Wait-for evidence, read: where each tracked thread's time went, and who ended each of its waits.

The kernel side is ``agent/ebpf/waitfor.bpf.c`` (loaded with the other probes by the eBPF
collector's loader child); this module holds its maps and turns them into per-thread seconds:

* ``track(tgids)`` says which processes to follow: their bits in the program's pid-indexed arrays,
  and an entry per thread they already have, initialised from ``/proc/PID/task/TID/{stat,syscall}``
  (a thread that never leaves its CPU, a spinning one, is seen from the start).  Processes no
  longer asked for are forgotten, in the kernel too.
* ``read()`` returns, since the last read, each thread's seconds on a CPU, runnable without one
  and blocked, and its waits: each blocked interval that ended (the syscall and descriptor it
  blocked in, and the waking task or interrupt context), each runnable interval after a
  preemption (the thread that took the CPU), and the blocked interval still open (its syscall,
  no waker yet).  Open intervals count as they go: a thread blocked for a minute shows blocked
  in every read, not all at once when it wakes; what was counted while open is taken off the
  interval's total when it closes.

Nothing here decides anything: ``agent/workloads/waitchain.py`` follows the waits from an
accelerator's driving thread; the verdict reads what that publishes.
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import statistics
import struct
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

from triscope.agent.ebpf import layout as L
from triscope.agent.ebpf.bpfsys import BPF_F_MMAPABLE, BPF_NOEXIST, BpfError, BpfMap

log = logging.getLogger(__name__)

_U64 = struct.Struct("<Q")
_U32 = struct.Struct("<I")
# x86_64 syscalls whose first argument is the descriptor they wait on (as waitfor.bpf.c reads them)
FD_SYSCALLS_X86_64 = frozenset({0, 1, 16, 17, 19, 20, 42, 43, 44, 45, 46, 47, 232, 281, 288, 299, 307, 441, 295})


@dataclass(slots=True)
class ThreadTime:
    """One thread since the last read, in seconds."""

    tid: int
    tgid: int
    cpu: float = 0.0
    runq: float = 0.0
    blocked: float = 0.0


class Wait(NamedTuple):
    """Seconds of one thread's waits of one kind since the last read.

    ``kind`` ``blocked``: blocked in syscall ``nr`` (-1 unknown) on descriptor ``fd`` (-1 none),
    ended by ``waker_tgid``/``waker_tid`` (a task: 0/0 the idle task) or, when ``ctx`` is not 0, by
    an interrupt context (``ctx >> 24``: 1 softirq, 2 hardware IRQ, 3 hrtimer, 4 no wakeup seen; the
    low bits its vector or IRQ); ``open``: still blocked at the read (no waker yet);
    ``runq``: reserved (the programs no longer record who took the CPU per preemption; a thread's
    runnable time is in its ``ThreadTime``)."""

    tid: int
    kind: str
    nr: int
    fd: int
    waker_tgid: int
    waker_tid: int
    ctx: int
    seconds: float
    waits: int = 0               # how many ended (0: open or runnable)


@dataclass(slots=True)
class WaitRead:
    threads: dict[int, ThreadTime] = field(default_factory=dict)
    waits: list[Wait] = field(default_factory=list)
    seconds: float = 0.0          # wall time since the last read
    lost: int = 0                 # intervals the kernel could not record (maps full), cumulative


@dataclass(slots=True)
class _Open:
    since: int
    state: int
    reported: int = 0             # ns of it already counted as open


class _Slots:
    """The ``wf_slots`` array (a followed thread's entry in the slot its tid picks) and
    ``wf_slot_bits`` (which slots are held): mapped into this process where the kernel allows it
    (read as memory), else read with a syscall per word and per held slot."""

    def __init__(self, slots: BpfMap, bits: BpfMap) -> None:
        self.slots, self.bits = slots, bits
        self.n = slots.max_entries
        self._mm: list[mmap.mmap] = []
        self._slot_mem: memoryview | None = None
        self._bit_mem: memoryview | None = None
        if slots.info.flags & bits.info.flags & BPF_F_MMAPABLE:
            try:
                self._slot_mem = self._map(slots)
                self._bit_mem = self._map(bits)
            except OSError as e:       # refused (e.g. by a security module): syscalls
                log.debug("wait-for: slots not mapped: %s", e)
                self.close()

    def _map(self, m: BpfMap) -> memoryview:
        size = m.value_size * m.max_entries
        mm = mmap.mmap(m.fd, (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE * mmap.PAGESIZE, mmap.MAP_SHARED,
                       mmap.PROT_READ)
        self._mm.append(mm)
        return memoryview(mm)[:size]

    def held(self) -> list[int]:
        """The slots the kernel holds now."""
        if self._bit_mem is not None:
            words = list(enumerate(self._bit_mem.cast("Q").tolist()))
        else:
            words = [(_U32.unpack_from(k)[0], _U64.unpack_from(v)[0]) for k, v in self.bits.items()]
        out = []
        for i, word in words:
            while word:                  # one u64 at a time (a 16,384-bit int costs its length per step)
                low = word & -word
                out.append(64 * i + low.bit_length() - 1)
                word ^= low
        return out

    def read(self, slot: int) -> bytes | None:
        """A slot's value (WF_SLOT), None where it cannot be read."""
        mem = self._slot_mem
        if mem is not None:
            off = slot * L.WF_SLOT.size
            return bytes(mem[off:off + L.WF_SLOT.size])
        return self.slots.lookup(_U32.pack(slot))

    def entries(self) -> list[tuple[int, tuple]]:
        """(tid, WF_CUR fields) of every held slot."""
        out = []
        mem, size, unpack = self._slot_mem, L.WF_SLOT.size, L.WF_SLOT.unpack_from
        for slot in self.held():
            if mem is not None:
                v = unpack(mem, slot * size)
            else:
                raw = self.slots.lookup(_U32.pack(slot))
                if raw is None:
                    continue
                v = unpack(raw)
            if v[-1]:
                out.append((v[-1], v[:-1]))
        return out

    def free_stale(self, tid: int) -> None:
        """A slot still naming ``tid`` from an earlier time it was followed (its thread gone since
        unseen): emptied, so that the thread of that id now gets an entry afresh."""
        slot = tid % self.n
        raw = self.read(slot)
        if raw is not None and _U64.unpack_from(raw, L.WF_SLOT_TID)[0] == tid:
            self.slots.update(_U32.pack(slot), bytes(L.WF_SLOT.size))

    def close(self) -> None:
        for v in (self._slot_mem, self._bit_mem):
            if v is not None:
                v.release()
        self._slot_mem = self._bit_mem = None
        for mm in self._mm:
            mm.close()
        self._mm.clear()


class WaitFor:
    """The wait-for maps, held by the agent.  ``maps``: ``wf_tgid_bits``, ``wf_tid_bits``,
    ``wf_cur``, ``wf_wait``, ``wf_slots``, ``wf_slot_bits`` and, with the scheduler's BTF,
    ``wf_clk`` (``BpfMap``); ``lost``: a callable giving the program's lost count.

    A thread's ``since`` is on the clock its ``clk`` names: bpf_ktime_get_ns (the agent's
    ``time.monotonic_ns``), or the run queue's (sched_clock), turned into the agent's with the
    pairs of both that the program leaves in ``wf_clk``."""

    def __init__(self, maps: dict[str, BpfMap], *, proc: str = "/proc",
                 clock_ns: Callable[[], int] = time.monotonic_ns, lost: Callable[[], int] | None = None) -> None:
        self.tgid_bits = maps["wf_tgid_bits"]
        self.tid_bits = maps["wf_tid_bits"]
        self.cur = maps["wf_cur"]
        self.wait = maps["wf_wait"]
        self.slots = _Slots(maps["wf_slots"], maps["wf_slot_bits"])
        self.clk = maps.get("wf_clk")
        self.proc = proc
        self.clock_ns = clock_ns
        self.lost = lost
        self.words = self.tgid_bits.max_entries
        self.tracked: set[int] = set()
        self._tgid_words: dict[int, int] = {}        # word index -> bits set there by us
        self._tid_words: dict[int, int] = {}
        self._prev: dict[int, tuple[int, int, int]] = {}      # tid -> cumulative (cpu, runq, blocked) ns
        self._open: dict[int, _Open] = {}
        # the last wait the kernel keeps in each thread's entry: tid -> (generation, key, ns, count) read
        self._last_wait: dict[int, tuple[int, tuple[int, int, int, int, int], int, int]] = {}
        # what was read of a last wait since moved to wf_wait: taken off when it is drained there
        self._debt: dict[int, list[list]] = {}
        self._last = clock_ns()

    # ------------------------------------------------------------------ what to follow
    def track(self, tgids: Iterable[int]) -> None:
        """Follow exactly these processes (and every thread they have or start)."""
        want = {t for t in tgids if 0 < t < self.words * 64}
        new, gone = want - self.tracked, self.tracked - want
        if not new and not gone:
            return
        for t in new:
            self._set(self.tgid_bits, self._tgid_words, t, True)
        for t in gone:
            self._set(self.tgid_bits, self._tgid_words, t, False)
        self.tracked = want
        if gone:
            self._forget(gone)
        now = self.clock_ns()
        for t in new:
            self._seed(t, now)

    def _set(self, m: BpfMap, words: dict[int, int], ident: int, on: bool) -> None:
        w, bit = ident >> 6, 1 << (ident & 63)
        cur = words.get(w, 0)
        val = cur | bit if on else cur & ~bit
        if val == cur and (on or not cur):
            return
        # the program may have set bits of this word itself (a tracked process's new thread): read it first
        raw = m.lookup(_U32.pack(w))
        kernel = _U64.unpack_from(raw)[0] if raw else 0
        kval = kernel | bit if on else kernel & ~bit
        m.update(_U32.pack(w), _U64.pack(kval))
        if val:
            words[w] = val
        else:
            words.pop(w, None)

    def _seed(self, tgid: int, now: int) -> None:
        """An entry per thread the process has now, in the state ``/proc`` shows, so that a thread
        which never switches (a spinning one) is counted from the start."""
        try:
            tids = [int(x) for x in os.listdir(f"{self.proc}/{tgid}/task") if x.isdigit()]
        except OSError:
            return
        for tid in tids:
            state, nr, fd = L.WF_UNKNOWN, -1, -1
            base = f"{self.proc}/{tgid}/task/{tid}"
            with contextlib.suppress(OSError, ValueError, IndexError):
                stat = open(f"{base}/stat", "rb").read()            # noqa: SIM115 - read at once
                ch = stat[stat.rindex(b")") + 2:stat.rindex(b")") + 3]
                if ch in (b"S", b"D", b"I"):
                    state = L.WF_BLOCKED
                    parts = open(f"{base}/syscall").read().split()  # noqa: SIM115
                    if parts and parts[0].lstrip("-").isdigit():
                        nr = int(parts[0])
                        if nr in FD_SYSCALLS_X86_64 and len(parts) > 1:
                            fd = int(parts[1], 16)
                            fd = fd if fd < 1 << 31 else -1
            rd0 = 0                  # its run-queue wait so far (schedstat): the kernel's count goes on from it
            with contextlib.suppress(OSError, ValueError, IndexError):
                rd0 = int(open(f"{base}/schedstat").read().split()[1])   # noqa: SIM115
            if tid < self.words * 64:
                value = L.WF_CUR.pack(now, 0, 0, 0, 0, tgid, state, nr, fd, 0, 0, rd0, 0, 0, -1, -1, 0, 0, 0,
                                      L.WF_CLK_MONO)
                with contextlib.suppress(BpfError):
                    self.slots.free_stale(tid)
                try:
                    self.cur.update(_U32.pack(tid), value, BPF_NOEXIST)
                except BpfError as e:      # map full: the program counts what it cannot keep too
                    log.debug("wait-for: thread %d not seeded: %s", tid, e)
                    continue
                self._set(self.tid_bits, self._tid_words, tid, True)

    def _forget(self, tgids: set[int]) -> None:
        """Their threads' bits cleared and hash entries deleted; a slot is left to the kernel, which
        gives it to the next thread whose id picks it (its holder no longer followed)."""
        held: list[tuple[int, tuple, bytes | None]] = [(_U32.unpack_from(k)[0], L.WF_CUR.unpack(v), k)
                                                       for k, v in self.cur.items()]
        held += [(tid, v, None) for tid, v in self.slots.entries()]
        for tid, v, k in held:
            if v[5] in tgids:
                if k is not None:
                    self.cur.delete(k)
                self._set(self.tid_bits, self._tid_words, tid, False)
                self._prev.pop(tid, None)
                self._open.pop(tid, None)
                self._last_wait.pop(tid, None)
                self._debt.pop(tid, None)

    # ------------------------------------------------------------------ reading
    def read(self) -> WaitRead:
        now = self.clock_ns()
        since_last = max(1, now - self._last)
        out = WaitRead(seconds=since_last / 1e9, lost=self.lost() if self.lost else 0)
        # drained before the entries are read: a last wait moved to wf_wait after this drain is still in
        # its entry as read below (its generation unchanged), or is drained next time (its debt waits)
        drained = self.wait.drain_raw()
        lasts: dict[int, list] = {}                      # tid -> [kind, nr, fd, wtgid, wtid, ctx, ns, count]
        correction, opens = self._read_entries(out, now, lasts)
        self._correct(out, correction)
        self._waits(out, correction, opens, drained, lasts)
        self._last = now
        return out

    def _read_entries(self, out: WaitRead, now: int, lasts: dict[int, list]
                      ) -> tuple[dict[int, tuple[int, int]], list[tuple[int, int, int, int]]]:
        """Each followed thread's entry: its closed totals since the last read into ``out.threads``,
        the open interval's part since then added, its last wait into ``lasts``.  Returns the
        intervals counted while open that have closed since (tid -> (state, ns counted)) and the
        blocked intervals still open (tid, nr, fd, ns).  (Every tracked thread, every read: names
        bound to locals, the agent's own CPU, bench waitfor.)"""
        correction: dict[int, tuple[int, int]] = {}
        seen: set[int] = set()
        opens: list[tuple[int, int, int, int]] = []
        tracked = self.tracked
        offset = self._clock_offset()
        threads, prev, open_ = out.threads, self._prev, self._open
        prev_get, open_get, open_pop, read_last = prev.get, open_.get, open_.pop, self._read_last
        last = self._last
        clk_rq, oncpu, runnable, unknown = L.WF_CLK_RQ, L.WF_ONCPU, L.WF_RUNNABLE, L.WF_UNKNOWN
        zero = (0, 0, 0)
        for tid, (since, cpu, runq, blocked, _sw, tgid, state, nr, fd, _by, gen, _rd0, c_ns, c_cnt, c_nr, c_fd,
                  c_wtgid, c_wtid, c_ctx, clk) in self._entries():
            if tgid not in tracked:
                continue
            seen.add(tid)
            # `since` names the open interval; `start` is it on our clock (0: unknown, the run queue's
            # clock with no pair of both clocks read yet)
            start = since if clk != clk_rq or not since else (since + offset if offset is not None else 0)
            if c_cnt:
                read_last(tid, gen, (c_nr, c_fd, c_wtgid, c_wtid, c_ctx), c_ns, c_cnt, lasts)
            p = prev_get(tid, zero)
            prev[tid] = (cpu, runq, blocked)
            t = threads[tid] = ThreadTime(tid, tgid, (cpu - p[0]) / 1e9 if cpu > p[0] else 0.0,
                                          (runq - p[1]) / 1e9 if runq > p[1] else 0.0,
                                          (blocked - p[2]) / 1e9 if blocked > p[2] else 0.0)
            o = open_get(tid)
            if o is not None and o.since != since:       # the interval counted while open has closed
                correction[tid] = (o.state, o.reported)
                o = None
            if state == unknown or not start:
                open_pop(tid, None)
                continue
            if o is None:
                o = open_[tid] = _Open(since, state)
            part = now - (start if start > last else last)
            part = part if part > 0 else 0
            o.reported += part
            if state == oncpu:
                t.cpu += part / 1e9
            elif state == runnable:
                t.runq += part / 1e9
            else:
                t.blocked += part / 1e9
                opens.append((tid, nr, fd, part))
        for d in (open_, prev, self._last_wait, self._debt):
            if len(d) > len(seen) or not d.keys() <= seen:
                for tid in d.keys() - seen:                 # threads gone
                    del d[tid]
        return correction, opens

    def _entries(self) -> Iterable[tuple[int, tuple]]:
        """tid -> WF_CUR fields: the hash's entries, then the slots' (read after: an entry the kernel
        moves from the hash to its slot meanwhile is in one or the other, and the slot's wins)."""
        kr, vr, _n = self.cur.items_raw()
        out = {tid: v for (tid,), v in zip(_U32.iter_unpack(kr), L.WF_CUR.iter_unpack(vr), strict=True)}
        out.update(self.slots.entries())
        return out.items()

    def _clock_offset(self) -> int | None:
        """ns from the run queue's clock to ours: the median over the CPUs' latest pairs (None: none yet)."""
        if self.clk is None:
            return None
        raw = self.clk.lookup(_U32.pack(0))
        if raw is None:
            return None
        stride = self.clk.stride
        offs = [mono - rq for mono, rq in (L.WF_CLK.unpack_from(raw, i * stride) for i in range(self.clk.ncpus))
                if mono and rq]
        return int(statistics.median(offs)) if offs else None

    @staticmethod
    def _correct(out: WaitRead, correction: dict[int, tuple[int, int]]) -> None:
        """What was counted of a closed interval while it was open, taken off its thread's totals."""
        for tid, (state, ns) in correction.items():
            tt = out.threads.get(tid)
            if tt is None:
                continue
            sec = ns / 1e9
            if state == L.WF_ONCPU:
                tt.cpu = max(0.0, tt.cpu - sec)
            elif state == L.WF_RUNNABLE:
                tt.runq = max(0.0, tt.runq - sec)
            else:
                tt.blocked = max(0.0, tt.blocked - sec)

    def _read_last(self, tid: int, gen: int, key: tuple[int, int, int, int, int], ns: int, cnt: int,
                   lasts: dict[int, list]) -> None:
        """A thread's last wait as its entry holds it: what it gathered since the last read.  When
        another kind of wait has taken its place since (a new generation), the kernel has moved the
        one read before to wf_wait, whole: what was read of it then becomes a debt, taken off when
        that row is drained."""
        prev = self._last_wait.get(tid)
        if prev is not None and prev[0] == gen and prev[1] == key:
            dns, dcnt = max(0, ns - prev[2]), max(0, cnt - prev[3])
        else:
            if prev is not None and prev[3]:
                self._debt.setdefault(tid, []).append([prev[1], prev[2], prev[3]])
            dns, dcnt = ns, cnt
        self._last_wait[tid] = (gen, key, ns, cnt)
        if dns or dcnt:
            lasts[tid] = [L.WF_KIND_BLOCKED, *key, dns, dcnt]

    def _pay(self, tid: int, rows: list[list]) -> None:
        """Take a thread's debts off its drained rows of the same kind (what was already read of them)."""
        debts = self._debt.get(tid)
        if not debts:
            return
        for debt in debts:
            for r in rows:
                if debt[2] <= 0 or r[0] != L.WF_KIND_BLOCKED or tuple(r[1:6]) != debt[0]:
                    continue
                take_ns, take_cnt = min(r[6], debt[1]), min(r[7], debt[2])
                r[6] -= take_ns
                r[7] -= take_cnt
                debt[1] -= take_ns
                debt[2] -= take_cnt
        left = [d for d in debts if d[2] > 0]
        if left:
            self._debt[tid] = left[-8:]        # bounded: a debt whose row never came (an exit) is dropped
        else:
            del self._debt[tid]

    def _waits(self, out: WaitRead, correction: dict[int, tuple[int, int]],
               opens: list[tuple[int, int, int, int]], drained: tuple[bytes, bytes, int],
               lasts: dict[int, list]) -> None:
        """The waits that ended since the last read (drained from the kernel, and gathered in each
        thread's last wait), less what each thread's closed interval had already counted while
        open, and the still-open ones."""
        closed: dict[int, list[list]] = {}
        threads = out.threads
        kr, vr, _n = drained
        for (tid, kind, nr, fd, wtgid, wtid, ctx, _), (ns, cnt) in zip(
                L.WF_KEY.iter_unpack(kr), L.WF_VAL.iter_unpack(vr), strict=True):
            if tid in threads:
                rows = closed.get(tid)
                if rows is None:
                    rows = closed[tid] = []
                rows.append([kind, nr, fd, wtgid, wtid, ctx, ns, cnt])
        if self._debt:
            for tid, rows in closed.items():
                self._pay(tid, rows)
        for tid, row in lasts.items():
            if tid in threads:
                closed.setdefault(tid, []).append(row)
        blocked_kind, blocked_state = L.WF_KIND_BLOCKED, L.WF_BLOCKED
        new, append = tuple.__new__, out.waits.append          # Wait(...) without its argument binding
        for tid, rows in closed.items():
            fix = correction.get(tid)
            if fix is not None and fix[0] == blocked_state and fix[1] > 0:
                _spread(rows, fix[1])
            for kind, nr, fd, wtgid, wtid, ctx, ns, cnt in rows:
                if ns > 0 or cnt:
                    append(new(Wait, (tid, "blocked" if kind == blocked_kind else "runq", nr, fd, wtgid, wtid, ctx,
                                      ns / 1e9, cnt)))
        for tid, nr, fd, ns in opens:
            append(new(Wait, (tid, "open", nr, fd, 0, 0, 0, ns / 1e9, 0)))

    def close(self) -> None:
        """Follow nothing (the reader stays usable: a WorkloadWaits closing hands the maps back as they
        were); the slots' mappings go with this object."""
        with contextlib.suppress(OSError, BpfError):
            self.track(())


def _spread(rows: list[list], ns: int) -> None:
    """``ns`` counted while a blocked interval was open, taken off a thread's closed waits (the
    interval is one of them) in proportion to their seconds."""
    blocked = [r for r in rows if r[0] == L.WF_KIND_BLOCKED]
    total = sum(r[6] for r in blocked)
    if total > 0:
        for r in blocked:
            r[6] = max(0, r[6] - ns * r[6] // total)
