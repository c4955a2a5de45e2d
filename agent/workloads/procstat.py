"""Per-process and per-thread CPU evidence for the processes that use an accelerator, per tick.

For each followed process, every tick:

* ``/proc/PID/stat`` ``utime + stime`` (the whole thread group, exited threads included): the
  process's CPU over the tick, and ``num_threads``;
* when the process used at least ``busy_cores`` of a core over the tick (only then can one of its
  threads be pegged: a thread's share never exceeds its process's), its threads'
  ``/proc/PID/task/TID/schedstat`` — time on a CPU and time runnable on a run queue, both in ns:
  the busiest thread's share of a core, and run-queue wait over (run + wait);
* a single-threaded process: ``/proc/PID/schedstat`` is its one thread (exact, and cheap); it is
  also its CPU between stat reads (``stat_every``: its stat is read at one read in 5, staggered by
  PID, ~9 us against ~2.5 us for the schedstat here): a thread it starts is seen at its next stat
  read, at most 4 reads later, whose delta carries the CPU the schedstat reads did not count (the
  counter stays exact over time; only that tick's split moves).

``/proc/PID/stat`` sums its CPU over every thread of the process in the kernel: on a cold cache
(a tick after a 1 s sleep) it costs ~5 us for a single-threaded process and ~17 us for one with
64 threads here, so a **quiet** process (below ``quiet_cores`` at its last read) is read every
``quiet_every``-th tick only (5), staggered by PID, and no more than ``quiet_per_tick`` (12) of
them a tick — with more quiet processes than 5 x 12 each is read correspondingly rarer (128:
every 11th tick); in between it reports no new CPU (its next read carries the whole delta, so its
counter stays exact over time) and its last share.  A quiet process that wakes up is seen at its
next read, and from then on every tick.

A multi-threaded process below ``busy_cores`` is not split: its busiest thread is bounded by its
own share (``ProcSample.busiest`` is that bound, ``exact`` False) and only its main thread's wait is
read (``/proc/PID/schedstat``, one ``pread``: where a DataLoader worker decodes).  A busy process's threads are read in order of their last known CPU and only until the
process's CPU not yet accounted to a read thread cannot beat the busiest one (``_read_threads``).
Descriptors stay open between ticks and are read with ``pread`` from offset 0 (procfs
regenerates the text on such a read, as ``base.OpenFiles`` does); a descriptor of an exited
process or thread answers ``ESRCH``/``ENOENT`` and is closed (a quiet process not read this tick
leaves when the caller stops following it: the workloads worker sees exits every second).  A
reused PID cannot be mistaken for the old process: the kept descriptors belong to the old one.

Kernels without ``CONFIG_SCHED_INFO`` have no ``schedstat`` files: threads are then read from
``/proc/PID/task/TID/stat`` (10 ms resolution) and no wait is reported.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

CLK_TCK = float(os.sysconf("SC_CLK_TCK")) if hasattr(os, "sysconf") else 100.0


@dataclass(slots=True)
class ProcSample:
    """One process over one tick."""

    cpu: float            # CPU seconds over the tick (0 on the first read: a baseline, not a spike)
    interval: float       # seconds between this read and the previous one of this process
    busiest: float        # the busiest thread's share of a core (0..1); the process's share when not split
    exact: bool           # busiest read per thread (or the process has one thread)
    run_ns: int = 0       # over the threads read: time on a CPU ...
    wait_ns: int = 0      # ... and time runnable, waiting for one (schedstat run_delay)
    waited: bool = False  # run_ns / wait_ns were read this tick (schedstat of its threads)
    first: bool = False   # the process's first read: no interval yet
    skipped: bool = False  # a quiet process not read this tick: cpu 0 now (its next read has it all)


class _Thread:
    __slots__ = ("fd", "run", "wait", "t", "last")

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.run = -1
        self.wait = 0
        self.t = -1.0         # the process read this thread was last read with
        self.last = -1        # its CPU (ns) over the last tick it was read, -1 before any


class _Proc:
    __slots__ = ("pid", "fd", "ticks", "t", "tids", "tids_at", "threads", "leader", "share", "quiet", "skipped",
                 "single", "since_stat", "ns_since")

    def __init__(self, pid: int, fd: int) -> None:
        self.pid = pid
        self.fd = fd
        self.ticks = -1
        self.t = 0.0
        self.share = 0.0      # its share of a core over its last read interval
        self.quiet = False    # below quiet_cores at its last read: read every quiet_every-th tick
        self.tids: tuple[int, ...] = ()
        self.tids_at = -1e18      # when the thread list was last read (only for busy processes)
        self.threads: dict[int, _Thread] = {}
        self.leader: _Thread | None = None
        self.skipped = ProcSample(0.0, 0.0, 0.0, False, skipped=True)   # reused while it is quiet
        self.single = False       # one thread at its last stat read: its schedstat alone is its CPU
        self.since_stat = 0       # its reads since its last stat read
        self.ns_since = 0         # CPU (ns) counted from its schedstat since its last stat read


class ProcStats:
    """Reads the followed processes once per tick.  ``follow()`` and ``sample()`` run on the same
    thread (the tick's).  A busy process's threads are listed (``/proc/PID/task``) when it becomes
    busy and again every ``tids_every`` seconds while it stays busy; nobody else's are."""

    def __init__(self, proc: str = "/proc", *, busy_cores: float = 0.5, quiet_cores: float = 0.05,
                 quiet_every: int = 5, quiet_per_tick: int = 12, tids_every: float = 5.0, max_thread_fds: int = 2048,
                 stat_every: int = 5, clock: Callable[[], float] = time.monotonic) -> None:
        self.proc = proc
        self.stat_every = max(1, stat_every)
        self.busy_cores = busy_cores
        self.quiet_cores = quiet_cores
        self.quiet_every = max(1, quiet_every)
        self.quiet_per_tick = max(1, quiet_per_tick)
        self.tids_every = tids_every
        self._tick = 0
        self.max_thread_fds = max_thread_fds
        self.clock = clock
        self._procs: dict[int, _Proc] = {}
        self._thread_fds = 0
        self.schedstat = True     # False once a kernel without schedstat files is seen
        self.threads_read = 0     # threads read by the last sample() (for the benchmark and tests)
        self.processes_read = 0   # processes read by the last sample()

    # -- which processes -------------------------------------------------------------------------
    def follow(self, pids: Iterable[int]) -> None:
        """Follow exactly these processes (their descriptors are opened here, on the caller's thread)."""
        want = set(pids)
        for pid in [p for p in self._procs if p not in want]:
            self._drop(pid)
        for pid in want:
            if pid in self._procs:
                continue
            try:
                fd = os.open(f"{self.proc}/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                continue
            self._procs[pid] = _Proc(pid, fd)

    @property
    def pids(self) -> list[int]:
        return list(self._procs)

    def _drop(self, pid: int) -> None:
        p = self._procs.pop(pid, None)
        if p is None:
            return
        with contextlib.suppress(OSError):
            os.close(p.fd)
        for th in p.threads.values():
            self._close_thread(th)
        p.threads.clear()
        if p.leader is not None:
            self._close_thread(p.leader)
            p.leader = None

    def _close_thread(self, th: _Thread) -> None:
        if th.fd >= 0:
            with contextlib.suppress(OSError):
                os.close(th.fd)
            self._thread_fds -= 1
            th.fd = -1

    def close(self) -> None:
        for pid in list(self._procs):
            self._drop(pid)

    # -- the tick ------------------------------------------------------------------------------------
    def sample(self) -> dict[int, ProcSample]:
        """One read of every followed process: {pid: ProcSample}; a process that exited is dropped."""
        out: dict[int, ProcSample] = {}
        self.threads_read = self.processes_read = 0
        busy = self.busy_cores
        self._tick += 1
        quiet = sum(1 for p in self._procs.values() if p.quiet)
        # each quiet process every quiet_every-th tick, or rarer when that would read more than
        # quiet_per_tick of them a tick (128 quiet processes: every 11th tick)
        every = max(self.quiet_every, -(-quiet // self.quiet_per_tick)) if self.quiet_every > 1 else 1
        tick = self._tick
        stat_every = self.stat_every
        quiet_cores = self.quiet_cores
        pread = os.pread
        t = self.clock()        # one clock read for the tick's reads (they take a millisecond or two)
        for pid, p in list(self._procs.items()):
            if p.quiet and (tick + pid) % every:      # staggered: 1/every of the quiet ones per tick
                p.skipped.busiest = p.share
                out[pid] = p.skipped
                continue
            self.processes_read += 1
            if p.single and p.since_stat < stat_every - 1:
                # inline of _read_single (the hot path: most processes, most ticks)
                th = p.leader
                if th is not None and th.fd >= 0 and th.t == p.t:
                    try:
                        run_s, wait_s, _ = pread(th.fd, 128, 0).split(b" ", 2)
                        run, wait = int(run_s), int(wait_s)
                    except (OSError, ValueError):
                        pass        # gone, or unreadable: the stat read below decides
                    else:
                        d_run = run - th.run
                        if d_run < 0:
                            d_run = 0
                        d_wait = wait - th.wait
                        th.run, th.wait, th.t = run, wait, t
                        interval = t - p.t
                        p.t = t
                        p.since_stat += 1
                        p.ns_since += d_run
                        share = d_run / 1e9 / interval if interval > 0 else 0.0
                        p.share = share if share < 1.0 else 1.0
                        p.quiet = share < quiet_cores
                        out[pid] = ProcSample(d_run / 1e9, interval, p.share, True, d_run, d_wait if d_wait > 0 else 0,
                                              True)
                        continue
            try:
                data = os.pread(p.fd, 1024, 0)
                # fields after "(comm) ": state ppid pgrp session tty tpgid flags minflt cminflt
                # majflt cmajflt utime(11) stime(12) cutime cstime priority nice num_threads(17)
                f = data[data.rindex(b")") + 2:].split(b" ", 19)
                ticks = int(f[11]) + int(f[12])
                nthreads = int(f[17])
            except (OSError, ValueError, IndexError):
                self._drop(pid)
                continue
            first = p.ticks < 0
            prev_t = p.t
            interval = t - prev_t if not first else 0.0
            if first:
                cpu = 0.0
            else:
                # what its schedstat reads counted since the last stat read is in the counter already;
                # a surplus of theirs (stat's 10 ms grain) is carried to the next stat read
                ns = max(0, ticks - p.ticks) * (1e9 / CLK_TCK) - p.ns_since
                cpu = max(0.0, ns) / 1e9
                p.ns_since = -int(ns) if ns < 0 else 0
            p.ticks, p.t = ticks, t
            p.since_stat = pid % stat_every if first else 0
            p.single = nthreads <= 1 and self.schedstat
            share = cpu / interval if interval > 0 else 0.0
            p.share, p.quiet = min(1.0, share), not first and share < self.quiet_cores
            s = ProcSample(cpu, interval, p.share, nthreads <= 1, first=first)
            if nthreads <= 1:
                self._read_leader(p, s, prev_t, t)
            elif share >= busy:
                if t - p.tids_at > self.tids_every:   # threads come and go: listed again every few seconds
                    self._list_threads(p, t)
                self._read_threads(p, s, prev_t, t)
            else:
                # below busy_cores: its threads are not split, but its main thread's run-queue wait
                # is read (one pread): a DataLoader worker does its work there, and eight of them
                # confined to one core each use a sixth of it while waiting the rest
                self._read_leader(p, s, prev_t, t, single=False)
            out[pid] = s
        return out

    def _read_leader(self, p: _Proc, s: ProcSample, prev_t: float, t: float, single: bool = True) -> None:
        """A process's own schedstat (its main thread's): for a single-threaded process its one
        thread's run and wait (and busiest share); for another, the main thread's run and wait only
        (its busiest thread stays bounded by the process's share)."""
        if not self.schedstat:
            return
        th = p.leader
        if th is None:
            try:
                th = p.leader = _Thread(os.open(f"{self.proc}/{p.pid}/schedstat", os.O_RDONLY | os.O_CLOEXEC))
                self._thread_fds += 1
            except FileNotFoundError:
                if not os.path.exists(f"{self.proc}/self/schedstat"):
                    self.schedstat = False
                return
            except OSError:
                return
        got = self._read_schedstat(th, prev_t, t)
        if got is not None and s.interval > 0 and not s.first:
            s.run_ns, s.wait_ns = got
            s.waited = True
            if single:
                s.busiest = min(1.0, got[0] / 1e9 / s.interval)

    def _read_schedstat(self, th: _Thread, prev_t: float, t: float) -> tuple[int, int] | None:
        """(run, wait) ns since the previous tick; None on an error or when the thread was not read
        at the previous tick (its first read, or it was left unread then): a baseline."""
        try:
            run_s, wait_s, _ = os.pread(th.fd, 128, 0).split(b" ", 2)
            run, wait = int(run_s), int(wait_s)
        except (OSError, ValueError):
            self._close_thread(th)
            return None
        prev_run, prev_wait, prev_read = th.run, th.wait, th.t
        th.run, th.wait, th.t = run, wait, t
        if prev_run < 0 or prev_read != prev_t:
            return None
        return max(0, run - prev_run), max(0, wait - prev_wait)

    def _list_threads(self, p: _Proc, t: float) -> None:
        p.tids = tuple(list_tids(self.proc, p.pid))
        p.tids_at = t
        for tid in [x for x in p.threads if x not in p.tids]:
            self._close_thread(p.threads.pop(tid))

    def _read_threads(self, p: _Proc, s: ProcSample, prev_t: float, t: float) -> None:
        """The busiest thread, read in order of each thread's last known CPU: once the CPU of the
        process not yet accounted to a read thread (``/proc/PID/stat``'s delta minus theirs, with two
        clock ticks of slack for its 10 ms grain) cannot beat the busiest one read, the rest are left
        unread: a pegged feeder among 63 sleepers costs one or two reads, not 64.  A thread with no
        fresh baseline (new, or left unread last tick) gives no value this tick; when such threads
        leave the busiest undecided, it is reported as the unaccounted CPU, an upper bound."""
        proc, interval = self.proc, s.interval
        kind = "schedstat" if self.schedstat else "stat"
        best = run_sum = wait_sum = 0
        remaining = s.cpu * 1e9
        slack = 2e9 / CLK_TCK
        unknown = stopped = False
        threads = p.threads
        for tid in sorted(p.tids, key=lambda x: -threads[x].last if x in threads else 1):
            if best and remaining + slack <= best:
                stopped = True       # no unread thread can have run more than the busiest one read
                break
            th = threads.get(tid)
            if th is None or th.fd < 0:
                try:
                    fd = os.open(f"{proc}/{p.pid}/task/{tid}/{kind}", os.O_RDONLY | os.O_CLOEXEC)
                except FileNotFoundError:
                    if kind == "schedstat" and not os.path.exists(f"{proc}/self/schedstat"):
                        self.schedstat = False
                    threads.pop(tid, None)
                    continue
                except OSError:
                    continue
                th = threads[tid] = _Thread(fd)
                self._thread_fds += 1
            self.threads_read += 1
            got = (self._read_schedstat(th, prev_t, t) if kind == "schedstat"
                   else self._read_thread_stat(th, prev_t, t))
            if th.fd >= 0 and self._thread_fds > self.max_thread_fds:
                self._close_thread(th)     # over the budget of kept descriptors: open again next time
                threads.pop(tid, None)
            if got is None:
                unknown = True
                continue
            run, wait = got
            th.last = run
            run_sum += run
            wait_sum += wait
            remaining -= run
            if run > best:
                best = run
        if interval > 0 and (run_sum or not unknown):
            busiest = best / 1e9 / interval
            if unknown and not stopped:     # undecided: bounded by what no read thread accounts for
                busiest = max(busiest, min(s.busiest, max(0.0, remaining) / 1e9 / interval))
            s.busiest = min(1.0, busiest)
            s.exact = stopped or not unknown
            s.run_ns, s.wait_ns = run_sum, wait_sum
            s.waited = kind == "schedstat"

    def _read_thread_stat(self, th: _Thread, prev_t: float, t: float) -> tuple[int, int] | None:
        """No schedstat: a thread's utime + stime (clock ticks) as ns; no wait."""
        try:
            data = os.pread(th.fd, 1024, 0)
            f = data[data.rindex(b")") + 2:].split(b" ", 14)
            run = int((int(f[11]) + int(f[12])) * (1e9 / CLK_TCK))
        except (OSError, ValueError, IndexError):
            self._close_thread(th)
            return None
        prev, prev_read = th.run, th.t
        th.run, th.t = run, t
        return None if prev < 0 or prev_read != prev_t else (max(0, run - prev), 0)


def list_tids(proc: str, pid: int) -> list[int]:
    """The thread ids of a process (``/proc/PID/task``); empty when it is gone."""
    try:
        return [int(t) for t in os.listdir(f"{proc}/{pid}/task") if t.isdigit()]
    except OSError:
        return []
