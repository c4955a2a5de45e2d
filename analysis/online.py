"""The mismatch detector per agent tick: a sampler post-processor.

``MismatchTracker.process(now, samples)`` takes one tick's samples (all collectors), keeps a
sliding window (``thresholds.window_s``) of the detector's inputs, one point per series and tick
(counters as rates), builds the window's features with ``triscope.analysis.features.window_features``
and classifies them with ``classify_window``: the same two functions the stored-window classifier
(``triscope.analysis.mismatch.window_verdicts``) runs over windows cut from stored series, so the
two agree (``tests/unit/test_analysis_agreement.py`` runs both over the recorded H200 trace).  It returns

* per accelerator (docs/workloads.md section 2), labelled with the accelerator (``gpu``, or
  ``npu`` and ``chip``) and its dominant workload (``namespace``, ``pod``, ``container``,
  ``workload``; empty strings when no process):
  ``triscope_mismatch_score`` (0..1) and ``triscope_mismatch_state{state=...}`` (1 for the
  accelerator's current state, 0 for the other six);
* the node's roll-up (its worst accelerator: I/O states first, by score), without accelerator
  labels: ``triscope_mismatch_score``, ``triscope_mismatch_state{state=...}``,
  ``triscope_mismatch_pin_churn`` (1 while DMA map rate says host memory is being
  pinned/unpinned at a churning rate);
* an ``EventRecord(kind="mismatch_state")`` when the node's state or the pin-churn flag changes
  (details: from, to, score, pin_churn, evidence).

The state is decided on the window's typical tick (medians of accelerator busy and link load)
and reported once it has held for ``state_dwell_s`` (2 s), for each accelerator and for the node:
a tick that straddles a phase change makes no state of its own.  Counters are turned into rates
from consecutive ticks (reset-aware).  Nothing is returned while no accelerator input has been
seen (a host without GPU/NPU has no mismatch state).  Cost is a few dictionary look-ups per input
sample plus means and medians over the window's points: well under 1 ms per tick with 8 GPUs and
their workloads (see ``bench/bench_analysis.py``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from triscope.analysis.config import MismatchThresholds, default_thresholds
from triscope.analysis.features import (
    CPU_BUSY,
    DMA_MAPS,
    GPU_BUSY,
    GPU_INFO,
    GPU_UTIL,
    LINK_FACT_METRICS,
    NPU_BUSY,
    PCIE_RX,
    PCIE_TX,
    PRESSURE,
    RETRANSMITS,
    WAIT_KEYED,
    WORKLOAD_COUNTER_FIELDS,
    WORKLOAD_FIELDS,
    AcceleratorWindow,
    LinkFacts,
    WindowValues,
    WorkloadKey,
    WorkloadWindow,
    accelerator_key,
    dma_series_by_accelerator,
    effective_ceiling,
    is_current,
    is_pressure_input,
    link_id,
    link_ids,
    negotiated_capacity,
    own_dma_series,
    wait_subkey,
    window_features,
    workload_key,
)
from triscope.analysis.reader import label_name
from triscope.analysis.verdict import NodeVerdict, classify_window
from triscope.core.samples import EventRecord, Sample
from triscope.core.verdict import Verdict, verdict_samples
from triscope.core.vocabulary import IO_STATES, NO_WORKLOAD, accelerator_name

_KIND = {GPU_INFO: "info", GPU_BUSY: "busy", NPU_BUSY: "busy", PCIE_RX: "rx", PCIE_TX: "tx", CPU_BUSY: "cpu", PRESSURE: "psi",
         DMA_MAPS: "dma", RETRANSMITS: "rtx", GPU_UTIL: "util", **dict.fromkeys(WORKLOAD_FIELDS, "wl"),
         **dict.fromkeys(WAIT_KEYED, "wl")}
_FACT: dict[str, tuple[str, int]] = {}   # link-fact metric -> (fact, preference: lower wins)
for _fact, _metrics in LINK_FACT_METRICS:
    for _rank, _m in enumerate(_metrics):
        _KIND[_m] = "fact"
        _FACT[_m] = (_fact, _rank)


@dataclass(slots=True)
class _Rolling:
    """The (ts, value) points of one series inside the sliding window.

    Plain lists, not deques: a window holds about ``window_s`` points (10 at 1 s ticks) and a deque
    allocates a 64-slot block (528 bytes) for its first point, so a series with its 10 points took
    1.8 KB in two deques against 0.66 KB in two lists (tracemalloc); with ten series a workload and
    72 workloads that was 0.8 MB of the agent's heap.  Expiring a prefix of a list that short is one
    small memmove."""

    ts: list[float] = field(default_factory=list)
    vals: list[float] = field(default_factory=list)

    def add(self, ts: float, v: float) -> None:
        self.ts.append(ts)
        self.vals.append(v)

    def expire(self, cutoff: float) -> None:
        ts = self.ts
        n = 0
        for t in ts:
            if t > cutoff:
                break
            n += 1
        if n:
            del ts[:n]
            del self.vals[:n]

    def values(self) -> list[float]:
        return list(self.vals)


@dataclass(slots=True)
class _Workload:
    """One workload's series on one accelerator inside the sliding window."""

    accelerator: str                # "gpu=0"
    key: WorkloadKey
    last: float = float("-inf")     # its newest tick
    # WorkloadWindow field -> points; a keyed wait-for series under (field, its key)
    series: dict[str | tuple[str, tuple[str, ...]], _Rolling] = field(default_factory=dict)
    prev: dict[str | tuple[str, tuple[str, ...]], tuple[float, float]] = field(default_factory=dict)   # counter -> (ts, value)


