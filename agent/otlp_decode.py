"""OTLP request bodies -> the few fields the agent uses: stage spans and stage metric points.

Both encodings OTLP/HTTP defines are read into the same plain structures:

* **protobuf** (``application/x-protobuf``): the generated classes of ``opentelemetry-proto``
  (``ExportTraceServiceRequest`` / ``ExportMetricsServiceRequest``);
* **JSON** (``application/json``, the OTLP JSON encoding: lowerCamelCase field names, hex trace
  and span ids, 64-bit integers as strings or numbers, enums as integers): walked directly from
  ``json.loads`` — ``json_format`` would read hex ids as base64 and is ten times slower.

What is kept (docs/otlp.md): per resource, the attributes that name the sender
(``RESOURCE_KEYS``); per span, its stage (the ``triscope.stage`` attribute, else a span name in
``STAGE_NAMES``) and its duration; per metric, histograms, exponential histograms and monotonic
sums whose data points carry a stage.  Everything else is counted (``ignored``) and dropped here,
before any aggregation, and so is what cannot be used soundly (``dropped``: a span longer than
``MAX_SPAN_S``, a metric named like the agent's own, a histogram point with more than ``MAX_BOUNDS``
bucket bounds; ``invalid``: bucket counts that are negative
or do not add up to the count, ...).  An attribute whose name Prometheus reserves (``__name__``,
anything starting with ``__``) never becomes a label.
A body that is not what its content type says raises ``DecodeError``.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from google.protobuf.message import DecodeError as _PbDecodeError
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

STAGE_ATTR = "triscope.stage"
# span names taken as a stage without the attribute: the stages analysis/stages.py orders
# (preprocess, h2d, compute, d2h) and those the example inference service exports
STAGE_NAMES = frozenset(("decode", "preprocess", "queue", "h2d", "compute", "model", "d2h", "postprocess"))
RESOURCE_KEYS = ("service.name", "service.namespace", "service.instance.id", "k8s.namespace.name",
                 "k8s.pod.name", "k8s.container.name", "process.pid")
MAX_ATTRS = 16          # data point attributes kept as labels (the rest dropped)
MAX_BOUNDS = 64         # explicit bucket bounds of one histogram point (OTel's default has 15): each is a
                        # series written every tick, so one point of 100,000 buckets would be 100,000 series
MAX_VALUE = 128         # characters of a label value
MAX_SPAN_S = 3600.0     # a stage span longer than this is dropped (too_long): a clock jump, not a stage
RESERVED_PREFIXES = ("triscope_", "__")   # metric names the receiver does not feed (the agent's own)
TEMPORALITY_DELTA, TEMPORALITY_CUMULATIVE = 1, 2
_TEMPORALITY_NAMES = {"AGGREGATION_TEMPORALITY_DELTA": 1, "AGGREGATION_TEMPORALITY_CUMULATIVE": 2}
_LABEL_BAD = re.compile(r"[^a-zA-Z0-9_]")
_METRIC_BAD = re.compile(r"[^a-zA-Z0-9_:]")
UNIT_SCALE = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}


PointTuple = tuple[dict[str, str], int, float, float, tuple[float, ...], tuple[float, ...]]


class DecodeError(ValueError):
    """The body is not a valid OTLP request in the encoding its content type names."""


@dataclass(slots=True)
class Point:
    """One stage data point: a histogram's (count, sum, bounds, bucket counts) or a sum's count."""

    name: str                        # Prometheus-style base name (unit suffix added, see metric_name)
    kind: str                        # "histogram" (sum/count/buckets) or "counter"
    labels: dict[str, str]           # the point's attributes as labels (``stage`` among them)
    temporality: int                 # TEMPORALITY_DELTA or TEMPORALITY_CUMULATIVE
    start_ns: int
    count: float
    total: float = 0.0
    bounds: tuple[float, ...] = ()
    buckets: tuple[float, ...] = ()


@dataclass(slots=True)
class Group:
    """What one resource sent: its naming attributes, its stage spans (stage, seconds) and points."""

    resource: dict[str, str]
    spans: list[tuple[str, float]] = field(default_factory=list)
    points: list[Point] = field(default_factory=list)


@dataclass(slots=True)
class Decoded:
    groups: list[Group] = field(default_factory=list)
    received: int = 0                # spans or data points in the body
    invalid: int = 0                 # stage spans/points that cannot be used (end before start, NaN ...)
    ignored: dict[str, int] = field(default_factory=dict)   # reason -> spans or points (attributes: reserved_label)
    dropped: dict[str, int] = field(default_factory=dict)   # reason -> stage spans or points refused here

    def ignore(self, reason: str, n: int = 1) -> None:
        if n:
            self.ignored[reason] = self.ignored.get(reason, 0) + n

    def drop(self, reason: str, n: int = 1) -> None:
        if n:
            self.dropped[reason] = self.dropped.get(reason, 0) + n


def clean(text: str, limit: int = MAX_VALUE) -> str:
    """A label value from a sender's bytes: printable, bounded."""
    return "".join(ch if ch.isprintable() else "?" for ch in text[:limit])


