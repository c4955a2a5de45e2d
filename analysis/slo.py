"""Service-level objectives: Sloth's ``prometheus/v1`` spec, evaluated over the store and turned
into Prometheus recording and alerting rules.

The spec (https://sloth.dev, ``prometheus/v1``)::

    version: "prometheus/v1"
    service: "inference"
    labels: {team: ml}              # optional, added to every rule
    period: 30d                     # triscope extension (Sloth: --default-slo-period); default 30d, 1h at least
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
scale with the period.  A period shorter than 3 days (1h at least: a recording of minutes, a demo)
shrinks the windows by period / 3d instead (``SLOSpec.windows``: 1h gives 4s, 25s, 50s, 5m, 20m,
1h), so the ticket's long window is the period and the factors stay those of 3 days.  Error ratios
are ratios of sums (all errors / all requests over the window), a window without requests is "no
data", never 0; an error counter with no series yet while requests are counted is 0 errors (a
labelled counter appears at its first increment; the rules add ``or vector(0)`` alike).

Coverage: a burn rate or a budget is a verdict over a whole window, so it needs data over enough
of that window (``BURN_MIN_COVERAGE``, ``PERIOD_MIN_COVERAGE``, with their reasons).  Below it the
window's state is "not enough data yet" (``WindowFigure.state``): no burn rate, no budget, and an
alert whose long window is short of data does not fire (nor does the ``slo`` remediation trigger,
which reads the status).  The generated Prometheus rules record the same coverage
(``slo:sli_data_coverage:ratio``) and every alert requires it of its long window.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from triscope.analysis.counters import (
    fetch_counters,
    increase,
    tier_for,
)
from triscope.analysis.reader import SeriesPoints, StoreReader

# the SLO's model types, the file format and its loader live in slo_spec; callers import them from here too
from triscope.analysis.slo_spec import (  # noqa: F401
    WINDOW_SECONDS,
    WINDOWS,
    AlertSpec,
    Query,
    SLOSpec,
    SLOSpecError,
    Term,
    load_slo_file,
    parse_duration,
    parse_query,
    parse_slo_text,
)
from triscope.core.labels import escape_value

# (severity, long window, short window, share of the period's budget burnt in the long window)
ALERT_RULES: tuple[tuple[str, str, str, float], ...] = (
    ("page", "1h", "5m", 0.02),
    ("page", "6h", "30m", 0.05),
    ("ticket", "3d", "6h", 0.10),
)

# ---------------------------------------------------------------------------------------------- coverage
# How much of a window data must cover before a verdict over it is made.  Coverage is the share of
# the window with points of the SLO's total series (gaps over three sampling intervals are holes,
# ``triscope.analysis.counters.increase``); in Prometheus, the seconds between consecutive rule
# evaluations that both found such a series, summed over the window (``slo:sli_data_coverage:ratio``).
BURN_MIN_COVERAGE = 0.90
"""A burn rate over a window (5m .. 3d) is compared with a factor computed for the *whole* window
(14.4x over 1h is 2 % of a 30-day budget burnt in that hour; 1x over 3d is 10 % of it): three
minutes of errors in an otherwise empty 3-day window are three minutes of errors, not a 3-day
burn.  90 % leaves room for an agent restart or a scrape gap (6 minutes of the hour, 7 hours of the
3 days) without silencing an alert."""
PERIOD_MIN_COVERAGE = 0.10
"""The period's SLI and error budget remaining need data over a tenth of the period (3 days of 30:
the ticket alert's window).  Below that the "budget left" is the first hours' error ratio scaled
up to the period, which the burn rates already say honestly; asking 90 % of the period would hide
the budget for four weeks after an install."""
NOT_ENOUGH_DATA = "not enough data yet"


def coverage_pct(coverage: float) -> str:
    """``0.07 %``, ``4.2 %``, ``93 %``: enough digits that a little data does not read as none."""
    p = coverage * 100
    return f"{p:.0f} %" if p >= 10 or p == 0 else f"{p:.1f} %" if p >= 1 else f"{p:.2f} %"


# ---------------------------------------------------------------------------------------------- evaluation
@dataclass(slots=True)
class WindowFigure:
    window: str
    seconds: float
    errors: float | None          # error events in the window (None: no matching series)
    total: float | None           # all events in the window
    error_ratio: float | None     # over the data in the window; None: no traffic ("no data")
    measured_burn: float | None   # error_ratio / budget, whatever the coverage
    coverage: float               # share of the window with data of the total series, 0..1
    min_coverage: float = BURN_MIN_COVERAGE   # what a verdict over the window needs

    @property
    def enough_data(self) -> bool:
        return self.coverage >= self.min_coverage

    @property
    def burn_rate(self) -> float | None:
        """The window's burn rate; None without traffic or with not enough data (``state`` says which)."""
        return self.measured_burn if self.enough_data else None

    @property
    def state(self) -> str:
        """``ok`` (a burn rate), ``no data`` (no series, or no traffic) or ``not enough data yet``."""
        if self.total is None:
            return "no data"
        if not self.enough_data:
            return NOT_ENOUGH_DATA
        return "no data" if self.error_ratio is None else "ok"

    def note(self) -> str:
        """``not enough data yet (0.07 % of the 3d window covered)``; "" when there is enough."""
        return "" if self.enough_data else f"{NOT_ENOUGH_DATA} ({coverage_pct(self.coverage)} of the {self.window} window covered)"


