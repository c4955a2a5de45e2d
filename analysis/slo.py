"""Service-level objectives: Sloth's ``prometheus/v1`` spec, evaluated over the store and turned
into Prometheus recording and alerting rules.

The spec (https://sloth.dev, ``prometheus/v1``)::

    version: "prometheus/v1"
    service: "inference"
    labels: {team: ml}              # optional, added to every rule
    period: 30d                     # triscope extension (Sloth: --default-slo-period); default 30d
    slos:
      - name: "requests-availability"
        objective: 99.5             # percent
        description: "..."          # optional
        labels: {tier: "1"}         # optional
        sli:
          events:
            error_query: sum(rate(app_requests_total{code=~"5.."}[{{.window}}]))
            total_query: sum(rate(app_requests_total[{{.window}}]))
        alerting:
          name: InferenceAvailability
          labels: {category: availability}
          annotations: {summary: "..."}
          page_alert: {labels: {severity: page}}      # disable: true to drop it
          ticket_alert: {labels: {severity: ticket}}

triscope evaluates the queries itself from stored series, so a query must be a sum of terms
``sum(rate(METRIC{matchers}[{{.window}}]))`` (or ``increase``) joined by ``+`` / ``-``, matchers
``=``, ``!=``, ``=~``, ``!~``.  That covers ratio SLIs (bad / total) and latency SLIs from histogram
buckets (``error_query: sum(rate(x_count[..])) - sum(rate(x_bucket{le="0.5"}[..]))``).  Sloth's
``sli.raw`` and ``sli.plugin`` forms are refused with the line they are on.

Burn rates: 5m, 30m, 1h, 6h, 1d, 3d; alerts by the SRE workbook's multi-window multi-burn-rate
rules: page when 2 % of the period's budget burns in 1 h (14.4x over 1 h and 5 m, for 30 d) or 5 %
in 6 h (6x over 6 h and 30 m); ticket when 10 % burns in 3 d (1x over 3 d and 6 h).  The factors
scale with the period.  Error ratios are ratios of sums (all errors / all requests over the
window), a window without requests is "no data", never 0.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from triscope import yamlsafe
from triscope.labels import Matcher, escape_value

WINDOWS: tuple[tuple[str, float], ...] = (
    ("5m", 300.0), ("30m", 1800.0), ("1h", 3600.0), ("6h", 21600.0), ("1d", 86400.0), ("3d", 259200.0),
)
WINDOW_SECONDS = dict(WINDOWS)
# (severity, long window, short window, share of the period's budget burnt in the long window)
ALERT_RULES: tuple[tuple[str, str, str, float], ...] = (
    ("page", "1h", "5m", 0.02),
    ("page", "6h", "30m", 0.05),
    ("ticket", "3d", "6h", 0.10),
)


class SLOSpecError(ValueError):
    """A malformed SLO file: the message is ``FILE:LINE: what is wrong``."""


# ---------------------------------------------------------------------------------------------- queries
@dataclass(frozen=True, slots=True)
class Term:
    sign: int                    # +1 / -1
    metric: str
    matchers: tuple[Matcher, ...]
    func: str = "rate"           # rate | increase

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(m.matches(labels) for m in self.matchers)


@dataclass(frozen=True, slots=True)
class Query:
    text: str
    terms: tuple[Term, ...]

    def render(self, window: str) -> str:
        """The PromQL for one window.  With several terms each is ``(term or vector(0))``: a counter
        that was never incremented (no series yet) must not blank the whole sum, as it does not in
        ``evaluate``."""
        if len(self.terms) == 1:
            return re.sub(r"\{\{\s*\.window\s*\}\}", window, self.text)
        parts = []
        for i, t in enumerate(self.terms):
            sel = t.metric + ("{" + ", ".join(m.promql() for m in t.matchers) + "}" if t.matchers else "")
            op = "" if i == 0 else (" - " if t.sign < 0 else " + ")
            parts.append(f"{op}(sum({t.func}({sel}[{window}])) or vector(0))")
        return "".join(parts)


_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_TERM_RE = re.compile(
    r"\s*(?P<sign>[+-])?\s*sum\s*\(\s*(?P<func>rate|increase)\s*\(\s*(?P<metric>" + _NAME + r")?\s*"
    r"(?:\{(?P<matchers>(?:[^{}\"']|\"(?:[^\"\\]|\\.)*\"|'(?:[^'\\]|\\.)*')*)\})?\s*"
    r"\[\s*\{\{\s*\.window\s*\}\}\s*\]\s*\)\s*\)\s*"
)
_MATCHER_RE = re.compile(r"\s*(" + r"[a-zA-Z_][a-zA-Z0-9_]*" + r")\s*(=~|!~|!=|=)\s*(\"(?:[^\"\\]|\\.)*\"|'(?:[^'\\]|\\.)*')\s*(,|$)")


def _unquote(s: str) -> str:
    body = s[1:-1]
    return re.sub(r"\\(.)", lambda m: {"n": "\n", "t": "\t"}.get(m.group(1), m.group(1)), body)


def parse_query(text: str) -> Query:
    """Parse ``sum(rate(sel[{{.window}}])) [+|- sum(rate(...))]...``; raises ValueError."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError("query is empty")
    s = text.strip()
    while s.startswith("(") and s.endswith(")") and _balanced(s[1:-1]):
        s = s[1:-1].strip()
    pos = 0
    terms: list[Term] = []
    while pos < len(s):
        m = _TERM_RE.match(s, pos)
        if not m or m.end() == pos:
            raise ValueError(f"unsupported query near {s[pos:pos + 40]!r}: triscope evaluates only "
                             "sum(rate(metric{matchers}[{{.window}}])) terms joined by + or -")
        sign = -1 if m.group("sign") == "-" else 1
        if not terms and m.group("sign") == "-":
            raise ValueError("a query cannot start with '-'")
        if terms and not m.group("sign"):
            raise ValueError(f"expected + or - before {m.group(0).strip()!r}")
        matchers: list[Matcher] = []
        metric = m.group("metric")
        body = m.group("matchers") or ""
        mpos = 0
        while mpos < len(body.strip()) and body.strip():
            mm = _MATCHER_RE.match(body, mpos)
            if not mm:
                raise ValueError(f"bad label matcher near {body[mpos:mpos + 30]!r}")
            name, op, val = mm.group(1), mm.group(2), _unquote(mm.group(3))
            if op in ("=~", "!~"):
                try:
                    re.compile(val)
                except re.error as e:
                    raise ValueError(f"bad regular expression {val!r}: {e}") from None
            if name == "__name__" and op == "=":
                metric = val
            else:
                matchers.append(Matcher(name, op, val))
            mpos = mm.end()
            if mpos >= len(body):
                break
        if not metric:
            raise ValueError("every term needs a metric name")
        terms.append(Term(sign, metric, tuple(matchers), m.group("func")))
        pos = m.end()
    return Query(text.strip(), tuple(terms))


