"""Kernel probes (eBPF): TCP retransmits, DMA mappings, IOMMU, PCIe AER.

Construction compiles and attaches the probes in a short-lived child process (``triscope.agent.ebpf.loader``)
and keeps only the file descriptors: this process never imports bcc or LLVM.  ``collect()`` reads
the in-kernel counters with a few ``bpf()`` syscalls and drains the rare-event ring buffer.

``attached[probe]`` / ``reasons[probe]`` say which probes run and why the others do not; the agent
switches the procfs retransmit counter off only while ``attached["tcp_retransmit"]`` is true.
"""

from __future__ import annotations

import contextlib
import logging
import os
import struct
import time
from collections.abc import Iterable
from typing import Any

from triscope.agent.collectors.base import Availability, BaseCollector
from triscope.agent.collectors.waitfor import WaitFor
from triscope.agent.ebpf import layout as L
from triscope.agent.ebpf.bpfsys import BpfError, BpfMap, Counters, RingBuffer, possible_cpus, sum_u64_percpu
from triscope.agent.ebpf.decode import cstr, decode_peer, decode_rare
from triscope.agent.ebpf.discover import (
    DEFAULT_BCC_PATH,
    HINT_BCC,
    HINT_PERM,
    HINT_TRACEFS,
    ProbePlan,
    bpf_privileges,
    classify_error,
    defines_for,
    ensure_tracefs,
    plan_probes,
)
from triscope.agent.ebpf.loader import LoadResult, run_loader
from triscope.core.samples import EventRecord, Sample

log = logging.getLogger(__name__)


def _unplanned_reason(p: ProbePlan, tracefs: str | None, why: str) -> tuple[str, str]:
    """Why a probe was not planned, and its hint: its own reason when tracefs was found, else why
    tracefs was not."""
    if tracefs:
        return p.reason, p.hint
    if why.startswith("no permission"):
        return why, HINT_PERM
    return f"no tracefs ({why})", HINT_TRACEFS

RARE_PROBES = {"iommu_page_fault": L.C_LOST_IOMMU_FAULT, "aer": L.C_LOST_AER}
MAX_EVENTS_PER_TICK = 200
DMA_REREAD_TICKS = 60   # the DMA hashes are read at least this often, moved or not