@dataclass(slots=True)
class AlertState:
    severity: str                 # page | ticket
    long_window: str
    short_window: str
    factor: float
    firing: bool
    long_burn: float | None       # None: no traffic, or the long window short of data
    short_burn: float | None      # over the data in the short window (it only says the burn goes on)
    long_coverage: float = 1.0
    enough_data: bool = True      # the long window is covered: the alert can be decided

    @property
    def state(self) -> str:
        return "FIRING" if self.firing else "ok" if self.enough_data else NOT_ENOUGH_DATA


@dataclass(slots=True)
class SLOStatus:
    slo: SLOSpec
    now: float
    sli: float | None              # 1 - error ratio over the period; None: no traffic or not enough data
    error_ratio: float | None
    budget_remaining: float | None  # 1 = untouched, 0 = spent, < 0 overspent; None: no data / not enough
    coverage: float                 # share of the period with data
    windows: dict[str, WindowFigure]
    alerts: list[AlertState]
    period: WindowFigure | None = None   # the period's figures as measured (``period.note()``)

    @property
    def page(self) -> bool:
        return any(a.firing for a in self.alerts if a.severity == "page")

    @property
    def ticket(self) -> bool:
        return any(a.firing for a in self.alerts if a.severity == "ticket")

    @property
    def budget_note(self) -> str:
        """Why there is no budget figure when data is short: ``not enough data yet (N % of the 30d window covered)``."""
        return "" if self.period is None or self.period.total is None else self.period.note()

    @property
    def status(self) -> str:
        """``page`` / ``ticket`` (an alert fires), ``no data`` (no traffic in any window), ``not enough
        data yet`` (no alert's long window is covered: nothing can be decided) or ``ok``."""
        if self.page:
            return "page"
        if self.ticket:
            return "ticket"
        figures = [*self.windows.values(), *([self.period] if self.period is not None else [])]
        if all(w.error_ratio is None for w in figures):
            return "no data"
        decidable = [a.enough_data for a in self.alerts] or [self.period is None or self.period.enough_data]
        return "ok" if any(decidable) else NOT_ENOUGH_DATA

    def as_dict(self) -> dict[str, Any]:
        p = self.period
        return {
            "service": self.slo.service, "slo": self.slo.name, "objective": self.slo.objective,
            "period": self.slo.period, "status": self.status, "sli": self.sli, "error_ratio": self.error_ratio,
            "error_budget_remaining": self.budget_remaining, "coverage": round(self.coverage, 4),
            "budget_state": "no data" if p is None else p.state,
            "min_coverage": {"burn_windows": BURN_MIN_COVERAGE, "period": PERIOD_MIN_COVERAGE},
            "burn_rates": {k: w.burn_rate for k, w in self.windows.items()},
            "windows": {k: {"errors": w.errors, "total": w.total, "error_ratio": w.error_ratio,
                            "burn_rate": w.burn_rate, "measured_burn_rate": w.measured_burn,
                            "coverage": round(w.coverage, 4), "state": w.state}
                        for k, w in self.windows.items()},
            "alerts": [{"severity": a.severity, "windows": [a.long_window, a.short_window], "factor": a.factor,
                        "firing": a.firing, "state": a.state, "long_burn": a.long_burn, "short_burn": a.short_burn,
                        "long_coverage": round(a.long_coverage, 4)}
                       for a in self.alerts],
            "page": self.page, "ticket": self.ticket,
        }