def _balanced(s: str) -> bool:
    depth = 0
    for ch in s:
        depth += ch == "("
        depth -= ch == ")"
        if depth < 0:
            return False
    return depth == 0


# ---------------------------------------------------------------------------------------------- spec
@dataclass(frozen=True, slots=True)
class AlertSpec:
    name: str
    labels: dict[str, str]
    annotations: dict[str, str]
    page_labels: dict[str, str] | None       # None: page alert disabled
    ticket_labels: dict[str, str] | None
    page_annotations: dict[str, str] = field(default_factory=dict)
    ticket_annotations: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class SLOSpec:
    service: str
    name: str
    objective: float             # percent, e.g. 99.9
    error_query: Query
    total_query: Query
    period_s: float = 30 * 86400.0
    description: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    alerting: AlertSpec | None = None
    source: str = ""             # FILE:LINE of the SLO

    @property
    def id(self) -> str:
        return f"{self.service}-{self.name}"

    @property
    def error_budget(self) -> float:
        """Allowed error ratio, e.g. 0.001 for 99.9 %."""
        return 1.0 - self.objective / 100.0

    @property
    def period(self) -> str:
        return _fmt_duration(self.period_s)

    def burn_factor(self, long_window: str, budget_share: float) -> float:
        """Burn rate at which ``budget_share`` of the period's budget goes in ``long_window``."""
        return round(budget_share * self.period_s / WINDOW_SECONDS[long_window], 6)


_DUR_RE = re.compile(r"^(\d+(?:\.\d+)?)(s|m|h|d|w)$")
_DUR_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(s: str) -> float:
    m = _DUR_RE.match(str(s).strip())
    if not m:
        raise ValueError(f"bad duration {s!r} (expected e.g. 30d, 6h, 5m)")
    return float(m.group(1)) * _DUR_UNIT[m.group(2)]


