"""The SLO file: Sloth's ``prometheus/v1`` spec as pydantic v2 models, its loader, and the types it
builds (``SLOSpec``, ``AlertSpec``, the parsed ``Query``).

``load_slo_file`` / ``parse_slo_text`` read the file with ``triscope.core.yamlsafe`` (one or several
``---`` separated documents), validate each document with ``SLOFileModel`` and build the
``SLOSpec`` objects that evaluation and the rule generator use (``triscope.analysis.slo``, which
re-exports these names).  A malformed file raises ``SLOSpecError``: ``FILE:LINE: field: what is
wrong``, the first problem in the file.  ``period`` takes every duration form of
``triscope.core.durations`` (``30d``, ``4w``, ``720h``...).  The spec itself is described in
``triscope.analysis.slo`` and ``docs/analysis.md``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator, Field, PlainValidator, model_validator

from triscope.core import yamlsafe
from triscope.core.configfile import ConfigFileError, ConfigModel, fail, problem, scalar_text, show, str_map
from triscope.core.configfile import validate as validate_config
from triscope.core.durations import Duration, parse_duration
from triscope.core.labels import Matcher

MIN_PERIOD_S = 3600.0
"""The shortest period: 1h, whose burn windows shrink to 4 s .. 1 h (``SLOSpec.windows``): a few of
the agent's 1-second ticks in the shortest.  For recordings and demos; Prometheus, scraping every
15-60 s, needs windows of several scrapes (a period of 3d or more keeps the workbook's 5m .. 3d)."""
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_SLO_NAME = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9_.-]*")
_ALERT_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


class SLOSpecError(ConfigFileError):
    """A malformed SLO file: the message is ``FILE:LINE: field: what is wrong``."""


# The burn-rate windows (label, seconds) of the SRE workbook, for any period of 3 days or more: the
# spec's burn factors are computed over them.  A shorter period scales them (``scaled_windows``).
WINDOWS: tuple[tuple[str, float], ...] = (
    ("5m", 300.0), ("30m", 1800.0), ("1h", 3600.0), ("6h", 21600.0), ("1d", 86400.0), ("3d", 259200.0),
)
WINDOW_SECONDS = dict(WINDOWS)
LONGEST_WINDOW_S = WINDOWS[-1][1]


def scaled_windows(period_s: float) -> tuple[tuple[str, float], ...]:
    """The burn windows of a period: the workbook's 5m .. 3d for a period of 3 days or more; a shorter
    period shrinks every window by period / 3d (whole seconds), so the ticket's long window is the
    period itself and each window keeps its share of it (a 1h period: 4s, 25s, 50s, 5m, 20m, 1h).
    The burn factors of ``SLOSpec.burn_factor`` are then those of a 3-day period (1.44x, 0.6x, 0.1x)."""
    k = min(1.0, period_s / LONGEST_WINDOW_S)
    if k >= 1.0:
        return WINDOWS
    secs = [float(max(1, round(sec * k))) for _label, sec in WINDOWS]
    return tuple((fmt_duration(s), s) for s in secs)


# ---------------------------------------------------------------------------------------------- queries
@dataclass(frozen=True, slots=True)
class Term:
    sign: int                    # +1 / -1
    metric: str
    matchers: tuple[Matcher, ...]
    func: str = "rate"           # rate | increase

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(m.matches(labels) for m in self.matchers)

    def selector(self) -> str:
        return self.metric + ("{" + ", ".join(m.promql() for m in self.matchers) + "}" if self.matchers else "")