@dataclass(slots=True)
class SLOInputs:
    """What an SLO's evaluation reads, fetched first: the cumulative values of every series of its
    queries' metrics over each window ending at ``now`` (window seconds -> series)."""

    now: float
    windows: dict[float, list[SeriesPoints]]

    def for_node(self, node: str) -> SLOInputs:
        """The same inputs restricted to one node's series (one fleet-wide read, evaluated per node)."""
        return SLOInputs(self.now, {sec: [sp for sp in series if sp.node == node]
                                    for sec, series in self.windows.items()})


def query_metrics(slo: SLOSpec) -> list[str]:
    """The metrics an SLO's error and total queries read."""
    return list(dict.fromkeys(t.metric for q in (slo.error_query, slo.total_query) for t in q.terms))


def fetch_slo_inputs(store: StoreReader, slo: SLOSpec, now: float, node: str | None = None) -> SLOInputs:
    """Read the SLO's counters (on ``node``, all nodes if None) over every window ending at ``now``
    (``triscope.analysis.counters.fetch_counters``: one read per metric and window; the windows
    served from raw points share one read of the longest)."""
    secs = list(dict.fromkeys([sec for _label, sec in slo.windows] + [slo.period_s]))
    reads = fetch_counters(store, query_metrics(slo), [(now - sec, now) for sec in secs], node)
    return SLOInputs(now, {sec: reads[(now - sec, now)] for sec in secs})


def _query_sum(q: Query, series: Sequence[SeriesPoints], span: float) -> tuple[float | None, float]:
    tier = tier_for(span)
    total = 0.0
    found = False
    coverage = 0.0
    for term in q.terms:
        for sp in series:
            if sp.metric != term.metric or not term.matches(sp.labels):
                continue
            found = True
            inc, cov = increase(sp.ts, sp.values, span, tier)
            total += term.sign * inc
            coverage = max(coverage, cov)
    return (total if found else None), coverage


def window_figure(slo: SLOSpec, label: str, sec: float, series: Sequence[SeriesPoints],
                  min_coverage: float | None = None) -> WindowFigure:
    """Errors, total, error ratio (a ratio of sums; None without requests), burn rate and coverage
    of one window of ``sec`` seconds from the cumulative values of the series in it.  ``min_coverage``:
    what a verdict over it needs (default ``BURN_MIN_COVERAGE``; the period: ``PERIOD_MIN_COVERAGE``).  Pure."""
    errors, _ = _query_sum(slo.error_query, series, sec)
    total, cov = _query_sum(slo.total_query, series, sec)
    if errors is None and total is not None:
        errors = 0.0     # no error series yet: nothing failed (the rules' ``or vector(0)``)
    ratio = None
    if total is not None and total > 0 and errors is not None:
        ratio = min(1.0, max(0.0, errors / total))
    burn = None if ratio is None else ratio / slo.error_budget
    return WindowFigure(label, sec, errors, total, ratio, burn, cov,
                        BURN_MIN_COVERAGE if min_coverage is None else min_coverage)


def period_figure(slo: SLOSpec, series: Sequence[SeriesPoints]) -> WindowFigure:
    """``window_figure`` over the SLO's period, with the period's coverage minimum."""
    return window_figure(slo, slo.period, slo.period_s, series, PERIOD_MIN_COVERAGE)


def evaluate_inputs(slo: SLOSpec, inputs: SLOInputs) -> SLOStatus:
    """The SLO's state at ``inputs.now``: burn rate per window, budget over the period, the
    multi-window multi-burn-rate alerts.  A window short of data (``BURN_MIN_COVERAGE``,
    ``PERIOD_MIN_COVERAGE``) gives no burn rate / budget, and an alert fires only when its long
    window is covered (its short window only confirms that the burn goes on, over whatever of it has
    data, as Prometheus' ``rate()`` does).  Pure: no store, no clock."""
    windows = {label: window_figure(slo, label, sec, inputs.windows.get(sec, [])) for label, sec in slo.windows}
    period = period_figure(slo, inputs.windows.get(slo.period_s, []))
    alerts = []
    for sev, lw_name, sw_name, share in ALERT_RULES:
        if slo.alerting is not None and (
                (sev == "page" and slo.alerting.page_labels is None)
                or (sev == "ticket" and slo.alerting.ticket_labels is None)):
            continue
        f = slo.burn_factor(lw_name, share)
        lw, sw = slo.window(lw_name)[0], slo.window(sw_name)[0]
        long, short = windows[lw], windows[sw]
        lb, sb = long.burn_rate, short.measured_burn
        firing = long.enough_data and lb is not None and sb is not None and lb > f and sb > f
        alerts.append(AlertState(sev, lw, sw, f, firing, lb, sb, long.coverage, long.enough_data))
    ratio = period.error_ratio if period.enough_data else None
    return SLOStatus(
        slo=slo, now=inputs.now,
        sli=None if ratio is None else 1.0 - ratio,
        error_ratio=ratio,
        budget_remaining=None if ratio is None else 1.0 - ratio / slo.error_budget,
        coverage=period.coverage,
        windows=windows,
        alerts=alerts,
        period=period,
    )