def _fmt_duration(sec: float) -> str:
    for unit, n in (("w", 604800), ("d", 86400), ("h", 3600), ("m", 60)):
        if sec % n == 0 and sec >= n and unit != "w":
            return f"{int(sec // n)}{unit}"
    return f"{int(sec)}s"


def _str_map(v: Any, where: str) -> dict[str, str]:
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise SLOSpecError(f"{where}: expected a mapping of names to strings")
    for k in v:
        if not isinstance(k, str) or not re.fullmatch(r"[a-zA-Z_][a-zA-Z0-9_]*", k):
            raise SLOSpecError(f"{where}: {k!r} is not a valid label name")
    return {str(k): "" if x is None else str(x) for k, x in v.items()}


def parse_slo_text(text: str, source: str = "<slo>") -> list[SLOSpec]:
    """Parse a Sloth ``prometheus/v1`` document (one or several, ``---`` separated)."""
    try:
        docs = [d for d in yamlsafe.parse_all(text, source) if d.root is not None]
    except yamlsafe.YAMLFileError as e:
        raise SLOSpecError(str(e)) from None
    if not docs:
        raise SLOSpecError(f"{source}:1: the file holds no SLO spec")
    out: list[SLOSpec] = []
    ids: dict[str, int] = {}
    for doc in docs:
        for spec in _parse_doc(doc, source):
            if spec.id in ids:
                raise SLOSpecError(f"{spec.source}: duplicate SLO {spec.name!r} of service {spec.service!r} "
                                   f"(first at line {ids[spec.id]})")
            ids[spec.id] = int(spec.source.rsplit(":", 1)[1])
            out.append(spec)
    return out


class _At:
    """``FILE:LINE`` of paths in one document: ``key(path)`` the line of a key (or list item),
    ``value(path)`` the line where the value at ``path`` starts."""

    def __init__(self, doc: yamlsafe.Document, source: str) -> None:
        self.doc, self.source = doc, source

    def key(self, path: tuple[Any, ...]) -> str:
        return f"{self.source}:{self.doc.line(path) or 1}"

    def value(self, path: tuple[Any, ...], key: str | None = None, obj: Any = None) -> str:
        """The value at ``path + (key,)`` when the mapping ``obj`` has ``key``, else at ``path``."""
        if key is not None and (obj is None or (isinstance(obj, dict) and key in obj)):
            path = path + (key,)
        return f"{self.source}:{self.doc.value_line(path) or 1}"