def label_name(key: str) -> str | None:
    """The Prometheus label name for an attribute key (``[a-zA-Z_][a-zA-Z0-9_]*``: other characters
    become ``_``, a leading digit or an empty key gets ``key_``); None when it would start with
    ``__``, which Prometheus reserves (``__name__`` would make the whole /metrics unreadable)."""
    name = _LABEL_BAD.sub("_", key)[:64]
    if name.startswith("__"):
        return None
    return "key_" + name if not name or name[0].isdigit() else name


def metric_name(name: str, unit: str) -> tuple[str, float] | None:
    """The Prometheus-style name of an OTLP metric and the factor its values are scaled by:
    invalid characters to ``_``; a time unit (s, ms, us, ns) becomes ``_seconds`` (values in
    seconds).  None for a name that stays invalid."""
    base = _METRIC_BAD.sub("_", name)
    scale = 1.0
    unit = unit.strip()
    if unit in UNIT_SCALE:
        scale = UNIT_SCALE[unit]
        for suffix in ("_seconds", "_milliseconds", "_ms", "_s"):
            if base.endswith(suffix):
                base = base[: -len(suffix)]
                break
        base += "_seconds"
    if not base or base[0].isdigit() or len(base) > 200:
        return None
    return base, scale


def decode(signal: str, body: bytes, fmt: str) -> Decoded:
    """``signal`` "traces" or "metrics", ``fmt`` "proto" or "json"."""
    if fmt == "proto":
        try:
            if signal == "traces":
                return _traces_pb(ExportTraceServiceRequest.FromString(body))
            return _metrics_pb(ExportMetricsServiceRequest.FromString(body))
        except _PbDecodeError as e:
            raise DecodeError(f"malformed protobuf {signal} request: {e}") from None
        except (ValueError, TypeError, OverflowError) as e:   # e.g. invalid UTF-8 in a string field
            raise DecodeError(f"malformed protobuf {signal} request: {e}") from None
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise DecodeError(f"malformed JSON: {e}") from None
    try:
        return _traces_json(doc) if signal == "traces" else _metrics_json(doc)
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError, RecursionError) as e:
        raise DecodeError(f"malformed OTLP JSON {signal} request: {type(e).__name__}: {e}") from None


# -- protobuf --------------------------------------------------------------------------------------------

def _any_pb(v: Any) -> str | None:
    which = v.WhichOneof("value")
    if which == "string_value":
        return str(v.string_value)
    if which in ("int_value", "bool_value"):
        return str(getattr(v, which)).lower() if which == "bool_value" else str(v.int_value)
    if which == "double_value":
        return repr(v.double_value)
    return None


def _resource_pb(attrs: Iterable[Any]) -> dict[str, str]:
    out: dict[str, str] = {}
    for kv in attrs:
        if kv.key in RESOURCE_KEYS:
            val = _any_pb(kv.value)
            if val is not None:
                out[kv.key] = clean(val)
    return out


def _traces_pb(req: Any) -> Decoded:
    res = Decoded()
    for rs in req.resource_spans:
        group = Group(_resource_pb(rs.resource.attributes))
        for ss in rs.scope_spans:
            for span in ss.spans:
                res.received += 1
                stage = None
                for kv in span.attributes:
                    if kv.key == STAGE_ATTR:
                        stage = _any_pb(kv.value)
                        break
                _add_span(res, group, stage, span.name, span.start_time_unix_nano, span.end_time_unix_nano)
        if group.spans:
            res.groups.append(group)
    return res


def _labels_pb(attrs: Iterable[Any], res: Decoded) -> dict[str, str]:
    return _labels(((kv.key, _any_pb(kv.value)) for kv in attrs), res)