def evaluate(store: StoreReader, slo: SLOSpec, now: float, node: str | None = None) -> SLOStatus:
    """The SLO's state at ``now`` from stored series (all nodes, or ``node``): ``fetch_slo_inputs``
    then ``evaluate_inputs``."""
    return evaluate_inputs(slo, fetch_slo_inputs(store, slo, now, node))


# ---------------------------------------------------------------------------------------------- what it says
def _terms_text(q: Query) -> str:
    out = ""
    for i, t in enumerate(q.terms):
        out += ("" if i == 0 else " - " if t.sign < 0 else " + ") + t.selector()
    return out


def _latency_threshold(slo: SLOSpec) -> tuple[str, float] | None:
    """(histogram, threshold in seconds) when the SLI is the latency form ``X_count - X_bucket{le=V}``
    over ``X_count`` (same matchers otherwise), else None."""
    err, tot = slo.error_query.terms, slo.total_query.terms
    if len(err) != 2 or len(tot) != 1 or err[0].sign < 0 or err[1].sign > 0:
        return None
    count, bucket = err[0], err[1]
    if not (count.metric.endswith("_count") and bucket.metric == count.metric[:-6] + "_bucket"
            and tot[0].metric == count.metric and set(tot[0].matchers) == set(count.matchers)):
        return None
    le = [m for m in bucket.matchers if m.name == "le" and m.op == "="]
    if len(le) != 1 or set(bucket.matchers) - set(le) != set(count.matchers):
        return None
    try:
        return count.metric[:-6], float(le[0].value)
    except ValueError:
        return None


def _seconds_text(x: float) -> str:
    return f"{x * 1000:g} ms" if x < 1 else f"{x:g} s"


def describe(slo: SLOSpec) -> tuple[str, str]:
    """What the SLO promises, from its own definition (never its free-text description, which can
    say another threshold than the queries count): a headline and the detail.

    ``("99.5 % of events within 250 ms, over a rolling 1h", "latency from the histogram ...")``."""
    period = f"over a rolling {slo.period}"
    windows = slo.windows
    scaled = windows != WINDOWS
    tail = (f"; burn windows {windows[0][0]} .. {windows[-1][0]}"
            + (f" (the workbook's 5m .. 3d scaled to the {slo.period} period)" if scaled else ""))
    lat = _latency_threshold(slo)
    if lat is not None:
        hist, le = lat
        sel = slo.total_query.terms[0].selector()
        return (f"{slo.objective:g} % of events within {_seconds_text(le)}, {period}",
                f"latency from the histogram {hist} ({sel}): an event above its le=\"{le:g}\" bucket is bad" + tail)
    return (f"{slo.objective:g} % of events good (at most {100 - slo.objective:.4g} % bad), {period}",
            f"bad: {_terms_text(slo.error_query)}; all: {_terms_text(slo.total_query)}" + tail)


# ---------------------------------------------------------------------------------------------- rules
def _sloth_labels(slo: SLOSpec) -> dict[str, str]:
    return {"sloth_id": slo.id, "sloth_service": slo.service, "sloth_slo": slo.name}


def _sel(labels: Mapping[str, str]) -> str:
    return "{" + ", ".join(f'{k}="{escape_value(v)}"' for k, v in labels.items()) + "}"


DOCS_URL_LABEL = "triscope_docs_url"
"""Prometheus external label holding the base URL of triscope's docs (the folder of alerts.md).
Alert annotations are templates evaluated by each Prometheus, and only it knows where its users read
the docs and open the dashboard: ``$externalLabels`` is the one per-Prometheus value a rule
template can read, so the same generated rules serve every cluster (docs/deploy.md)."""
DASHBOARD_URL_LABEL = "triscope_dashboard_url"
"""Prometheus external label holding the dashboard's base URL (no trailing slash)."""