def _parse_doc(d: yamlsafe.Document, source: str) -> list[SLOSpec]:
    at = _At(d, source)
    doc = d.root
    if not isinstance(doc, dict):
        raise SLOSpecError(f"{at.value(())}: expected a mapping with version, service and slos")
    known_top = {"version", "service", "labels", "slos", "period"}
    for k in doc:
        if k not in known_top:
            raise SLOSpecError(f"{at.key((k,))}: unknown key {k!r} (expected one of "
                               f"{', '.join(sorted(known_top))})")
    if doc.get("version") != "prometheus/v1":
        raise SLOSpecError(f"{at.value((), 'version', doc)}: version must be \"prometheus/v1\" (Sloth's spec), "
                           f"got {doc.get('version')!r}")
    service = doc.get("service")
    if not isinstance(service, str) or not service.strip():
        raise SLOSpecError(f"{at.value((), 'service', doc)}: service must be a non-empty string")
    labels = _str_map(doc.get("labels"), at.value((), "labels", doc))
    period_s = 30 * 86400.0
    if "period" in doc:
        try:
            period_s = parse_duration(doc["period"])
        except ValueError as e:
            raise SLOSpecError(f"{at.value(('period',))}: {e}") from None
        if period_s < 3 * 86400:
            raise SLOSpecError(f"{at.value(('period',))}: period must be at least 3d (the ticket alert's long window)")
    slos = doc.get("slos")
    if not isinstance(slos, list) or not slos:
        raise SLOSpecError(f"{at.value((), 'slos', doc)}: slos must be a non-empty list")
    out = []
    known = {"name", "objective", "description", "labels", "sli", "alerting"}
    for i, s in enumerate(slos):
        p: tuple[Any, ...] = ("slos", i)
        where = at.key(p)
        if not isinstance(s, dict):
            raise SLOSpecError(f"{where}: each SLO must be a mapping")
        for k in s:
            if k not in known:
                raise SLOSpecError(f"{at.key(p + (k,))}: unknown key {k!r} in SLO (expected one of "
                                   f"{', '.join(sorted(known))})")
        name = s.get("name")
        if not isinstance(name, str) or not re.fullmatch(r"[a-zA-Z0-9][a-zA-Z0-9_.-]*", name or ""):
            raise SLOSpecError(f"{at.value(p, 'name', s)}: name must be a non-empty string of "
                               "letters, digits, '-', '_' or '.'")
        obj = s.get("objective")
        if isinstance(obj, bool) or not isinstance(obj, int | float) or not 0 < float(obj) < 100:
            raise SLOSpecError(f"{at.value(p, 'objective', s)}: objective must be a "
                               f"percentage between 0 and 100 (exclusive), got {obj!r}")
        sli = s.get("sli")
        sp = p + ("sli",)
        if not isinstance(sli, dict):
            raise SLOSpecError(f"{at.value(p, 'sli', s)}: sli must be a mapping with 'events'")
        for k in sli:
            if k in ("raw", "plugin"):
                raise SLOSpecError(f"{at.key(sp + (k,))}: sli.{k} is not supported by triscope "
                                   "(it evaluates SLIs itself): use sli.events with error_query and total_query")
            if k != "events":
                raise SLOSpecError(f"{at.key(sp + (k,))}: unknown key {k!r} in sli (expected 'events')")
        ev = sli.get("events")
        ep = sp + ("events",)
        if not isinstance(ev, dict):
            raise SLOSpecError(f"{at.value(sp, 'events', sli)}: sli.events must be a "
                               "mapping with error_query and total_query")
        queries: dict[str, Query] = {}
        for k in ev:
            if k not in ("error_query", "total_query"):
                raise SLOSpecError(f"{at.key(ep + (k,))}: unknown key {k!r} in sli.events")
        for qk in ("error_query", "total_query"):
            if qk not in ev:
                raise SLOSpecError(f"{at.value(ep)}: sli.events.{qk} is missing")
            try:
                queries[qk] = parse_query(ev[qk])
            except ValueError as e:
                raise SLOSpecError(f"{at.value(ep + (qk,))}: {qk}: {e}") from None
        alerting = None
        if "alerting" in s:
            alerting = _parse_alerting(s["alerting"], at, p + ("alerting",), f"{service}-{name}")
        desc = s.get("description") or ""
        out.append(SLOSpec(service=service, name=name, objective=float(obj), error_query=queries["error_query"],
                           total_query=queries["total_query"], period_s=period_s, description=str(desc),
                           labels={**labels, **_str_map(s.get("labels"), at.value(p, "labels", s))},
                           alerting=alerting, source=where))
    return out


def _parse_alerting(a: Any, at: _At, p: tuple[Any, ...], slo_id: str) -> AlertSpec:
    if not isinstance(a, dict):
        raise SLOSpecError(f"{at.value(p)}: alerting must be a mapping")
    known = {"name", "labels", "annotations", "page_alert", "ticket_alert"}
    for k in a:
        if k not in known:
            raise SLOSpecError(f"{at.key(p + (k,))}: unknown key {k!r} in alerting")
    name = a.get("name") or re.sub(r"[^a-zA-Z0-9]+", " ", slo_id).title().replace(" ", "") + "ErrorBudgetBurn"
    if not isinstance(name, str) or not re.fullmatch(_NAME, name):
        raise SLOSpecError(f"{at.value(p, 'name', a)}: alerting.name {name!r} is not a valid alert name")

    def sub(key: str) -> tuple[dict[str, str] | None, dict[str, str]]:
        v = a.get(key)
        if v is None:
            return {}, {}
        kp = p + (key,)
        if not isinstance(v, dict):
            raise SLOSpecError(f"{at.value(kp)}: alerting.{key} must be a mapping")
        for k in v:
            if k not in ("disable", "labels", "annotations"):
                raise SLOSpecError(f"{at.key(kp + (k,))}: unknown key {k!r} in alerting.{key}")
        if v.get("disable") is True:
            return None, {}
        return (_str_map(v.get("labels"), at.value(kp, "labels", v)),
                _str_map(v.get("annotations"), at.value(kp, "annotations", v)))

    pl, pa = sub("page_alert")
    tl, ta = sub("ticket_alert")
    return AlertSpec(name=name, labels=_str_map(a.get("labels"), at.value(p, "labels", a)),
                     annotations=_str_map(a.get("annotations"), at.value(p, "annotations", a)),
                     page_labels=pl, ticket_labels=tl, page_annotations=pa, ticket_annotations=ta)


