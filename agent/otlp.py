"""OTLP/HTTP in: stage spans and stage metrics become the stage-duration series the scrape path yields.

``triscope agent --otlp-listen 127.0.0.1:4318`` serves ``POST /v1/traces`` and ``/v1/metrics``
(protobuf or JSON, identity, gzip or deflate) on the shared bounded HTTP server
(``triscope.web.httpd``) with one worker thread for decoding: the agent's tick never waits for a
request.  docs/otlp.md is the contract; in short:

* a span with a stage (attribute ``triscope.stage``, else a span name in ``STAGE_NAMES``) adds its
  duration (end - start) to ``inference_stage_duration_seconds_{sum,count,bucket}`` with labels
  ``stage``, ``job`` (``service.namespace/service.name``), ``instance`` (``service.instance.id``) and
  the workload labels ``namespace``, ``pod``, ``container``, ``workload`` (from the ``k8s.*``
  resource attributes, else ``process.pid`` through the agent's own attribution);
* a histogram / exponential histogram / monotonic sum whose points carry ``stage`` becomes
  ``NAME_{sum,count,bucket}`` / ``NAME_total``, delta and cumulative alike;
* the agent owns the cumulative counters: every tick yields each series' running totals, as a
  scrape of the application would.

Bounded: a body over ``max_body`` (as sent, and again once decompressed: a gzip bomb stops there)
is refused with 413; at most ``max_items`` spans and points are taken between two ticks (the
rest of that request is dropped and reported as a partial success, and later requests in that
interval get 429 with ``Retry-After: 1``, before any decoding); a new series only within the
agent's sample budget (``triscope.agent.budget``: a series costs its samples a tick, bounds + 3 for
a histogram, charged to its sender, ``service.name`` and peer address, and to the total that the
scrape targets share; beyond it the new series' points are dropped, ``sender_budget`` /
``total_budget``, while the series already kept go on); at most ``max_streams`` cumulative
streams (series, sender, start time); series and streams idle for ``series_ttl`` are forgotten
(and their samples given back).  Every stage span or point not taken is counted in
``triscope_otlp_dropped_total{signal,reason}`` and in the partial success.

A running total that would overflow (a float past 1.8e308: ``1e308 + 1e308``) restarts the series,
as a counter reset does in Prometheus: it is stored as 0 at the next tick, then with what came
after, so ``increase()`` counts on instead of the series reading ``+Inf`` for good.
"""

from __future__ import annotations

import bisect
import contextlib
import json
import logging
import math
import threading
import time
import zlib
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsPartialSuccess,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTracePartialSuccess,
    ExportTraceServiceResponse,
)
from prometheus_client.utils import floatToGoString

from triscope.agent.budget import SampleBudget, histogram_samples, otlp_sender
from triscope.agent.collectors.base import BaseCollector
from triscope.agent.otlp_decode import TEMPORALITY_CUMULATIVE, Decoded, DecodeError, Point, decode
from triscope.agent.workloads import attribution
from triscope.core.samples import Sample
from triscope.web.httpd import HttpServer, Limits, Request, Response

log = logging.getLogger(__name__)

STAGE_METRIC = "inference_stage_duration_seconds"   # analysis.stages.DEFAULT_STAGE_METRIC
STAGE_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
PATHS = {"/v1/traces": "traces", "/v1/metrics": "metrics"}
CONTENT_TYPES = {"application/x-protobuf": "proto", "application/json": "json"}
ENCODINGS = ("", "identity", "gzip", "x-gzip", "deflate")
RESERVED = ("job", "instance", "namespace", "pod", "container", "workload", "le")
GRPC_INVALID_ARGUMENT, GRPC_RESOURCE_EXHAUSTED = 3, 8


