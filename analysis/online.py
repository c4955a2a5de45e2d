"""The mismatch detector per agent tick: a sampler post-processor.

``MismatchTracker.process(now, samples)`` takes one tick's samples (all collectors), keeps a
sliding window (``thresholds.window_s``) of the inputs ``triscope.analysis.mismatch`` reads, classifies the
window with the same ``classify_window`` the stored-series path uses, and returns

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
dictionary look-ups per input sample plus running sums: well under 1 ms per tick (see
``bench/bench_analysis.py``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from triscope.analysis.config import MismatchThresholds, default_thresholds
from triscope.analysis.mismatch import (
    CPU_BUSY,
    DMA_MAPS,
    GPU_BUSY,
    GPU_INFO,
    LINK_CAPACITY,
    LINK_SPEED,
    LINK_WIDTH,
    NPU_BUSY,
    PCIE_RX,
    PCIE_TX,
    PRESSURE,
    RETRANSMITS,
    STATES,
    AcceleratorFeatures,
    Verdict,
    WindowFeatures,
    classify_window,
    effective_ceiling,
    link_capacity_bytes_per_second,
)
from triscope.samples import EventRecord, Sample

_KIND = {GPU_INFO: "info", GPU_BUSY: "busy", NPU_BUSY: "busy", PCIE_RX: "rx", PCIE_TX: "tx", CPU_BUSY: "cpu", PRESSURE: "psi",
         DMA_MAPS: "dma", RETRANSMITS: "rtx"}
for _m in LINK_CAPACITY:
    _KIND[_m] = "cap"
for _m in LINK_SPEED:
    _KIND[_m] = "speed"
for _m in LINK_WIDTH:
    _KIND[_m] = "width"


@dataclass(slots=True)
class _Rolling:
    """Time-bounded window of (ts, value) with a running sum."""

    items: deque[tuple[float, float]] = field(default_factory=deque)
    total: float = 0.0

    def add(self, ts: float, v: float) -> None:
        self.items.append((ts, v))
        self.total += v

    def expire(self, cutoff: float) -> None:
        it = self.items
        while it and it[0][0] <= cutoff:
            self.total -= it.popleft()[1]

    def mean(self) -> float | None:
        return self.total / len(self.items) if self.items else None

    def median(self) -> float | None:
        if not self.items:
            return None
        vals = sorted(v for _, v in self.items)
        return vals[len(vals) // 2]  # the upper median: a real tick, never the average of two sides


def _label_name(labels: Mapping[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


class MismatchTracker:
    """Per-node online mismatch state.  One instance per agent; not thread-safe (one sampler)."""

    def __init__(self, thresholds: MismatchThresholds | None = None) -> None:
        self.th = thresholds or default_thresholds()
        self._counters: dict[tuple[str, str], tuple[float, float]] = {}  # (metric, labels) -> (ts, value)
        self._busy: dict[str, _Rolling] = {}
        self._link: dict[str, _Rolling] = {}
        self._link_max: dict[str, float] = {}
        # link facts keyed by link id ("device=<bdf>" or "gpu=<n>"); accelerator -> its link ids
        self._cap: dict[str, float] = {}
        self._speed: dict[str, float] = {}
        self._width: dict[str, float] = {}
        self._links_of: dict[str, tuple[str, ...]] = {}
        self._bus_ids: set[str] = set()
        self._cpu = _Rolling()
        self._psi = _Rolling()
        self._dma = _Rolling()
        self._rtx = _Rolling()
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

    def _negotiated(self, acc: str) -> float | None:
        for lid in self._links_of.get(acc, (acc,)):
            if lid in self._speed and lid in self._width:
                return link_capacity_bytes_per_second(self._speed[lid], self._width[lid])
            if lid in self._cap:
                return self._cap[lid]
        return None

    def process(self, now: float, samples: Iterable[Sample | EventRecord]) -> list[Sample | EventRecord]:
        """Feed one tick; return the mismatch samples (and an event on a state change)."""
        dma_by_dev: dict[str, float] | None = None
        rtx_sum: float | None = None
        psi_max: float | None = None
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
                name = _label_name(s.labels)
                r = self._busy.get(name)
                if r is None:
                    r = self._busy[name] = _Rolling()
                r.add(now, v)
            elif k == "rx" or k == "tx":
                name = _label_name(s.labels)
                rate = self._rate(s.name, name, now, v)
                if rate is not None and rate > link_now.get(name, -1.0):
                    link_now[name] = rate
            elif k == "cpu":
                self._cpu.add(now, v)
            elif k == "psi":
                lab = s.labels
                if lab.get("resource") in ("cpu", "memory") and lab.get("kind", "some") == "some":
                    psi_max = v if psi_max is None else max(psi_max, v)
            elif k == "dma" or k == "rtx":
                rate = self._rate(s.name, _label_name(s.labels), now, v)
                if rate is not None:
                    if k == "dma":
                        if dma_by_dev is None:
                            dma_by_dev = {}
                        dev = s.labels.get("device", "")
                        dma_by_dev[dev] = dma_by_dev.get(dev, 0.0) + rate
                    else:
                        rtx_sum = (rtx_sum or 0.0) + rate
            elif k == "info":
                gpu, bus = s.labels.get("gpu"), s.labels.get("bus_id")
                if bus:
                    self._bus_ids.add(bus)
                if gpu is not None:
                    name = f"gpu={gpu}"
                    links = (f"device={bus}", name) if bus else (name,)
                    if self._links_of.get(name) != links:
                        self._links_of[name] = links
            else:  # link capacity / speed / width
                if s.labels.get("kind", "current") != "current":
                    continue
                lid = f"device={s.labels['device']}" if "device" in s.labels else (
                    f"gpu={s.labels['gpu']}" if "gpu" in s.labels else None)
                if lid is None:
                    continue
                if k == "cap":
                    self._cap[lid] = v
                elif k == "speed":
                    self._speed[lid] = v
                else:
                    self._width[lid] = v
        for name, rate in link_now.items():
            r = self._link.get(name)
            if r is None:
                r = self._link[name] = _Rolling()
            r.add(now, rate)
            if rate > self._link_max.get(name, 0.0):
                self._link_max[name] = rate
        if psi_max is not None:
            self._psi.add(now, psi_max)
        if dma_by_dev is not None:
            # the accelerators' own devices when known (a NIC maps per packet: not pin churn)
            mine = [r for d, r in dma_by_dev.items() if d in self._bus_ids]
            self._dma.add(now, sum(mine) if mine else sum(dma_by_dev.values()))
        if rtx_sum is not None:
            self._rtx.add(now, rtx_sum)
        self._ticks.add(now, 1.0)

        cutoff = now - self.th.window_s
        for r in (self._cpu, self._psi, self._dma, self._rtx, self._ticks, *self._busy.values(), *self._link.values()):
            r.expire(cutoff)
        if not self._busy:
            return []
        ticks = max(1, len(self._ticks.items))
        accs = []
        for name, r in self._busy.items():
            if not r.items:
                continue
            ceiling = None
            lb = None
            lmed = None
            lr = self._link.get(name)
            if lr is not None and lr.items:
                lb = lr.mean()
                lmed = lr.median()
                negotiated = self._negotiated(name)
                ceiling = effective_ceiling(negotiated, self._link_max.get(name), self.th)
            accs.append(AcceleratorFeatures(name, r.mean(), lb, ceiling, min(1.0, len(r.items) / ticks),
                                            r.median(), lmed))
        f = WindowFeatures(accs, self._cpu.mean(), self._psi.mean(), self._dma.mean(), self._rtx.mean())
        verdict = classify_window(f, self.th)
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
