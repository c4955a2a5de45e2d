"""The mismatch detector per agent tick: a sampler post-processor.

``MismatchTracker.process(now, samples)`` takes one tick's samples (all collectors), keeps a
sliding window (``thresholds.window_s``) of the detector's inputs, one point per series and tick
(counters as rates), builds the window's features with ``triscope.analysis.features.window_features``
and classifies them with ``classify_window``: the same two functions the stored-window classifier
(``triscope.analysis.mismatch.window_states``) runs over windows cut from stored series, so the
two agree (``tests/test_analysis_agreement.py`` runs both over the recorded H200 trace).  It returns

* ``triscope_mismatch_score`` (gauge, 0..1),
* ``triscope_mismatch_state{state=...}`` (1 for the current state, 0 for the other five),
* ``triscope_mismatch_pin_churn`` (gauge, 1 while DMA map rate says host memory is being
  pinned/unpinned at a churning rate),
* an ``EventRecord(kind="mismatch_state")`` when the state or the pin-churn flag changes (details: from, to, score,
  pin_churn, evidence).

The state is decided on the window's typical tick (medians of accelerator busy and link load)
and reported once it has held for ``state_dwell_s`` (2 s): a tick that straddles a phase change
makes no state of its own.  Counters are turned into rates from consecutive ticks (reset-aware).  Nothing is returned while
no accelerator input has been seen (a host without GPU/NPU has no mismatch state).  Cost is a few
dictionary look-ups per input sample plus means and medians over the window's points: well under
1 ms per tick (see ``bench/bench_analysis.py``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from triscope.analysis.config import MismatchThresholds, default_thresholds
from triscope.analysis.features import (
    CPU_BUSY,
    DMA_MAPS,
    GPU_BUSY,
    GPU_INFO,
    LINK_FACT_METRICS,
    NPU_BUSY,
    PCIE_RX,
    PCIE_TX,
    PRESSURE,
    RETRANSMITS,
    AcceleratorWindow,
    LinkFacts,
    WindowValues,
    effective_ceiling,
    is_current,
    is_pressure_input,
    link_id,
    link_ids,
    negotiated_capacity,
    own_dma_series,
    window_features,
)
from triscope.analysis.mismatch import STATES, Verdict, classify_window
from triscope.analysis.reader import label_name
from triscope.samples import EventRecord, Sample

_KIND = {GPU_INFO: "info", GPU_BUSY: "busy", NPU_BUSY: "busy", PCIE_RX: "rx", PCIE_TX: "tx", CPU_BUSY: "cpu", PRESSURE: "psi",
         DMA_MAPS: "dma", RETRANSMITS: "rtx"}
_FACT: dict[str, tuple[str, int]] = {}   # link-fact metric -> (fact, preference: lower wins)
for _fact, _metrics in LINK_FACT_METRICS:
    for _rank, _m in enumerate(_metrics):
        _KIND[_m] = "fact"
        _FACT[_m] = (_fact, _rank)


@dataclass(slots=True)
class _Rolling:
    """The (ts, value) points of one series inside the sliding window."""

    ts: deque[float] = field(default_factory=deque)
    vals: deque[float] = field(default_factory=deque)

    def add(self, ts: float, v: float) -> None:
        self.ts.append(ts)
        self.vals.append(v)

    def expire(self, cutoff: float) -> None:
        ts, vals = self.ts, self.vals
        while ts and ts[0] <= cutoff:
            ts.popleft()
            vals.popleft()

    def values(self) -> list[float]:
        return list(self.vals)


def _expire_all(series: dict[str, _Rolling], cutoff: float) -> None:
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
        self._ticks = _Rolling()
        self.state: str | None = None
        self._candidate: tuple[str, float] | None = None
        self.pin_churn = False
        self.last: Verdict | None = None

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
                name = label_name(s.labels)
                if name not in self._busy_labels:
                    self._busy_labels[name] = dict(s.labels)
                self._add(self._busy, name, now, v)
            elif k == "rx" or k == "tx":
                name = label_name(s.labels)
                rate = self._rate(s.name, name, now, v)
                if rate is not None and rate > link_now.get(name, -1.0):
                    link_now[name] = rate
            elif k == "cpu":
                self._cpu.add(now, v)
            elif k == "psi":
                if is_pressure_input(s.labels):
                    self._add(self._psi, label_name(s.labels), now, v)
            elif k == "dma" or k == "rtx":
                key = label_name(s.labels)
                rate = self._rate(s.name, key, now, v)
                if rate is not None:
                    if k == "dma":
                        self._dma_device[key] = s.labels.get("device")
                        self._add(self._dma, key, now, rate)
                    else:
                        self._add(self._rtx, key, now, rate)
            elif k == "info":
                gpu, bus = s.labels.get("gpu"), s.labels.get("bus_id")
                if bus:
                    self._bus_ids.add(bus)
                    if gpu is not None and bus not in self._buses.setdefault(gpu, []):
                        self._buses[gpu].append(bus)
                        self._negotiated.clear()
            else:  # link speed / width / capacity, as trained now
                lid = link_id(s.labels)
                if lid is None or not is_current(s.labels):
                    continue
                fact, rank = _FACT[s.name]
                have = self._facts.setdefault(lid, {})
                old = have.get(fact)
                if old is None or (rank <= old[0] and old != (rank, v)):
                    have[fact] = (rank, v)
                    self._negotiated.clear()
        for name, rate in link_now.items():
            self._add(self._link, name, now, rate)
            if rate > self._link_max.get(name, 0.0):
                self._link_max[name] = rate
        self._ticks.add(now, 1.0)

    def window_values(self, copy: bool = True) -> WindowValues:
        """The sliding window's values, in the shape ``window_features`` takes (the stored-window
        classifier builds the same shape from stored series).  ``copy=False`` hands out the live
        window (valid until the next ``process``)."""
        def vals(r: _Rolling) -> Sequence[float]:
            return list(r.vals) if copy else r.vals

        ticks = float(max(1, len(self._ticks.ts)))
        accs = []
        for name, r in self._busy.items():
            lr = self._link.get(name)
            ceiling = None
            if lr is not None:
                ceiling = effective_ceiling(self._capacity(name), self._link_max.get(name), self.th)
            accs.append(AcceleratorWindow(name, vals(r), None if lr is None else vals(lr), ceiling, ticks))
        dma_keys = list(self._dma)
        own = own_dma_series([self._dma_device.get(k) for k in dma_keys], self._bus_ids)
        return WindowValues(accs, vals(self._cpu), [vals(r) for r in self._psi.values()],
                            [vals(self._dma[dma_keys[i]]) for i in own], [vals(r) for r in self._rtx.values()])

    def process(self, now: float, samples: Iterable[Sample | EventRecord]) -> list[Sample | EventRecord]:
        """Feed one tick; return the mismatch samples (and an event on a state change)."""
        self._ingest(now, samples)
        cutoff = now - self.th.window_s
        self._cpu.expire(cutoff)
        self._ticks.expire(cutoff)
        for series in (self._busy, self._link, self._psi, self._dma, self._rtx):
            _expire_all(series, cutoff)
        if not self._busy:
            return []
        verdict = classify_window(window_features(self.window_values(copy=False)), self.th)
        if verdict is None:
            return []
        state = self._debounce(now, verdict.state)
        out: list[Sample | EventRecord] = [Sample("triscope_mismatch_score", verdict.score, {}, "gauge")]
        out.extend(Sample("triscope_mismatch_state", 1.0 if st == state else 0.0, {"state": st}, "gauge")
                   for st in STATES)
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
                "warning" if state in ("io-saturated", "staging-bound", "network-bound") else "info",
                {"from": prev, "to": state, "score": verdict.score, "pin_churn": verdict.pin_churn, "evidence": verdict.evidence},
                now,
            ))
            self.state = state
            self.pin_churn = verdict.pin_churn
        self.last = verdict
        return out

    def _debounce(self, now: float, new: str) -> str:
        """The state to report: a new state is taken once the window has shown it for
        ``state_dwell_s`` seconds in a row (a tick straddling a phase change is not a state)."""
        if self.state is None or new == self.state or self.th.state_dwell_s <= 0:
            self._candidate = None
            return new
        if self._candidate is None or self._candidate[0] != new:
            self._candidate = (new, now)
        if now - self._candidate[1] >= self.th.state_dwell_s:
            self._candidate = None
            return new
        return self.state


def run_over(ticks: Sequence[tuple[float, Sequence[Sample]]], thresholds: MismatchThresholds | None = None
             ) -> list[list[Sample | EventRecord]]:
    """Convenience for tests and replays: feed a sequence of (ts, samples) ticks."""
    tr = MismatchTracker(thresholds)
    return [tr.process(ts, samples) for ts, samples in ticks]