@dataclass
class OtlpOptions:
    listen: tuple[str, int] = ("127.0.0.1", 4318)
    max_body: int = 4 << 20        # bytes, as sent and decompressed
    max_items: int = 50_000        # spans + data points taken between two ticks
    max_series: int | None = None  # a cap on series besides the sample budget (None: the budget alone)
    max_streams: int = 1024        # cumulative streams kept (4 x max_series when that is set)
    series_ttl: float = 600.0      # seconds without an update before a series is forgotten
    proc: str = "/proc"
    pods_log_dir: str = attribution.DEFAULT_PODS_LOG_DIR


def series_samples(kind: str, bounds: tuple[float, ...]) -> int:
    """Samples a tick one series stores: a counter 1, a histogram its buckets, ``+Inf``, count and sum."""
    return 1 if kind == "counter" else histogram_samples(len(bounds))


class _Series:
    __slots__ = ("buckets", "bounds", "cost", "count", "created_ns", "forgot_ns", "kind", "labels", "name", "owner",
                 "total", "touched", "zero_first")

    def __init__(self, name: str, kind: str, labels: dict[str, str], bounds: tuple[float, ...], now: float,
                 zero_first: bool, mono: float, owner: str = "") -> None:
        self.name, self.kind, self.labels, self.bounds = name, kind, labels, bounds
        self.owner = owner     # the sender its samples are charged to (the one that created it)
        self.cost = series_samples(kind, bounds)
        # a series born of spans or delta points is stored as 0 at its first tick and with what was
        # added from the next one: a counter's first point is its baseline (increase() starts
        # there), so the first batch counts as an increase, as it would have for a service whose
        # histogram was scraped at 0 before its first request.  A series born of a cumulative
        # stream starts at the stream's totals, the baseline a first scrape of it would give.
        self.zero_first = zero_first
        self.buckets = [0.0] * (len(bounds) + 1) if bounds else []   # per bucket, not cumulative
        self.count = self.total = 0.0
        self.created_ns = int(now * 1e9)
        self.forgot_ns = 0     # the latest start time of a stream of this series forgotten (evicted, idle)
        self.touched = mono

    def add(self, count: float, total: float, buckets: Sequence[float] | None) -> None:
        """Add to the running totals; one that would no longer be finite (a float overflow)
        restarts the series from what is added now, as a counter reset: stored as 0 at the next
        tick, then with its new totals (``increase()`` reads a reset, never ``+Inf``)."""
        c, t = self.count + count, self.total + total
        new = [a + b for a, b in zip(self.buckets, buckets, strict=False)] if buckets is not None and self.buckets else None
        if math.isfinite(c) and math.isfinite(t) and (new is None or all(map(math.isfinite, new))):
            self.count, self.total = c, t
            if new is not None:
                self.buckets[:len(new)] = new
            return
        self.reset(count, total, buckets)

    def reset(self, count: float, total: float, buckets: Sequence[float] | None) -> None:
        self.count, self.total = count, total
        if self.buckets:
            self.buckets = [0.0] * len(self.buckets)
            if buckets is not None:
                self.buckets[:len(buckets)] = list(buckets)
        self.zero_first = True


Key = tuple[str, tuple[tuple[str, str], ...]]
# a cumulative stream: its series, the identity of its sender (the resource attributes the agent
# reads) and its start time
StreamKey = tuple[Key, tuple[tuple[str, str], ...], int]
# a stream's last report: count, sum, bucket counts, when it was updated (monotonic)
_Last = tuple[float, float, tuple[float, ...], float]


