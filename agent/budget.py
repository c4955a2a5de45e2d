"""The series and sample budget: how much of every tick the agent's senders may fill.

What a sender adds is stored every tick for as long as it lasts, so a sender is charged for what it
creates, **in samples a tick**, not in series: a histogram series with ``b`` bucket bounds is
``b + 3`` samples (its buckets, ``+Inf``, ``_count`` and ``_sum``: 17 for the stage spans' 14
bounds, 67 for a histogram with the 64 bounds OTLP allows), an exponential histogram 2 (count,
sum), a counter 1, a scraped sample 1.

* A **sender** is, for OTLP, its ``service.name`` resource attribute and its peer address
  (``infer@10.0.0.7``); for a ``--scrape`` target, its URL.  Each has ``sender_samples`` (or its own
  figure in the budget file's ``senders``); all of them together, OTLP and scrapes alike, have
  ``total_samples``.
* Only **new** series are refused: a series that holds its samples keeps flowing every tick
  whatever others send.  A series gives its samples back when it is forgotten (OTLP: idle for its
  TTL; a scrape: absent from the target for ``idle_s``).
* A refusal is counted (``triscope_budget_refused_series_total{source,reason}``, and for OTLP in
  ``triscope_otlp_dropped_total`` and the partial success) and logged at most once a minute per
  source and reason, with the sender and what was refused since the last line.

Thread-safe: the OTLP receiver's worker and every scrape target's worker charge it concurrently;
the tick reads its figures.  ``docs/otlp.md`` ("Budget") is the contract.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from triscope.core.samples import Sample

log = logging.getLogger("triscope.agent.budget")

DEFAULT_TOTAL_SAMPLES = 4096
DEFAULT_SENDER_SAMPLES = 2048
DEFAULT_IDLE_S = 600.0
LOG_EVERY_S = 60.0
SENDER_BUDGET, TOTAL_BUDGET = "sender_budget", "total_budget"
SOURCES = ("otlp", "scrape")


def histogram_samples(bounds: int) -> int:
    """Samples a tick of one histogram series with ``bounds`` explicit bucket bounds (``b + 3``);
    without bounds (an exponential histogram: count and sum only) 2."""
    return bounds + 3 if bounds else 2


@dataclass(frozen=True)
class BudgetOptions:
    total_samples: int = DEFAULT_TOTAL_SAMPLES      # every sender together, samples a tick
    sender_samples: int = DEFAULT_SENDER_SAMPLES    # one sender, unless ``senders`` names it
    senders: Mapping[str, int] = field(default_factory=dict)   # a sender's own figure: URL, SERVICE or SERVICE@ADDRESS
    idle_s: float = DEFAULT_IDLE_S                  # a scraped series absent this long gives its samples back
    file: str | None = None                         # where it was read from (for the log lines)

    def __post_init__(self) -> None:
        if self.total_samples < 0 or self.sender_samples < 0 or any(v < 0 for v in self.senders.values()):
            raise ValueError("budgets are numbers of samples, >= 0")

    def limit_for(self, sender: str, service: str | None = None) -> int:
        """The budget of ``sender`` (``service@address`` for OTLP, a URL for a scrape): its own line
        in ``senders``, else its service's (OTLP, any address), else ``sender_samples``."""
        hit = self.senders.get(sender)
        if hit is None and service is not None:
            hit = self.senders.get(service)
        return self.sender_samples if hit is None else hit


def otlp_sender(service: str, peer: str | None) -> str:
    """The name of an OTLP sender: ``service.name`` and the peer address (``infer@10.0.0.7``)."""
    return f"{service}@{peer or 'local'}"


@dataclass(slots=True)
class _Refused:
    series: int = 0
    samples: int = 0
    senders: set[str] = field(default_factory=set)
    example: str = ""


