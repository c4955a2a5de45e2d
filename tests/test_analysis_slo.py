"""SLOs: spec parsing with file:line errors, evaluation over the store, and the generated
Prometheus rules checked and unit-tested by the real promtool."""

from __future__ import annotations

import json
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest
import yaml

from triscope.analysis.slo import (
    SLOSpecError,
    evaluate,
    load_slo_file,
    parse_query,
    parse_slo_text,
    prometheus_rules,
    rules_yaml,
)
from triscope.samples import Sample, Tick
from triscope.store import Store

REPO = Path(__file__).resolve().parent.parent

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
    assert s.windows["3d"].coverage < 0.05  # 65 minutes of data in a 3-day window
    assert s.page and s.ticket and s.status == "page"
    assert s.budget_remaining == pytest.approx(1 - 100.0, rel=1e-3)
    lat = evaluate(st, slos[1], start + 65 * 60)
    assert lat.windows["1h"].error_ratio == pytest.approx(0.05, rel=1e-6)  # half the errors are slow
    assert [a.severity for a in lat.alerts] == ["page", "page"]  # ticket disabled
    assert json.loads(json.dumps(s.as_dict()))["status"] == "page"
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


# ------------------------------------------------------------------------------------ promtool
PROMTOOL = shutil.which("promtool")


def _alert_labels(slo_name: str, severity: str, alert_labels: dict[str, str]) -> dict[str, str]:
    return {"owner": "test", "sloth_id": f"app-{slo_name}", "sloth_service": "app", "sloth_slo": slo_name,
            "sloth_severity": severity, **alert_labels}


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
    ann = {g_rule["labels"]["sloth_severity"]: g_rule["annotations"]
           for g in groups for g_rule in g["rules"] if g_rule.get("alert") == "AppAvailability"}
    page = {"exp_labels": _alert_labels("availability", "page", {"category": "availability", "severity": "page"}),
            "exp_annotations": ann["page"]}
    ticket = {"exp_labels": _alert_labels("availability", "ticket", {"category": "availability",
                                                                      "severity": "ticket"}),
              "exp_annotations": ann["ticket"]}
    tests = {
        "rule_files": [rules.name],
        "evaluation_interval": "1m",
        "tests": [
            {   # 10 % errors: both page windows (and the ticket) fire
                "interval": "1m",
                "input_series": [
                    {"series": 'app_requests_total{code="200"}', "values": "0+900x120"},
                    {"series": 'app_requests_total{code="500"}', "values": "0+100x120"},
                ],
                "alert_rule_test": [{"eval_time": "65m", "alertname": "AppAvailability",
                                     "exp_alerts": [page, ticket]}],
                "promql_expr_test": [{
                    "expr": 'round(1000 * slo:sli_error:ratio_rate1h{sloth_slo="availability"})',
                    "eval_time": "65m",
                    "exp_samples": [{"labels": '{owner="test", sloth_id="app-availability", '
                                               'sloth_service="app", sloth_slo="availability", sloth_window="1h"}',
                                     "value": 100}],
                }],
            },
            {   # 0.5 % errors (5x): the page must not fire, the ticket (1x over 3d and 6h) does
                "interval": "1m",
                "input_series": [
                    {"series": 'app_requests_total{code="200"}', "values": "0+995x240"},
                    {"series": 'app_requests_total{code="500"}', "values": "0+5x240"},
                ],
                "alert_rule_test": [{"eval_time": "3h", "alertname": "AppAvailability", "exp_alerts": [ticket]}],
            },
            {   # 10 % errors for 20 minutes, then clean: the short windows reset the page
                "interval": "1m",
                "input_series": [
                    {"series": 'app_requests_total{code="200"}', "values": "0+900x20 18000+1000x60"},
                    {"series": 'app_requests_total{code="500"}', "values": "0+100x20 2000+0x60"},
                ],
                "alert_rule_test": [
                    {"eval_time": "15m", "alertname": "AppAvailability", "exp_alerts": [page, ticket]},
                    {"eval_time": "60m", "alertname": "AppAvailability", "exp_alerts": [ticket]},
                ],
            },
            {   # no errors at all: nothing fires
                "interval": "1m",
                "input_series": [
                    {"series": 'app_requests_total{code="200"}', "values": "0+1000x120"},
                ],
                "alert_rule_test": [{"eval_time": "100m", "alertname": "AppAvailability", "exp_alerts": []},
                                    {"eval_time": "100m", "alertname": "AppLatency", "exp_alerts": []}],
            },
        ],
    }
    tfile = tmp_path / "slo-test.yml"
    tfile.write_text(yaml.safe_dump(tests, sort_keys=False))
    res = subprocess.run([PROMTOOL, "test", "rules", str(tfile)], capture_output=True, text=True, cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SUCCESS" in res.stdout + res.stderr

    # and a deliberately wrong expectation must fail: the page does fire at 10 % errors
    tests["tests"] = [dict(tests["tests"][0], alert_rule_test=[
        {"eval_time": "65m", "alertname": "AppAvailability", "exp_alerts": [ticket]}])]
    tfile.write_text(yaml.safe_dump(tests, sort_keys=False))
    bad = subprocess.run([PROMTOOL, "test", "rules", str(tfile)], capture_output=True, text=True, cwd=tmp_path)
    assert bad.returncode != 0


@pytest.mark.prometheus
def test_shipped_example_rules_pass_promtool(tmp_path: Path) -> None:
    assert PROMTOOL, "promtool is missing: run 'make test' (it installs prometheus)"
    out = tmp_path / "r.yml"
    out.write_text(rules_yaml(load_slo_file(REPO / "deploy" / "slo.example.yaml")))
    chk = subprocess.run([PROMTOOL, "check", "rules", str(out)], capture_output=True, text=True)
    assert chk.returncode == 0, chk.stdout + chk.stderr


def test_store_evaluation_agrees_with_prometheus_semantics(sqlite_url: str, tmp_path: Path) -> None:
    """The third promtool case evaluated by triscope itself: same page/ticket decisions."""
    st = Store.open(sqlite_url)
    st.upgrade()
    start = 1_800_000_000.0
    st.write_ticks("n1", _app_ticks(start, 80, lambda i: 0.10 if i < 20 else 0.0))
    slo = load_slo_file(_write(tmp_path, SPEC))[0]
    at15 = evaluate(st, slo, start + 15 * 60)
    assert at15.page and at15.ticket
    at60 = evaluate(st, slo, start + 60 * 60)
    assert not at60.page and at60.ticket
    assert at60.windows["5m"].error_ratio == 0.0 and at60.windows["1h"].burn_rate > 14.4
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
    j = subprocess.run([exe, "slo", "status", "--db", sqlite_url, "--slo", str(spec), "--at", str(start + 3900),
                        "--json"], capture_output=True, text=True)
    rows = [json.loads(line) for line in j.stdout.splitlines()]
    assert rows[0]["page"] is True and rows[0]["burn_rates"]["1h"] == pytest.approx(100.0)