@dataclass(slots=True)
class _Agg:
    """Delta points or spans of one series in one request, summed before the lock is taken."""

    key: Key
    labels: dict[str, str]
    kind: str
    bounds: tuple[float, ...]
    sender: str = ""
    service: str = ""
    n: int = 0
    count: float = 0.0
    total: float = 0.0
    buckets: list[float] | None = None
    reset: bool = False     # the sum overflowed within the request: it holds what came after, a reset

    def add(self, count: float, total: float, buckets: Sequence[float] | None) -> None:
        self.n += 1
        c, t = self.count + count, self.total + total
        new = [a + b for a, b in zip(self.buckets, buckets, strict=False)] if self.buckets is not None and buckets else None
        if math.isfinite(c) and math.isfinite(t) and (new is None or all(map(math.isfinite, new))):
            self.count, self.total = c, t
            if new is not None:
                self.buckets = new
            return
        self.count, self.total, self.reset = count, total, True
        if self.buckets is not None:
            self.buckets = list(buckets) if buckets else [0.0] * len(self.buckets)


@dataclass(slots=True)
class _Chain:
    """The reports of one cumulative stream in one request, in order, each not below the one
    before (a report below is a conflict, dropped before the lock is taken)."""

    key: Key
    labels: dict[str, str]
    kind: str
    bounds: tuple[float, ...]
    ident: tuple[tuple[str, str], ...]
    start_ns: int
    points: list[Point]
    sender: str = ""
    service: str = ""


def _ge(p: Point, count: float, buckets: tuple[float, ...]) -> bool:
    """``p`` is at or above a stream's earlier report (every running total, buckets included)."""
    return p.count >= count and all(a >= b for a, b in zip(p.buckets, buckets, strict=False))


