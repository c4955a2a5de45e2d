"""SLOs: spec parsing with file:line errors, evaluation over the store, and the generated
Prometheus rules checked and unit-tested by the real promtool."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from triscope.analysis.slo import (
    BURN_MIN_COVERAGE,
    NOT_ENOUGH_DATA,
    PERIOD_MIN_COVERAGE,
    SLOSpecError,
    coverage_pct,
    evaluate,
    load_slo_file,
    parse_query,
    parse_slo_text,
    prometheus_rules,
    rules_yaml,
)
from triscope.core.samples import Sample, Tick
from triscope.store import Store

REPO = Path(__file__).resolve().parents[2]

SPEC = textwrap.dedent("""\
    version: "prometheus/v1"
    service: "app"
    labels:
      owner: "test"
    slos:
      - name: "availability"
        objective: 99.9
        sli:
          events:
            error_query: sum(rate(app_requests_total{code=~"5.."}[{{.window}}]))
            total_query: sum(rate(app_requests_total[{{.window}}]))
        alerting:
          name: AppAvailability
          labels:
            category: "availability"
          annotations:
            summary: "app availability budget burn"
          page_alert:
            labels:
              severity: "page"
          ticket_alert:
            labels:
              severity: "ticket"
      - name: "latency"
        objective: 99.0
        sli:
          events:
            error_query: >-
              sum(rate(app_request_duration_seconds_count[{{.window}}]))
              - sum(rate(app_request_duration_seconds_bucket{le="0.5"}[{{.window}}]))
            total_query: sum(rate(app_request_duration_seconds_count[{{.window}}]))
        alerting:
          name: AppLatency
          page_alert:
            labels:
              severity: "page"
          ticket_alert:
            disable: true
    """)


def _write(tmp_path: Path, text: str, name: str = "slo.yaml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


# ------------------------------------------------------------------------------------ parsing
def test_parse_spec_and_burn_factors(tmp_path: Path) -> None:
    slos = load_slo_file(_write(tmp_path, SPEC))
    assert [s.id for s in slos] == ["app-availability", "app-latency"]
    a, lat = slos
    assert a.error_budget == pytest.approx(0.001)
    assert a.period_s == 30 * 86400
    # SRE workbook factors for a 30-day period
    assert a.burn_factor("1h", 0.02) == pytest.approx(14.4)
    assert a.burn_factor("6h", 0.05) == pytest.approx(6.0)
    assert a.burn_factor("3d", 0.10) == pytest.approx(1.0)
    assert a.error_query.terms[0].matchers[0].op == "=~"
    assert [t.sign for t in lat.error_query.terms] == [1, -1]
    assert lat.error_query.terms[1].matchers[0].value == "0.5"
    assert lat.alerting is not None and lat.alerting.ticket_labels is None
    assert a.source.endswith("slo.yaml:6")


@pytest.mark.parametrize("mutate, line, words", [
    (lambda s: s.replace("objective: 99.9", "objective: 120"), 7, "slos[0].objective: must be a percentage"),
    (lambda s: s.replace('sum(rate(app_requests_total[{{.window}}]))',
                         'avg(app_requests_total)'), 11, "unsupported query"),
    (lambda s: s.replace("    alerting:\n      name: AppAvailability",
                         "    alerting:\n      nmae: AppAvailability"), 13, "unknown key 'nmae'"),
    (lambda s: s.replace('version: "prometheus/v1"', 'version: "openslo/v1"'), 1, "prometheus/v1"),
    (lambda s: s.replace("  - name: \"latency\"", "  - name: \"availability\""), 24, "duplicate SLO"),
    (lambda s: s.replace("      events:\n        error_query: sum(rate(app_requests_total{code",
                         "      raw:\n        error_query: sum(rate(app_requests_total{code", 1),
     9, "sli.raw is not supported"),
    (lambda s: s.replace('code=~"5.."', 'code=~"5(."'), 10, "bad regular expression"),
    (lambda s: s.replace("    objective: 99.9\n", "    objective: 99.9\n   bad: [\n"), 8, "not valid YAML"),
])
def test_malformed_file_names_file_line_reason(tmp_path: Path, mutate, line: int, words: str) -> None:  # type: ignore[no-untyped-def]
    text = mutate(SPEC)
    assert text != SPEC
    p = _write(tmp_path, text)
    with pytest.raises(SLOSpecError) as ei:
        load_slo_file(p)
    msg = str(ei.value)
    assert msg.startswith(f"{p}:"), msg
    assert words in msg, msg
    got_line = int(msg[len(str(p)) + 1:].split(":", 1)[0])
    assert abs(got_line - line) <= 1, msg


def test_cli_check_reports_file_line(tmp_path: Path) -> None:
    p = _write(tmp_path, SPEC.replace("objective: 99.0", "objective: \"high\""))
    r = subprocess.run([str(REPO / ".venv/bin/triscope"), "slo", "check", str(p)], capture_output=True, text=True)
    assert r.returncode == 2
    assert f"{p}:25: slos[1].objective: must be a percentage" in r.stderr
    assert "Traceback" not in r.stderr


def test_query_parser() -> None:
    q = parse_query('sum(rate(x_total{a="1", b!~"z|y"}[{{.window}}])) - sum(increase(y_total[{{ .window }}]))')
    assert [(t.sign, t.metric, t.func) for t in q.terms] == [(1, "x_total", "rate"), (-1, "y_total", "increase")]
    assert q.terms[0].matches({"a": "1", "b": "q"}) and not q.terms[0].matches({"a": "1", "b": "y"})
    assert "[30m]" in q.render("30m") and "or vector(0)" in q.render("30m")
    for bad in ("", "rate(x[5m])", 'sum(rate(x{a=1}[{{.window}}]))', "sum(rate(x[5m]))"):
        with pytest.raises(ValueError):
            parse_query(bad)


def test_shipped_example_parses_and_matches_workload_metrics() -> None:
    slos = load_slo_file(REPO / "deploy" / "slo.example.yaml")
    assert len(slos) >= 2
    workload = (REPO / "examples" / "workload" / "h200_phases.py").read_text()
    for s in slos:
        for t in s.error_query.terms + s.total_query.terms:
            base = t.metric.removesuffix("_total").removesuffix("_count").removesuffix("_bucket")
            assert f'"{base}"' in workload, f"{t.metric} is not exported by the H200 workload"


# ------------------------------------------------------------------------------------ evaluation over the store
def _app_ticks(start: float, minutes: int, err_ratio_at, step: float = 60.0, per_min: float = 1000.0):  # type: ignore[no-untyped-def]
    ok = err = 0.0
    count = fast = 0.0
    out = []
    for i in range(minutes + 1):
        t = start + i * step
        out.append(Tick(t, [
            Sample("app_requests_total", ok, {"code": "200"}, "counter"),
            Sample("app_requests_total", err, {"code": "500"}, "counter"),
            Sample("app_request_duration_seconds_count", count, {}, "counter"),
            Sample("app_request_duration_seconds_bucket", fast, {"le": "0.5"}, "counter"),
            Sample("app_request_duration_seconds_bucket", count, {"le": "+Inf"}, "counter"),
        ]))
        r = err_ratio_at(i)
        ok += per_min * (1 - r)
        err += per_min * r
        count += per_min
        fast += per_min * (1 - r / 2)
    return out


@pytest.mark.parametrize("db", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def test_evaluate_burn_rates_budget_and_alerts(db: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    url = request.getfixturevalue("sqlite_url" if db == "sqlite" else "pg_url")
    st = Store.open(url)
    st.upgrade()
    start = 1_800_000_000.0
    # 10 % errors for 70 minutes
    st.write_ticks("n1", _app_ticks(start, 70, lambda i: 0.10))
    slos = load_slo_file(_write(tmp_path, SPEC))
    s = evaluate(st, slos[0], start + 65 * 60)
    assert s.windows["5m"].error_ratio == pytest.approx(0.10, rel=1e-6)
    assert s.windows["5m"].total == pytest.approx(5000)
    assert s.windows["1h"].burn_rate == pytest.approx(100.0, rel=1e-6)
    assert s.windows["3d"].error_ratio == pytest.approx(0.10, rel=1e-3)
    # raw points (6 h) and 1-minute rollups (1 d, 3 d) count the same requests, to one bucket at the edge
    assert s.windows["6h"].total == pytest.approx(65000)
    assert abs(s.windows["1d"].total - 65000) <= 1000 and s.windows["1d"].total == s.windows["3d"].total
    assert s.windows["5m"].coverage == pytest.approx(1.0, abs=0.01)
    assert s.windows["1h"].coverage == pytest.approx(1.0, abs=0.01)
    assert s.windows["3d"].coverage < 0.05  # 65 minutes of data in a 3-day window
    # the 1h page fires on a covered hour; the 3-day ticket and the 30-day budget have too little data
    assert s.page and not s.ticket and s.status == "page"
    ticket = next(a for a in s.alerts if a.severity == "ticket")
    assert ticket.state == NOT_ENOUGH_DATA and not ticket.enough_data and ticket.long_burn is None
    assert s.windows["3d"].state == NOT_ENOUGH_DATA and s.windows["3d"].burn_rate is None
    assert s.windows["3d"].measured_burn == pytest.approx(100.0, rel=1e-3)  # measured, not a verdict
    assert s.budget_remaining is None and s.sli is None
    assert s.budget_note == f"not enough data yet ({coverage_pct(s.coverage)} of the 30d window covered)"
    assert s.period is not None and s.period.measured_burn == pytest.approx(100.0, rel=1e-3)
    lat = evaluate(st, slos[1], start + 65 * 60)
    assert lat.windows["1h"].error_ratio == pytest.approx(0.05, rel=1e-6)  # half the errors are slow
    assert [a.severity for a in lat.alerts] == ["page", "page"]  # ticket disabled
    d = json.loads(json.dumps(s.as_dict()))
    assert d["status"] == "page" and d["error_budget_remaining"] is None and d["budget_state"] == NOT_ENOUGH_DATA
    assert d["burn_rates"]["3d"] is None and d["windows"]["3d"]["state"] == NOT_ENOUGH_DATA
    assert d["burn_rates"]["1h"] == pytest.approx(100.0) and d["windows"]["1h"]["state"] == "ok"
    st.close()


def test_ratio_of_sums_no_traffic_and_no_data(sqlite_url: str, tmp_path: Path) -> None:
    st = Store.open(sqlite_url)
    st.upgrade()
    start = 1_800_000_000.0
    # two series with very different traffic: 1000/min at 0.1 % errors, 10/min at 50 % errors
    ticks = []
    a_ok = a_err = b_ok = b_err = 0.0
    for i in range(121):
        t = start + i * 60
        ticks.append(Tick(t, [
            Sample("app_requests_total", a_ok, {"code": "200", "instance": "a"}, "counter"),
            Sample("app_requests_total", a_err, {"code": "500", "instance": "a"}, "counter"),
            Sample("app_requests_total", b_ok, {"code": "200", "instance": "b"}, "counter"),
            Sample("app_requests_total", b_err, {"code": "500", "instance": "b"}, "counter"),
        ]))
        if i < 60:  # traffic only in the first hour
            a_ok += 999
            a_err += 1
            b_ok += 5
            b_err += 5
    st.write_ticks("n1", ticks)
    slo = load_slo_file(_write(tmp_path, SPEC))[0]
    s = evaluate(st, slo, start + 60 * 60)
    # ratio of sums: (60 + 300) / (60000 + 600), not the mean of the two ratios (0.2505)
    assert s.windows["1h"].error_ratio == pytest.approx(360 / 60600, rel=1e-6)
    # the second hour has no traffic: no data, not 0 and not NaN
    later = evaluate(st, slo, start + 120 * 60)
    assert later.windows["5m"].error_ratio is None and later.windows["5m"].burn_rate is None
    assert later.windows["5m"].total == 0
    assert later.windows["1d"].error_ratio == pytest.approx(360 / 60600, rel=1e-6)
    assert not later.page
    # no series at all
    other = parse_slo_text(SPEC.replace("app_requests_total", "nothing_total"))[0]
    nd = evaluate(st, other, start + 3600)
    assert nd.status == "no data" and nd.budget_remaining is None and nd.coverage == 0
    st.close()


# ------------------------------------------------------------------------------------ coverage
def test_three_minutes_of_bad_data_decide_nothing(sqlite_url: str, tmp_path: Path) -> None:
    """Every request failing for three minutes: measured burn rates of 1000x everywhere, and no
    window is covered enough for a verdict: no page, no ticket, no budget figure."""
    st = Store.open(sqlite_url)
    st.upgrade()
    start = 1_800_000_000.0
    st.write_ticks("n1", _app_ticks(start, 3, lambda i: 1.0))
    slo = load_slo_file(_write(tmp_path, SPEC))[0]
    s = evaluate(st, slo, start + 180)
    assert s.windows["3d"].measured_burn == pytest.approx(1000.0)   # what the old evaluation alerted on
    assert s.status == NOT_ENOUGH_DATA and not s.page and not s.ticket
    for w in s.windows.values():
        assert w.coverage < BURN_MIN_COVERAGE and w.state == NOT_ENOUGH_DATA and w.burn_rate is None, w
    assert [a.state for a in s.alerts] == [NOT_ENOUGH_DATA] * 3
    assert s.budget_remaining is None and s.coverage < PERIOD_MIN_COVERAGE
    assert s.windows["3d"].note() == f"not enough data yet ({coverage_pct(s.windows['3d'].coverage)} of the 3d window covered)"
    assert re.fullmatch(r"0\.0[5-9] %", coverage_pct(s.windows["3d"].coverage))   # minutes of 3 days: not "0 %"
    # three minutes without traffic are "no data", not "not enough data yet"
    st.write_ticks("quiet", [Tick(start + 60 * i, [Sample("app_requests_total", 5.0, {"code": "200"}, "counter")])
                             for i in range(4)])
    assert evaluate(st, slo, start + 180, node="quiet").status == "no data"
    st.close()


def test_evaluate_inputs_counts_a_gap_as_uncovered() -> None:
    """An hour with a 20-minute hole in it is not covered enough for the 1h page (the hole counts as
    covered for three sampling intervals only, ``counters.increase``); the same hour whole is."""
    from triscope.analysis.reader import SeriesPoints
    from triscope.analysis.slo import WINDOWS, SLOInputs, evaluate_inputs

    slo = parse_slo_text(SPEC)[0]
    now = 100_000.0
    full = [now - 3600 + 60 * i for i in range(61)]
    holed = [t for t in full if not now - 3000 < t < now - 1800]

    def inputs(ts: list[float]) -> SLOInputs:
        def series(sec: float) -> list[SeriesPoints]:
            return [SeriesPoints("app_requests_total", {"code": c}, [t for t in ts if t >= now - sec],
                                 [k * (t - ts[0]) / 60 for t in ts if t >= now - sec], "counter", "n")
                    for c, k in (("200", 900.0), ("500", 100.0))]
        return SLOInputs(now, {sec: series(sec) if sec <= 3600 else [] for _w, sec in WINDOWS} | {slo.period_s: []})

    holed_st = evaluate_inputs(slo, inputs(holed))
    assert holed_st.windows["1h"].coverage == pytest.approx((1 + 40 + 3) / 60)   # first point, 40 steps, capped hole
    assert holed_st.windows["1h"].measured_burn == pytest.approx(100.0)
    assert holed_st.windows["1h"].state == NOT_ENOUGH_DATA and not holed_st.page
    full_st = evaluate_inputs(slo, inputs(full))
    assert full_st.windows["1h"].coverage == pytest.approx(1.0) and full_st.page


# ------------------------------------------------------------------------------------ promtool
PROMTOOL = shutil.which("promtool")


def _alert_labels(slo_name: str, severity: str, alert_labels: dict[str, str]) -> dict[str, str]:
    return {"owner": "test", "sloth_id": f"app-{slo_name}", "sloth_service": "app", "sloth_slo": slo_name,
            "sloth_severity": severity, **alert_labels}


# Scenarios run by promtool over the generated rules and by triscope over a store, on the same
# counters: (name, minutes of data, (good, bad) requests per minute at minute i, [(minute, alerts firing)]).
# Availability 99.9 %: page at 14.4x over 1h (and 5m) or 6x over 6h (and 30m), ticket at 1x over 3d (and 6h),
# each only with 90 % of its long window covered.
Scenario = tuple[str, int, Callable[[int], tuple[int, int]], list[tuple[int, set[str]]]]
SCENARIOS: list[Scenario] = [
    # every request fails for three minutes: 1000x over every window, and no window is covered
    ("three-minutes-all-bad", 3, lambda i: (0, 1000), [(3, set())]),
    # 10 % errors (100x): the page waits for a covered hour; the ticket for a covered 3 days
    ("ten-percent", 120, lambda i: (900, 100), [(30, set()), (65, {"page"}), (120, {"page"})]),
    # 10 % errors for 80 minutes, then clean: the short window resets the page
    ("burst-then-clean", 140, lambda i: (900, 100) if i < 80 else (1000, 0), [(70, {"page"}), (140, set())]),
    # 0.5 % errors (5x): below both page factors; the ticket fires once 90 % of 3 days are covered
    ("slow-burn-3d", 4380, lambda i: (995, 5), [(48 * 60, set()), (66 * 60, {"ticket"}), (73 * 60, {"ticket"})]),
    # no errors: nothing
    ("clean", 120, lambda i: (1000, 0), [(100, set())]),
]


def _counts(minutes: int, per_min: Callable[[int], tuple[int, int]]) -> tuple[list[int], list[int]]:
    good, bad = [0], [0]
    for i in range(minutes):
        g, b = per_min(i)
        good.append(good[-1] + g)
        bad.append(bad[-1] + b)
    return good, bad


def _series_notation(values: list[int]) -> str:
    """promtool's expanding notation (``a+bxn``: n+1 values) for a list of integers."""
    out, i = [], 0
    while i < len(values):
        if i + 1 == len(values):
            out.append(str(values[i]))
            break
        step, j = values[i + 1] - values[i], i + 1
        while j + 1 < len(values) and values[j + 1] - values[j] == step:
            j += 1
        out.append(f"{values[i]}+{step}x{j - i}")
        i = j + 1
    return " ".join(out)