def load_slo_file(path: str | Path) -> list[SLOSpec]:
    """Read and validate an SLO file; raises ``SLOSpecError("FILE:LINE: reason")`` (also for a file
    that is missing, too large, binary, or a YAML bomb: see ``triscope.yamlsafe``)."""
    try:
        text = yamlsafe.read_text(path)
    except yamlsafe.YAMLFileError as e:
        raise SLOSpecError(str(e)) from None
    return parse_slo_text(text, str(path))


# ---------------------------------------------------------------------------------------------- evaluation
@dataclass(slots=True)
class WindowFigure:
    window: str
    seconds: float
    errors: float | None          # error events in the window (None: no matching series)
    total: float | None           # all events in the window
    error_ratio: float | None     # None: no traffic ("no data")
    burn_rate: float | None
    coverage: float               # share of the window with data of the total series, 0..1


@dataclass(slots=True)
class AlertState:
    severity: str                 # page | ticket
    long_window: str
    short_window: str
    factor: float
    firing: bool
    long_burn: float | None
    short_burn: float | None


@dataclass(slots=True)
class SLOStatus:
    slo: SLOSpec
    now: float
    sli: float | None              # 1 - error ratio over the period
    error_ratio: float | None
    budget_remaining: float | None  # 1 = untouched, 0 = spent, < 0 overspent; None: no data
    coverage: float                 # share of the period with data
    windows: dict[str, WindowFigure]
    alerts: list[AlertState]

    @property
    def page(self) -> bool:
        return any(a.firing for a in self.alerts if a.severity == "page")

    @property
    def ticket(self) -> bool:
        return any(a.firing for a in self.alerts if a.severity == "ticket")

    @property
    def status(self) -> str:
        if self.error_ratio is None and all(w.error_ratio is None for w in self.windows.values()):
            return "no data"
        return "page" if self.page else "ticket" if self.ticket else "ok"

    def as_dict(self) -> dict[str, Any]:
        return {
            "service": self.slo.service, "slo": self.slo.name, "objective": self.slo.objective,
            "period": self.slo.period, "status": self.status, "sli": self.sli, "error_ratio": self.error_ratio,
            "error_budget_remaining": self.budget_remaining, "coverage": round(self.coverage, 4),
            "burn_rates": {k: w.burn_rate for k, w in self.windows.items()},
            "windows": {k: {"errors": w.errors, "total": w.total, "error_ratio": w.error_ratio,
                            "burn_rate": w.burn_rate, "coverage": round(w.coverage, 4)}
                        for k, w in self.windows.items()},
            "alerts": [{"severity": a.severity, "windows": [a.long_window, a.short_window], "factor": a.factor,
                        "firing": a.firing, "long_burn": a.long_burn, "short_burn": a.short_burn}
                       for a in self.alerts],
            "page": self.page, "ticket": self.ticket,
        }


def _tier_for(span: float) -> str:
    return "raw" if span <= 6 * 3600 else "1m" if span <= 7 * 86400 else "1h"