@dataclass(frozen=True, slots=True)
class Query:
    text: str
    terms: tuple[Term, ...]

    def render(self, window: str, absent_is_zero: bool = False) -> str:
        """The PromQL for one window.  With several terms each is ``(term or vector(0))``: a counter
        that was never incremented (no series yet) must not blank the whole sum, as it does not in
        ``evaluate``; ``absent_is_zero`` does the same for a query of one term (the error query:
        requests counted and no error series yet is 0 errors, not "no data")."""
        if len(self.terms) == 1:
            text = re.sub(r"\{\{\s*\.window\s*\}\}", window, self.text)
            return f"({text}) or vector(0)" if absent_is_zero else text
        parts = []
        for i, t in enumerate(self.terms):
            op = "" if i == 0 else (" - " if t.sign < 0 else " + ")
            parts.append(f"{op}(sum({t.func}({t.selector()}[{window}])) or vector(0))")
        return "".join(parts)

    def presence(self) -> str:
        """PromQL that has one element when some series of the query has points to rate over the
        last 5 minutes (traffic or not), none otherwise: what counts as data for coverage."""
        return " or ".join(f"count(rate({t.selector()}[5m]))" for t in self.terms)


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
        return fmt_duration(self.period_s)

    @property
    def windows(self) -> tuple[tuple[str, float], ...]:
        """This SLO's burn windows (label, seconds), shortest first: ``scaled_windows(period)``."""
        return scaled_windows(self.period_s)

    def window(self, name: str) -> tuple[str, float]:
        """This SLO's window (label, seconds) standing for the workbook's ``name`` (``5m`` .. ``3d``,
        what ``ALERT_RULES`` say): the same for a period of 3 days or more, its share of a shorter
        one (``1h`` of a 1h period is ``50s``)."""
        return self.windows[[label for label, _ in WINDOWS].index(name)]

    def burn_factor(self, long_window: str, budget_share: float) -> float:
        """Burn rate at which ``budget_share`` of the period's budget goes in the window standing for
        the workbook's ``long_window`` (``1h``: 14.4 for 2 % of a 30-day period)."""
        return round(budget_share * self.period_s / self.window(long_window)[1], 6)


def fmt_duration(sec: float) -> str:
    """``30d``, ``84h``, ``25s``, ``200s``: the largest unit that divides it (Prometheus reads each)."""
    whole = max(0, int(round(sec)))
    for unit, n in (("d", 86400), ("h", 3600), ("m", 60)):
        if whole >= n and whole % n == 0:
            return f"{whole // n}{unit}"
    return f"{whole}s"


# ---------------------------------------------------------------------------------------------- value types
def _label_map(value: Any) -> dict[str, str]:
    return str_map(value, _LABEL_NAME, "label name")


LabelMap = Annotated[dict[str, str], PlainValidator(_label_map)]


def _service(value: str) -> str:
    if not value.strip():
        raise ValueError("must be a non-empty string")
    return value


def _slo_name(value: str) -> str:
    if not _SLO_NAME.fullmatch(value):
        raise ValueError("must be a non-empty string of letters, digits, '-', '_' or '.'")
    return value


def _alert_name(value: str) -> str:
    if value and not _ALERT_NAME.fullmatch(value):
        raise ValueError(f"{show(value)} is not a valid alert name")
    return value