def runbook_url(alert: str) -> str:
    """The ``runbook_url`` annotation of ``alert``: its section of docs/alerts.md (a Markdown heading
    ``## <alert>`` gets the anchor ``#<alert lowercased>``)."""
    return f"{{{{ $externalLabels.{DOCS_URL_LABEL} }}}}/alerts.md#{alert.lower()}"


def slo_alert_links(alert: str) -> dict[str, str]:
    """``runbook_url`` and ``dashboard_url`` of a generated SLO alert.  An SLO is fleet-wide (ratio of
    sums over all replicas, no node label), so the dashboard link opens the SLOs page over the last
    hour, the page alert's long window; the SLO file's own annotations override both."""
    return {"runbook_url": runbook_url(alert),
            "dashboard_url": f"{{{{ $externalLabels.{DASHBOARD_URL_LABEL} }}}}/slos?range=1h"}


def prometheus_rules(slos: Sequence[SLOSpec]) -> dict[str, Any]:
    """Prometheus rule groups (recording + alerting) equivalent to ``evaluate``, Sloth's names."""
    groups: list[dict[str, Any]] = []
    for slo in slos:
        sl = _sloth_labels(slo)
        base = {**slo.labels, **sl}
        sel = _sel(sl)
        rec: list[dict[str, Any]] = []
        p = slo.period
        own = [w for w, _sec in slo.windows]
        for w in own:
            rec.append({"record": f"slo:sli_error:ratio_rate{w}",
                        "expr": f"({slo.error_query.render(w, True)})\n/\n({slo.total_query.render(w)})\n",
                        "labels": {**base, "sloth_window": w}})
        # ratio of sums over the period: recorded 5m event rates summed over the period
        rec.append({"record": "slo:sli_errors:rate5m", "expr": slo.error_query.render("5m", True),
                    "labels": {**base, "sloth_window": "5m"}})
        rec.append({"record": "slo:sli_total:rate5m", "expr": slo.total_query.render("5m"),
                    "labels": {**base, "sloth_window": "5m"}})
        if p not in own:   # a period under 3 days is its longest window: recorded above
            rec.append({"record": f"slo:sli_error:ratio_rate{p}",
                        "expr": f"sum_over_time(slo:sli_errors:rate5m{sel}[{p}])\n/ ignoring (sloth_window)\n"
                                f"sum_over_time(slo:sli_total:rate5m{sel}[{p}])\n",
                        "labels": {**base, "sloth_window": p}})
        # coverage: seconds since the previous evaluation while the total series has data (the rule
        # reads its own last sample; a gap leaves a stale marker, so the first evaluation after one
        # counts 0), summed over each window: independent of the evaluation interval
        rec.append({"record": "slo:sli_data_covered:seconds",
                    "expr": f"(\n  (time() - timestamp(slo:sli_data_covered:seconds{sel}))\n  or on() vector(0)\n)\n"
                            f"and on()\n({slo.total_query.presence()})\n",
                    "labels": base})
        for w, sec in dict([*slo.windows, (p, slo.period_s)]).items():
            rec.append({"record": "slo:sli_data_coverage:ratio",
                        "expr": f"clamp_max(sum_over_time(slo:sli_data_covered:seconds{sel}[{w}]) / {sec:.0f}, 1)",
                        "labels": {**base, "sloth_window": w}})
        groups.append({"name": f"sloth-slo-sli-recordings-{slo.id}", "rules": rec})
        meta = [
            {"record": "slo:objective:ratio", "expr": f"vector({slo.objective / 100:.10g})", "labels": base},
            {"record": "slo:error_budget:ratio", "expr": f"vector(1-{slo.objective / 100:.10g})", "labels": base},
            {"record": "slo:time_period:days", "expr": f"vector({slo.period_s / 86400:g})", "labels": base},
            {"record": "slo:current_burn_rate:ratio",
             "expr": f"slo:sli_error:ratio_rate5m{sel}\n/ on(sloth_id, sloth_slo, sloth_service) group_left\n"
                     f"slo:error_budget:ratio{sel}\n", "labels": base},
            {"record": "slo:period_burn_rate:ratio",   # no figure while the period is short of data
             "expr": f"(\n  slo:sli_error:ratio_rate{p}{sel}\n  / on(sloth_id, sloth_slo, sloth_service) group_left\n"
                     f"  slo:error_budget:ratio{sel}\n)\nand on(sloth_id, sloth_slo, sloth_service)\n"
                     f"(slo:sli_data_coverage:ratio{_sel({**sl, 'sloth_window': p})} >= {PERIOD_MIN_COVERAGE:g})\n",
             "labels": base},
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
            for s2, lw_name, sw_name, share in ALERT_RULES:
                if s2 != sev:
                    continue
                f = slo.burn_factor(lw_name, share)
                lw, sw = slo.window(lw_name)[0], slo.window(sw_name)[0]
                thr = f"({f:g} * {slo.error_budget:.10g})"
                cov = _sel({**sl, "sloth_window": lw})
                parts.append(f"(\n    max(slo:sli_error:ratio_rate{sw}{sel} > {thr}) without (sloth_window)\n"
                             f"    and\n    max(slo:sli_error:ratio_rate{lw}{sel} > {thr}) without (sloth_window)\n"
                             f"    and\n    max(slo:sli_data_coverage:ratio{cov} >= {BURN_MIN_COVERAGE:g}) without (sloth_window)\n)")
            alerts.append({
                "alert": a.name,
                "expr": "\nor\n".join(parts) + "\n",
                "labels": {**a.labels, **labels, "sloth_severity": sev},
                "annotations": {"title": f"(ticket) {slo.service} {slo.name} SLO error budget burn rate is too fast."
                                if sev == "ticket" else
                                f"(page) {slo.service} {slo.name} SLO error budget burn rate is over expected.",
                                **slo_alert_links(a.name), **a.annotations, **ann},
            })
        groups.append({"name": f"sloth-slo-alerts-{slo.id}", "rules": alerts})
    return {"groups": groups}


class _RulesDumper(yaml.SafeDumper):
    def ignore_aliases(self, data: Any) -> bool:
        return True     # every rule spells its labels out: no &id001 anchors for a reader to chase


def _str_presenter(dumper: yaml.SafeDumper, data: str) -> yaml.Node:
    if "\n" in data:
        return dumper.represent_scalar("tag:yaml.org,2002:str", data, style="|")
    return dumper.represent_scalar("tag:yaml.org,2002:str", data)


_RulesDumper.add_representer(str, _str_presenter)


def rules_yaml(slos: Sequence[SLOSpec], source: str = "") -> str:
    head = "# Generated by 'triscope slo rules'" + (f" from {source}" if source else "") + ": do not edit.\n"
    return head + yaml.dump(prometheus_rules(slos), Dumper=_RulesDumper, sort_keys=False, width=200)


PROMETHEUSRULE_LABELS: dict[str, str] = {
    "app.kubernetes.io/name": "triscope",
    "release": "kube-prometheus-stack",     # the default ruleSelector of kube-prometheus-stack
}
"""Labels of the generated PrometheusRule: ``release`` is what kube-prometheus-stack's Prometheus
selects rules by (docs/deploy.md: change it to what your Prometheus selects)."""


def prometheusrule_yaml(slos: Sequence[SLOSpec], *, name: str, namespace: str | None = None,
                        labels: Mapping[str, str] | None = None,
                        extra_groups: Sequence[Mapping[str, Any]] = (), header: str = "") -> str:
    """A ``monitoring.coreos.com/v1`` PrometheusRule whose spec holds ``extra_groups`` (rule groups
    read from plain rule files, e.g. the shipped triscope alerts) followed by the SLO groups: one
    object for the Prometheus Operator, generated, so the SLO rules it ships are always those of
    the SLO file.  ``header`` (comment lines) goes on top, e.g. how to regenerate the file."""
    groups = [dict(g) for g in extra_groups] + prometheus_rules(slos)["groups"]
    names = [g["name"] for g in groups]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"rule group(s) {', '.join(dup)} defined twice")
    meta: dict[str, Any] = {"name": name}
    if namespace:
        meta["namespace"] = namespace
    meta["labels"] = dict(PROMETHEUSRULE_LABELS if labels is None else labels)
    doc = {"apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule", "metadata": meta,
           "spec": {"groups": groups}}
    return header + yaml.dump(doc, Dumper=_RulesDumper, sort_keys=False, width=200)


ENV_SLO_FILE = "TRISCOPE_SLO_FILE"


def default_slo_file() -> Path | None:
    """``$TRISCOPE_SLO_FILE``, else the shipped example (``deploy/slo.example.yaml``, package data)."""
    import os

    from triscope import defaults

    env = os.environ.get(ENV_SLO_FILE)
    if env:
        return Path(env)
    return defaults.SLO if defaults.SLO.exists() else None