def _metrics_pb(req: Any) -> Decoded:
    res = Decoded()
    for rm in req.resource_metrics:
        group = Group(_resource_pb(rm.resource.attributes))
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                which = m.WhichOneof("data")
                if which in ("histogram", "exponential_histogram"):
                    data = getattr(m, which)
                    pts = [(_labels_pb(p.attributes, res), p.start_time_unix_nano, p.count, p.sum,
                            tuple(p.explicit_bounds) if which == "histogram" else (),
                            tuple(p.bucket_counts) if which == "histogram" else ()) for p in data.data_points]
                    _add_points(res, group, m.name, m.unit, "histogram", data.aggregation_temporality, pts)
                elif which == "sum" and m.sum.is_monotonic:
                    pts = [(_labels_pb(p.attributes, res), p.start_time_unix_nano,
                            p.as_double if p.WhichOneof("value") == "as_double" else p.as_int, 0.0, (), ())
                           for p in m.sum.data_points]
                    _add_points(res, group, m.name, m.unit, "counter", m.sum.aggregation_temporality, pts)
                else:
                    data = getattr(m, which) if which else None
                    res.received += len(data.data_points) if data is not None else 0
                    res.ignore("unsupported_type", len(data.data_points) if data is not None else 0)
        if group.points:
            res.groups.append(group)
    return res


# -- JSON -----------------------------------------------------------------------------------------------

def _list(obj: Any, key: str) -> list[Any]:
    v = obj.get(key) if isinstance(obj, dict) else None
    if v is None:
        return []
    if not isinstance(v, list):
        raise TypeError(f"{key} must be an array")
    return v


def _dict(obj: Any, key: str) -> dict[str, Any]:
    v = obj.get(key) if isinstance(obj, dict) else None
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise TypeError(f"{key} must be an object")
    return v


def _int(v: Any, what: str) -> int:
    """A 64-bit integer field: a decimal string (the OTLP JSON encoding) or a JSON number."""
    if v is None:
        return 0
    if isinstance(v, bool) or not isinstance(v, (int, str, float)):
        raise TypeError(f"{what} must be an integer (or a string holding one)")
    if isinstance(v, float):
        if v != int(v):
            raise ValueError(f"{what} must be an integer")
        return int(v)
    return int(v)


def _num(v: Any, what: str) -> float:
    if v is None:
        return 0.0
    if isinstance(v, bool) or not isinstance(v, (int, float, str)):
        raise TypeError(f"{what} must be a number")
    return float(v)    # "NaN", "Infinity" strings are the protobuf JSON spellings


def _any_json(v: Any) -> str | None:
    if not isinstance(v, dict):
        raise TypeError("an attribute value must be an AnyValue object")
    if "stringValue" in v:
        if not isinstance(v["stringValue"], str):
            raise TypeError("stringValue must be a string")
        return v["stringValue"]
    if "intValue" in v:
        return str(_int(v["intValue"], "intValue"))
    if "boolValue" in v:
        return "true" if v["boolValue"] else "false"
    if "doubleValue" in v:
        return repr(_num(v["doubleValue"], "doubleValue"))
    return None


def _attrs_json(obj: Any) -> Iterator[tuple[str, str | None]]:
    for kv in _list(obj, "attributes"):
        if not isinstance(kv, dict) or not isinstance(kv.get("key"), str):
            raise TypeError("an attribute must be an object with a string key")
        yield kv["key"], _any_json(kv.get("value", {}))


def _resource_json(obj: Any) -> dict[str, str]:
    return {k: clean(v) for k, v in _attrs_json(_dict(obj, "resource")) if k in RESOURCE_KEYS and v is not None}


def _traces_json(doc: Any) -> Decoded:
    if not isinstance(doc, dict):
        raise TypeError("the request must be a JSON object")
    res = Decoded()
    for rs in _list(doc, "resourceSpans"):
        group = Group(_resource_json(rs))
        for ss in _list(rs, "scopeSpans"):
            for span in _list(ss, "spans"):
                if not isinstance(span, dict):
                    raise TypeError("a span must be an object")
                res.received += 1
                stage = next((v for k, v in _attrs_json(span) if k == STAGE_ATTR), None)
                name = span.get("name", "")
                if not isinstance(name, str):
                    raise TypeError("a span's name must be a string")
                _add_span(res, group, stage, name, _int(span.get("startTimeUnixNano"), "startTimeUnixNano"),
                          _int(span.get("endTimeUnixNano"), "endTimeUnixNano"))
        if group.spans:
            res.groups.append(group)
    return res


def _temporality_json(data: dict[str, Any]) -> int:
    t = data.get("aggregationTemporality", 0)
    return _TEMPORALITY_NAMES.get(t, 0) if isinstance(t, str) and not t.isdigit() else _int(t, "aggregationTemporality")


