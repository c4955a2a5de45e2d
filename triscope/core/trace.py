"""Recorded traces: one node's stored series and events as a compact file, and back into a store.

A trace lets the dashboard and the analysis show real GPU data on machines without a GPU
(``examples/traces/h200-phases.jsonl.gz`` was recorded on an H200).

File format (gzip-compressed JSON lines, ``.jsonl.gz``):

* line 1, the header: ``{"format": "triscope-trace", "version": 1, "node": NAME, "start": T0,
  "end": T1, "labels": {...}, "series": [[SID, METRIC, LABELS, KIND], ...]}``;
* then one line per tick: ``{"t": TS, "v": [[SID, VALUE], ...]}`` (counters cumulative, as
  stored), in time order;
* then one line per event: ``{"e": {"ts", "kind", "severity", "message", "details"}}``;
* then (optional) one line per remediation decision about the node: ``{"d": {"ts", "rule",
  "action", "outcome", "target", "target_key", "reason", "dry_run", ...}}`` (an audit row;
  ``received_ts``/``issued_ts``/``finished_ts`` shift with ``ts``).  The caller reads and writes
  the audit table (``triscope.store.audit``); this module only carries the rows.

Also here: the workload's phase log (JSON lines ``{"ts", "phase", "edge": "start"|"end", ...}``)
turned into ``phase`` events, and phase spans read back from stored events.
"""

from __future__ import annotations

import gzip
import json
import math
import re
import time
import zlib
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import IO, Any

from triscope.core import names
from triscope.core.errors import UserError
from triscope.core.samples import EventRecord, Sample, Tick
from triscope.core.timeparse import MAX_TS

FORMAT = "triscope-trace"
VERSION = 1
TICKS_PER_BATCH = 120


class TraceError(UserError):
    """A trace file that cannot be read (one clear line)."""


@dataclass
class TraceInfo:
    node: str
    start: float
    end: float
    series: int
    ticks: int
    events: int
    samples: int
    decisions: int = 0
    offset: float = 0.0         # import: what every timestamp was moved by


DECISION_FIELDS = ("ts", "engine_id", "rule", "trigger_kind", "trigger", "trigger_key", "action", "target",
                   "target_key", "node", "namespace", "outcome", "rail", "reason", "dry_run", "params", "response",
                   "received_ts", "issued_ts", "finished_ts")
"""The audit row's fields a trace carries (not its id: the importing store numbers its own)."""
DECISION_TIMES = ("ts", "received_ts", "issued_ts", "finished_ts")


# ---------------------------------------------------------------------- phases
def phase_events_from_log(path: Path | str) -> list[EventRecord]:
    """The workload's phase log as ``phase`` events (one per start and per end edge)."""
    out: list[EventRecord] = []
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise TraceError(f"cannot read phase log {path}: {e}") from None
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line:
            continue
        try:
            rec = _json_line(line)
            if not isinstance(rec, dict):
                raise ValueError("not a JSON object")
            ts, phase, edge = _finite(rec["ts"], "ts"), str(rec["phase"]), str(rec.get("edge", "start"))
        except (ValueError, KeyError, TypeError) as e:
            raise TraceError(f"{path}:{n}: not a phase record ({e})") from None
        details = {k: v for k, v in rec.items() if k != "ts"}
        details.setdefault("edge", edge)
        out.append(EventRecord(kind="phase", message=f"phase {phase} {edge}", severity="info",
                               details=details, ts=ts))
    return out


def phase_spans(events: Iterable[Any]) -> dict[str, tuple[float, float]]:
    """``{phase: (start, end)}`` from stored phase events (EventRow or EventRecord), in start order."""
    starts: dict[str, float] = {}
    spans: dict[str, tuple[float, float]] = {}
    for e in sorted(events, key=lambda e: e.ts):
        if e.kind != "phase":
            continue
        d = e.details or {}
        phase = d.get("phase")
        if not phase:
            continue
        if d.get("edge") == "end":
            s = float(d.get("start", starts.get(phase, e.ts)))
            spans[phase] = (s, float(d.get("end", e.ts)))
        else:
            starts[phase] = e.ts
    for phase, s in starts.items():  # a phase whose end edge never came: open until the next start
        if phase not in spans:
            later = [t for t in starts.values() if t > s]
            spans[phase] = (s, min(later) if later else s)
    return dict(sorted(spans.items(), key=lambda kv: kv[1][0]))