@dataclass(slots=True)
class _Dwell:
    """The reported state of one accelerator (or the node): a new state is taken once the window
    has shown it for ``state_dwell_s`` seconds in a row (a tick straddling a phase change is not
    a state)."""

    state: str | None = None
    candidate: tuple[str, float] | None = None

    def update(self, now: float, new: str, dwell_s: float) -> str:
        if self.state is None or new == self.state or dwell_s <= 0:
            self.candidate = None
            self.state = new
            return new
        if self.candidate is None or self.candidate[0] != new:
            self.candidate = (new, now)
        if now - self.candidate[1] >= dwell_s:
            self.candidate = None
            self.state = new
        return self.state


def _expire_all(series: dict[Any, _Rolling], cutoff: float) -> None:
    """Expire every series; forget those left empty (a series that stopped reporting)."""
    gone = []
    for key, r in series.items():
        r.expire(cutoff)
        if not r.ts:
            gone.append(key)
    for key in gone:
        del series[key]


class MismatchTracker:
    """Per-node online mismatch state.  One instance per agent; not thread-safe (one sampler)."""

    def __init__(self, thresholds: MismatchThresholds | None = None) -> None:
        self.th = thresholds or default_thresholds()
        self._counters: dict[tuple[str, str], tuple[float, float]] = {}  # (metric, labels) -> (ts, value)
        self._busy: dict[str, _Rolling] = {}
        self._busy_labels: dict[str, dict[str, str]] = {}
        self._util: dict[str, _Rolling] = {}       # accelerator -> NVML utilisation per tick
        self._link: dict[str, _Rolling] = {}       # accelerator -> busier PCIe direction per tick, bytes/s
        self._link_max: dict[str, float] = {}
        # link facts: link id -> fact -> (preference, value); gpu -> its PCI addresses
        self._facts: dict[str, dict[str, tuple[int, float]]] = {}
        self._buses: dict[str, list[str]] = {}
        self._bus_ids: set[str] = set()
        self._negotiated: dict[str, float | None] = {}   # accelerator -> capacity; cleared when a fact changes
        self._cpu = _Rolling()
        self._psi: dict[str, _Rolling] = {}        # per PSI series (cpu / memory "some")
        self._dma: dict[str, _Rolling] = {}        # per DMA-map series, maps/s
        self._dma_device: dict[str, str | None] = {}
        self._rtx: dict[str, _Rolling] = {}        # per retransmit series, retransmits/s
        # per-workload series by their labels (accelerator + workload label values)
        self._wl: dict[tuple[str | None, ...], _Workload] = {}
        self._ticks = _Rolling()
        self.state: str | None = None
        self._node_dwell = _Dwell()
        self._acc_dwell: dict[str, _Dwell] = {}
        self.pin_churn = False
        self.last: NodeVerdict | None = None

    @property
    def accelerator_states(self) -> dict[str, str]:
        """Each accelerator's reported state (after the dwell), by name (``gpu=0``)."""
        return {k: d.state for k, d in self._acc_dwell.items() if d.state is not None}

    # -------------------------------------------------------------- helpers
    def _rate(self, name: str, lk: str, now: float, value: float) -> float | None:
        key = (name, lk)
        prev = self._counters.get(key)
        self._counters[key] = (now, value)
        if prev is None or now <= prev[0]:
            return None
        inc = value - prev[1] if value >= prev[1] else value  # counter reset
        return inc / (now - prev[0])

    @staticmethod
    def _add(series: dict[str, _Rolling], key: str, now: float, v: float) -> None:
        r = series.get(key)
        if r is None:
            r = series[key] = _Rolling()
        r.add(now, v)

    def _link_facts(self) -> LinkFacts:
        return {lid: {k: v for k, (_rank, v) in f.items()} for lid, f in self._facts.items()}

    def _capacity(self, name: str) -> float | None:
        """The accelerator's negotiated link capacity (cached until a link fact or address changes)."""
        if name not in self._negotiated:
            self._negotiated[name] = negotiated_capacity(link_ids(self._busy_labels[name], self._buses),
                                                         self._link_facts())
        return self._negotiated[name]

    def _ingest(self, now: float, samples: Iterable[Sample | EventRecord]) -> None:
        link_now: dict[str, float] = {}
        kinds = _KIND
        for s in samples:
            if not isinstance(s, Sample):
                continue
            k = kinds.get(s.name)
            if k is None:
                continue
            v = float(s.value)
            if v != v:
                continue
            if k == "busy":
                self._ingest_busy(s, now, v)
            elif k == "util":
                self._add(self._util, label_name(s.labels), now, v)
            elif k == "rx" or k == "tx":
                self._ingest_link_rate(s, now, v, link_now)
            elif k == "wl":
                self._ingest_workload(s, now, v)
            elif k == "cpu":
                self._cpu.add(now, v)
            elif k == "psi":
                if is_pressure_input(s.labels):
                    self._add(self._psi, label_name(s.labels), now, v)
            elif k == "dma" or k == "rtx":
                self._ingest_rate(k, s, now, v)
            elif k == "info":
                self._ingest_info(s)
            else:  # link speed / width / capacity, as trained now
                self._ingest_link_fact(s, v)
        self._add_link_load(now, link_now)
        self._ticks.add(now, 1.0)

    def _add_link_load(self, now: float, link_now: dict[str, float]) -> None:
        """Each link's load this tick into its window, and the highest seen so far."""
        for name, rate in link_now.items():
            self._add(self._link, name, now, rate)
            if rate > self._link_max.get(name, 0.0):
                self._link_max[name] = rate

    def _ingest_busy(self, s: Sample, now: float, v: float) -> None:
        name = label_name(s.labels)
        if name not in self._busy_labels:
            self._busy_labels[name] = dict(s.labels)
        self._add(self._busy, name, now, v)

    def _ingest_link_rate(self, s: Sample, now: float, v: float, link_now: dict[str, float]) -> None:
        """A PCIe byte counter: its rate, the higher of RX and TX kept as the link's load this tick."""
        name = label_name(s.labels)
        rate = self._rate(s.name, name, now, v)
        if rate is not None and rate > link_now.get(name, -1.0):
            link_now[name] = rate

    def _ingest_workload(self, s: Sample, now: float, v: float) -> None:
        """A per-workload series: into its workload's window (a counter as its per-second rate)."""
        g = s.labels.get
        ident = (g("gpu"), g("npu"), g("chip"), g("namespace"), g("pod"), g("container"), g("workload"))
        w = self._wl.get(ident)
        if w is None:
            acc = accelerator_key(s.labels)
            if acc is None:
                return
            w = self._wl[ident] = _Workload(acc, workload_key(s.labels))
        w.last = now
        keyed = WAIT_KEYED.get(s.name)
        fld: str | None
        if keyed is not None:
            fld, _names, is_counter = keyed
            key: str | tuple[str, tuple[str, ...]] = (fld, wait_subkey(s.name, s.labels))
        else:
            fld = WORKLOAD_FIELDS[s.name]
            is_counter = fld in WORKLOAD_COUNTER_FIELDS
            key = fld or ""
        if is_counter:      # a counter: its per-second rate
            prev = w.prev.get(key)
            w.prev[key] = (now, v)
            if prev is None or now <= prev[0]:
                return
            v = (v - prev[1] if v >= prev[1] else v) / (now - prev[0])
        if fld is not None:
            r = w.series.get(key)
            if r is None:
                r = w.series[key] = _Rolling()
            r.add(now, v)

    def _ingest_rate(self, k: str, s: Sample, now: float, v: float) -> None:
        """DMA maps or retransmits: a counter, kept as its per-second rate."""
        key = label_name(s.labels)
        rate = self._rate(s.name, key, now, v)
        if rate is None:
            return
        if k == "dma":
            self._dma_device[key] = s.labels.get("device")
            self._add(self._dma, key, now, rate)
        else:
            self._add(self._rtx, key, now, rate)

    def _ingest_info(self, s: Sample) -> None:
        """An accelerator's info series: its bus address (for its link and its DMA devices)."""
        gpu, bus = s.labels.get("gpu"), s.labels.get("bus_id")
        if bus:
            self._bus_ids.add(bus)
            if gpu is not None and bus not in self._buses.setdefault(gpu, []):
                self._buses[gpu].append(bus)
                self._negotiated.clear()

    def _ingest_link_fact(self, s: Sample, v: float) -> None:
        """A link's speed, width or capacity as trained now (the best-ranked source kept)."""
        lid = link_id(s.labels)
        if lid is None or not is_current(s.labels):
            return
        fact, rank = _FACT[s.name]
        have = self._facts.setdefault(lid, {})
        old = have.get(fact)
        if old is None or (rank <= old[0] and old != (rank, v)):
            have[fact] = (rank, v)
            self._negotiated.clear()

    def window_values(self, copy: bool = True) -> WindowValues:
        """The sliding window's values, in the shape ``window_features`` takes (the stored-window
        classifier builds the same shape from stored series).  ``copy=False`` hands out the live
        window (valid until the next ``process``)."""
        def vals(r: _Rolling) -> Sequence[float]:
            return list(r.vals) if copy else r.vals

        ticks = float(max(1, len(self._ticks.ts)))
        dma_keys = list(self._dma)
        devices = [self._dma_device.get(k) for k in dma_keys]
        dma_of = dma_series_by_accelerator(devices, self._buses) if dma_keys else None
        by_acc: dict[str, list[_Workload]] = {}
        for w in self._wl.values():
            by_acc.setdefault(w.accelerator, []).append(w)
        accs = []
        for name, r in self._busy.items():
            lr = self._link.get(name)
            ceiling = None
            if lr is not None:
                ceiling = effective_ceiling(self._capacity(name), self._link_max.get(name), self.th)
            mine = None if dma_of is None else dma_of.get(name)
            wls = by_acc.get(name)
            workloads = [] if not wls else [_workload_window(w, vals) for w in sorted(wls, key=lambda x: x.key)]
            ur = self._util.get(name)
            accs.append(AcceleratorWindow(name, vals(r), None if lr is None else vals(lr), ceiling, ticks,
                                          None if mine is None else [vals(self._dma[dma_keys[i]]) for i in mine],
                                          workloads, None if ur is None else vals(ur)))
        own = own_dma_series(devices, self._bus_ids)
        return WindowValues(accs, vals(self._cpu), [vals(r) for r in self._psi.values()],
                            [vals(self._dma[dma_keys[i]]) for i in own], [vals(r) for r in self._rtx.values()])

    def _expire_workloads(self, cutoff: float) -> None:
        gone = []
        for ident, w in self._wl.items():
            if w.last <= cutoff:
                gone.append(ident)
            else:
                _expire_all(w.series, cutoff)
        for ident in gone:
            del self._wl[ident]

    def process(self, now: float, samples: Iterable[Sample | EventRecord]) -> list[Sample | EventRecord]:
        """Feed one tick; return the mismatch samples (and an event on a state change)."""
        self._ingest(now, samples)
        cutoff = now - self.th.window_s
        self._cpu.expire(cutoff)
        self._ticks.expire(cutoff)
        for series in (self._busy, self._util, self._link, self._psi, self._dma, self._rtx):
            _expire_all(series, cutoff)
        if self._wl:
            self._expire_workloads(cutoff)
        if not self._busy:
            return []
        verdict = classify_window(window_features(self.window_values(copy=False)), self.th)
        if verdict is None:
            return []
        dwell = self.th.state_dwell_s
        out: list[Sample | EventRecord] = []
        seen = set()
        for av in verdict.accelerators:
            seen.add(av.accelerator)
            d = self._acc_dwell.get(av.accelerator)
            if d is None:
                d = self._acc_dwell[av.accelerator] = _Dwell()
            before = d.state
            reported = d.update(now, av.state, dwell)
            labels = {**av.labels, **av.workload}
            if reported != before and (before is not None or reported in IO_STATES):
                out.append(accelerator_event(now, before, reported, av.score, labels,
                                             av.evidence.get("reasons", []) if reported == av.state else []))
            out.extend(verdict_samples(Verdict(now, reported, workload_key(av.workload), av.score, av.accelerator)))
        if len(seen) != len(self._acc_dwell):
            for gone in [k for k in self._acc_dwell if k not in seen]:
                del self._acc_dwell[gone]
        state = self._node_dwell.update(now, verdict.state, dwell)
        out.extend(verdict_samples(Verdict(now, state, NO_WORKLOAD, verdict.score)))
        out.append(Sample("triscope_mismatch_pin_churn", 1.0 if verdict.pin_churn else 0.0, {}, "gauge"))
        if state != self.state or verdict.pin_churn != self.pin_churn:
            prev = self.state
            if state == prev:
                msg = f"pin churn {'started' if verdict.pin_churn else 'ended'} (state {state}, score {verdict.score:.2f})"
            else:
                msg = (f"coordination state {prev or 'unknown'} -> {state} (score {verdict.score:.2f})"
                       + (", pin churn" if verdict.pin_churn else ""))
            out.append(EventRecord(
                "mismatch_state",
                msg,
                "warning" if state in IO_STATES else "info",
                {"from": prev, "to": state, "score": verdict.score, "pin_churn": verdict.pin_churn, "evidence": verdict.evidence},
                now,
            ))
            self.state = state
            self.pin_churn = verdict.pin_churn
        self.last = verdict
        return out