def _metrics_json(doc: Any) -> Decoded:
    if not isinstance(doc, dict):
        raise TypeError("the request must be a JSON object")
    res = Decoded()
    for rm in _list(doc, "resourceMetrics"):
        group = Group(_resource_json(rm))
        for sm in _list(rm, "scopeMetrics"):
            for m in _list(sm, "metrics"):
                if not isinstance(m, dict) or not isinstance(m.get("name", ""), str) \
                        or not isinstance(m.get("unit", ""), str):
                    raise TypeError("a metric must be an object with a string name and unit")
                name, unit = m.get("name", ""), m.get("unit", "")
                if "histogram" in m or "exponentialHistogram" in m:
                    explicit = "histogram" in m
                    data = _dict(m, "histogram" if explicit else "exponentialHistogram")
                    pts: list[PointTuple] = [
                        (_labels(_attrs_json(p), res), _int(p.get("startTimeUnixNano"), "startTimeUnixNano"),
                         float(_int(p.get("count"), "count")), _num(p.get("sum"), "sum"),
                         tuple(_num(b, "explicitBounds") for b in _list(p, "explicitBounds")) if explicit else (),
                         tuple(float(_int(c, "bucketCounts")) for c in _list(p, "bucketCounts")) if explicit else ())
                           for p in _points_json(data)]
                    _add_points(res, group, name, unit, "histogram", _temporality_json(data), pts)
                elif "sum" in m and _dict(m, "sum").get("isMonotonic") is True:
                    data = _dict(m, "sum")
                    pts = [(_labels(_attrs_json(p), res), _int(p.get("startTimeUnixNano"), "startTimeUnixNano"),
                            _num(p["asDouble"], "asDouble") if "asDouble" in p else float(_int(p.get("asInt"), "asInt")),
                            0.0, (), ()) for p in _points_json(data)]
                    _add_points(res, group, name, unit, "counter", _temporality_json(data), pts)
                else:
                    n = sum(len(_points_json(_dict(m, k))) for k in ("gauge", "sum", "summary") if k in m)
                    res.received += n
                    res.ignore("unsupported_type", n)
        if group.points:
            res.groups.append(group)
    return res


def _points_json(data: dict[str, Any]) -> list[dict[str, Any]]:
    pts = _list(data, "dataPoints")
    if not all(isinstance(p, dict) for p in pts):
        raise TypeError("a data point must be an object")
    return pts


# -- shared ---------------------------------------------------------------------------------------------

def _add_span(res: Decoded, group: Group, stage: str | None, name: str, start: int, end: int) -> None:
    if stage is None:
        low = name.lower()
        stage = low if low in STAGE_NAMES else None
    if not stage or not stage.strip():
        res.ignore("no_stage")
        return
    if start <= 0 or end < start:
        res.invalid += 1
        return
    if end - start > MAX_SPAN_S * 1e9:
        res.drop("too_long")
        return
    group.spans.append((clean(stage.strip(), 64), (end - start) / 1e9))


def _labels(attrs: Iterable[tuple[str, str | None]], res: Decoded) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in attrs:
        if value is None or len(out) >= MAX_ATTRS:
            continue
        name = "stage" if key == STAGE_ATTR else label_name(key)
        if name is None:
            res.ignore("reserved_label")     # counts attributes, not points: the point is kept without it
            continue
        out[name] = clean(value)
    return out


def _add_points(res: Decoded, group: Group, name: str, unit: str, kind: str, temporality: int,
                pts: Sequence[PointTuple]) -> None:
    res.received += len(pts)
    staged = [p for p in pts if p[0].get("stage")]
    res.ignore("no_stage", len(pts) - len(staged))
    if not staged:
        return
    named = metric_name(name, unit)
    if named is None or temporality not in (TEMPORALITY_DELTA, TEMPORALITY_CUMULATIVE):
        res.invalid += len(staged)
        return
    base, scale = named
    if base.startswith(RESERVED_PREFIXES):
        res.drop("reserved_name", len(staged))
        return
    if kind == "counter" and not base.endswith(("_total", "_sum", "_count")):
        base += "_total"
    for labels, start_ns, count, total, bounds, buckets in staged:
        if len(bounds) > MAX_BOUNDS or len(buckets) > MAX_BOUNDS + 1:
            res.drop("too_many_buckets")
            continue
        if not math.isfinite(count) or not math.isfinite(total) or any(not math.isfinite(b) for b in bounds):
            # NaN or an infinity would poison the series' cumulative state for good (every later
            # point compared against it): refused per point, with its reason
            res.drop("not_finite")
            continue
        if count < 0 or total != total or abs(total) == float("inf") or (bounds or buckets) and (
                len(buckets) != len(bounds) + 1 or list(bounds) != sorted(bounds)
                or any(c < 0 for c in buckets) or sum(buckets) != count):
            res.invalid += 1
            continue
        if kind == "counter":
            count = count * scale
        group.points.append(Point(base, kind, labels, temporality, start_ns, float(count), total * scale,
                                  tuple(b * scale for b in bounds), tuple(float(c) for c in buckets)))