def _objective(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < float(value) < 100:
        raise ValueError(f"must be a percentage between 0 and 100 (exclusive), not {show(value)}")
    return float(value)


def _query(value: Any) -> Query:
    if not isinstance(value, str):
        raise ValueError(f"must be a query (text), not {show(value)}")
    return parse_query(value)      # ValueError: what is wrong with it


def _version(value: Any) -> str:
    if value != "prometheus/v1":
        raise ValueError(f"must be \"prometheus/v1\" (Sloth's spec), not {show(value)}")
    return value


def _period(seconds: float) -> float:
    if seconds < MIN_PERIOD_S:
        raise ValueError(f"must be at least {fmt_duration(MIN_PERIOD_S)} (its shortest burn window is then "
                         "4 seconds: a few of the agent's ticks)")
    return seconds


def _no_null(value: Any) -> Any:
    return "" if value is None else value


# ---------------------------------------------------------------------------------------------- models
class AlertVariantModel(ConfigModel):
    """``page_alert`` / ``ticket_alert``."""

    disable: bool = False
    labels: LabelMap = Field(default_factory=dict)
    annotations: LabelMap = Field(default_factory=dict)


class AlertingModel(ConfigModel):
    name: Annotated[str, BeforeValidator(_no_null), AfterValidator(_alert_name)] = ""   # "": derived from the SLO
    labels: LabelMap = Field(default_factory=dict)
    annotations: LabelMap = Field(default_factory=dict)
    page_alert: AlertVariantModel = AlertVariantModel()
    ticket_alert: AlertVariantModel = AlertVariantModel()

    def to_spec(self, slo_id: str) -> AlertSpec:
        name = self.name or re.sub(r"[^a-zA-Z0-9]+", " ", slo_id).title().replace(" ", "") + "ErrorBudgetBurn"
        page, ticket = self.page_alert, self.ticket_alert
        return AlertSpec(name=name, labels=dict(self.labels), annotations=dict(self.annotations),
                         page_labels=None if page.disable else dict(page.labels),
                         ticket_labels=None if ticket.disable else dict(ticket.labels),
                         page_annotations={} if page.disable else dict(page.annotations),
                         ticket_annotations={} if ticket.disable else dict(ticket.annotations))


class EventsModel(ConfigModel):
    error_query: Annotated[Any, PlainValidator(_query)]
    total_query: Annotated[Any, PlainValidator(_query)]


class SLIModel(ConfigModel):
    events: EventsModel

    @model_validator(mode="before")
    @classmethod
    def _events_only(cls, value: Any) -> Any:
        for key in ("raw", "plugin"):
            if isinstance(value, dict) and key in value:
                raise problem(f"sli.{key} is not supported by triscope (it evaluates SLIs itself): use sli.events "
                              "with error_query and total_query", key)
        return value


class SLOModel(ConfigModel):
    name: Annotated[str, AfterValidator(_slo_name)]
    objective: Annotated[float, BeforeValidator(_objective)]
    description: Annotated[str, BeforeValidator(scalar_text)] = ""
    labels: LabelMap = Field(default_factory=dict)
    sli: SLIModel
    alerting: AlertingModel | None = None


class SLOFileModel(ConfigModel):
    """One document of an SLO file."""

    version: Annotated[Any, AfterValidator(_version)]
    service: Annotated[str, AfterValidator(_service)]
    labels: LabelMap = Field(default_factory=dict)
    period: Annotated[Duration, AfterValidator(_period)] = 30 * 86400.0
    slos: Annotated[list[SLOModel], Field(min_length=1)]


# ---------------------------------------------------------------------------------------------- loading
def _specs(model: SLOFileModel, doc: yamlsafe.Document) -> list[SLOSpec]:
    out = []
    for i, s in enumerate(model.slos):
        slo_id = f"{model.service}-{s.name}"
        alerting = s.alerting.to_spec(slo_id) if s.alerting is not None else None
        if alerting is not None and not _ALERT_NAME.fullmatch(alerting.name):
            raise fail(doc, ("slos", i, "alerting"), f"the alert name derived from the SLO, {alerting.name!r}, is "
                       "not a valid alert name: set alerting.name", SLOSpecError)
        out.append(SLOSpec(service=model.service, name=s.name, objective=s.objective,
                           error_query=s.sli.events.error_query, total_query=s.sli.events.total_query,
                           period_s=model.period, description=s.description, labels={**model.labels, **s.labels},
                           alerting=alerting, source=f"{doc.file}:{doc.line(('slos', i)) or 1}"))
    return out


def parse_slo_text(text: str, source: str = "<slo>") -> list[SLOSpec]:
    """Parse a Sloth ``prometheus/v1`` document (one or several, ``---`` separated)."""
    try:
        docs = [d for d in yamlsafe.parse_all(text, source) if d.root is not None]
    except yamlsafe.YAMLFileError as e:
        raise SLOSpecError(e.file, e.line, e.reason) from None
    if not docs:
        raise SLOSpecError(source, 1, "the file holds no SLO spec")
    out: list[SLOSpec] = []
    first: dict[str, int] = {}
    for doc in docs:
        for i, spec in enumerate(_specs(validate_config(SLOFileModel, doc, error=SLOSpecError), doc)):
            line = doc.line(("slos", i)) or 1
            if spec.id in first:
                raise fail(doc, ("slos", i, "name"), f"duplicate SLO {spec.name!r} of service {spec.service!r} "
                           f"(first at line {first[spec.id]})", SLOSpecError)
            first[spec.id] = line
            out.append(spec)
    return out


def load_slo_file(path: str | Path) -> list[SLOSpec]:
    """Read and validate an SLO file; raises ``SLOSpecError("FILE:LINE: field: what is wrong")`` (also
    for a file that is missing, too large, binary, or a YAML bomb: see ``triscope.core.yamlsafe``)."""
    try:
        text = yamlsafe.read_text(path)
    except yamlsafe.YAMLFileError as e:
        raise SLOSpecError(e.file, e.line, e.reason) from None
    return parse_slo_text(text, str(path))


__all__ = ["LONGEST_WINDOW_S", "MIN_PERIOD_S", "WINDOWS", "WINDOW_SECONDS", "AlertSpec", "Query", "SLOFileModel", "SLOModel", "SLOSpec",
           "SLOSpecError", "Term", "fmt_duration", "load_slo_file", "parse_duration", "parse_query", "parse_slo_text", "scaled_windows"]
