"""The SLO file: Sloth's ``prometheus/v1`` spec as pydantic v2 models, and its loader.

``load_slo_file`` / ``parse_slo_text`` read the file with ``triscope.yamlsafe`` (one or several
``---`` separated documents), validate each document with ``SLOFileModel`` and build the
``SLOSpec`` objects that evaluation and the rule generator use (``triscope.analysis.slo``, which
re-exports these names).  A malformed file raises ``SLOSpecError``: ``FILE:LINE: field: what is
wrong``, the first problem in the file.  ``period`` takes every duration form of
``triscope.durations`` (``30d``, ``4w``, ``720h``...).  The spec itself is described in
``triscope.analysis.slo`` and ``docs/analysis.md``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import AfterValidator, BeforeValidator, Field, PlainValidator, model_validator

from triscope import yamlsafe
from triscope.configfile import ConfigFileError, ConfigModel, fail, problem, scalar_text, show, str_map
from triscope.configfile import validate as validate_config
from triscope.durations import Duration, parse_duration

if TYPE_CHECKING:
    from triscope.analysis.slo import AlertSpec, Query, SLOSpec

MIN_PERIOD_S = 3 * 86400.0
"""The shortest period: the ticket alert's long window (3d)."""
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_SLO_NAME = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9_.-]*")
_ALERT_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


class SLOSpecError(ConfigFileError):
    """A malformed SLO file: the message is ``FILE:LINE: field: what is wrong``."""


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
    from triscope.analysis.slo import parse_query  # slo re-exports this module: imported once both exist

    if not isinstance(value, str):
        raise ValueError(f"must be a query (text), not {show(value)}")
    return parse_query(value)      # ValueError: what is wrong with it


def _version(value: Any) -> str:
    if value != "prometheus/v1":
        raise ValueError(f"must be \"prometheus/v1\" (Sloth's spec), not {show(value)}")
    return value


def _period(seconds: float) -> float:
    if seconds < MIN_PERIOD_S:
        raise ValueError("must be at least 3d (the ticket alert's long window)")
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
        from triscope.analysis.slo import AlertSpec

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
    from triscope.analysis.slo import SLOSpec

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
    for a file that is missing, too large, binary, or a YAML bomb: see ``triscope.yamlsafe``)."""
    try:
        text = yamlsafe.read_text(path)
    except yamlsafe.YAMLFileError as e:
        raise SLOSpecError(e.file, e.line, e.reason) from None
    return parse_slo_text(text, str(path))


__all__ = ["MIN_PERIOD_S", "SLOFileModel", "SLOModel", "SLOSpecError", "load_slo_file", "parse_duration",
           "parse_slo_text"]