# ---------------------------------------------------------------------- export
def _num(v: float) -> float | int:
    """Integral values as JSON integers (shorter); everything else exactly (shortest repr)."""
    if v == v and abs(v) < 2**53 and v == int(v):
        return int(v)
    return v


def export_trace(store: Any, node: str, path: Path | str, *, start: float | None = None, end: float | None = None,
                 node_labels: dict[str, Any] | None = None, exclude_prefixes: Sequence[str] = (),
                 decisions: Sequence[dict[str, Any]] = ()) -> TraceInfo:
    """Write ``node``'s raw samples and events in [start, end] to ``path`` (gzip JSON lines), and
    ``decisions`` (audit rows as dicts) after them."""
    bounds = store.time_bounds(node)
    if bounds is None:
        raise TraceError(f"node {node!r} has no samples in {store.engine.url.render_as_string(hide_password=True)}")
    ev_start, ev_end = start, end  # without a range: every event of the node
    start = bounds[0] if start is None else start
    end = bounds[1] if end is None else end
    infos = [s for s in store.series(node=node) if not any(s.metric.startswith(p) for p in exclude_prefixes)]
    by_ts: dict[float, list[list[float | int]]] = defaultdict(list)
    series_rows: list[list[Any]] = []
    nsamples = 0
    for sid, info in enumerate(infos):
        sd = store.query_series(info, start, end, max_points=None, rate=False, tier="raw")
        if not sd.ts:
            continue
        series_rows.append([sid, info.metric, info.labels, info.kind])
        for t, v in zip(sd.ts, sd.values, strict=True):
            by_ts[t].append([sid, _num(v)])
            nsamples += 1
    events = store.events(node=node, start=ev_start, end=ev_end)
    if node_labels is None:
        node_labels = next((n.labels for n in store.nodes() if n.name == node), {})
    header = {"format": FORMAT, "version": VERSION, "node": node, "start": start, "end": end,
              "labels": node_labels or {}, "created": time.time(), "series": series_rows}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt", encoding="utf-8", compresslevel=9) as f:
        f.write(json.dumps(header, separators=(",", ":")) + "\n")
        for t in sorted(by_ts):
            f.write(json.dumps({"t": t, "v": by_ts[t]}, separators=(",", ":")) + "\n")
        for e in events:
            f.write(json.dumps({"e": {"ts": e.ts, "kind": e.kind, "severity": e.severity, "message": e.message,
                                      "details": e.details}}, separators=(",", ":")) + "\n")
        for d in decisions:
            f.write(json.dumps({"d": {k: v for k, v in d.items() if k in DECISION_FIELDS}},
                               separators=(",", ":"), default=str) + "\n")
    return TraceInfo(node, start, end, len(series_rows), len(by_ts), len(events), nsamples, len(decisions))


# ---------------------------------------------------------------------- import
MAX_LINE_CHARS = 64 * 1024 * 1024
"""Longest line of a trace (the header lists every series: ~35 KB for the H200 recording)."""
SEVERITIES = ("info", "warning", "error", "critical")


@dataclass
class Trace:
    header: dict[str, Any]
    ticks: list[tuple[float, list[tuple[int, float]]]]
    events: list[dict[str, Any]]
    decisions: list[dict[str, Any]] = field(default_factory=list)

    def shifted_decisions(self, offset: float) -> list[dict[str, Any]]:
        """The decisions with every timestamp moved by ``offset`` (as ``import_trace`` moves ticks):
        the time fields, and the absolute times written inside their texts ("wrote FILE until
        2026-12-01T21:19:02Z" in a reason, a response's expiry), so a reason says the same time
        as the row it is on."""
        return [{k: (float(v) + offset if k in DECISION_TIMES and v is not None else shift_times_in(v, offset))
                 for k, v in d.items()} for d in self.decisions]


_ISO_TIME = re.compile(r"\b(\d{4}-\d\d-\d\d)([T ])(\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:?\d\d)")


