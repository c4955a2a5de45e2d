"""From an accelerator's driving thread along what it waits on, to where the waiting ends.

Each tick (docs/waitfor.md):

1. **The driving threads** of each workload on each accelerator: the threads of its processes on
   the accelerator that called the accelerator's driver API (uprobes on ``libcuda``: sync, copies),
   kept as driving for ``driver_ttl`` seconds (a thread that waits on a feeder for five seconds
   makes no call meanwhile); without those probes, the threads that blocked on the accelerator's
   device node; else the process's main thread.  ``found_by`` says which.
2. **Where their time went, first hop** (``STATES``): on a CPU doing their own work; runnable
   without a CPU; waiting on the accelerator (blocked in its driver, woken by its IRQ, or inside a
   synchronisation call — CUDA's default sync spins, so that CPU time is the accelerator's); inside
   host-to-device copies from pageable or pinned memory; blocked on a lock, on IPC, on a network
   socket, on disk, sleeping; other.
3. **The chain**: a wait ended by another task is replaced by what that task's time went to in the
   same tick, followed up to ``max_depth`` hops (cycles dropped: a loader worker waiting for the
   main thread to ask for more is not what the main thread waits on).  A loopback TCP connection
   is followed to the process holding its other end unless it lost packets lately (a feeder over
   127.0.0.1 is a producer; a lossy connection is the network).  The ends (``CAUSES``): a thread
   working on a CPU (whose: the culprit), runnable without one (``cpu_throttled`` for the share of
   CFS periods its cgroup was throttled in), the accelerator, copies, a network connection (the
   culprit: its remote end, inbound or outbound), a timer, disk, a producer not followed yet
   (``producer``: followed from the next tick), other.
4. **Demand**: seconds the workload's threads waited for requests (blocked on the server's side of
   a connection or on a listener) and seconds its other threads waited on its driving threads.

This module measures; it decides nothing.  ``analysis/verdict.py`` reads the series.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from triscope.agent.collectors.waitfor import ThreadTime, Wait, WaitRead
from triscope.agent.ebpf import layout as L
from triscope.agent.workloads.processset import CgroupCpu
from triscope.agent.workloads.waitwhat import (
    ACCEPT_SYSCALLS,
    CHILD_SYSCALLS,
    FUTEX_SYSCALLS,
    IO_SYSCALLS,
    SLEEP_SYSCALLS,
    FdIndex,
    Irqs,
    Procs,
    Sock,
    SocketIndex,
)

log = logging.getLogger(__name__)

STATES = ("cpu", "cpu_wait", "accelerator", "copy_pageable", "copy_pinned", "lock", "ipc", "network", "disk",
          "timer", "other")
CAUSES = ("cpu", "cpu_wait", "cpu_throttled", "accelerator", "copy_pageable", "copy_pinned", "network", "timer",
          "disk", "producer", "other")
_NET_VECS = (2, 3)          # net_tx, net_rx
_TIMER_VECS = (1, 8)        # timer, hrtimer
_BLOCK_VEC = 4


class ApiTime(Protocol):
    """One thread's time inside the accelerator's driver API since the last read (``cudacalls.ApiTime``)."""

    calls: int
    sync_seconds: float
    sync_open: bool
    h2d_pageable_seconds: float
    h2d_pinned_seconds: float
    d2h_seconds: float


@dataclass(frozen=True, slots=True)
class Term:
    """Where (part of) a driving thread's time ended up."""

    cause: str
    tid: int = 0
    tgid: int = 0
    conn: str = ""            # network: the remote end ("ip:port", "listener", "?")
    inbound: bool = False
    inode: int = 0


@dataclass(frozen=True, slots=True)
class _Follow:
    tid: int
    tgid: int


@dataclass(frozen=True, slots=True)
class _FollowProc:
    """The other end of a loopback connection whose client we are: the process serving us."""

    tgid: int
    conn: Term | None = None       # the connection itself: where the wait ends if the server shows nothing


Target = Term | _Follow | _FollowProc


