"""The workloads collector's wait-for series: each workload's driving threads on each accelerator,
where their time went, and where the chain of waits from them ends (docs/waitfor.md).

``WorkloadWaits`` is driven by the workloads collector's tick: ``tick(accels, out)`` follows the
processes of every workload on every accelerator (and the producers the chain reached last tick,
at most ``max_followed``), reads the kernel's wait-for maps (``waitfor.WaitFor``) and the
accelerator API probes (``cudacalls``, when there), walks the chain (``waitchain.WaitChain``) and
appends, per accelerator and workload (labels: the accelerator's, ``namespace``, ``pod``,
``container``, ``workload``):

* ``triscope_workload_driver_threads{found_by}``: how many driving threads, found how;
* ``triscope_workload_driver_seconds_total{state}``: their time, first hop (``waitchain.STATES``);
* ``triscope_workload_wait_chain_seconds_total{cause, relation, culprit, culprit_namespace,
  culprit_pod, culprit_container, culprit_workload}``: their time followed to where it ends
  (``waitchain.CAUSES``); ``relation`` of the culprit to the workload: ``self`` (a driving
  thread), ``process`` (another thread of its process), ``workload`` (another process of its
  set, e.g. a DataLoader worker), ``pod`` (another container of its pod), ``other`` (another
  workload), ``kernel``, and for a network end ``inbound`` (the server's side of a connection:
  requests) or ``outbound`` (the client's side: an upstream); the ``top`` culprits of each tick
  by seconds, the rest summed per cause with empty culprit labels;
* ``triscope_workload_wait_connection_{retransmits,segments_sent,ooo_received,segments_received}_total{culprit}``:
  the counters of each network culprit's connection (its own socket's ``tcp_info``);
* ``triscope_workload_service_chain_seconds_total{cause, relation, culprit, ...}``: the request path:
  the time of its threads that waited for requests, once a request was in (their waits for requests
  left out), followed to where it ends (the two largest culprits, the rest per cause);
* ``triscope_workload_requests_wait_seconds_total``: its threads' time waiting for requests;
* ``triscope_workload_driver_waited_on_seconds_total``: its other threads' time waiting on its
  driving threads.

Every counter counts from when the agent began following its series; one not seen for
``keep_s`` is forgotten (and starts again at 0: a reset, which rates handle).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from triscope.agent.collectors.waitfor import WaitFor
from triscope.agent.workloads.attribution import WORKLOAD_LABELS, PodDir, ProcessInfo, Workload
from triscope.agent.workloads.sockdiag import Counters, listening_ports, tcp_counters, tcp_lookup
from triscope.agent.workloads.waitchain import Term, WaitChain, WorkloadChain
from triscope.agent.workloads.waitwhat import FdIndex, Irqs, Procs, SocketIndex, peer_key
from triscope.core.samples import Sample

log = logging.getLogger(__name__)

Labels = tuple[tuple[str, str], ...]
CULPRIT_LABELS = ("culprit_namespace", "culprit_pod", "culprit_container", "culprit_workload")
CONN_SERIES = ("triscope_workload_wait_connection_retransmits_total",
               "triscope_workload_wait_connection_segments_sent_total",
               "triscope_workload_wait_connection_ooo_received_total",
               "triscope_workload_wait_connection_segments_received_total")


class WorkloadWaits:
    """``waitfor``: the kernel maps' reader; ``api``: an object with ``track(tgids)`` and
    ``read() -> {tid: ApiTime}`` (``cudacalls.CudaCalls``) or None; ``tcp_keys``: the per-workload
    TCP reader's inode -> sock_diag key; ``pods``: the kubelet log tree; ``cpu_stat``: a process's
    cgroup ``cpu.stat``."""

    def __init__(self, waitfor: WaitFor, *, proc: str = "/proc", api: Any = None,
                 tcp_keys: Callable[[], Mapping[int, tuple[int, bytes]]] = dict,
                 pods: Callable[[], Mapping[str, PodDir] | None] = lambda: None,
                 cpu_stat: Callable[[ProcessInfo], tuple[str, str] | None] = lambda _i: None,
                 top: int = 3, max_followed: int = 32, keep_s: float = 600.0, read_every: float = 2.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.waitfor = waitfor
        self.api = api
        self.read_every = read_every
        self._next_read = 0.0
        self._last_accels: tuple[Any, ...] = ()
        self.top = top
        self.max_followed = max_followed
        self.keep_s = keep_s
        self.clock = clock
        self.procs = Procs(proc, pods, cpu_stat, clock=clock)
        self.sockets = SocketIndex(tcp_keys, dump=tcp_counters, listeners=listening_ports, lookup=tcp_lookup, proc=proc,
                                   clock=clock)
        self.chain = WaitChain(FdIndex(proc, clock=clock), self.sockets, Irqs(proc), self.procs,
                               lossy=self._lossy, clock=clock)
        self._followed: dict[int, float] = {}
        self._tracked: frozenset[int] = frozenset()
        # accelerator + workload labels -> (metric, further labels) -> [labels, value, last seen]
        self._counters: dict[Labels, dict[tuple[str, Labels], list[Any]]] = {}
        self._conn: dict[int, tuple[Counters, float]] = {}            # inode -> (counters, read at)
        self._conn_hist: dict[int, list[tuple[float, Counters]]] = {}
        self._conn_totals: dict[tuple[Labels, str], list[float]] = {}   # (workload, culprit) -> running totals
        self._threads: dict[Labels, tuple[float, str]] = {}               # workload -> driving threads, found by
        self._conn_seen: dict[int, Counters] = {}                         # inode -> its counters last counted
        self._next_conn = 0.0
        self.problem = ""
        # the API probes attach a library by a loader run (~1 s): done on a worker of its own, never
        # on the tick; a read finding the worker busy skips its probes that tick
        self._api_lock = threading.Lock()
        self._api_want: frozenset[int] | None = None
        self._api_wake = threading.Event()
        self._api_stop = False
        self._api_thread: threading.Thread | None = None

    # ------------------------------------------------------------------ the tick
    def tick(self, accels: Sequence[Any], out: list[Any]) -> None:
        """``accels``: the workloads collector's plan (``_Accel``: labels, groups, listed).  The maps
        are read and the chain walked every ``read_every`` seconds (the verdict reads 10 s windows of
        these counters); the ticks between publish the counters as they stand."""
        now = self.clock()
        if now < self._next_read and tuple(accels) == self._last_accels:
            self._publish(accels, now, out)
            return
        self._next_read = now + self.read_every
        self._last_accels = tuple(accels)
        pids = {p for a in accels for _wl, ps in a.groups for p in ps}
        for tg in self.chain.want_follow:
            self._followed[tg] = now
        for tg in [t for t, at in self._followed.items() if now - at > 60.0 or t in pids]:
            del self._followed[tg]
        if len(self._followed) > self.max_followed:
            keep = sorted(self._followed.items(), key=lambda kv: -kv[1])[: self.max_followed]
            self._followed = dict(keep)
        want = frozenset(pids) | frozenset(self._followed)
        if want != self._tracked:
            try:
                self.waitfor.track(want)
            except OSError as e:
                self._say(f"cannot follow the workloads' threads: {e}")
                return
            self._tracked = want
            if self.api is not None:
                self._api_track(frozenset(pids))
        try:
            read = self.waitfor.read()
        except OSError as e:
            self._say(f"cannot read the wait-for maps: {e}")
            return
        api: Mapping[int, Any] = {}
        if self.api is not None and self._api_lock.acquire(blocking=False):
            try:
                api = self.api.read()
            except Exception as e:  # noqa: BLE001 - the API probes are optional evidence
                log.debug("wait-for: accelerator API probes unreadable: %s", e)
            finally:
                self._api_lock.release()
        self.problem = ""
        self.chain.begin(read, api)
        self._read_connections(now)
        for acc in accels:
            listed = dict(getattr(acc, "listed", ()))
            for wl, ps in acc.groups:
                got = self.chain.workload((acc.labels, wl), listed.get(wl, ps[:1]), ps)
                if got is not None:
                    self._emit(acc.labels, wl, set(ps), got, now, out)
        self._forget(now)

    def _publish(self, accels: Sequence[Any], now: float, out: list[Any]) -> None:
        """Every series of these accelerators' workloads as it stands (a tick between reads)."""
        for acc in accels:
            for wl, _ps in acc.groups:
                base: Labels = (*acc.labels, *zip(WORKLOAD_LABELS, wl, strict=True))
                n = self._threads.get(base)
                if n is not None:
                    out.append(Sample("triscope_workload_driver_threads", n[0], {**dict(base), "found_by": n[1]}))
                for metric, st in self._counters.get(base, {}).items():
                    if now - st[2] < self.keep_s:
                        out.append(Sample(metric[0], float(st[1]), st[0], "counter"))

    def _api_track(self, pids: frozenset[int]) -> None:
        """Hand the accelerator processes to the API probes' worker (started on first use)."""
        self._api_want = pids
        self._api_wake.set()
        if self._api_thread is None:
            self._api_thread = threading.Thread(target=self._api_loop, name="accelerator-api", daemon=True)
            self._api_thread.start()

    def _api_loop(self) -> None:
        while not self._api_stop:
            self._api_wake.wait()
            self._api_wake.clear()
            want = self._api_want
            if self._api_stop or want is None:
                continue
            with self._api_lock:
                try:
                    self.api.track(want)
                except Exception as e:  # noqa: BLE001 - the worker never dies; the probes are optional
                    log.warning("wait-for: accelerator API probes: %s", e)

    def _say(self, why: str) -> None:
        if why != self.problem:
            log.warning("wait-for: %s", why)
        self.problem = why

    # ------------------------------------------------------------------ series
    def _emit(self, acc: Labels, wl: Workload, pids: set[int], c: WorkloadChain, now: float, out: list[Any]) -> None:
        base: Labels = (*acc, *zip(WORKLOAD_LABELS, wl, strict=True))
        self._threads[base] = (float(len(c.drivers)), c.found_by)
        out.append(Sample("triscope_workload_driver_threads", float(len(c.drivers)), {**dict(base), "found_by": c.found_by}))
        for state, sec in c.states.items():
            self._add("triscope_workload_driver_seconds_total", base, (("state", state),), sec, now)
        self._add("triscope_workload_requests_wait_seconds_total", base, (), c.requests_wait, now)
        self._add("triscope_workload_driver_waited_on_seconds_total", base, (), c.waited_on, now)
        drivers = set(c.drivers)
        driver_tgids = {t for t in (self.procs.tgid(d) for d in drivers) if t}
        for chain_metric, causes, keep in (("triscope_workload_service_chain_seconds_total", c.service, 2),
                                           ("triscope_workload_wait_chain_seconds_total", c.causes, self.top)):
            for extra, sec, inodes in self._ranked(causes, keep, wl, pids, drivers, driver_tgids):
                self._add(chain_metric, base, extra, sec, now)
                if inodes:
                    self._connections(inodes, dict(extra)["culprit"], base, now)
        for metric, st in self._counters.get(base, {}).items():
            if now - st[2] < self.keep_s:
                out.append(Sample(metric[0], float(st[1]), st[0], "counter"))

    def _ranked(self, causes: Mapping[Term, float], keep: int, wl: Workload, pids: set[int], drivers: set[int],
                driver_tgids: set[int]) -> list[tuple[Labels, float, set[int]]]:
        """The chain's ends as series labels: ends with the same labels merged (every connection to
        one upstream, every thread of one feeder), the ``keep`` largest by seconds, the rest summed per
        cause with empty culprit labels; with each, the sockets of its network ends."""
        merged: dict[Labels, list[Any]] = {}
        for term, sec in causes.items():
            extra = (("cause", term.cause), *self._culprit(term, wl, pids, drivers, driver_tgids))
            m = merged.setdefault(extra, [0.0, set()])
            m[0] += sec
            if term.cause == "network" and term.inode:
                m[1].add(term.inode)
        ranked = sorted(merged.items(), key=lambda kv: -kv[1][0])
        out: list[tuple[Labels, float, set[int]]] = [(extra, m[0], m[1]) for extra, m in ranked[:keep]]
        rest: dict[str, float] = {}
        for extra, m in ranked[keep:]:
            rest[extra[0][1]] = rest.get(extra[0][1], 0.0) + m[0]
        blank = (("relation", ""), ("culprit", ""), *((k, "") for k in CULPRIT_LABELS))
        out += [((("cause", cause), *blank), sec, set()) for cause, sec in rest.items()]
        return out

    def _connections(self, inodes: set[int], name: str, base: Labels, now: float) -> None:
        """A network culprit's connections' counters, summed under its name as running totals of
        each socket's increase (a connection per request comes and goes; its counts stay)."""
        tot = self._conn_totals.setdefault((base, name), [0.0, 0.0, 0.0, 0.0])
        for ino in inodes:
            got = self._conn.get(ino)
            if got is None:
                continue
            prev = self._conn_seen.get(ino, (0, 0, 0, 0))
            for i in range(4):
                tot[i] += max(0, got[0][i] - prev[i])
            self._conn_seen[ino] = got[0]
        for metric, v in zip(CONN_SERIES, tot, strict=True):
            self._set(metric, base, (("culprit", name),), v, now)

    def _culprit(self, term: Term, wl: Workload, pids: set[int], drivers: set[int],
                 driver_tgids: set[int]) -> tuple[tuple[str, str], ...]:
        if term.cause == "network":
            rel = "inbound" if term.inbound else "outbound"
            name = term.conn or "?"
            labels: Workload = ("", "", "", "")
        elif not term.tgid:
            rel, name, labels = "", "", ("", "", "", "")
        else:
            facts = self.procs.get(term.tgid)
            labels = facts.workload if facts is not None else ("", "", "", "")
            name = facts.comm if facts is not None else str(term.tgid)
            if term.tid in drivers:
                rel = "self"
                name = self.procs.thread_comm(term.tgid, term.tid) or name
            elif term.tgid in driver_tgids:
                rel = "process"
                name = self.procs.thread_comm(term.tgid, term.tid) or name
            elif term.tgid in pids:
                rel = "workload"
            elif facts is not None and facts.kernel:
                rel = "kernel"
            elif wl[1] and (labels[0], labels[1]) == (wl[0], wl[1]):
                rel = "pod"
            else:
                rel = "other"
        return (("relation", rel), ("culprit", name), *zip(CULPRIT_LABELS, labels, strict=True))

    def _state(self, metric: str, base: Labels, extra: Labels, now: float) -> list[Any]:
        """A series' [labels, value, last seen], kept under its accelerator and workload labels."""
        per = self._counters.setdefault(base, {})
        st = per.get((metric, extra))
        if st is None:
            st = per[(metric, extra)] = [dict(base + extra), 0.0, now]
        return st

    def _add(self, metric: str, base: Labels, extra: Labels, sec: float, now: float) -> None:
        st = self._state(metric, base, extra, now)
        st[1] += max(0.0, sec)
        st[2] = now

    def _set(self, metric: str, base: Labels, extra: Labels, value: float, now: float) -> None:
        st = self._state(metric, base, extra, now)
        st[1] = value
        st[2] = now

    def _forget(self, now: float) -> None:
        for ck in [ck for ck in self._conn_totals if ck[0] not in self._counters]:
            del self._conn_totals[ck]
        for base in list(self._counters):
            per = self._counters[base]
            for k in [k for k, st in per.items() if now - st[2] > self.keep_s]:
                del per[k]
            if not per:
                del self._counters[base]

    # ------------------------------------------------------------------ connections the chain ends on
    def _read_connections(self, now: float) -> None:
        """The counters of the TCP connections the last ticks' chains ended on, every 2 s (sock_diag
        exact lookups: the sockets asked for, not the host's tables)."""
        if now < self._next_conn:
            return
        self._next_conn = now + 2.0
        if self.chain._tick is None:
            return
        want, peers = self._connections_waited_on()
        if not want:
            return
        answered: dict[int, tuple[int, bytes]] = {}
        try:
            got = tcp_lookup({**want, **{-i: k for i, k in peers.items()}}, answered)
        except OSError as e:
            log.debug("wait-for: connection lookups failed: %s", e)
            return
        ends = {(k[0], k[1][:36]): ino for ino, k in answered.items()}
        for ino in want:
            c = got.get(ino)
            if c is None:
                continue
            pk = peers.get(ino)
            other = ends.get((pk[0], pk[1][:36])) if pk is not None else None
            if other is not None and other in got and other != ino:
                # its other end retransmitted to it: a loss on the way in, as out-of-order arrivals are
                c = (c[0], c[1], c[2] + got[other][0], c[3])
            self._conn[ino] = (c, now)
            hist = self._conn_hist.setdefault(ino, [])
            hist.append((now, c))
            while hist and now - hist[0][0] > 12.0:
                hist.pop(0)
        for ino in [i for i, (_c, at) in self._conn.items() if now - at > 60.0]:
            self._conn.pop(ino, None)
            self._conn_hist.pop(ino, None)
            self._conn_seen.pop(ino, None)

    def _connections_waited_on(self) -> tuple[dict[int, tuple[int, bytes]], dict[int, tuple[int, bytes]]]:
        """The TCP connections the traced threads blocked on this tick (inode -> sock_diag key), and,
        for those over loopback, their other end's key (inode -> the peer's key)."""
        tk = self.chain._tick
        assert tk is not None
        want: dict[int, tuple[int, bytes]] = {}
        peers: dict[int, tuple[int, bytes]] = {}
        for tid, t in tk.threads.items():
            for w in tk.waits.get(tid, ()):
                if w.fd < 0 or w.kind == "runq":
                    continue
                fd = self.chain.fds.get(t.tgid, w.fd)
                if fd.kind != "socket" or not fd.inode or fd.inode in want or self.sockets.is_listener(fd.inode):
                    continue
                s = self.sockets.get(fd.inode, holder=(t.tgid, w.fd))
                if s is not None and s.key is not None:
                    want[fd.inode] = s.key
                    if s.loopback:
                        peers[fd.inode] = peer_key(s.key)
        return want, peers

    def _lossy(self, inode: int) -> bool:
        """Does this connection lose packets: at least two losses (its retransmits, or segments it
        received after a loss) making at least 1 % of its segments, between its reads of the last
        ~10 s; read once only, over its life so far (a connection the chain meets for the first time
        is judged at once).  One stray retransmit (a SYN under load) is not a lossy path."""
        hist = self._conn_hist.get(inode)
        if not hist:
            return False
        b = hist[-1][1]
        a = hist[0][1] if len(hist) >= 2 else (0, 0, 0, 0)
        lost = (b[0] - a[0]) + (b[2] - a[2])
        segs = (b[1] - a[1]) + (b[3] - a[3])
        return lost >= 2 and lost >= 0.01 * max(segs, 1)

    def close(self) -> None:
        self._api_stop = True
        self._api_wake.set()
        if self._api_thread is not None:
            self._api_thread.join(timeout=5.0)
        if self.api is not None:
            with contextlib.suppress(Exception):
                self.api.close()
        self.chain.close()
        with contextlib.suppress(Exception):
            self.waitfor.close()