def _promtool_tests(rules: Path, alerts: dict[str, dict[str, Any]], scenarios: list[Scenario]) -> dict[str, Any]:
    tests = []
    for _name, minutes, per_min, checks in scenarios:
        good, bad = _counts(minutes, per_min)
        tests.append({
            "interval": "1m",
            "input_series": [{"series": 'app_requests_total{code="200"}', "values": _series_notation(good)},
                             {"series": 'app_requests_total{code="500"}', "values": _series_notation(bad)}],
            "alert_rule_test": [{"eval_time": f"{m}m", "alertname": "AppAvailability",
                                 "exp_alerts": [alerts[sev] for sev in ("page", "ticket") if sev in want]}
                                for m, want in checks],
        })
    return {"rule_files": [rules.name], "evaluation_interval": "1m", "tests": tests}


def _promtool(tests: dict[str, Any], tmp_path: Path, name: str = "slo-test.yml") -> subprocess.CompletedProcess[str]:
    tfile = tmp_path / name
    tfile.write_text(yaml.safe_dump(tests, sort_keys=False))
    return subprocess.run([PROMTOOL or "promtool", "test", "rules", str(tfile)], capture_output=True, text=True,
                          cwd=tmp_path, timeout=300)


@pytest.mark.prometheus
def test_promtool_check_and_test_rules(tmp_path: Path) -> None:
    assert PROMTOOL, "promtool is missing: run 'make test' (it installs prometheus)"
    spec = _write(tmp_path, SPEC)
    rules = tmp_path / "slo-rules.yml"
    r = subprocess.run([str(REPO / ".venv/bin/triscope"), "slo", "rules", str(spec), "-o", str(rules)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    chk = subprocess.run([PROMTOOL, "check", "rules", str(rules)], capture_output=True, text=True)
    assert chk.returncode == 0, chk.stdout + chk.stderr
    assert "SUCCESS" in chk.stdout

    groups = prometheus_rules(load_slo_file(spec))["groups"]
    # no external labels in this test: the links render as bare paths
    ann = {g_rule["labels"]["sloth_severity"]: {k: re.sub(r"\{\{ \$externalLabels\.\w+ \}\}", "", v)
                                                for k, v in g_rule["annotations"].items()}
           for g in groups for g_rule in g["rules"] if g_rule.get("alert") == "AppAvailability"}
    assert ann["page"]["runbook_url"] == "/alerts.md#appavailability"
    assert ann["page"]["dashboard_url"] == "/slos?range=1h"
    alerts = {sev: {"exp_labels": _alert_labels("availability", sev, {"category": "availability", "severity": sev}),
                    "exp_annotations": ann[sev]} for sev in ("page", "ticket")}
    tests = _promtool_tests(rules, alerts, SCENARIOS)
    sel = '{sloth_slo="availability", sloth_window="%s"}'
    lab = ('{owner="test", sloth_id="app-availability", sloth_service="app", sloth_slo="availability"%s}')
    # the recordings under the alerts: error ratio, coverage, and a budget only once the period is covered
    tests["tests"][1]["promql_expr_test"] = [
        {"expr": "round(1000 * slo:sli_error:ratio_rate1h%s)" % (sel % "1h"), "eval_time": "65m",
         "exp_samples": [{"labels": lab % ', sloth_window="1h"', "value": 100}]},
        # at 30 minutes: evaluations from 2m (the first with a rate) count 60 s each: 29 of 60
        {"expr": "round(100 * slo:sli_data_coverage:ratio%s)" % (sel % "1h"), "eval_time": "30m",
         "exp_samples": [{"labels": lab % ', sloth_window="1h"', "value": 48}]},
        {"expr": 'slo:period_error_budget_remaining:ratio{sloth_slo="availability"}', "eval_time": "120m",
         "exp_samples": []},
    ]
    tests["tests"][3]["promql_expr_test"] = [
        {"expr": "round(100 * slo:sli_data_coverage:ratio%s)" % (sel % "3d"), "eval_time": f"{48 * 60}m",
         "exp_samples": [{"labels": lab % ', sloth_window="3d"', "value": 67}]},
        {"expr": 'slo:period_error_budget_remaining:ratio{sloth_slo="availability"}', "eval_time": f"{48 * 60}m",
         "exp_samples": []},   # 2 of 30 days covered: no budget figure
        {"expr": 'round(slo:period_error_budget_remaining:ratio{sloth_slo="availability"})',
         "eval_time": f"{73 * 60}m",  # a tenth of the period covered: 1 - 5x
         "exp_samples": [{"labels": lab % ', sloth_window="30d"', "value": -4}]},
    ]
    res = _promtool(tests, tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SUCCESS" in res.stdout + res.stderr

    # the coverage guard is what keeps three minutes of errors quiet: without it, page and ticket fire
    text = rules.read_text()
    guard = re.compile(r"\n\s*and\n\s*max\(slo:sli_data_coverage:ratio\{[^}]*\} >= 0\.9\) without \(sloth_window\)")
    assert len(guard.findall(text)) == 3 + 2           # availability page x2 + ticket, latency page x2
    rules.write_text(guard.sub("", text))
    three = _promtool_tests(rules, alerts, [SCENARIOS[0]])
    three["tests"][0]["alert_rule_test"][0]["exp_alerts"] = [alerts["page"], alerts["ticket"]]
    unguarded = _promtool(three, tmp_path, "unguarded.yml")
    assert unguarded.returncode == 0, unguarded.stdout + unguarded.stderr
    # and a wrong expectation fails: the guarded rules do not fire on those three minutes
    rules.write_text(text)
    wrong = _promtool(three, tmp_path, "wrong.yml")
    assert wrong.returncode != 0 and "AppAvailability" in wrong.stdout + wrong.stderr


@pytest.mark.prometheus
def test_shipped_example_rules_pass_promtool(tmp_path: Path) -> None:
    assert PROMTOOL, "promtool is missing: run 'make test' (it installs prometheus)"
    out = tmp_path / "r.yml"
    out.write_text(rules_yaml(load_slo_file(REPO / "deploy" / "slo.example.yaml")))
    chk = subprocess.run([PROMTOOL, "check", "rules", str(out)], capture_output=True, text=True)
    assert chk.returncode == 0, chk.stdout + chk.stderr


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s[0] for s in SCENARIOS])
def test_store_evaluation_agrees_with_prometheus_semantics(scenario: Scenario, sqlite_url: str, tmp_path: Path) -> None:
    """The promtool scenarios evaluated by triscope itself over a store: the same alerts fire."""
    _name, minutes, per_min, checks = scenario
    st = Store.open(sqlite_url)
    st.upgrade()
    start = 1_800_000_000.0
    good, bad = _counts(minutes, per_min)
    st.write_ticks("n1", [Tick(start + 60 * i, [Sample("app_requests_total", float(g), {"code": "200"}, "counter"),
                                                Sample("app_requests_total", float(b), {"code": "500"}, "counter")])
                          for i, (g, b) in enumerate(zip(good, bad, strict=True))])
    slo = load_slo_file(_write(tmp_path, SPEC))[0]
    for m, want in checks:
        s = evaluate(st, slo, start + 60 * m)
        assert {a.severity for a in s.alerts if a.firing} == want, (m, s.as_dict())
    if _name == "slow-burn-3d":
        assert evaluate(st, slo, start + 48 * 3600).budget_remaining is None
        late = evaluate(st, slo, start + 73 * 3600)
        assert late.coverage >= PERIOD_MIN_COVERAGE and late.budget_remaining == pytest.approx(1 - 5.0, rel=1e-3)
    st.close()


def test_cli_status(sqlite_url: str, tmp_path: Path) -> None:
    st = Store.open(sqlite_url)
    st.upgrade()
    start = 1_800_000_000.0
    st.write_ticks("n1", _app_ticks(start, 70, lambda i: 0.10))
    st.close()
    spec = _write(tmp_path, SPEC)
    exe = str(REPO / ".venv/bin/triscope")
    r = subprocess.run([exe, "slo", "status", "--db", sqlite_url, "--slo", str(spec), "--at", str(start + 3900)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "app/availability" in r.stdout and "[PAGE]" in r.stdout and "1h=100.00x" in r.stdout
    assert "3d=not-enough-data" in r.stdout
    assert re.search(r"ticket 3d/6h > 1x: not enough data yet \(1\.\d % of the 3d window covered\)", r.stdout), r.stdout
    assert re.search(r"SLI and error budget: not enough data yet \(0\.\d+ % of the 30d window covered\)", r.stdout)
    j = subprocess.run([exe, "slo", "status", "--db", sqlite_url, "--slo", str(spec), "--at", str(start + 3900),
                        "--json"], capture_output=True, text=True)
    rows = [json.loads(line) for line in j.stdout.splitlines()]
    assert rows[0]["page"] is True and rows[0]["burn_rates"]["1h"] == pytest.approx(100.0)
    assert rows[0]["ticket"] is False and rows[0]["burn_rates"]["3d"] is None
    assert rows[0]["error_budget_remaining"] is None and rows[0]["budget_state"] == "not enough data yet"
    # three minutes in: nothing decided, said as such, exit 0 as for any status
    early = subprocess.run([exe, "slo", "status", "--db", sqlite_url, "--slo", str(spec), "--at", str(start + 180)],
                           capture_output=True, text=True)
    assert early.returncode == 0, early.stderr
    assert "[NOT ENOUGH DATA YET]" in early.stdout and "FIRING" not in early.stdout
    assert early.stdout.count(": not enough data yet (") == 2 + 3 + 2   # SLI/budget x2 SLOs, 3 + 2 alerts


def test_generated_alerts_link_runbook_and_dashboard_unless_the_spec_does() -> None:
    """Every generated SLO alert gets runbook_url / dashboard_url templates over Prometheus external
    labels; an SLO file's own annotations win."""
    groups = prometheus_rules(parse_slo_text(SPEC))["groups"]
    alerts = [r for g in groups for r in g["rules"] if "alert" in r]
    assert {a["alert"] for a in alerts} == {"AppAvailability", "AppLatency"}
    for a in alerts:
        assert a["annotations"]["runbook_url"] == (
            "{{ $externalLabels.triscope_docs_url }}/alerts.md#" + a["alert"].lower())
        assert a["annotations"]["dashboard_url"] == "{{ $externalLabels.triscope_dashboard_url }}/slos?range=1h"
    own = SPEC.replace('summary: "app availability budget burn"',
                       'summary: "app availability budget burn"\n        runbook_url: "https://wiki/app"')
    alerts = [r for g in prometheus_rules(parse_slo_text(own))["groups"] for r in g["rules"]
              if r.get("alert") == "AppAvailability"]
    assert alerts and all(a["annotations"]["runbook_url"] == "https://wiki/app" for a in alerts)


def test_prometheusrule_wraps_extra_groups_then_the_slo_groups() -> None:
    from triscope.analysis.slo import prometheusrule_yaml

    slos = parse_slo_text(SPEC)
    extra = [{"name": "mine", "rules": [{"alert": "Mine", "expr": "vector(1)"}]}]
    doc = yaml.safe_load(prometheusrule_yaml(slos, name="x", extra_groups=extra, header="# h\n"))
    assert doc["apiVersion"] == "monitoring.coreos.com/v1" and doc["kind"] == "PrometheusRule"
    assert doc["metadata"] == {"name": "x", "labels": {"app.kubernetes.io/name": "triscope",
                                                       "release": "kube-prometheus-stack"}}
    assert doc["spec"]["groups"][0] == extra[0]
    assert doc["spec"]["groups"][1:] == prometheus_rules(slos)["groups"]
    with pytest.raises(ValueError, match="mine"):
        prometheusrule_yaml(slos, name="x", extra_groups=extra * 2)