def _shift_iso(m: re.Match[str], offset: float) -> str:
    sep, frac, zone = m.group(2), m.group(4) or "", m.group(5)
    try:
        t = datetime.fromisoformat(f"{m.group(1)}T{m.group(3)}{frac}{'+00:00' if zone == 'Z' else zone}")
    except ValueError:
        return m.group(0)
    moved = (t + timedelta(seconds=offset)).astimezone(t.tzinfo)
    text = moved.strftime(f"%Y-%m-%d{sep}%H:%M:%S") + (f"{moved.microsecond / 1e6:.{len(frac) - 1}f}"[1:] if frac else "")
    return text + ("Z" if zone == "Z" else moved.strftime("%z")[:3] + ":" + moved.strftime("%z")[3:]
                   if ":" in zone else moved.strftime("%z"))


def shift_times_in(value: Any, offset: float) -> Any:
    """``value`` with every ISO 8601 time that names its zone (``...Z``, ``+02:00``) moved by
    ``offset`` seconds, in the same form; strings inside lists and mappings too; other values as
    they are.  A time without a zone is left alone (it may not be an instant)."""
    if not offset:
        return value
    if isinstance(value, str):
        return _ISO_TIME.sub(lambda m: _shift_iso(m, offset), value) if "-" in value else value
    if isinstance(value, list):
        return [shift_times_in(v, offset) for v in value]
    if isinstance(value, dict):
        return {k: shift_times_in(v, offset) for k, v in value.items()}
    return value


def _open(path: Path) -> IO[str]:
    with open(path, "rb") as raw:
        magic = raw.read(2)
    if magic == b"\x1f\x8b":
        return gzip.open(path, "rt", encoding="utf-8")
    return open(path, encoding="utf-8")


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not allowed (JSON has no NaN or Infinity)")


def _json_line(line: str) -> Any:
    """One line of strict JSON (no NaN / Infinity); nesting too deep is a ValueError."""
    try:
        return json.loads(line, parse_constant=_no_constant)
    except RecursionError:
        raise ValueError("nested too deeply") from None


def _finite(v: Any, what: str) -> float:
    """A timestamp: a finite number of epoch seconds between 1970 and 9999."""
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or not 0 <= v <= MAX_TS:
        raise ValueError(f"{what} must be epoch seconds (a finite number from 1970 to 9999), not {_short(v)}")
    return float(v)


def _short(v: Any) -> str:
    return names.shorten(repr(v), 60)


def _check_header(header: Any, path: Path) -> None:
    """The header's fields, each checked (one line naming the field when one is wrong)."""
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise TraceError(f"{path} is not a triscope trace (no '{FORMAT}' header)")

    def bad(reason: str) -> TraceError:
        return TraceError(f"{path}:1: bad trace header: {reason}")

    version = header.get("version", VERSION)
    if isinstance(version, bool) or not isinstance(version, int):
        raise bad(f"version must be an integer, not {_short(version)}")
    if version > VERSION:
        raise TraceError(f"{path}: trace version {version} is newer than this triscope understands ({VERSION})")
    node = header.get("node")
    problem = names.node_name_problem(node) if node is not None else None
    if problem:
        raise bad(problem)
    try:
        for k in ("start", "end"):
            if header.get(k) is not None:
                _finite(header[k], k)
    except ValueError as e:
        raise bad(str(e)) from None
    labels = header.get("labels") or {}
    if not isinstance(labels, dict) or not all(isinstance(v, str | int | float | bool) or v is None
                                               for v in labels.values()):
        raise bad("labels must be a mapping of names to plain values")
    header["labels"] = {str(k): v if not isinstance(v, str) else names.bound_label_value(v) for k, v in labels.items()}
    series = header.get("series", [])
    if not isinstance(series, list):
        raise bad("series must be a list of [ID, METRIC, LABELS, KIND]")
    seen: set[int] = set()
    for i, row in enumerate(series):
        problem = _series_problem(i, row, seen)
        if problem:
            raise bad(problem)


def _series_problem(i: int, row: Any, seen: set[int]) -> str | None:
    """What is wrong with the header's ``series[i]`` (its id added to ``seen``), or None."""
    if not (isinstance(row, list) and len(row) == 4 and isinstance(row[0], int) and not isinstance(row[0], bool)):
        return f"series[{i}] is not [ID, METRIC, LABELS, KIND]: {_short(row)}"
    sid, metric, lab, kind = row
    if sid in seen:
        return f"series[{i}]: id {sid} is used twice"
    seen.add(sid)
    problem = names.metric_name_problem(metric)
    if problem:
        return f"series[{i}]: {problem}"
    if not isinstance(lab, dict) or not all(isinstance(v, str) for v in lab.values()):
        return f"series[{i}] ({metric}): labels must be a mapping of names to strings"
    for k in lab:
        problem = names.label_name_problem(k)
        if problem:
            return f"series[{i}] ({metric}): {problem}"
    if kind not in ("gauge", "counter"):
        return f"series[{i}] ({metric}): kind must be gauge or counter, not {_short(kind)}"
    return None