class StageSeries:
    """The series OTLP feeds, their running totals, and the receiver's own counters.  A request is
    reduced without the lock (spans and delta points to one sum per series, cumulative reports to
    one chain per stream); the lock is held to apply those (work per series and stream, not per
    point); each tick reads under it."""

    def __init__(self, opts: OtlpOptions, clock: Callable[[], float] = time.time,
                 budget: SampleBudget | None = None) -> None:
        self.opts = opts
        self.clock = clock
        self.budget = budget if budget is not None else SampleBudget()
        self._lock = threading.Lock()
        self._series: dict[Key, _Series] = {}
        self._streams: OrderedDict[StreamKey, _Last] = OrderedDict()   # least recently updated first
        self._tick_mono = time.monotonic()    # when the last tick read the series
        self._taken = 0
        self.counts: dict[tuple[str, ...], float] = {}   # (metric, label values...) -> value

    def count(self, *key: str, n: float = 1.0) -> None:
        if n:
            with self._lock:
                self.counts[key] = self.counts.get(key, 0.0) + n

    def exhausted(self) -> bool:
        with self._lock:
            return self._taken >= self.opts.max_items

    def _reserve(self, n: int) -> int:
        with self._lock:
            take = max(0, min(n, self.opts.max_items - self._taken))
            self._taken += take
            return take

    def add(self, signal: str, dec: Decoded, labels_of: Callable[[dict[str, str]], dict[str, str]],
            peer: str | None = None) -> tuple[int, str]:
        """Add a decoded request (``peer``: the sender's address); returns (spans or points
        rejected, why) for the partial success."""
        self.count("received", signal, n=dec.received)
        for reason, n in dec.ignored.items():
            self.count("ignored", signal, reason, n=n)
        dropped: dict[str, int] = dict(dec.dropped)
        if dec.invalid:
            dropped["invalid"] = dec.invalid
        wanted = sum(len(g.spans) + len(g.points) for g in dec.groups)
        take = self._reserve(wanted)
        if wanted > take:
            dropped["buffer_full"] = wanted - take
        aggs, chains, early = self._reduce(dec, take, labels_of, peer)
        for reason, n in early.items():
            dropped[reason] = dropped.get(reason, 0) + n
        now, mono = self.clock(), time.monotonic()
        late: dict[str, int] = {}     # refused under the lock
        with self._lock:
            for a in aggs:
                s = self._get(a.key, a.kind, a.labels, a.bounds, now, True, mono, a.sender, a.service)
                if isinstance(s, str):
                    late[s] = late.get(s, 0) + a.n
                elif s.bounds != a.bounds or s.kind != a.kind:
                    late["bounds_mismatch"] = late.get("bounds_mismatch", 0) + a.n
                elif a.reset:
                    s.reset(a.count, a.total, a.buckets)
                else:
                    s.add(a.count, a.total, a.buckets)
            for ch in chains:
                for reason, n in self._apply_chain(ch, now, mono).items():
                    late[reason] = late.get(reason, 0) + n
            for reason, n in late.items():
                dropped[reason] = dropped.get(reason, 0) + n
            for reason, n in dropped.items():
                ck: tuple[str, ...] = ("dropped", signal, reason)
                self.counts[ck] = self.counts.get(ck, 0.0) + n
            ck = ("accepted", signal)
            self.counts[ck] = self.counts.get(ck, 0.0) + take - sum(early.values()) - sum(late.values())
        rejected = sum(dropped.values())
        why = ", ".join(f"{n} {r.replace('_', ' ')}" for r, n in sorted(dropped.items()) if n)
        return rejected, why

    def _reduce(self, dec: Decoded, take: int, labels_of: Callable[[dict[str, str]], dict[str, str]],
                peer: str | None = None) -> tuple[list[_Agg], list[_Chain], dict[str, int]]:
        """The first ``take`` spans and points of a request, without the lock: spans and delta
        points summed per series, cumulative reports chained per stream; and the points refused
        already: a cumulative report without a start time (``no_start_time``: a restart could not
        be told from another sender's totals), one below its stream's previous report in this
        request (``stream_conflict``)."""
        aggs: dict[tuple[Key, str, tuple[float, ...]], _Agg] = {}
        chains: dict[tuple[StreamKey, tuple[float, ...]], _Chain] = {}
        early: dict[str, int] = {}
        left = take
        for g in dec.groups:
            if left <= 0:
                break
            base = labels_of(g.resource)
            service = g.resource.get("service.name", "")
            sender = otlp_sender(service, peer)
            by_stage: dict[str, tuple[_Agg, list[float]]] = {}   # this resource's spans: labels built once a stage
            for stage, seconds in g.spans[:left]:
                hit = by_stage.get(stage)
                if hit is None:
                    labels = {"stage": stage, **base}
                    key = (STAGE_METRIC, tuple(sorted(labels.items())))
                    ak: tuple[Key, str, tuple[float, ...]] = (key, "histogram", STAGE_BUCKETS)
                    a = aggs.get(ak)
                    if a is None:
                        a = aggs[ak] = _Agg(key, labels, "histogram", STAGE_BUCKETS, sender, service,
                                            buckets=[0.0] * (len(STAGE_BUCKETS) + 1))
                    hit = by_stage[stage] = (a, a.buckets or [])
                a, buckets = hit
                a.n += 1
                a.count += 1
                a.total += seconds
                buckets[bisect.bisect_left(STAGE_BUCKETS, seconds)] += 1
            left -= min(left, len(g.spans))
            ident = tuple(sorted(g.resource.items()))
            for p in g.points[:max(0, left)]:
                labels = {(f"exported_{k}" if k in RESERVED else k): v for k, v in p.labels.items()}
                labels.update(base)
                key = (p.name, tuple(sorted(labels.items())))
                if p.temporality == TEMPORALITY_CUMULATIVE:
                    if p.start_ns <= 0:
                        early["no_start_time"] = early.get("no_start_time", 0) + 1
                        continue
                    ck = ((key, ident, p.start_ns), p.bounds)
                    ch = chains.get(ck)
                    if ch is None:
                        chains[ck] = _Chain(key, labels, p.kind, p.bounds, ident, p.start_ns, [p], sender, service)
                    elif _ge(p, ch.points[-1].count, ch.points[-1].buckets):
                        ch.points.append(p)
                    else:
                        early["stream_conflict"] = early.get("stream_conflict", 0) + 1
                    continue
                ak = (key, p.kind, p.bounds)    # one series, one shape: another is refused under the lock
                a = aggs.get(ak)
                if a is None:
                    a = aggs[ak] = _Agg(key, labels, p.kind, p.bounds, sender, service,
                                        buckets=[0.0] * len(p.buckets) if p.buckets else None)
                a.add(p.count, p.total, p.buckets)
            left -= min(left, len(g.points))
        return list(aggs.values()), list(chains.values()), early

    def _get(self, key: Key, kind: str, labels: dict[str, str], bounds: tuple[float, ...], now: float,
             zero_first: bool, mono: float, sender: str = "", service: str = "") -> _Series | str:
        """The series, created when new and the budget grants its samples to ``sender``; else the
        reason it is refused (``series_limit``, ``sender_budget``, ``total_budget``)."""
        s = self._series.get(key)
        if s is None:
            if self.opts.max_series is not None and len(self._series) >= self.opts.max_series:
                return "series_limit"
            refused = self.budget.take("otlp", sender, series_samples(kind, bounds), service)
            if refused is not None:
                return refused
            s = self._series[key] = _Series(key[0], kind, labels, bounds, now, zero_first, mono, sender)
        s.touched = mono
        return s

    def _drop_series(self, key: Key) -> None:
        s = self._series.pop(key)
        self.budget.give("otlp", s.owner, s.cost)

    def _room_for_stream(self) -> bool:
        """Whether one more stream can be kept: under the cap, or by forgetting the least recently
        updated one when it was not updated since the last tick (a stream that reported in this
        interval is never evicted: a point that would need its room is refused instead)."""
        cap = 4 * self.opts.max_series if self.opts.max_series is not None else self.opts.max_streams
        if len(self._streams) < cap:
            return True
        oldest = next(iter(self._streams))
        if self._streams[oldest][3] >= self._tick_mono:
            return False
        self._forget(oldest)
        return True

    def _forget(self, skey: StreamKey) -> None:
        """Drop a stream's last report; its series remembers the start time, so that the stream,
        should it report again, is a baseline and its past is not counted twice."""
        del self._streams[skey]
        s = self._series.get(skey[0])
        if s is not None:
            s.forgot_ns = max(s.forgot_ns, skey[2])

    def _apply_chain(self, ch: _Chain, now: float, mono: float) -> dict[str, int]:
        """One stream's reports of one request, under the lock: what is new since its last report
        (the stream's previous report, or for a new stream its first report when the stream is
        older than a series that already counts, else zero) is added.  Returns the points refused
        by reason."""
        n = len(ch.points)
        key = ch.key
        skey: StreamKey = (key, ch.ident, ch.start_ns)
        last = self._streams.get(skey)
        if last is None and not self._room_for_stream():
            return {"stream_limit": n}
        s = self._get(key, ch.kind, ch.labels, ch.bounds, now, False, mono, ch.sender, ch.service)
        if isinstance(s, str):
            return {s: n}
        if s.bounds != ch.bounds or s.kind != ch.kind:
            return {"bounds_mismatch": n}
        first, end = ch.points[0], ch.points[-1]
        refused = 0
        if last is None:
            older = s.count > 0 and (ch.start_ns < s.created_ns or ch.start_ns <= s.forgot_ns)
            base = (first.count, first.total, first.buckets) if older else (0.0, 0.0, ())
        else:
            # reports below the stream's last one: another sender with the same identity and start
            # time (or a sender that broke the data model): dropped, the series never goes back
            while refused < n and not _ge(ch.points[refused], last[0], last[2]):
                refused += 1
            if refused == n:
                return {"stream_conflict": n}
            base = (last[0], last[1], last[2])
        step = (end.count - base[0], end.total - base[1],
                [c - (base[2][i] if base[2] else 0.0) for i, c in enumerate(end.buckets)] if s.buckets else None)
        if not (math.isfinite(step[0]) and math.isfinite(step[1])):
            # the step itself overflows (a sum from -1e308 to 1e308): a restart of this stream's totals
            s.reset(end.count, end.total, end.buckets if s.buckets else None)
        else:
            s.add(*step)
        self._streams[skey] = (end.count, end.total, end.buckets, mono)
        self._streams.move_to_end(skey)
        return {"stream_conflict": refused} if refused else {}

    def samples(self) -> list[Sample]:
        """Every live series' running totals and the receiver's counters; opens the next interval."""
        out: list[Sample] = []
        cutoff = time.monotonic() - self.opts.series_ttl
        with self._lock:
            self._taken = 0
            self._tick_mono = time.monotonic()
            for key in [k for k, s in self._series.items() if s.touched < cutoff]:
                self._drop_series(key)
            for skey in [k for k, v in self._streams.items() if v[3] < cutoff]:
                self._forget(skey)
            for s in self._series.values():
                zero = s.zero_first
                s.zero_first = False
                if s.kind == "counter":
                    out.append(Sample(s.name, 0.0 if zero else s.count, s.labels, "counter"))
                    continue
                out.append(Sample(s.name + "_count", 0.0 if zero else s.count, s.labels, "counter"))
                out.append(Sample(s.name + "_sum", 0.0 if zero else s.total, s.labels, "counter"))
                if s.bounds:
                    run = 0.0
                    for le, c in zip((*s.bounds, float("inf")), s.buckets, strict=False):
                        run += c
                        out.append(Sample(s.name + "_bucket", 0.0 if zero else run,
                                          {**s.labels, "le": floatToGoString(le)}, "counter"))
            out.append(Sample("triscope_otlp_series", float(len(self._series))))
            out.append(Sample("triscope_otlp_series_samples", float(sum(s.cost for s in self._series.values()))))
            for ck, v in self.counts.items():
                out.append(_self_sample(ck, v))
        return out