def _workload_window(w: _Workload, vals: Any) -> WorkloadWindow:
    """One workload's window: its plain series by field, its keyed wait-for series into their dicts."""
    ww = WorkloadWindow(w.key, w.last)
    for key, sr in w.series.items():
        if isinstance(key, tuple):
            getattr(ww, key[0])[key[1]] = vals(sr)
        else:
            setattr(ww, key, vals(sr))
    return ww


def accelerator_event(now: float, before: str | None, state: str, score: float, labels: dict[str, str],
                      reasons: Sequence[str]) -> EventRecord:
    """``accelerator_state``: one accelerator's reported state changed; its labels (accelerator and
    the workload the verdict names) and the verdict's own reasons, which the engine's Kubernetes
    Events quote (remediation/verdict_events.py)."""
    acc = accelerator_name(labels) or "accelerator"
    wl = labels.get("workload") or (f"{labels.get('namespace', '')}/{labels['pod']}" if labels.get("pod") else "")
    msg = f"{acc} {before or 'unknown'} -> {state}" + (f" ({wl})" if wl else "") + f", score {score:.2f}"
    return EventRecord("accelerator_state", msg, "warning" if state in IO_STATES else "info",
                       {"from": before, "to": state, "score": round(score, 3), "labels": dict(labels),
                        "reasons": list(reasons)[:4]}, now)