def _parse_line(rec: Any, known: set[int]) -> tuple[str, Any]:
    """('t', tick), ('e', event) or ('d', decision) of one line after the header; ValueError says
    what is wrong."""
    if not isinstance(rec, dict):
        raise ValueError("not a JSON object")
    if "t" in rec:
        return "t", _tick(rec, known)
    if "e" in rec:
        return "e", _event(rec["e"])
    if "d" in rec:
        return "d", _decision(rec["d"])
    raise ValueError("neither a tick, an event nor a decision")


def _tick(rec: dict[str, Any], known: set[int]) -> tuple[float, list[tuple[int, float]]]:
    t = _finite(rec["t"], "t")
    raw = rec.get("v")
    if not isinstance(raw, list):
        raise ValueError("v must be a list of [SERIES_ID, VALUE]")
    vals = []
    for pair in raw:
        if not (isinstance(pair, list) and len(pair) == 2):
            raise ValueError(f"v holds {_short(pair)}, not [SERIES_ID, VALUE]")
        sid, v = pair
        if isinstance(sid, bool) or not isinstance(sid, int) or isinstance(v, bool) or not isinstance(v, int | float):
            raise ValueError(f"v holds {_short(pair)}, not [SERIES_ID, VALUE]")
        if sid not in known:
            raise ValueError(f"unknown series id {sid}")
        vals.append((sid, float(v)))
    return t, vals


def _event(e: Any) -> dict[str, Any]:
    if not isinstance(e, dict):
        raise ValueError("e must be an object")
    _finite(e.get("ts"), "ts")
    kind = e.get("kind")
    if not isinstance(kind, str) or not kind or len(kind) > 64:
        raise ValueError(f"kind must be a name of 1 to 64 characters, not {_short(kind)}")
    if e.get("severity", "info") not in SEVERITIES:
        raise ValueError(f"severity must be one of {', '.join(SEVERITIES)}, not {_short(e.get('severity'))}")
    if not isinstance(e.get("message", ""), str):
        raise ValueError("message must be a string")
    if not isinstance(e.get("details") or {}, dict):
        raise ValueError("details must be an object")
    return e


def _decision(d: Any) -> dict[str, Any]:
    if not isinstance(d, dict):
        raise ValueError("d must be an object")
    for k in DECISION_TIMES:
        if k == "ts" or d.get(k) is not None:
            _finite(d.get(k), k)
    for k in ("rule", "action", "outcome"):
        if not isinstance(d.get(k), str) or not d[k] or len(d[k]) > 253:
            raise ValueError(f"{k} must be a name of 1 to 253 characters, not {_short(d.get(k))}")
    for k in ("params", "response"):
        if not isinstance(d.get(k) or {}, dict):
            raise ValueError(f"{k} must be an object")
    return {k: v for k, v in d.items() if k in DECISION_FIELDS}


