"""Root-cause results for the dashboard, through ``analysis.rca``.

``explain(store, node, start, end)`` returns ranked ``Cause`` rows, or an explained empty result
when ``analysis.rca`` is not in this build yet.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dashboard.data import _as_dict, optional


@dataclass
class Cause:
    title: str
    summary: str
    score: float | None = None
    metric: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    onset: float | None = None
    kind: str = "series"


@dataclass
class RcaResult:
    causes: list[Cause]
    baseline: tuple[float, float] | None
    note: str


def explain(store: Any, node: str, start: float, end: float) -> RcaResult:
    fn, why = optional("analysis.rca", "root_causes", "explain", "rca", "query")
    if fn is None:
        return RcaResult([], None, f"ranked causes come from the historical root-cause analysis, which is not "
                                   f"available in this build ({why}); the detector's verdict and the events are below")
    res = fn(store, node, start, end)
    d = _as_dict(res) if not isinstance(res, list) else {"causes": res}
    raw = d.get("causes") or d.get("ranked") or []
    base = d.get("baseline")
    baseline = (float(base[0]), float(base[1])) if isinstance(base, (list, tuple)) and len(base) == 2 else None
    causes = [_cause(_as_dict(x)) for x in raw]
    return RcaResult(causes, baseline, "" if causes else "nothing moved against the baseline in this window")


def _cause(x: dict[str, Any]) -> Cause:
    metric = x.get("metric") or x.get("series")
    labels = x.get("labels") or {}
    title = str(x.get("title") or x.get("name") or metric or x.get("kind") or "cause")
    summary = str(x.get("summary") or x.get("reason") or x.get("evidence") or "")
    score = x.get("score")
    onset = x.get("onset")
    return Cause(title, summary, float(score) if score is not None else None,
                 metric if isinstance(metric, str) else None, dict(labels) if isinstance(labels, dict) else {},
                 float(onset) if onset is not None else None, str(x.get("kind", "series")))