_SELF_LABELS = {"requests": ("signal", "code"), "received": ("signal",), "accepted": ("signal",),
                "ignored": ("signal", "reason"), "dropped": ("signal", "reason")}


def _self_sample(key: tuple[str, ...], value: float) -> Sample:
    what, *values = key
    return Sample(f"triscope_otlp_{what}_total", value, dict(zip(_SELF_LABELS[what], values, strict=True)), "counter")


class OtlpCollector(BaseCollector):
    """What the sampler reads each tick: the series' running totals (no I/O, no waiting)."""

    name = "otlp"

    def __init__(self, state: StageSeries) -> None:
        self.state = state

    def collect(self, now: float) -> Iterator[Sample]:
        yield from self.state.samples()


class _TooLarge(Exception):
    pass


MAX_GZIP_MEMBERS = 64
"""A gzip body is one member from every OTLP client seen; concatenated members are legal, so a few are
taken, but not the hundreds of thousands of empty ones a hostile sender packs into 4 MiB."""
_CHUNK = 1 << 16


def inflate(body: bytes, encoding: str, cap: int) -> bytes:
    """The body decoded per ``Content-Encoding``, at most ``cap`` bytes (``_TooLarge`` beyond:
    decompression stops there); ``zlib.error`` for a corrupt or truncated stream or more than
    ``MAX_GZIP_MEMBERS`` gzip members.  Linear in the body: each member is fed in chunks of 64 KiB from
    an offset (never a copy of the rest of the body per member)."""
    if encoding in ("", "identity"):
        return body
    out = bytearray()
    view = memoryview(body)
    gzip = encoding in ("gzip", "x-gzip")
    wbits = 16 + zlib.MAX_WBITS if gzip else zlib.MAX_WBITS
    if not gzip and body[:1] and (body[0] & 0x0F) != 8:   # raw deflate, as some clients send it
        wbits = -zlib.MAX_WBITS
    pos, members = 0, 0
    while pos < len(body):
        members += 1
        if members > MAX_GZIP_MEMBERS:
            raise zlib.error(f"more than {MAX_GZIP_MEMBERS} gzip members")
        d = zlib.decompressobj(wbits)
        while not d.eof:
            if pos >= len(body):
                raise zlib.error("truncated compressed body")
            chunk = view[pos:pos + _CHUNK]
            out += d.decompress(chunk, cap + 1 - len(out))
            if len(out) > cap or d.unconsumed_tail:
                raise _TooLarge
            pos += len(chunk) - len(d.unused_data)
        if not gzip:
            break      # zlib / raw deflate: one stream, trailing bytes ignored as before
    return bytes(out)