def read_trace(path: Path | str) -> Trace:
    """Read and check a trace file; anything wrong is one ``TraceError`` line (``FILE:LINE: ...``)."""
    path = Path(path)
    if not path.is_file():
        raise TraceError(f"trace file {path} does not exist" if not path.exists() else f"{path} is not a file")
    ticks: list[tuple[float, list[tuple[int, float]]]] = []
    events: list[dict[str, Any]] = []
    decisions: list[dict[str, Any]] = []
    n = 1
    try:
        with _open(path) as f:
            first = f.readline(MAX_LINE_CHARS + 1)
            if len(first) > MAX_LINE_CHARS:
                raise TraceError(f"{path} is not a triscope trace (its first line is longer than "
                                 f"{MAX_LINE_CHARS:,} characters)")
            try:
                header = _json_line(first)
            except ValueError:
                raise TraceError(f"{path} is not a triscope trace (first line is not JSON)") from None
            _check_header(header, path)
            known = {int(s[0]) for s in header.get("series", [])}
            while True:
                line = f.readline(MAX_LINE_CHARS + 1)
                if not line:
                    break
                n += 1
                if len(line) > MAX_LINE_CHARS:
                    raise TraceError(f"{path}:{n}: bad trace line (longer than {MAX_LINE_CHARS:,} characters)")
                if not line.strip():
                    continue
                try:
                    what, item = _parse_line(_json_line(line), known)
                except ValueError as err:
                    raise TraceError(f"{path}:{n}: bad trace line ({err})") from None
                if what == "t":
                    ticks.append(item)
                elif what == "e":
                    events.append(item)
                else:
                    decisions.append(item)
    except UnicodeDecodeError:
        raise TraceError(f"{path}:{n}: not a triscope trace (not UTF-8 text: a binary file?)") from None
    except (OSError, EOFError, zlib.error) as e:
        raise TraceError(f"cannot read trace {path}: {e}") from None
    return Trace(header, ticks, events, decisions)


def _shift_details(details: dict[str, Any], offset: float, lo: float, hi: float) -> dict[str, Any]:
    """Shift the timestamps phase events carry in their details (start/end/ts) along with the event."""
    out = dict(details)
    for k in ("start", "end", "ts"):
        v = out.get(k)
        if isinstance(v, (int, float)) and lo - 3600 <= v <= hi + 3600:
            out[k] = v + offset
    return out


def iter_ticks(trace: Trace, offset: float = 0.0) -> Iterator[Any]:

    series = {int(s[0]): (str(s[1]), dict(s[2]), str(s[3])) for s in trace.header["series"]}
    for t, vals in trace.ticks:
        samples = []
        for sid, v in vals:
            metric, labels, kind = series[sid]
            samples.append(Sample(metric, v, labels, "counter" if kind == "counter" else "gauge"))
        yield Tick(t + offset, samples, ())


def import_trace(store: Any, path: Path | str, *, node: str | None = None, shift_to_now: bool = False,
                 now: float | None = None, trace: Trace | None = None) -> TraceInfo:
    """Load a trace into ``store`` under ``node`` (default: the node it was recorded on).

    ``shift_to_now`` moves every timestamp by the same offset so the trace ends now.  Loading the
    same trace twice (without shifting) adds nothing: samples are idempotent per (series, ts) and
    events already present (same ts, kind, message) are skipped.  ``trace``: the file already read
    by ``read_trace``.
    """
    if node is not None:
        problem = names.node_name_problem(node)
        if problem:
            raise TraceError(problem)
    trace = read_trace(path) if trace is None else trace
    node = node or str(trace.header.get("node") or "trace")
    start = float(trace.header.get("start") or (trace.ticks[0][0] if trace.ticks else 0.0))
    end = float(trace.header.get("end") or (trace.ticks[-1][0] if trace.ticks else start))
    offset = 0.0
    if shift_to_now:
        offset = (time.time() if now is None else now) - end
    batch: list[Any] = []
    nsamples = 0
    for tick in iter_ticks(trace, offset):
        batch.append(tick)
        nsamples += len(tick.samples)
        if len(batch) >= TICKS_PER_BATCH:
            store.write_ticks(node, batch)
            batch = []
    if batch:
        store.write_ticks(node, batch)
    labels = trace.header.get("labels") or {}
    if labels and hasattr(store, "set_node_labels"):
        store.set_node_labels(node, {**labels, "trace": Path(path).name})
    existing = {(round(e.ts, 6), e.kind, e.message)
                for e in store.events(node=node, start=start + offset - 1, end=end + offset + 1)}
    new: list[EventRecord] = []
    for e in trace.events:
        ts = float(e["ts"]) + offset
        key = (round(ts, 6), str(e["kind"]), str(e.get("message", "")))
        if key in existing:
            continue
        new.append(EventRecord(kind=str(e["kind"]), message=str(e.get("message", "")),
                               severity=e.get("severity", "info"),
                               details=_shift_details(e.get("details") or {}, offset, start, end), ts=ts))
    if new:
        store.add_events(node, new)
    return TraceInfo(node, start + offset, end + offset, len(trace.header["series"]), len(trace.ticks),
                     len(new), nsamples, len(trace.decisions), offset)
