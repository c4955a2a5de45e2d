"""The triggers a policy writes: each kind's form in the file, validated (``alert``, ``metric``,
``mismatch``, ``slo``, ``xid``), and what the engine keeps of it (``Trigger``).

A metric trigger names a metric the agent stores (a ``triscope_`` name in the catalogue, or an
application's own); its scope (:func:`metric_scope`: one accelerator or workload, the whole node, an
application) decides what its rule may act on (``triscope.remediation.policy``).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Discriminator, Field, PlainValidator

from triscope.core.configfile import ConfigModel, problem, show, str_map, unknown_key, variant
from triscope.core.durations import Duration
from triscope.core.labels import Matcher
from triscope.core.metrics import CATALOGUE, spec
from triscope.core.vocabulary import QUIET_STATES, STATES
from triscope.remediation.targets import Text

TRIGGER_KINDS = ("alert", "metric", "mismatch", "slo", "xid")
_ACCELERATOR_LABELS = ("gpu", "npu", "workload")


def metric_scope(metric: str) -> str:
    """``accelerator`` (a catalogued metric with a ``gpu``, ``npu`` or ``workload`` label: it fires for
    one accelerator or workload), ``node`` (a catalogued metric with none: node-wide, it names no
    workload) or ``application`` (not in the catalogue: a scraped application's own metric)."""
    sp = spec(metric)
    if sp is None:
        return "application"
    return "accelerator" if any(lab in sp.labels for lab in _ACCELERATOR_LABELS) else "node"


_MATCHER = re.compile(r"^\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*\"?(.*?)\"?\s*$")
_METRIC = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
OPS: dict[str, Callable[[float, float], bool]] = {
    ">": lambda a, b: a > b, ">=": lambda a, b: a >= b, "<": lambda a, b: a < b, "<=": lambda a, b: a <= b,
    "==": lambda a, b: a == b, "!=": lambda a, b: a != b}


# what the engine keeps of a trigger ---------------------------------------------------------------
@dataclass(frozen=True)
class Trigger:
    kind: str                                   # alert | metric | mismatch | slo | xid
    alert: str = ""
    matchers: tuple[Matcher, ...] = ()
    metric: str = ""
    labels: tuple[tuple[str, str], ...] = ()
    op: str = ">"
    threshold: float = 0.0
    for_s: float = 0.0
    state: str = ""
    slo: str = ""
    slo_status: str = "page"
    xid_codes: tuple[int, ...] = ()
    within_s: float = 300.0
    nodes: tuple[Matcher, ...] = ()              # stored-data triggers: which nodes (by node labels / name)
    workloads: tuple[Matcher, ...] = ()          # metric / mismatch: which workloads (by the series' workload labels)
    slo_file: str = ""                           # slo triggers: the SLO spec file (settings.slo_file)

    def describe(self) -> str:
        if self.kind == "alert":
            m = ",".join(f"{x.name}{x.op}{x.value}" for x in self.matchers)
            return f"alert {self.alert}" + (f"{{{m}}}" if m else "")
        if self.kind == "metric":
            lab = ",".join(f"{k}={v}" for k, v in self.labels)
            return f"{self.metric}{{{lab}}} {self.op} {self.threshold:g} for {self.for_s:g}s"
        if self.kind == "mismatch":
            return f"mismatch state {self.state} for {self.for_s:g}s"
        if self.kind == "slo":
            return f"SLO {self.slo} status {self.slo_status}" + (f" for {self.for_s:g}s" if self.for_s else "")
        return f"XID {','.join(map(str, self.xid_codes))} within {self.within_s:g}s"


# the file's forms ---------------------------------------------------------------------------------
EXPORTED_NOT_STORED = ("triscope_process_cpu_seconds_total", "triscope_process_virtual_memory_bytes",
                       "triscope_process_resident_memory_bytes", "triscope_process_start_time_seconds")
"""What the agent's /metrics shows beside the catalogue: its process's CPU and memory (prometheus_client's
ProcessCollector names), rendered at scrape time and not stored (tests/e2e/test_remediation_metric_catalogue.py
checks this against a live agent)."""


def _metric_name(value: str) -> str:
    if not _METRIC.fullmatch(value):
        raise ValueError(f"{show(value)} is not a metric name")
    if value in EXPORTED_NOT_STORED:
        raise ValueError(f"{show(value)} is the agent's own process metric, exported for Prometheus only and never "
                         "stored: a metric trigger reads the store, so it could never fire (alert on it instead)")
    if value.startswith("triscope_") and spec(value) is None:
        # the agent exports only catalogued names: a misspelt one would never fire
        close = difflib.get_close_matches(value, list(CATALOGUE), n=3, cutoff=0.6)
        raise ValueError(f"{show(value)} is not a triscope metric (triscope/core/metrics.py lists every one the agent "
                         "exports; an application's own metrics do not start with triscope_)"
                         + (f"; did you mean {', '.join(close)}?" if close else ""))
    return value


def _matchers(value: Any) -> tuple[Matcher, ...]:
    """``['severity=page', 'namespace=~inf.*']`` or ``{severity: page}``."""
    if value is None:
        return ()
    if isinstance(value, dict):
        items: list[tuple[Any, str | int]] = [(f"{k}={v}", k) for k, v in value.items()]
    elif isinstance(value, list):
        items = [(x, i) for i, x in enumerate(value)]
    else:
        raise problem("must be a list like ['severity=page', 'namespace=~inf.*'] or a mapping")
    out = []
    for text, at in items:
        m = _MATCHER.match(text) if isinstance(text, str) else None
        if not m:
            raise problem(f"matcher {show(text)} is not LABEL=VALUE, LABEL!=VALUE, LABEL=~REGEX or LABEL!~REGEX", at)
        if m.group(2) in ("=~", "!~"):
            try:
                re.compile(m.group(3))
            except re.error as e:
                raise problem(f"matcher {show(text)}: bad regular expression: {e}", at) from None
        out.append(Matcher(m.group(1), m.group(2), m.group(3)))
    return tuple(out)


Matchers = Annotated[tuple[Matcher, ...], PlainValidator(_matchers)]


def _xid_codes(value: Any) -> tuple[int, ...]:
    codes = value if isinstance(value, list) else [value]
    if not codes or not all(isinstance(c, int) and not isinstance(c, bool) and c > 0 for c in codes):
        raise ValueError(f"must be an XID code or a list of codes (positive integers), not {show(value)}")
    return tuple(codes)


def _labels(value: Any) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(str_map(value, what="label").items()))