class SampleBudget:
    """``take(source, sender, samples)`` before a new series is kept (None: granted, else the
    reason it is refused), ``give(...)`` when it is forgotten; ``samples()`` the agent's own figures."""

    def __init__(self, opts: BudgetOptions | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.opts = opts or BudgetOptions()
        self.clock = clock
        self._lock = threading.Lock()
        self._used = 0
        self._by_source = dict.fromkeys(SOURCES, 0)
        self._senders: dict[tuple[str, str], int] = {}       # (source, sender) -> samples held (> 0 only)
        self.refused: dict[tuple[str, str], int] = {}        # (source, reason) -> new series refused
        self._pending: dict[tuple[str, str], _Refused] = {}  # refused since the last log line
        self._logged: dict[tuple[str, str], float] = {}      # when each (source, reason) was last logged

    @property
    def used(self) -> int:
        return self._used

    def held(self, source: str, sender: str) -> int:
        with self._lock:
            return self._senders.get((source, sender), 0)

    def take(self, source: str, sender: str, samples: int, service: str | None = None) -> str | None:
        """Charge ``samples`` (a tick) to ``sender`` for one new series: None when granted, else
        ``"sender_budget"`` or ``"total_budget"`` (counted, and logged at most once a minute)."""
        limit = self.opts.limit_for(sender, service)
        with self._lock:
            held = self._senders.get((source, sender), 0)
            if held + samples > limit:
                reason = SENDER_BUDGET
            elif self._used + samples > self.opts.total_samples:
                reason = TOTAL_BUDGET
            else:
                self._senders[(source, sender)] = held + samples
                self._used += samples
                self._by_source[source] = self._by_source.get(source, 0) + samples
                return None
            key = (source, reason)
            self.refused[key] = self.refused.get(key, 0) + 1
            pend = self._pending.get(key)
            if pend is None:
                pend = self._pending[key] = _Refused(example=f"{sender!r} holding {held} of {limit}")
            pend.series += 1
            pend.samples += samples
            if len(pend.senders) < 1000:
                pend.senders.add(sender)
            now = self.clock()
            due = now - self._logged.get(key, -LOG_EVERY_S) >= LOG_EVERY_S
            if due:
                self._logged[key] = now
                del self._pending[key]
        if due:
            self._log(source, reason, pend)
        return reason

    def give(self, source: str, sender: str, samples: int) -> None:
        """A series charged to ``sender`` is gone: its samples are free again."""
        with self._lock:
            key = (source, sender)
            held = self._senders.get(key, 0) - samples
            if held > 0:
                self._senders[key] = held
            else:
                self._senders.pop(key, None)
            self._used = max(0, self._used - samples)
            self._by_source[source] = max(0, self._by_source.get(source, 0) - samples)

    def _log(self, source: str, reason: str, pend: _Refused) -> None:
        what = "OTLP sender" if source == "otlp" else "scrape target"
        if reason == SENDER_BUDGET:
            bound = f"the sender budget ({self.opts.sender_samples} samples a tick unless the budget file says)"
        else:
            bound = f"the total budget ({self.opts.total_samples} samples a tick, OTLP and scrapes together)"
        log.warning("budget: %d new %s series (%d samples a tick) refused over %s, from %d %s(s), e.g. %s; "
                    "their existing series keep flowing (raise --budget-sender-samples / --budget-total-samples "
                    "or a sender's line in --budget-file)", pend.series, source, pend.samples, bound,
                    len(pend.senders), what, pend.example)

    def samples(self) -> list[Sample]:
        """The budget's figures for the tick (docs/otlp.md, "Budget"); refusals not logged yet are
        logged here once their minute is over (a sender that stopped is still reported)."""
        now = self.clock()
        due: list[tuple[str, str, _Refused]] = []
        with self._lock:
            for key in [k for k in self._pending if now - self._logged.get(k, -LOG_EVERY_S) >= LOG_EVERY_S]:
                self._logged[key] = now
                due.append((*key, self._pending.pop(key)))
            out = [Sample("triscope_budget_limit_samples", float(self.opts.total_samples), {"scope": "total"}),
                   Sample("triscope_budget_limit_samples", float(self.opts.sender_samples), {"scope": "sender"})]
            senders = dict.fromkeys(SOURCES, 0)
            for source, _ in self._senders:
                senders[source] = senders.get(source, 0) + 1
            for source in sorted(self._by_source):
                out.append(Sample("triscope_budget_used_samples", float(self._by_source[source]), {"source": source}))
                out.append(Sample("triscope_budget_senders", float(senders.get(source, 0)), {"source": source}))
            for (source, reason), n in sorted(self.refused.items()):
                out.append(Sample("triscope_budget_refused_series_total", float(n),
                                  {"source": source, "reason": reason}, "counter"))
        for source, reason, pend in due:
            self._log(source, reason, pend)
        return out


class ScrapeLedger:
    """What one scrape target holds of the budget: its series groups (a histogram or summary with
    its buckets / quantiles, ``_count`` and ``_sum`` is one group; any other sample one), each with
    its samples and when it was last scraped.  ``admit`` keeps the groups already held and the new
    ones the budget grants, in the order the target sent them; a group absent for ``idle_s`` gives
    its samples back."""

    def __init__(self, budget: SampleBudget, sender: str) -> None:
        self.budget = budget
        self.sender = sender
        self._held: dict[object, list[float]] = {}    # group -> [samples, last seen (monotonic)]

    def admit(self, groups: Iterable[tuple[object, list[Sample]]]) -> list[Sample]:
        now = self.budget.clock()
        out: list[Sample] = []
        for key, samples in groups:
            n = len(samples)
            held = self._held.get(key)
            if held is None:
                if self.budget.take("scrape", self.sender, n) is not None:
                    continue
                self._held[key] = [float(n), now]
            else:
                if n > held[0]:    # the group grew (a new bucket): the growth is charged like a new series
                    if self.budget.take("scrape", self.sender, n - int(held[0])) is not None:
                        held[1] = now
                        continue
                    held[0] = float(n)
                held[1] = now
            out.extend(samples)
        cutoff = now - self.budget.opts.idle_s
        gone = [k for k, (_, seen) in self._held.items() if seen < cutoff]
        for k in gone:
            self.budget.give("scrape", self.sender, int(self._held.pop(k)[0]))
        return out

    def close(self) -> None:
        for n, _ in self._held.values():
            self.budget.give("scrape", self.sender, int(n))
        self._held.clear()