class EbpfCollector(BaseCollector):
    """Counts in the kernel, reads once per tick.

    Parameters: ``probes`` (names from ``triscope.agent.ebpf.layout.PROBES``; default all), ``bcc_path``
    (where Debian's python3-bpfcc lives; only the loader child puts it on ``sys.path``),
    ``python`` (interpreter for the child), ``tracefs`` (default: found, mounted when missing and
    ``mount_tracefs``), ``burst_threshold`` (retransmits in one tick that make a
    ``retransmit_burst`` event with the top peers), ``top_peers``, ``per_peer_series`` (export
    ``triscope_tcp_retransmits_by_peer_total``; off by default for cardinality).
    """

    name = "ebpf"

    def __init__(self, *, probes: Iterable[str] | None = None, bcc_path: str | None = DEFAULT_BCC_PATH,
                 python: str | None = None, tracefs: str | None = None, mount_tracefs: bool = True,
                 burst_threshold: int = 100, top_peers: int = 5, per_peer_series: bool = False,
                 load_timeout: float = 60.0, env: dict[str, str] | None = None, start: bool = True,
                 selftest_pid: int | None = None, counters_rows: bool = True) -> None:
        self.probe_names = [p.name for p in L.PROBES if probes is None or p.name in set(probes)]
        self.bcc_path = bcc_path
        self.python = python
        self.tracefs = tracefs
        self.mount_tracefs = mount_tracefs
        self.burst_threshold = burst_threshold
        self.top_peers = top_peers
        self.per_peer_series = per_peer_series
        self.load_timeout = load_timeout
        self.env = env
        self.selftest_pid = selftest_pid   # tests: getppid() of this pid feeds the DMA and ring paths
        self.counters_rows = counters_rows  # counters mapped into memory (5.5+); else a per-CPU array
        self.attached: dict[str, bool] = {n: False for n in self.probe_names}
        self.reasons: dict[str, str] = {n: "not started" for n in self.probe_names}
        self.hints: dict[str, str] = {n: "" for n in self.probe_names}
        self.tracepoints: dict[str, list[str]] = {n: [] for n in self.probe_names}
        self.attach_seconds: float | None = None
        self.timings: dict[str, float] = {}
        self.fatal = ""
        self.extra_attached: dict[str, list[str]] = {}
        self._load: LoadResult | None = None
        self._maps: dict[str, BpfMap] = {}
        self._counters: Counters | None = None
        self._ring: RingBuffer | None = None
        self._started = False
        self._ncpus = 0
        # state between ticks
        self._prev_retrans = 0
        self._prev_ts: float | None = None
        self._peer_prev: dict[bytes, int] = {}
        self._peer_totals: dict[str, int] = {}
        self._devnames: dict[int, str] = {}
        self._dma_seen = -1                       # C_DMA_EVENTS when the DMA hashes were last read
        self._dma_ticks = 0
        self._dma_out: list[Sample] = []          # and the samples they gave
        self._states_seen: set[int] = set()
        self.waitfor: WaitFor | None = None       # the wait-for maps' reader, when that probe attached
        self._fault_by_dev: dict[str, int] = {}
        self._aer_by_dev: dict[tuple[str, str], int] = {}
        if start:
            self.start()

    # ------------------------------------------------------------------------------ start / stop
    def start(self) -> None:
        if self._started:
            return
        self._started = True
        t0 = time.monotonic()
        tracefs = self.tracefs
        why = "ok"
        if tracefs is None:
            tracefs, why = ensure_tracefs(self.mount_tracefs)
        plans = plan_probes(tracefs, set(self.probe_names))
        for p in plans:
            if not p.ok:
                self.reasons[p.spec.name], self.hints[p.spec.name] = _unplanned_reason(p, tracefs, why)
        attach = [a for p in plans if p.ok for a in p.attach_entries()]
        allowed, why_not = bpf_privileges()
        if attach and not allowed:
            self._explain_planned(plans, why_not, HINT_PERM)
            attach = []
        defines = defines_for(plans)
        if self.selftest_pid is not None and attach:
            defines += ["WANT_SELFTEST", f"SELFTEST_PID={self.selftest_pid}", f"SELFTEST_NR={_getppid_nr()}"]
            attach.append({"probe": "selftest", "tp": "raw_syscalls:sys_enter", "kind": "raw", "fn": "on_selftest"})
        if attach:
            self._attach(plans, defines, attach)
        self.attach_seconds = time.monotonic() - t0
        for name in self.probe_names:
            if not self.attached[name]:
                log.warning("eBPF probe %s is off: %s%s", name, self.reasons[name],
                            f" — {self.hints[name]}" if self.hints[name] else "")
        n = sum(self.attached.values())
        log.info("eBPF: %d/%d probes attached in %.2f s", n, len(self.probe_names), self.attach_seconds)

    def _explain_planned(self, plans: list[ProbePlan], reason: str, hint: str) -> None:
        """The same reason for every probe that was planned (it could have attached)."""
        for p in plans:
            if p.ok:
                self.reasons[p.spec.name], self.hints[p.spec.name] = reason, hint

    def _run_loader(self, defines: list[str], attach: list[dict[str, str]]) -> LoadResult:
        res = run_loader(defines, attach, python=self.python, bcc_path=self.bcc_path,
                         timeout=self.load_timeout, env=self.env, counters_rows=self.counters_rows)
        if res.fatal == "compile" and self.counters_rows and "counters" in res.error:
            # a kernel before 5.5 refuses the mmapable counters map: the per-CPU array instead
            log.info("eBPF: mmapable counters refused (%s); using a per-CPU array",
                     (res.error.strip().splitlines() or ["?"])[0][:200])
            self.counters_rows = False
            res = run_loader(defines, attach, python=self.python, bcc_path=self.bcc_path,
                             timeout=self.load_timeout, env=self.env, counters_rows=False)
        return res

    def _attach(self, plans: list[ProbePlan], defines: list[str], attach: list[dict[str, str]]) -> None:
        """Load and attach in the loader child; then each probe's outcome and the maps."""
        res = self._run_loader(defines, attach)
        self._load = res
        self.timings = res.timings
        if res.fatal:
            self.fatal = res.fatal
            if res.fatal == "bcc":
                first = res.error.strip().splitlines()[0] if res.error.strip() else ""
                reason, hint = f"BCC missing ({first})", HINT_BCC
            else:
                reason, hint = classify_error(res.error)
            self._explain_planned(plans, reason, hint)
            return
        by_probe: dict[str, list[Any]] = {}
        for a in res.attachments:
            by_probe.setdefault(a.probe, []).append(a)
        for name, atts in by_probe.items():
            if name not in self.attached:   # the test hook
                self.extra_attached[name] = [a.error or "ok" for a in atts]
            else:
                self._record_attachments(name, atts)
        try:
            self._open_maps(res)
        except (BpfError, OSError) as e:
            log.error("eBPF maps unreadable: %s", e)
            for name in self.probe_names:
                if self.attached[name]:
                    self.attached[name] = False
                    self.reasons[name] = f"maps unreadable: {e}"
            res.close()

    def _record_attachments(self, name: str, atts: list[Any]) -> None:
        """One probe's tracepoints: attached (and which failed), or why none did."""
        ok = [a.tracepoint for a in atts if a.ok]
        self.tracepoints[name] = ok
        self.attached[name] = bool(ok)
        if ok:
            bad = [f"{a.tracepoint}: {a.error}" for a in atts if not a.ok]
            self.reasons[name] = "attached to " + ", ".join(ok) + (f" (failed: {'; '.join(bad)})" if bad else "")
            self.hints[name] = ""
            return
        err = "; ".join(a.error for a in atts)
        reason, hint = classify_error(err)
        if "failed to load bpf program" in err.lower() and os.geteuid() == 0:
            reason, hint = f"rejected by the kernel: {err[:300]}", "see the verifier log in the agent's stderr"
        self.reasons[name], self.hints[name] = reason, hint

    def _open_maps(self, res: LoadResult) -> None:
        self._ncpus = possible_cpus()
        for name, fd in list(res.maps.items()):
            if name == "rare_events":
                self._ring = RingBuffer(fd)
            elif name == "counters":
                self._counters = Counters(fd, L.N_COUNTERS, self._ncpus)
            else:
                self._maps[name] = BpfMap(fd, self._ncpus)
            del res.maps[name]
        wf = L.WF_MAPS
        if self.attached.get("waitfor") and all(m in self._maps for m in wf):
            counters = self._counters
            self.waitfor = WaitFor({m: self._maps[m] for m in (*wf, *L.WF_MAPS_OPTIONAL) if m in self._maps},
                                   lost=(lambda: counters.read()[L.C_WF_LOST]) if counters is not None else None)

    def close(self) -> None:
        if self.waitfor is not None:
            with contextlib.suppress(OSError, BpfError):
                self.waitfor.close()
            self.waitfor = None
        for m in self._maps.values():
            with contextlib.suppress(OSError):
                m.close()
        self._maps.clear()
        if self._counters is not None:
            with contextlib.suppress(OSError):
                self._counters.close()
            self._counters = None
        if self._ring is not None:
            with contextlib.suppress(OSError):
                self._ring.close()
            self._ring = None
        if self._load is not None:
            self._load.close()   # closing the attachment fds detaches the programs
            self._load = None
        for n in self.attached:
            if self.attached[n]:
                self.attached[n] = False
                self.reasons[n] = "closed"

    # ------------------------------------------------------------------------------ protocol
    def check(self) -> Availability:
        self.start()
        n = sum(self.attached.values())
        if n:
            off = [k for k, v in self.attached.items() if not v]
            return Availability(True, f"{n}/{len(self.attached)} probes attached" + (f" (off: {', '.join(off)})" if off else ""))
        reasons = sorted(set(self.reasons.values()))
        hints = sorted({h for h in self.hints.values() if h})
        return Availability(False, "no eBPF probe attached: " + "; ".join(reasons), "; ".join(hints))

    def status(self) -> list[tuple[str, bool, str, str]]:
        """(probe, attached, reason, hint) per probe, for ``triscope doctor``."""

        return [(n, self.attached[n], self.reasons[n], self.hints[n]) for n in self.probe_names]

    def collect(self, now: float) -> list[Sample | EventRecord]:
        self.start()
        out: list[Sample | EventRecord] = [
            Sample("triscope_probe_attached", 1.0 if self.attached[n] else 0.0, {"probe": n}) for n in self.probe_names
        ]
        if self._counters is None:
            return out
        c = self._counters.read()
        self._collect_tcp(now, c, out)
        self._collect_dma(c, out)
        if self.attached.get("dma_map_sg"):
            # maps of more entries than one event carries (128): how many, and the bytes estimated
            # past them from full_ents (already inside triscope_dma_map_bytes_total)
            out.append(Sample("triscope_dma_map_sg_truncated_total", float(c[L.C_DMA_SG_TRUNCATED]), {}, "counter"))
            out.append(Sample("triscope_dma_map_sg_estimated_bytes_total", float(c[L.C_DMA_SG_ESTIMATED_BYTES]), {},
                              "counter"))
        self._collect_iommu_aer(c, out)
        return out

    # ------------------------------------------------------------------------------ readers
    def _read_peers(self) -> dict[bytes, int]:
        m = self._maps.get("tcp_peers")
        if m is None:
            return {}
        return {k: struct.unpack_from("<Q", v)[0] for k, v in m.items()}

    def _collect_tcp(self, now: float, c: list[int], out: list[Sample | EventRecord]) -> None:
        skb_on = self.attached.get("tcp_retransmit", False)
        syn_on = self.attached.get("tcp_retransmit_synack", False)
        if not (skb_on or syn_on):
            return
        total = c[L.C_TCP_SKB] + c[L.C_TCP_SYNACK]
        out.append(Sample("triscope_tcp_retransmits_total", float(total), {}, "counter"))
        if syn_on:
            out.append(Sample("triscope_tcp_synack_retransmits_total", float(c[L.C_TCP_SYNACK]), {}, "counter"))
        for st in range(16):
            if c[L.C_TCP_STATE + st]:
                self._states_seen.add(st)
        for st in sorted(self._states_seen):
            out.append(Sample("triscope_tcp_retransmits_by_state_total", float(c[L.C_TCP_STATE + st]),
                              {"state": L.TCP_STATES.get(st, str(st))}, "counter"))
        delta = total - self._prev_retrans
        interval = (now - self._prev_ts) if self._prev_ts is not None else None
        self._prev_retrans = total
        self._prev_ts = now
        if delta <= 0 and not self.per_peer_series:
            return
        cur = self._read_peers()
        peer_delta: dict[str, int] = {}
        for k, n in cur.items():
            d = n - self._peer_prev.get(k, 0)
            if d < 0:          # evicted from the LRU and seen again
                d = n
            if d > 0:
                p = decode_peer(k)
                peer_delta[p] = peer_delta.get(p, 0) + d
        self._peer_prev = cur
        for p, d in peer_delta.items():
            self._peer_totals[p] = self._peer_totals.get(p, 0) + d
        if self.per_peer_series:
            for p, n in self._peer_totals.items():
                out.append(Sample("triscope_tcp_retransmits_by_peer_total", float(n), {"peer": p}, "counter"))
        if delta >= self.burst_threshold:
            top = sorted(peer_delta.items(), key=lambda kv: (-kv[1], kv[0]))[: self.top_peers]
            lead = f"; top peer {top[0][0]} ({top[0][1]})" if top else ""
            out.append(EventRecord(
                "retransmit_burst",
                f"{delta} TCP retransmits in one tick{lead}",
                "warning",
                {"retransmits": delta, "threshold": self.burst_threshold,
                 "interval_s": round(interval, 3) if interval else None,
                 "top_peers": [{"peer": p, "retransmits": n} for p, n in top]},
            ))

    def _collect_dma(self, c: list[int], out: list[Sample | EventRecord]) -> None:
        self._dma_ticks += 1
        # no DMA event since the last read: same values.  Every DMA_REREAD_TICKS ticks the hashes
        # are read anyway (a CPU that orders stores loosely may show the count before the update)
        if c[L.C_DMA_EVENTS] == self._dma_seen and self._dma_ticks % DMA_REREAD_TICKS:
            out.extend(self._dma_out)
            return
        self._dma_seen = c[L.C_DMA_EVENTS]
        start = len(out)
        self._read_dma(out)
        self._dma_out = [s for s in out[start:] if isinstance(s, Sample)]

    def _read_dma(self, out: list[Sample | EventRecord]) -> None:
        agg: dict[tuple[str, int, int], list[int]] = {}
        m = self._maps.get("dma_stats")
        if m is not None:
            rows = m.items()
            if any(L.DMA_KEY.unpack(k)[0] not in self._devnames for k, _ in rows):
                devs = self._maps.get("dma_devs")
                if devs is not None:
                    for k, v in devs.items():
                        self._devnames[struct.unpack("<Q", k)[0]] = cstr(v) or "unknown"
            for k, v in rows:
                dev, d, op = L.DMA_KEY.unpack(k)
                cnt, nbytes = sum_u64_percpu(m, v, 2)
                a = agg.setdefault((self._devnames.get(dev, "unknown"), d, op), [0, 0])
                a[0] += cnt
                a[1] += nbytes
        m = self._maps.get("dma_named")
        if m is not None:
            for k, v in m.items():
                name, d, op = L.DMA_NAMED_KEY.unpack(k)
                cnt, nbytes = sum_u64_percpu(m, v, 2)
                a = agg.setdefault((cstr(name) or "unknown", d, op), [0, 0])
                a[0] += cnt
                a[1] += nbytes
        errors: dict[str, int] = {}
        for (dev, d, op), (cnt, nbytes) in sorted(agg.items()):
            labels = {"device": dev, "direction": L.DMA_DIRECTIONS.get(d, str(d))}
            if op == 0:
                out.append(Sample("triscope_dma_map_total", float(cnt), labels, "counter"))
                out.append(Sample("triscope_dma_map_bytes_total", float(nbytes), labels, "counter"))
            elif op == 1:
                out.append(Sample("triscope_dma_unmap_total", float(cnt), labels, "counter"))
                out.append(Sample("triscope_dma_unmap_bytes_total", float(nbytes), labels, "counter"))
            else:
                errors[dev] = errors.get(dev, 0) + cnt
        for dev, cnt in sorted(errors.items()):
            out.append(Sample("triscope_dma_map_errors_total", float(cnt), {"device": dev}, "counter"))

    def _collect_iommu_aer(self, c: list[int], out: list[Sample | EventRecord]) -> None:
        if self.attached.get("iommu_map"):
            out.append(Sample("triscope_iommu_map_bytes_total", float(c[L.C_IOMMU_MAP_BYTES]), {"device": "all"}, "counter"))
        if self.attached.get("iommu_unmap"):
            out.append(Sample("triscope_iommu_unmap_bytes_total", float(c[L.C_IOMMU_UNMAP_BYTES]), {"device": "all"}, "counter"))
        self._drain_rare(out)
        for probe, slot in RARE_PROBES.items():
            if self.attached.get(probe):
                out.append(Sample("triscope_probe_lost_events_total", float(c[slot]), {"probe": probe}, "counter"))
        if self.attached.get("iommu_page_fault"):
            by_dev = dict(self._fault_by_dev)
            if c[L.C_LOST_IOMMU_FAULT]:      # counted in the kernel, record lost: device unknown
                by_dev["unknown"] = by_dev.get("unknown", 0) + c[L.C_LOST_IOMMU_FAULT]
            for dev, n in sorted(by_dev.items()):
                out.append(Sample("triscope_iommu_page_faults_total", float(n), {"device": dev}, "counter"))
        if self.attached.get("aer"):
            by_key = dict(self._aer_by_dev)
            if c[L.C_LOST_AER]:
                by_key[("unknown", "unknown")] = by_key.get(("unknown", "unknown"), 0) + c[L.C_LOST_AER]
            for (dev, sev), n in sorted(by_key.items()):
                out.append(Sample("triscope_pcie_aer_errors_total", float(n), {"device": dev, "severity": sev}, "counter"))


    def _drain_rare(self, out: list[Sample | EventRecord]) -> None:
        """The ring buffer's rare events (IOMMU faults, AER): counted per device, and the first
        ``MAX_EVENTS_PER_TICK`` of them kept as events."""
        if self._ring is None:
            return
        emitted = 0
        for raw in self._ring.drain():
            ev = decode_rare(raw)
            if ev is None:
                continue
            d = ev["details"]
            if ev["kind"] == "iommu_fault":
                self._fault_by_dev[d["device"]] = self._fault_by_dev.get(d["device"], 0) + 1
            else:
                key = (d["device"], d["severity"])
                self._aer_by_dev[key] = self._aer_by_dev.get(key, 0) + 1
            if emitted < MAX_EVENTS_PER_TICK:
                out.append(EventRecord(ev["kind"], ev["message"], ev["severity"], ev["details"], ev["ts"]))
                emitted += 1


def _getppid_nr() -> int:
    import platform

    return {"x86_64": 110, "aarch64": 173}.get(platform.machine(), 110)