@dataclass(slots=True)
class WorkloadChain:
    """One workload on one accelerator, this tick (seconds)."""

    drivers: tuple[int, ...] = ()
    found_by: str = ""
    states: dict[str, float] = field(default_factory=dict)
    causes: dict[Term, float] = field(default_factory=dict)
    requests_wait: float = 0.0
    waited_on: float = 0.0
    # the request path: the workload's threads that waited for requests this tick (intake, handlers),
    # their time once a request is in (their waits for requests left out), followed as the chain is
    service: dict[Term, float] = field(default_factory=dict)


@dataclass(slots=True)
class _Tick:
    threads: dict[int, ThreadTime]
    waits: dict[int, list[Wait]]
    api: Mapping[int, Any]
    memo: dict[tuple[int, bool], dict[Term, float]] = field(default_factory=dict)
    busy: set[int] = field(default_factory=set)
    parts: dict[int, list[tuple[float, str, Target]]] = field(default_factory=dict)
    by_tgid: dict[int, list[ThreadTime]] = field(default_factory=dict)


class WaitChain:
    """``fds``/``sockets``/``irqs``/``procs``: the lookups of ``waitwhat``; ``lossy``: inode -> did
    that TCP connection lose packets lately (retransmits or out-of-order arrivals)."""

    def __init__(self, fds: FdIndex, sockets: SocketIndex, irqs: Irqs, procs: Procs, *,
                 lossy: Callable[[int], bool] = lambda _ino: False, max_depth: int = 4, driver_ttl: float = 30.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.fds = fds
        self.sockets = sockets
        self.irqs = irqs
        self.procs = procs
        self.lossy = lossy
        self.max_depth = max_depth
        self.driver_ttl = driver_ttl
        self.clock = clock
        self.want_follow: set[int] = set()      # processes the chain reached but nobody tracks yet
        self._drivers: dict[tuple[Any, Any], dict[int, tuple[float, str]]] = {}
        self._carry: dict[tuple[int, int, int], tuple[Target, float]] = {}   # an open wait's last known end
        self._cfs: dict[str, CgroupCpu] = {}
        self._cfs_prev: dict[str, tuple[int, int]] = {}
        self._throttle: dict[str, float] = {}
        self._tick: _Tick | None = None

    # ------------------------------------------------------------------ per tick
    def begin(self, read: WaitRead, api: Mapping[int, Any] | None = None) -> None:
        waits: dict[int, list[Wait]] = {}
        for w in read.waits:
            waits.setdefault(w.tid, []).append(w)
        self._tick = _Tick(read.threads, waits, api or {})
        for t in read.threads.values():
            self._tick.by_tgid.setdefault(t.tgid, []).append(t)
        self._throttle.clear()
        self.want_follow = set()
        now = self.clock()
        for k in [k for k, (_t, at) in self._carry.items() if now - at > 120.0]:
            del self._carry[k]

    def workload(self, key: tuple[Any, Any], listed: Sequence[int], pids: Iterable[int]) -> WorkloadChain | None:
        """One workload (``key``: accelerator and workload) on one accelerator: ``listed`` its
        processes on the accelerator, ``pids`` its whole process set.  None: nothing of it traced."""
        tk = self._tick
        if tk is None:
            return None
        threads = [t for p in set(pids) for t in tk.by_tgid.get(p, ())]
        if not threads:
            return None
        drivers, found_by = self._driving(key, set(listed), threads)
        out = WorkloadChain(tuple(sorted(drivers)), found_by)
        for tid in drivers:
            t = tk.threads.get(tid)
            if t is None:
                continue
            total = t.cpu + t.runq + t.blocked
            for sec, state, _target in self._parts(tid):
                out.states[state] = out.states.get(state, 0.0) + sec
            for term, share in self._resolve(tid, 0).items():
                out.causes[term] = out.causes.get(term, 0.0) + share * total
        self._split_throttled(out)
        dset = set(drivers)
        intake: list[ThreadTime] = []
        for t in threads:
            waited = False
            for w in tk.waits.get(t.tid, ()):
                if w.kind == "runq":
                    continue
                if t.tid not in dset and w.waker_tid in dset and w.kind == "blocked":
                    out.waited_on += w.seconds
                if self._is_request_wait(t.tgid, w):
                    out.requests_wait += w.seconds
                    waited = True
            if waited and t.tid not in dset:
                intake.append(t)
        for t in intake:
            self._service(t, out)
        return out

    def _service(self, t: ThreadTime, out: WorkloadChain) -> None:
        """One intake or handler thread's time once a request is in: its parts less its waits for
        requests, each followed to where it ends, into ``out.service``."""
        tk = self._tick
        assert tk is not None
        for sec, _state, target in self._parts(t.tid):
            if sec <= 0 or (isinstance(target, Term) and target.cause == "network" and target.inbound):
                continue
            if isinstance(target, Term):
                out.service[target] = out.service.get(target, 0.0) + sec
                continue
            for term, share in self._follow(target, 0).items():
                if term.cause == "network" and term.inbound:
                    continue          # reached a wait for requests further on: demand, not service
                out.service[term] = out.service.get(term, 0.0) + sec * share

    # ------------------------------------------------------------------ driving threads
    def _driving(self, key: tuple[Any, Any], listed: set[int], threads: list[ThreadTime]) -> tuple[set[int], str]:
        tk = self._tick
        assert tk is not None
        now = self.clock()
        known = self._drivers.setdefault(key, {})
        live = {t.tid for t in threads}
        for tid in [x for x, (at, _how) in known.items() if now - at > self.driver_ttl or x not in live]:
            del known[tid]
        for t in threads:
            if t.tgid not in listed:
                continue
            a = tk.api.get(t.tid)
            if a is not None and (getattr(a, "calls", 0) > 0 or getattr(a, "sync_open", False)):
                known[t.tid] = (now, "driver_calls")
        if not any(how == "driver_calls" for _at, how in known.values()):
            for t in threads:
                if t.tgid in listed and t.cpu > 0 and self._waits_on_device(t) \
                        and not self.procs.thread_comm(t.tgid, t.tid).startswith("cuda"):
                    known[t.tid] = (now, "driver_waits")
        if known:
            hows = {how for _at, how in known.values()}
            how = "driver_calls" if "driver_calls" in hows else "driver_waits"
            return {tid for tid, (_at, h) in known.items() if h == how}, how
        mains = {t.tid for t in threads if t.tid == t.tgid and t.tgid in listed}
        return mains, "main_thread"

    def _waits_on_device(self, t: ThreadTime) -> bool:
        tk = self._tick
        assert tk is not None
        for w in tk.waits.get(t.tid, ()):
            if w.kind != "runq" and w.fd >= 0 and self.fds.get(t.tgid, w.fd).kind == "accel":
                return True
        return False

    # ------------------------------------------------------------------ one thread's parts
    def _parts(self, tid: int) -> list[tuple[float, str, Target]]:
        """(seconds, first-hop state, where it goes) for one thread this tick."""
        tk = self._tick
        assert tk is not None
        got = tk.parts.get(tid)
        if got is not None:
            return got
        t = tk.threads[tid]
        out: list[tuple[float, str, Target]] = []
        accel_blocked = 0.0
        for w in tk.waits.get(tid, ()):
            if w.kind == "runq":
                continue
            state, target = self._classify(t, w)
            if w.kind == "blocked" and w.seconds > 0 and isinstance(target, (_Follow, _FollowProc)):
                # who ended this kind of wait: what an open one, or one that timed out, waits for
                self._carry[(tid, w.nr, w.fd)] = (target, self.clock())
            if state == "accelerator":
                accel_blocked += w.seconds
            out.append((w.seconds, state, target))
        cpu = t.cpu
        a = tk.api.get(tid)
        if a is not None:
            accel = max(0.0, getattr(a, "sync_seconds", 0.0) + getattr(a, "d2h_seconds", 0.0) - accel_blocked)
            pageable = getattr(a, "h2d_pageable_seconds", 0.0)
            pinned = getattr(a, "h2d_pinned_seconds", 0.0)
            inside = accel + pageable + pinned
            scale = min(1.0, cpu / inside) if inside > 0 else 0.0    # inside a call but not on a CPU: counted there
            for sec, state, cause in ((accel, "accelerator", "accelerator"), (pageable, "copy_pageable", "copy_pageable"),
                                      (pinned, "copy_pinned", "copy_pinned")):
                if sec * scale > 0:
                    out.append((sec * scale, state, Term(cause, tid, t.tgid)))
            cpu -= inside * scale
        if cpu > 0:
            out.append((cpu, "cpu", Term("cpu", tid, t.tgid)))
        if t.runq > 0:
            out.append((t.runq, "cpu_wait", Term("cpu_wait", tid, t.tgid)))
        tk.parts[tid] = out
        return out

    def _classify(self, t: ThreadTime, w: Wait) -> tuple[str, Target]:
        """A blocked (or still open) wait: what it blocked in (the first-hop state) and where it goes."""
        nr, tid, tgid = w.nr, t.tid, t.tgid
        if nr in SLEEP_SYSCALLS:
            return "timer", Term("timer", tid, tgid)
        fd = self.fds.get(tgid, w.fd) if w.fd >= 0 else None
        kind, detail = w.ctx >> 24, w.ctx & 0xFFFFFF
        if (fd is not None and fd.kind == "accel") or (kind == L.WF_CTX_HARDIRQ and self.irqs.kind(detail) == "accel"):
            return "accelerator", Term("accelerator", tid, tgid)
        if (fd is not None and fd.kind == "file") or nr in IO_SYSCALLS or (kind == L.WF_CTX_SOFTIRQ and detail == _BLOCK_VEC) \
                or (kind == L.WF_CTX_HARDIRQ and self.irqs.kind(detail) == "disk"):
            return "disk", Term("disk", tid, tgid)
        sock = self._socket_of(tgid, fd, w.fd) if fd is not None else None
        if sock is not None:
            # the client's side of a loopback connection whose other end serves it (a feeder over
            # 127.0.0.1) is followed there; the server's side waits for requests: demand, not a producer
            if sock.loopback and not sock.inbound and not self.lossy(sock.inode):
                peer = self.sockets.peer_owner(sock, lambda: sorted({x.tgid for x in self._tick.threads.values()})
                                               if self._tick else [])
                conn = Term("network", conn=sock.remote, inbound=sock.inbound, inode=sock.inode)
                if peer and peer != tgid:
                    return "network", _FollowProc(peer, conn)
                return "network", conn
            return "network", Term("network", conn=sock.remote, inbound=sock.inbound, inode=sock.inode)
        if nr in ACCEPT_SYSCALLS or (fd is not None and fd.kind == "socket" and self.sockets.is_listener(fd.inode)) \
                or (fd is not None and fd.kind == "epoll" and self._loop_waits_for_requests(tgid, fd, w)):
            return "network", Term("network", conn="listener", inbound=True)
        net_woken = kind == L.WF_CTX_SOFTIRQ and detail in _NET_VECS
        if fd is not None and fd.kind in ("socket", "epoll") and net_woken:
            return "network", Term("network", conn="?")
        if nr in FUTEX_SYSCALLS:
            state = "lock"
        elif (fd is not None and fd.kind in ("pipe", "eventfd", "socket", "epoll")) or nr in CHILD_SYSCALLS:
            state = "ipc"
        else:
            state = "other"
        return state, self._ended_by(t, w, state)

    def _socket_of(self, tgid: int, fd: Any, fdnum: int = -1) -> Sock | None:
        if fd.kind == "socket" and fd.inode:
            return self.sockets.get(fd.inode, holder=(tgid, fdnum) if fdnum >= 0 else None)
        if fd.kind == "epoll":
            found = [s for m in fd.members[:16] if (mf := self.fds.get(tgid, m)).kind == "socket"
                     and not self.sockets.is_listener(mf.inode)
                     and (s := self.sockets.get(mf.inode, allow_dump=False, holder=(tgid, m))) is not None]
            if len(found) == 1:
                return found[0]
        return None

    def _ended_by(self, t: ThreadTime, w: Wait, state: str) -> Target:
        if w.kind == "open":
            prev = self._carry.get((t.tid, w.nr, w.fd))
            return prev[0] if prev is not None else Term("other")
        kind, detail = w.ctx >> 24, w.ctx & 0xFFFFFF
        timed_out = kind == L.WF_CTX_HRTIMER or (kind == L.WF_CTX_SOFTIRQ and detail in _TIMER_VECS)
        if timed_out:
            # a wait (not a sleep: those are timers already) that ran out its timeout waited for
            # whoever usually ends it: a feeder too slow to answer within it is still the feeder
            prev = self._carry.get((t.tid, w.nr, w.fd))
            return prev[0] if prev is not None else Term("timer", t.tid, t.tgid)
        if kind == L.WF_CTX_SOFTIRQ:
            if detail in _NET_VECS:
                return Term("network", conn="?")
            return Term("other")
        if kind == L.WF_CTX_HARDIRQ:
            k = self.irqs.kind(detail)
            return Term("accelerator", t.tid, t.tgid) if k == "accel" else Term("disk", t.tid, t.tgid) \
                if k == "disk" else Term("other")
        if kind or not w.waker_tgid:
            return Term("other")        # no wakeup seen, or the idle task
        facts = self.procs.get(w.waker_tgid)
        if facts is not None and facts.kernel:
            return Term("other", w.waker_tid, w.waker_tgid)
        return _Follow(w.waker_tid, w.waker_tgid)

    # ------------------------------------------------------------------ the chain
    def _resolve(self, tid: int, depth: int, serving: bool = False) -> dict[Term, float]:
        """Shares (summing to 1, or empty) of where one thread's time ends up.  ``serving``: the
        thread is a server we are the client of (the other end of a loopback connection): its waits
        for requests are waits for us, left out."""
        tk = self._tick
        assert tk is not None
        got = tk.memo.get((tid, serving))
        if got is not None:
            return got
        tk.busy.add(tid)
        acc: dict[Term, float] = {}
        total = 0.0
        for sec, _state, target in self._parts(tid):
            if sec <= 0 or (serving and isinstance(target, Term) and target.cause == "network" and target.inbound):
                continue
            if isinstance(target, Term):
                acc[target] = acc.get(target, 0.0) + sec
                total += sec
                continue
            for term, share in self._follow(target, depth).items():
                acc[term] = acc.get(term, 0.0) + sec * share
            total += sec
        tk.busy.discard(tid)
        out = {k: v / total for k, v in acc.items()} if total > 0 else {}
        tk.memo[(tid, serving)] = out
        return out

    def _follow(self, target: _Follow | _FollowProc, depth: int) -> dict[Term, float]:
        """Where a wait ended by another task (or served by another process) goes: that task's own
        time, shares summing to 1; the producer itself when it is not traced (followed from the next
        tick), too deep, or shows nothing; nothing for a cycle (a producer waiting on its consumer)."""
        tk = self._tick
        assert tk is not None
        serving = isinstance(target, _FollowProc)
        nxt = self._next_thread(target)
        if nxt is None:
            if target.tgid not in tk.by_tgid:
                self.want_follow.add(target.tgid)
            if isinstance(target, _FollowProc) and target.conn is not None:
                return {target.conn: 1.0}
            return {Term("producer", target.tid if isinstance(target, _Follow) else 0, target.tgid): 1.0}
        if nxt in tk.busy:
            return {}
        if depth + 1 >= self.max_depth:
            return {Term("producer", nxt, tk.threads[nxt].tgid): 1.0}
        sub = self._resolve(nxt, depth + 1, serving)
        if not sub:         # nothing of it traced this tick, or (a server) all its time waiting for us
            if isinstance(target, _FollowProc) and target.conn is not None:
                return {target.conn: 1.0}
            return {Term("producer", nxt, tk.threads[nxt].tgid): 1.0}
        return sub

    def _next_thread(self, target: _Follow | _FollowProc) -> int | None:
        """The traced thread a wait continues into: the waker itself, or the busiest thread of the
        process at the other end of a loopback connection; None when it is not traced."""
        tk = self._tick
        assert tk is not None
        if isinstance(target, _Follow):
            return target.tid if target.tid in tk.threads else None
        best, who = -1.0, None
        for t in tk.by_tgid.get(target.tgid, ()):
            if t.cpu + t.runq > best:
                best, who = t.cpu + t.runq, t.tid
        return who

    def _split_throttled(self, out: WorkloadChain) -> None:
        """A culprit's runnable time in the share of CFS periods its cgroup was throttled in is
        ``cpu_throttled``: held at its CPU limit, not waiting behind other tasks."""
        for term in [t for t in out.causes if t.cause == "cpu_wait" and t.tgid]:
            share = self._throttled_share(term.tgid)
            if share > 0:
                sec = out.causes.pop(term)
                held = Term("cpu_throttled", term.tid, term.tgid)
                out.causes[held] = out.causes.get(held, 0.0) + sec * share
                if share < 1:
                    out.causes[term] = sec * (1 - share)

    def _throttled_share(self, tgid: int) -> float:
        facts = self.procs.get(tgid)
        where = facts.cpu_stat if facts is not None else None
        if where is None:
            return 0.0
        path, kind = where
        if path in self._throttle:
            return self._throttle[path]
        reader = self._cfs.get(path)
        if reader is None:
            try:
                reader = self._cfs[path] = CgroupCpu(path, kind)
            except OSError:
                self._throttle[path] = 0.0
                return 0.0
        got = reader.read()
        share = 0.0
        if got is not None:
            prev = self._cfs_prev.get(path)
            self._cfs_prev[path] = (got[0], got[1])
            if prev is not None and got[0] > prev[0]:
                share = min(1.0, max(0.0, (got[1] - prev[1]) / (got[0] - prev[0])))
        self._throttle[path] = share
        return share

    def _is_request_wait(self, tgid: int, w: Wait) -> bool:
        if w.nr in ACCEPT_SYSCALLS:
            return True
        if w.fd < 0:
            return False
        fd = self.fds.get(tgid, w.fd)
        if fd.kind == "epoll":
            return self._loop_waits_for_requests(tgid, fd, w)
        if fd.kind != "socket":
            return False
        if self.sockets.is_listener(fd.inode):
            return True
        s = self.sockets.get(fd.inode, allow_dump=False)
        return s is not None and s.inbound

    def _loop_waits_for_requests(self, tgid: int, fd: Any, w: Wait) -> bool:
        """An event loop's wait (asyncio, uvicorn, an aio gRPC server: one epoll set for every
        connection) is a wait for requests when the set watches the server's side only (a listener
        or inbound connections; its own wake-up pipes and Unix sockets aside) and no thread of its
        own process ended it (a worker handing a result back to the loop is waited on, not demand).
        A set that also watches an outbound connection may be waiting on a dependency: not read as
        demand."""
        if w.kind == "blocked" and w.waker_tgid == tgid:
            return False
        serving = False
        for m in fd.members[:16]:
            mf = self.fds.get(tgid, m)
            if mf.kind != "socket" or not mf.inode:
                continue
            if self.sockets.is_listener(mf.inode):
                serving = True
                continue
            s = self.sockets.get(mf.inode, allow_dump=False, holder=(tgid, m))
            if s is None:
                continue          # not TCP: the loop's self-pipe (a Unix socket pair)
            if not s.inbound:
                return False
            serving = True
        return serving

    def close(self) -> None:
        for c in self._cfs.values():
            c.close()
        self._cfs.clear()
