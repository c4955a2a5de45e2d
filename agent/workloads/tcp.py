"""Each workload's own TCP: segments its sockets retransmitted and sent, and packets that reached
them out of order (a loss on the way in) over the data segments they received.

Node-wide retransmits say that some connection on the node loses packets, not whose: a lossy
stream of a process that never touches a GPU must not make a GPU service ``network-bound``, and a
low-rate service losing 10 % of its own packets retransmits too few segments to move a node-wide
rate.  So the loss is read per workload, two ways by where its processes run:

* **the agent's own network namespace** (processes off Kubernetes, ``hostNetwork`` pods): the
  ``tcp_info`` counters of the sockets each process holds (``/proc/PID/fd``), from sock_diag.  The
  whole table (``sockdiag.tcp_counters``: one netlink dump for both address families, whose cost
  hardly depends on the socket count: the kernel walks every bucket of its established hash, ~1 ms
  with 24 GiB of memory and more with more) is read only when a process is new or holds a socket
  no read has seen yet (a socket that turns out not to be TCP, or a listener, is remembered as such:
  it asks for the table once).  Otherwise each known TCP socket is asked for alone
  (``sockdiag.tcp_lookup``: a hash lookup by its addresses, checked against its cookie; 0.10 ms for
  a workload's 16 sockets against 0.90 ms for the table: bench/RESULTS.md, "workloads tcp"), and
  the table is read instead when those answers cannot be.  A socket's counters are summed as
  deltas between reads: one first seen in a process already read counts whole (it was opened since),
  one of a process read for the first time is a baseline.  A socket that opens and closes between
  two reads is not seen.
* **a namespace of its own** (a pod): the namespace's totals (``/proc/PID/net/snmp``
  ``RetransSegs`` / ``OutSegs``) are its pod's sockets: exact, and one file read.

Cost is kept off the tick: the workloads worker calls ``read`` every ``every`` seconds (5); a
process's descriptors are listed at once when it is new, and then (where more than 4 processes are
followed) at most every ``fds_every`` seconds (15), staggered, and only when its count of
descriptors changed (``/proc/PID/fd``'s size), a socket of its last listing is gone, or 120 s
passed: a socket opened in place of another non-socket descriptor is seen within 120 s, counted
whole from then.  ``counters(workload)`` gives the running totals the tick publishes.

**A CPU budget, whatever the socket count.**  Each read measures its own thread CPU and the next
waits until that cost is at most ``cpu_budget`` of a core (0.2 %): a workload holding 10,000
sockets cost 170-240 ms a read (10,000 descriptors listed, 10,000 exact lookups), 3.3-3.6 % of a
core every 5 s.  Now the read asks the whole table when that is cheaper than the lookups (measured:
each lookup's cost per socket against the last dump's whole cost, ~10 µs a socket against ~4 µs
a table socket), a process whose last listing took over 2 ms is listed again only on the
staggered ``fds_every`` round, and what remains is spread out: such a workload's counters are
read every 5-20 s instead of every 5 s, its new sockets seen within ~20-30 s instead of ~15 s
(docs/workloads.md).  A workload of a few dozen sockets costs ~0.1 ms a read and keeps its 5 s.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from triscope.agent.workloads.sockdiag import (
    Counters,
    SockDiagError,
    SockKey,
    netns_id,
    netns_tcp_totals,
    socket_inodes,
    tcp_counters,
    tcp_lookup,
)

log = logging.getLogger(__name__)


CPU_BUDGET = 0.002
"""The share of a core the per-workload TCP read may take, on average over its reads (0.4 % until
issue 46: with 64 busy workloads, 2,048 connections and ~4,200 sockets on the host a read costs
~13 ms, the dump, plus the staggered listings, and at 0.4 % it was every 5 s, half the agent's CPU)."""
FDS_MAX_S = 120.0
"""The longest a costly process goes without its descriptors listed (a socket handed to it by another)."""
SMALL_LISTING_S = 0.002
"""A process whose descriptors list within this is listed at every read where few processes are followed."""


@dataclass(slots=True)
class _Proc:
    netns: int | None
    inodes: set[int]
    listed_at: float
    list_s: float = 0.0      # thread CPU of its last listing
    nfds: int = 0            # its open descriptors at that listing (/proc/PID/fd's size; 0: not given)
    stale: bool = False      # a socket of its last listing is gone: listed again at the next read


def _fd_count(proc: str, pid: int) -> int:
    """A process's open descriptors, the size ``/proc/PID/fd`` reports (Linux 6.2+; 0 before, or gone)."""
    try:
        return os.stat(f"{proc}/{pid}/fd").st_size
    except OSError:
        return 0


class WorkloadTcp:
    """Per-workload TCP counters.  ``read(groups)`` with ``groups``: workload key -> its processes."""

    def __init__(self, proc: str = "/proc", *, every: float = 5.0, fds_every: float = 15.0,
                 clock: Callable[[], float] = time.monotonic,
                 dump: Callable[..., dict[int, Counters]] = tcp_counters,
                 lookup: Callable[[Mapping[int, SockKey]], dict[int, Counters]] = tcp_lookup,
                 cpu_budget: float = CPU_BUDGET) -> None:
        self.proc = proc
        self.every = every
        self.cpu_budget = cpu_budget
        self.last_cost = 0.0                                # thread CPU of the last read (s)
        self._dump_s = 0.0                                  # thread CPU of the last whole-table read
        self._lookup_s = 10e-6                              # thread CPU per socket of the last lookups
        self._table: set[int] | None = None                 # every inode in the last whole-table read
        self._table_grew = True                             # ... one the read before had not: a new socket
        self.fds_every = fds_every
        self.clock = clock
        self.dump = dump
        self.lookup = lookup
        self.full_reads = 0                                 # whole-table dumps so far (tests, the benchmark)
        self._keys: dict[int, SockKey] = {}                 # inode -> its exact-lookup key (the workloads' sockets)
        self._other: set[int] = set()                       # workloads' sockets a whole-table read gave no key:
                                                            # not TCP (UNIX, UDP, netlink) or a listener
        self.next_due = 0.0
        self.problem = ""                       # why sock_diag cannot be read here ("" when it can)
        self._own_ns = netns_id(proc, os.getpid())
        self._procs: dict[int, _Proc] = {}
        self._sockets: dict[int, Counters] = {}            # inode -> counters at the last read
        self._ns_last: dict[int, Counters] = {}            # foreign netns -> totals at the last read
        self._totals: dict[object, list[int]] = {}         # workload -> [retransmits, segments, ooo, data in]

    def due(self) -> bool:
        return self.clock() >= self.next_due

    def counters(self, workload: object) -> Counters | None:
        t = self._totals.get(workload)
        return None if t is None else (t[0], t[1], t[2], t[3])

    def read(self, groups: Mapping[Any, Sequence[int]]) -> None:
        now = self.clock()
        self.next_due = now + self.every
        c0 = time.thread_time()
        try:
            self._read(groups, now)
        finally:
            # the next read waits until this one's cost is within the budget
            self.last_cost = time.thread_time() - c0
            if self.cpu_budget > 0:
                self.next_due = now + max(self.every, self.last_cost / self.cpu_budget)

    def _read(self, groups: Mapping[Any, Sequence[int]], now: float) -> None:
        alive: set[int] = set()
        host: dict[object, list[int]] = {}
        foreign: dict[int, tuple[int, list[object]]] = {}      # netns -> (a pid in it, workloads)
        for wl, pids in groups.items():
            self._totals.setdefault(wl, [0, 0, 0, 0])
            for pid in pids:
                alive.add(pid)
                self._sort(wl, pid, host, foreign)
        for pid in [p for p in self._procs if p not in alive]:
            del self._procs[pid]
        if host:
            self._read_host(host, now)
        for ns, (pid, wls) in foreign.items():
            self._read_foreign(ns, pid, wls)
        for ns in [n for n in self._ns_last if n not in foreign]:
            del self._ns_last[ns]
        for wl in [w for w in self._totals if w not in groups]:
            del self._totals[wl]

    def _sort(self, wl: object, pid: int, host: dict[object, list[int]],
              foreign: dict[int, tuple[int, list[object]]]) -> None:
        """Put a workload's process with the agent's network namespace (``host``) or under its own
        (``foreign``: one pid per namespace to read it through); a process whose namespace is
        unreadable is left out."""
        p = self._procs.get(pid)
        if p is None:
            p = self._procs[pid] = _Proc(netns_id(self.proc, pid), set(), -1e18)
        if p.netns is None:
            return
        if p.netns == self._own_ns or self._own_ns is None:
            host.setdefault(wl, []).append(pid)
        else:
            entry = foreign.setdefault(p.netns, (pid, []))
            if wl not in entry[1]:
                entry[1].append(wl)

    def _read_foreign(self, ns: int, pid: int, wls: list[object]) -> None:
        """A namespace of its own: its TCP totals' increase since the last read, to each workload in it."""
        got = netns_tcp_totals(self.proc, pid)
        if got is None:
            return
        prev = self._ns_last.get(ns)
        self._ns_last[ns] = got
        if prev is None:
            return
        d = [max(0, got[i] - prev[i]) for i in range(4)]
        for wl in wls:
            t = self._totals[wl]
            for i in range(4):
                t[i] += d[i]

    def _read_host(self, host: dict[object, list[int]], now: float) -> None:
        listed, baseline, firsts = self._list_fds(host, now)
        socks = self._socket_counters(set().union(*listed.values()) if listed else set(), bool(firsts))
        if socks is None:
            for p in firsts:            # their baseline was not read: they are new again next time
                p.listed_at = -1e18
            return
        # a listed socket no answer has (closed, or its lookup missed): its process is listed again
        # at the next read (a connection replaced by another keeps the count of descriptors)
        answered, other = socks.keys(), self._other
        for pids in host.values():
            for pid in pids:
                p = self._procs[pid]
                if not p.stale and any(i not in answered and i not in other for i in p.inodes):
                    p.stale = True
        seen: set[int] = set()
        for wl, mine in listed.items():
            t = self._totals[wl]
            for ino in mine - seen:     # a socket two workloads hold counts for the first one only
                c = socks.get(ino)
                if c is None:
                    continue
                prev = self._sockets.get(ino)
                if prev is not None:
                    if prev == c:       # most sockets of a large set: nothing moved
                        continue
                    for i in range(4):
                        t[i] += max(0, c[i] - prev[i])
                elif ino not in baseline:   # opened since the last listing: its whole life counts
                    for i in range(4):
                        t[i] += c[i]
            seen |= mine
        # a socket still held but not answered this time (a lookup it missed) keeps its last
        # counters, so that its next answer counts only what is new
        old = self._sockets
        self._sockets = {ino: socks[ino] if ino in socks else old[ino] for ino in seen if ino in socks or ino in old}

    def _list_fds(self, host: dict[object, list[int]], now: float) -> tuple[dict[object, set[int]], set[int], list[_Proc]]:
        """Each workload's socket inodes; the sockets of processes listed for the first time (a
        baseline, not counted); those processes."""
        n_all = sum(len(v) for v in host.values())
        listed: dict[object, set[int]] = {}
        baseline: set[int] = set()
        firsts: list[_Proc] = []
        for wl, pids in host.items():
            mine = listed[wl] = set()
            for pid in pids:
                p = self._procs[pid]
                first = p.listed_at < -1e17
                # descriptors listed again every fds_every seconds, staggered by PID; new ones at once
                # (every read where few are followed).  A process whose listing is costly (thousands of
                # sockets) is listed only when its count of descriptors changed (or, where the kernel
                # does not give it, when the last whole-table read held a socket new since the one
                # before), and at least every FDS_MAX_S: a socket it opened is then counted whole
                # from its first listing, later, not lost.
                # Where more are followed, every process is listed again only when its count of
                # descriptors changed, a socket of its last listing is gone, or FDS_MAX_S passed
                # (issue 46: 64 workloads' listings were 40 % of a read).
                costly = p.list_s >= SMALL_LISTING_S
                if first or p.stale or (n_all <= 4 and not costly) or (
                        now - p.listed_at >= self.fds_every * (1.0 + (pid % 7) / 14.0)
                        and (self._changed(pid, p) or now - p.listed_at >= FDS_MAX_S)):
                    c0 = time.thread_time()
                    nfds = _fd_count(self.proc, pid)
                    got = socket_inodes(self.proc, pid)
                    if got is None:
                        continue
                    if first:
                        baseline |= got
                        firsts.append(p)
                    p.inodes, p.listed_at, p.list_s, p.nfds = got, now, time.thread_time() - c0, nfds
                    p.stale = False
                mine |= p.inodes
        return listed, baseline, firsts

    def _changed(self, pid: int, p: _Proc) -> bool:
        """Whether a costly process may hold a socket its last listing did not."""
        n = _fd_count(self.proc, pid)
        return n != p.nfds if n and p.nfds else self._table_grew

    def _socket_counters(self, wanted: set[int], new_process: bool) -> dict[int, Counters] | None:
        """The counters of the sockets in ``wanted``: the whole table when a process is new or holds
        a socket no read has seen yet (at most once per socket: one that is not TCP, or a listener,
        is remembered as such), otherwise each known TCP socket asked for alone.  None when
        sock_diag cannot be asked (said once)."""
        self._other &= wanted
        try:
            socks = None
            ask = {ino: self._keys[ino] for ino in wanted if ino in self._keys}
            # each socket asked for alone, unless the whole table costs less (thousands of sockets)
            if not new_process and not wanted - self._keys.keys() - self._other and \
                    len(ask) * self._lookup_s < max(self._dump_s, 1e-3):
                c0 = time.thread_time()
                try:
                    socks = self.lookup(ask)
                except OSError as e:            # the answers could not be read (ENOBUFS): the table instead
                    log.debug("workloads: sock_diag lookups failed (%s): reading the whole table", e)
                else:
                    if len(ask) >= 16:
                        self._lookup_s = (time.thread_time() - c0) / len(ask)
                    for ino in [i for i in self._keys if i not in socks]:
                        del self._keys[ino]     # closed (or its addresses reused): no longer asked for
            if socks is None:
                keys: dict[int, SockKey] = {}
                table: set[int] = set()
                c0 = time.thread_time()
                socks = self.dump(keys=keys, wanted=wanted, table=table)
                self._dump_s = time.thread_time() - c0
                self._table_grew = self._table is None or not table <= self._table
                self._table = table
                self._keys = {ino: keys[ino] for ino in wanted if ino in keys}
                self._other = wanted - keys.keys()
                self.full_reads += 1
        except (SockDiagError, OSError) as e:
            if not self.problem:
                log.warning("workloads: no per-workload TCP evidence in the agent's network namespace: %s", e)
            self.problem = str(e) or type(e).__name__
            return None
        self.problem = ""
        return socks