def counter_increase(store: Any, info: Any, start: float, end: float) -> tuple[float, float]:
    """Reset-aware increase of one counter series over [start, end] and the share of the range
    its points cover (gaps longer than 3 sampling intervals are not covered).

    Reads the cumulative values: raw points up to 6 h, else the 1-minute (up to 7 d) or hourly
    rollups, whose first and last value per bucket (min and max of a counter) keep the increase
    exact unless the counter reset inside a bucket (then it is approximate)."""
    span = end - start
    tier = _tier_for(span)
    sd = store.query_series(info, start, end, max_points=None, rate=False, tier=tier)
    ts, vals = sd.ts, sd.values
    if len(ts) < 2 or span <= 0:
        return 0.0, 0.0
    gaps = [b - a for a, b in zip(ts, ts[1:], strict=False)]
    med = sorted(gaps)[len(gaps) // 2]
    cap = max(3 * med, 60.0 if tier == "1m" else 3600.0 if tier == "1h" else 0.0, 1e-9)
    inc = 0.0
    covered = min(med, cap)  # the first point stands for one interval
    for i in range(1, len(ts)):
        d = vals[i] - vals[i - 1]
        inc += d if d >= 0 else vals[i]
        covered += min(gaps[i - 1], cap)
    return inc, min(1.0, covered / span)


def _query_sum(store: Any, q: Query, start: float, end: float, node: str | None,
               cache: dict[tuple[Any, ...], list[Any]]) -> tuple[float | None, float]:
    total = 0.0
    found = False
    coverage = 0.0
    for term in q.terms:
        key = (term.metric, node)
        infos = cache.get(key)
        if infos is None:
            infos = cache[key] = store.series(node=node, metric=term.metric)
        for info in infos:
            if not term.matches(info.labels):
                continue
            found = True
            inc, cov = counter_increase(store, info, start, end)
            total += term.sign * inc
            coverage = max(coverage, cov)
    return (total if found else None), coverage


def evaluate(store: Any, slo: SLOSpec, now: float, node: str | None = None) -> SLOStatus:
    """The SLO's state at ``now`` from stored series (all nodes, or ``node``)."""
    cache: dict[tuple[Any, ...], list[Any]] = {}
    eb = slo.error_budget

    def window(label: str, sec: float) -> WindowFigure:
        errors, _ = _query_sum(store, slo.error_query, now - sec, now, node, cache)
        total, cov = _query_sum(store, slo.total_query, now - sec, now, node, cache)
        ratio = None
        if total is not None and total > 0 and errors is not None:
            ratio = min(1.0, max(0.0, errors / total))
        burn = None if ratio is None else ratio / eb
        return WindowFigure(label, sec, errors, total, ratio, burn, cov)

    windows = {label: window(label, sec) for label, sec in WINDOWS}
    period = window(slo.period, slo.period_s)
    alerts = []
    for sev, lw, sw, share in ALERT_RULES:
        if slo.alerting is not None and (
                (sev == "page" and slo.alerting.page_labels is None)
                or (sev == "ticket" and slo.alerting.ticket_labels is None)):
            continue
        f = slo.burn_factor(lw, share)
        lb, sb = windows[lw].burn_rate, windows[sw].burn_rate
        firing = lb is not None and sb is not None and lb > f and sb > f
        alerts.append(AlertState(sev, lw, sw, f, firing, lb, sb))
    ratio = period.error_ratio
    return SLOStatus(
        slo=slo, now=now,
        sli=None if ratio is None else 1.0 - ratio,
        error_ratio=ratio,
        budget_remaining=None if ratio is None else 1.0 - ratio / eb,
        coverage=period.coverage,
        windows=windows,
        alerts=alerts,
    )


# ---------------------------------------------------------------------------------------------- rules
def _sloth_labels(slo: SLOSpec) -> dict[str, str]:
    return {"sloth_id": slo.id, "sloth_service": slo.service, "sloth_slo": slo.name}


def _sel(labels: Mapping[str, str]) -> str:
    return "{" + ", ".join(f'{k}="{escape_value(v)}"' for k, v in labels.items()) + "}"


def prometheus_rules(slos: Sequence[SLOSpec]) -> dict[str, Any]:
    """Prometheus rule groups (recording + alerting) equivalent to ``evaluate``, Sloth's names."""
    groups: list[dict[str, Any]] = []
    for slo in slos:
        sl = _sloth_labels(slo)
        base = {**slo.labels, **sl}
        sel = _sel(sl)
        rec: list[dict[str, Any]] = []
        for w, _sec in WINDOWS:
            rec.append({"record": f"slo:sli_error:ratio_rate{w}",
                        "expr": f"({slo.error_query.render(w)})\n/\n({slo.total_query.render(w)})\n",
                        "labels": {**base, "sloth_window": w}})
        # ratio of sums over the period: recorded 5m event rates summed over the period
        rec.append({"record": "slo:sli_errors:rate5m", "expr": slo.error_query.render("5m"),
                    "labels": {**base, "sloth_window": "5m"}})
        rec.append({"record": "slo:sli_total:rate5m", "expr": slo.total_query.render("5m"),
                    "labels": {**base, "sloth_window": "5m"}})
        p = slo.period
        rec.append({"record": f"slo:sli_error:ratio_rate{p}",
                    "expr": f"sum_over_time(slo:sli_errors:rate5m{sel}[{p}])\n/ ignoring (sloth_window)\n"
                            f"sum_over_time(slo:sli_total:rate5m{sel}[{p}])\n",
                    "labels": {**base, "sloth_window": p}})
        groups.append({"name": f"sloth-slo-sli-recordings-{slo.id}", "rules": rec})
        meta = [
            {"record": "slo:objective:ratio", "expr": f"vector({slo.objective / 100:.10g})", "labels": base},
            {"record": "slo:error_budget:ratio", "expr": f"vector(1-{slo.objective / 100:.10g})", "labels": base},
            {"record": "slo:time_period:days", "expr": f"vector({slo.period_s / 86400:g})", "labels": base},
            {"record": "slo:current_burn_rate:ratio",
             "expr": f"slo:sli_error:ratio_rate5m{sel}\n/ on(sloth_id, sloth_slo, sloth_service) group_left\n"
                     f"slo:error_budget:ratio{sel}\n", "labels": base},
            {"record": "slo:period_burn_rate:ratio",
             "expr": f"slo:sli_error:ratio_rate{p}{sel}\n/ on(sloth_id, sloth_slo, sloth_service) group_left\n"
                     f"slo:error_budget:ratio{sel}\n", "labels": base},
            {"record": "slo:period_error_budget_remaining:ratio",
             "expr": f"1 - slo:period_burn_rate:ratio{sel}", "labels": base},
            {"record": "sloth_slo_info", "expr": "vector(1)",
             "labels": {**base, "sloth_objective": f"{slo.objective:g}", "sloth_mode": "cli-gen-prom",
                        "sloth_spec": "prometheus/v1", "sloth_version": "triscope"}},
        ]
        groups.append({"name": f"sloth-slo-meta-recordings-{slo.id}", "rules": meta})
        a = slo.alerting
        if a is None:
            continue
        alerts = []
        for sev, labels, ann in (("page", a.page_labels, a.page_annotations),
                                 ("ticket", a.ticket_labels, a.ticket_annotations)):
            if labels is None:
                continue
            parts = []
            for s2, lw, sw, share in ALERT_RULES:
                if s2 != sev:
                    continue
                f = slo.burn_factor(lw, share)
                thr = f"({f:g} * {slo.error_budget:.10g})"
                parts.append(f"(\n    max(slo:sli_error:ratio_rate{sw}{sel} > {thr}) without (sloth_window)\n"
                             f"    and\n    max(slo:sli_error:ratio_rate{lw}{sel} > {thr}) without (sloth_window)\n)")
            alerts.append({
                "alert": a.name,
                "expr": "\nor\n".join(parts) + "\n",
                "labels": {**a.labels, **labels, "sloth_severity": sev},
                "annotations": {"title": f"(ticket) {slo.service} {slo.name} SLO error budget burn rate is too fast."
                                if sev == "ticket" else
                                f"(page) {slo.service} {slo.name} SLO error budget burn rate is over expected.",
                                **a.annotations, **ann},
            })
        groups.append({"name": f"sloth-slo-alerts-{slo.id}", "rules": alerts})
    return {"groups": groups}


class _RulesDumper(yaml.SafeDumper):
    pass


def _str_presenter(dumper: yaml.SafeDumper, data: str) -> yaml.Node:
    if "\n" in data:
        return dumper.represent_scalar("tag:yaml.org,2002:str", data, style="|")
    return dumper.represent_scalar("tag:yaml.org,2002:str", data)


_RulesDumper.add_representer(str, _str_presenter)


def rules_yaml(slos: Sequence[SLOSpec], source: str = "") -> str:
    head = "# Generated by 'triscope slo rules'" + (f" from {source}" if source else "") + ": do not edit.\n"
    return head + yaml.dump(prometheus_rules(slos), Dumper=_RulesDumper, sort_keys=False, width=200)


def finite(x: float | None) -> bool:
    return x is not None and math.isfinite(x)


ENV_SLO_FILE = "TRISCOPE_SLO_FILE"


def default_slo_file() -> Path | None:
    """``$TRISCOPE_SLO_FILE``, else the shipped example (``deploy/slo.example.yaml``, package data)."""
    import os

    from triscope import defaults

    env = os.environ.get(ENV_SLO_FILE)
    if env:
        return Path(env)
    return defaults.SLO if defaults.SLO.exists() else None