def _mismatch_state(value: str) -> str:
    if value in QUIET_STATES:
        raise ValueError(f"{show(value)} never triggers: an accelerator that is {value} is not held back by I/O or "
                         "the host (one of: " + ", ".join(s for s in STATES if s not in QUIET_STATES) + ")")
    if value not in STATES:
        raise ValueError(f"unknown mismatch state {show(value)} (one of: "
                         + ", ".join(s for s in STATES if s not in QUIET_STATES) + ")")
    return value


class AlertTrigger(ConfigModel):
    alert: Text
    matchers: Matchers = ()

    def to_trigger(self, slo_file: str) -> Trigger:
        return Trigger("alert", alert=self.alert, matchers=self.matchers)


class MetricTrigger(ConfigModel):
    metric: Annotated[str, AfterValidator(_metric_name)]
    labels: Annotated[tuple[tuple[str, str], ...], PlainValidator(_labels)] = ()
    op: Literal[">", ">=", "<", "<=", "==", "!="] = ">"
    threshold: float
    for_: Duration = Field(default=0.0, alias="for")
    nodes: Matchers = ()
    workloads: Matchers = ()

    def to_trigger(self, slo_file: str) -> Trigger:
        return Trigger("metric", metric=self.metric, labels=self.labels, op=self.op, threshold=self.threshold,
                       for_s=self.for_, nodes=self.nodes, workloads=self.workloads)


class MismatchTrigger(ConfigModel):
    mismatch: Annotated[str, AfterValidator(_mismatch_state)]
    for_: Duration = Field(default=0.0, alias="for")
    nodes: Matchers = ()
    workloads: Matchers = ()

    def to_trigger(self, slo_file: str) -> Trigger:
        return Trigger("mismatch", state=self.mismatch, for_s=self.for_, nodes=self.nodes, workloads=self.workloads)


class SLOTrigger(ConfigModel):
    slo: Text
    status: Literal["page", "ticket"] = "page"
    for_: Duration = Field(default=0.0, alias="for")
    nodes: Matchers = ()

    def to_trigger(self, slo_file: str) -> Trigger:
        return Trigger("slo", slo=self.slo, slo_status=self.status, for_s=self.for_, nodes=self.nodes,
                       slo_file=slo_file)


class XidTrigger(ConfigModel):
    xid: Annotated[tuple[int, ...], PlainValidator(_xid_codes)]
    within: Duration = 300.0
    nodes: Matchers = ()

    def to_trigger(self, slo_file: str) -> Trigger:
        return Trigger("xid", xid_codes=self.xid, within_s=self.within, nodes=self.nodes)


_TRIGGER_MODELS: dict[str, type[ConfigModel]] = {
    "alert": AlertTrigger, "metric": MetricTrigger, "mismatch": MismatchTrigger, "slo": SLOTrigger, "xid": XidTrigger}


def _trigger_kind(value: Any) -> str:
    if not isinstance(value, dict):
        return "<alert>" if value is not None else "<no kind>"   # not a mapping: the alert model says so
    kinds = [k for k in TRIGGER_KINDS if k in value]
    return f"<{kinds[0]}>" if len(kinds) == 1 else "<no kind>"


def _no_kind(value: Any) -> Any:
    """A trigger with none or several of the kinds: an unknown key first, then what is missing."""
    keys = list(dict.fromkeys(k for m in _TRIGGER_MODELS.values() for k in m.allowed_keys()))
    for key in value or {}:
        if key not in keys:
            raise unknown_key(key, keys)
    kinds = [k for k in TRIGGER_KINDS if k in (value or {})]
    raise problem("a trigger needs exactly one of: alert, metric, mismatch, slo, xid"
                  + (f" (found {', '.join(kinds)})" if kinds else ""))


TriggerModel = Annotated[
    Annotated[AlertTrigger, variant("alert")] | Annotated[MetricTrigger, variant("metric")]
    | Annotated[MismatchTrigger, variant("mismatch")] | Annotated[SLOTrigger, variant("slo")]
    | Annotated[XidTrigger, variant("xid")] | Annotated[Any, AfterValidator(_no_kind), variant("no kind")],
    Discriminator(_trigger_kind)]