class OtlpReceiver:
    """``OtlpReceiver(OtlpOptions(listen=...))``: ``.collector`` for the sampler, ``start()`` binds
    and serves, ``shutdown()``."""

    def __init__(self, opts: OtlpOptions, clock: Callable[[], float] = time.time,
                 budget: SampleBudget | None = None) -> None:
        self.opts = opts
        self.state = StageSeries(opts, clock, budget)
        self.collector = OtlpCollector(self.state)
        self.http: HttpServer | None = None
        self._pids: dict[int, tuple[float, dict[str, str]]] = {}
        self._pods: tuple[float, dict[str, attribution.PodDir] | None] = (0.0, None)

    @property
    def address(self) -> tuple[str, int]:
        if self.http is None:
            return self.opts.listen
        return self.http.server_address[0], self.http.server_address[1]

    def start(self) -> OtlpReceiver:
        """Bind (an address in use raises ``OSError`` here, in the caller's thread) and serve."""
        limits = Limits(max_connections=16, idle_timeout=30.0, header_timeout=5.0, request_timeout=15.0,
                        write_timeout=10.0, max_header_bytes=16384, max_headers=64, max_body=self.opts.max_body,
                        backlog=128)
        self.http = HttpServer(self.opts.listen, self.handle, limits=limits, workers=1, name="otlp",
                               methods=("POST",), error=self._framing_error).start()
        return self

    def shutdown(self) -> None:
        if self.http is not None:
            self.http.shutdown()

    # -- HTTP ------------------------------------------------------------------------------------------
    def _framing_error(self, status: int, message: str) -> Response:
        self.state.count("requests", "", str(status))   # refused before the path was looked at
        return Response.text(status, message)

    def handle(self, req: Request) -> Response:
        signal = PATHS.get(req.path)
        if signal is None:
            self.state.count("requests", "", "404")
            return Response.text(404, "only POST /v1/traces and /v1/metrics are served here (OTLP/HTTP)")
        ctype = (req.header("content-type") or "").split(";")[0].strip().lower()
        fmt = CONTENT_TYPES.get(ctype)
        if fmt is None:
            self.state.count("requests", signal, "415")
            return Response.text(415, f"unsupported Content-Type {ctype[:60]!r}: send application/x-protobuf "
                                      "or application/json")
        encoding = (req.header("content-encoding") or "").strip().lower()
        if encoding not in ENCODINGS:
            self.state.count("requests", signal, "415")
            return Response.text(415, f"unsupported Content-Encoding {encoding[:40]!r}: send gzip, deflate or none")
        if self.state.exhausted():
            self.state.count("requests", signal, "429")
            resp = self._status(fmt, 429, GRPC_RESOURCE_EXHAUSTED, "the agent took all it takes until its next "
                                "tick; retry in a second")
            resp.headers.append(("Retry-After", "1"))
            return resp
        try:
            body = inflate(req.body, encoding, self.opts.max_body)
            dec = decode(signal, body, fmt)
        except _TooLarge:
            self.state.count("requests", signal, "413")
            return self._status(fmt, 413, GRPC_RESOURCE_EXHAUSTED,
                                f"body larger than {self.opts.max_body} bytes once decompressed")
        except zlib.error as e:
            self.state.count("requests", signal, "400")
            return self._status(fmt, 400, GRPC_INVALID_ARGUMENT, f"cannot decompress the {encoding} body: {e}")
        except DecodeError as e:
            self.state.count("requests", signal, "400")
            return self._status(fmt, 400, GRPC_INVALID_ARGUMENT, str(e)[:500])
        rejected, why = self.state.add(signal, dec, self.labels_of, req.peer[0] if req.peer else None)
        self.state.count("requests", signal, "200")
        return self._success(signal, fmt, rejected, why)

    @staticmethod
    def _status(fmt: str, status: int, code: int, message: str) -> Response:
        """An error answer: a ``google.rpc.Status`` in the request's encoding (OTLP/HTTP)."""
        if fmt == "json":
            return Response(status, json.dumps({"code": code, "message": message}).encode(), "application/json")
        msg = message.encode()
        return Response(status, b"\x08" + bytes([code]) + b"\x12" + _varint(len(msg)) + msg, "application/x-protobuf")

    @staticmethod
    def _success(signal: str, fmt: str, rejected: int, why: str) -> Response:
        msg = f"rejected: {why}" if rejected else ""
        if fmt == "json":
            body: dict[str, object] = {}
            if rejected:
                field = "rejectedSpans" if signal == "traces" else "rejectedDataPoints"
                body["partialSuccess"] = {field: str(rejected), "errorMessage": msg}
            return Response(200, json.dumps(body).encode(), "application/json")
        if signal == "traces":
            tr = ExportTraceServiceResponse()
            if rejected:
                tr.partial_success.CopyFrom(ExportTracePartialSuccess(rejected_spans=rejected, error_message=msg))
            return Response(200, tr.SerializeToString(), "application/x-protobuf")
        mr = ExportMetricsServiceResponse()
        if rejected:
            mr.partial_success.CopyFrom(ExportMetricsPartialSuccess(rejected_data_points=rejected, error_message=msg))
        return Response(200, mr.SerializeToString(), "application/x-protobuf")

    # -- who sent it ---------------------------------------------------------------------------------
    def labels_of(self, resource: dict[str, str]) -> dict[str, str]:
        """``job``, ``instance`` and the workload labels of a sender, from its resource attributes."""
        name = resource.get("service.name") or "otlp"
        ns = resource.get("service.namespace")
        labels = {"job": f"{ns}/{name}" if ns else name, "instance": resource.get("service.instance.id", ""),
                  "namespace": resource.get("k8s.namespace.name", ""), "pod": resource.get("k8s.pod.name", ""),
                  "container": resource.get("k8s.container.name", ""), "workload": ""}
        pid = resource.get("process.pid", "")
        if not labels["pod"] and pid.isdigit() and int(pid) > 1:
            labels.update(self._by_pid(int(pid)))
        return labels

    def _by_pid(self, pid: int) -> dict[str, str]:
        """The agent's attribution of a local process (cgroup -> pod, else unit or command), cached
        30 s; nothing when the process is not visible here (another PID namespace)."""
        now = time.monotonic()
        hit = self._pids.get(pid)
        if hit is not None and hit[0] > now:
            return hit[1]
        info = attribution.read_process(self.opts.proc, pid)
        out: dict[str, str] = {}
        if info is not None:
            if self._pods[0] <= now:
                self._pods = (now + 30.0, attribution.read_pod_dirs(self.opts.pods_log_dir))
            w = attribution.attribute(info, (), self._pods[1])
            out = dict(zip(attribution.WORKLOAD_LABELS, w, strict=True))
        if len(self._pids) >= 1024:
            self._pids.clear()
        self._pids[pid] = (now + 30.0, out)
        return out


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


@contextlib.contextmanager
def running(opts: OtlpOptions) -> Iterator[OtlpReceiver]:
    """A started receiver for the length of a ``with`` (tests, tools)."""
    r = OtlpReceiver(opts).start()
    try:
        yield r
    finally:
        r.shutdown()
