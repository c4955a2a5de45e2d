"""SLOs whose period a recording of minutes can cover (the demo's 1h, deploy/slo.demo.yaml) speak —
burn rates, a budget, a page — while a 30-day SLO over the same minutes stays silent; the windows
of a short period are the workbook's scaled to it, in the evaluation and in the generated
Prometheus rules alike (checked by the real promtool); the card text is the SLO's own definition."""

from __future__ import annotations

import re
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest
import yaml

from triscope.analysis.slo import (
    NOT_ENOUGH_DATA,
    SLOSpecError,
    describe,
    evaluate,
    load_slo_file,
    parse_slo_text,
    prometheus_rules,
    rules_yaml,
)
from triscope.analysis.slo_spec import WINDOWS, scaled_windows
from triscope.core.samples import Sample, Tick
from triscope.store import Store

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "deploy" / "slo.demo.yaml"
EXAMPLE = REPO / "deploy" / "slo.example.yaml"
RECORDING = REPO / "examples" / "traces" / "h200-inference-5.jsonl.gz"


def _spec(period: str) -> str:
    return textwrap.dedent(f"""\
        version: "prometheus/v1"
        service: "app"
        period: {period}
        slos:
          - name: "availability"
            objective: 99.0
            sli:
              events:
                error_query: sum(rate(app_errors_total[{{{{.window}}}}]))
                total_query: sum(rate(app_requests_total[{{{{.window}}}}])) + sum(rate(app_errors_total[{{{{.window}}}}]))
            alerting:
              name: AppAvailability
              page_alert: {{labels: {{severity: page}}}}
              ticket_alert: {{labels: {{severity: ticket}}}}
          - name: "late"
            objective: 99.0
            sli:
              events:
                error_query: sum(rate(app_requests_total{{status="late"}}[{{{{.window}}}}]))
                total_query: sum(rate(app_requests_total[{{{{.window}}}}]))
            alerting:
              name: AppLate
              page_alert: {{labels: {{severity: page}}}}
              ticket_alert: {{labels: {{severity: ticket}}}}
        """)


def _ticks(start: float, seconds: int, late_share: float = 0.2, per_s: int = 100) -> list[Tick]:
    """One tick a second: ``per_s`` requests, ``late_share`` of them late; no error series at all
    (a labelled error counter appears at its first failure)."""
    out, ok, late = [], 0.0, 0.0
    for i in range(seconds + 1):
        out.append(Tick(start + i, [Sample("app_requests_total", ok, {"status": "ok"}, "counter"),
                                    Sample("app_requests_total", late, {"status": "late"}, "counter")]))
        ok += per_s * (1 - late_share)
        late += per_s * late_share
    return out


def test_windows_scale_below_three_days_only() -> None:
    assert scaled_windows(30 * 86400) == WINDOWS == scaled_windows(3 * 86400)
    assert [w for w, _ in scaled_windows(3600)] == ["4s", "25s", "50s", "5m", "20m", "1h"]
    one_h, thirty_d = parse_slo_text(_spec("1h"))[1], parse_slo_text(_spec("30d"))[1]
    # the factors of a scaled period are those of 3 days: 2 % of the budget in the 1h-window's share
    assert one_h.burn_factor("1h", 0.02) == pytest.approx(0.02 * 3600 / 50)
    assert one_h.burn_factor("3d", 0.10) == pytest.approx(0.10)
    assert thirty_d.burn_factor("1h", 0.02) == pytest.approx(14.4)
    with pytest.raises(SLOSpecError, match="at least 1h"):
        parse_slo_text(_spec("30m"))


def test_minutes_of_data_speak_under_a_1h_period_and_stay_silent_under_30d(sqlite_url: str) -> None:
    st = Store.open(sqlite_url)
    st.upgrade()
    start = 1_800_000_000.0
    st.write_ticks("n1", _ticks(start, 540))     # nine minutes, 20 % late
    end = start + 540
    avail1h, late1h = parse_slo_text(_spec("1h"))
    s = evaluate(st, late1h, end)
    assert s.status == "page" and s.page, s.as_dict()
    assert s.windows["50s"].burn_rate == pytest.approx(20.0, rel=1e-6)
    assert s.windows["5m"].burn_rate == pytest.approx(20.0, rel=1e-6)
    assert s.windows["20m"].state == NOT_ENOUGH_DATA and s.windows["1h"].state == NOT_ENOUGH_DATA
    assert s.coverage >= 0.1 and s.budget_remaining == pytest.approx(1 - 20.0, rel=1e-3)
    assert [a.state for a in s.alerts] == ["FIRING", "FIRING", NOT_ENOUGH_DATA]    # the 1h ticket window: 9 min
    # no error series at all while requests are counted: 0 errors, not "no data"
    a = evaluate(st, avail1h, end)
    assert a.windows["5m"].error_ratio == 0.0 and a.sli == 1.0 and a.status == "ok", a.as_dict()
    # the same nine minutes under a 30-day period: burn measured, nothing decided, no budget, no page
    late30 = parse_slo_text(_spec("30d"))[1]
    s30 = evaluate(st, late30, end)
    assert s30.windows["5m"].burn_rate == pytest.approx(20.0, rel=1e-6)
    assert s30.status == NOT_ENOUGH_DATA and not s30.page and not s30.ticket and s30.budget_remaining is None
    st.close()


def test_demo_slos_count_different_things_and_the_recording_speaks(sqlite_url: str) -> None:
    """The demo file's two SLOs: one counts failed requests, the other slow ones (no error term in
    common); over a real recording (9 minutes, no failure, a fifth of the requests over 250 ms)
    availability is ok at 100 % and latency has a budget figure (overspent) and pages."""
    from triscope.core.trace import import_trace

    avail, lat = load_slo_file(DEMO)
    assert avail.period == lat.period == "1h"
    err_metrics = [{t.metric for t in s.error_query.terms} for s in (avail, lat)]
    assert err_metrics[0].isdisjoint(err_metrics[1]), err_metrics
    st = Store.open(sqlite_url)
    st.upgrade()
    info = import_trace(st, RECORDING)
    a, la = evaluate(st, avail, info.end + 1), evaluate(st, lat, info.end + 1)
    assert a.status == "ok" and a.sli == 1.0 and a.budget_remaining == 1.0, a.as_dict()
    # decided (the page windows are covered), the budget overspent, the 5m window burning
    assert la.status in ("ok", "page") and la.budget_remaining is not None and la.budget_remaining < 0, la.as_dict()
    ratio = la.windows["5m"].error_ratio
    assert ratio is not None and 0.1 < ratio < 0.5
    # the late requests come in bursts: at some instant of the last five minutes the page fires
    assert any(evaluate(st, lat, info.end - k).page for k in range(0, 300, 10))
    assert not any(evaluate(st, avail, info.end - k).page for k in range(0, 300, 60))
    st.close()


def test_card_text_is_the_definition() -> None:
    avail, lat = load_slo_file(DEMO)
    head, detail = describe(lat)
    assert head == "99.5 % of events within 250 ms, over a rolling 1h", head
    assert 'inference_request_duration_seconds' in detail and 'le="0.25"' in detail
    assert "scaled to the 1h period" in detail and "4s .. 1h" in detail
    head, detail = describe(avail)
    assert head.startswith("99.9 % of events good (at most 0.1 % bad), over a rolling 1h"), head
    assert detail.startswith("bad: inference_request_errors_total; all: inference_requests_total + "
                             "inference_request_errors_total"), detail
    # the production example: the workbook's windows, said so without "scaled"
    on_time = load_slo_file(EXAMPLE)[0]
    assert "burn windows 5m .. 3d" in describe(on_time)[1] and "scaled" not in describe(on_time)[1]


def test_rules_use_the_scaled_windows_once_each() -> None:
    groups = prometheus_rules(parse_slo_text(_spec("1h")))["groups"]
    rec = [r for g in groups for r in g["rules"] if "record" in r]
    keys = [(r["record"], tuple(sorted(r["labels"].items()))) for r in rec]
    assert len(keys) == len(set(keys)), "a series recorded twice"
    windows = {r["labels"]["sloth_window"] for r in rec if r["record"].startswith("slo:sli_error:ratio_rate")}
    assert windows == {"4s", "25s", "50s", "5m", "20m", "1h"}
    alerts = [r for g in groups for r in g["rules"] if r.get("alert") == "AppLate"]
    page = next(a for a in alerts if a["labels"]["severity"] == "page")
    assert "slo:sli_error:ratio_rate50s" in page["expr"] and "slo:sli_error:ratio_rate4s" in page["expr"]
    assert "(1.44 * 0.01)" in page["expr"], page["expr"]
    # the example (30 days) is what deploy/ ships: unchanged windows
    ex = prometheus_rules(load_slo_file(EXAMPLE))["groups"]
    assert {r["labels"]["sloth_window"] for g in ex for r in g["rules"]
            if r.get("record", "").startswith("slo:sli_error:ratio_rate")} == {"5m", "30m", "1h", "6h", "1d", "3d", "30d"}


PROMTOOL = shutil.which("promtool")


@pytest.mark.prometheus
def test_promtool_agrees_on_a_1h_period(tmp_path: Path, sqlite_url: str) -> None:
    """Nine minutes at one-second resolution, 20 % late: the 1h SLO's rules page once the 50 s
    window is covered, as triscope's evaluation does; the error series that never appeared reads 0."""
    assert PROMTOOL, "promtool is missing: run 'make test' (it installs prometheus)"
    rules = tmp_path / "rules.yml"
    slos = parse_slo_text(_spec("1h"))
    rules.write_text(rules_yaml(slos))
    chk = subprocess.run([PROMTOOL, "check", "rules", str(rules)], capture_output=True, text=True)
    assert chk.returncode == 0, chk.stdout + chk.stderr
    labels = {"sloth_id": "app-late", "sloth_service": "app", "sloth_slo": "late", "severity": "page",
              "sloth_severity": "page"}
    page = next(r for g in prometheus_rules(slos)["groups"] for r in g["rules"]
                if r.get("alert") == "AppLate" and r["labels"]["severity"] == "page")
    # no external labels here: the links' templates render as bare paths
    ann = {k: re.sub(r"\{\{ \$externalLabels\.\w+ \}\}", "", v) for k, v in page["annotations"].items()}
    tests = {"rule_files": [rules.name], "evaluation_interval": "1s", "tests": [{
        "interval": "1s",
        "input_series": [{"series": 'app_requests_total{status="ok"}', "values": "0+80x540"},
                         {"series": 'app_requests_total{status="late"}', "values": "0+20x540"}],
        "alert_rule_test": [{"eval_time": "30s", "alertname": "AppLate", "exp_alerts": []},
                            {"eval_time": "9m", "alertname": "AppLate", "exp_alerts": [
                                {"exp_labels": labels, "exp_annotations": ann}]}],
        "promql_expr_test": [{"expr": 'slo:sli_error:ratio_rate5m{sloth_slo="availability"}', "eval_time": "9m",
                              "exp_samples": [{"labels": 'slo:sli_error:ratio_rate5m{sloth_id="app-availability", '
                                                         'sloth_service="app", sloth_slo="availability", '
                                                         'sloth_window="5m"}', "value": 0}]}],
    }]}
    f = tmp_path / "t.yml"
    f.write_text(yaml.safe_dump(tests, sort_keys=False))
    res = subprocess.run([PROMTOOL, "test", "rules", f.name], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    st = Store.open(sqlite_url)
    st.upgrade()
    st.write_ticks("n1", _ticks(1_800_000_000.0, 540))
    late = slos[1]
    assert not evaluate(st, late, 1_800_000_000.0 + 30).page
    assert evaluate(st, late, 1_800_000_000.0 + 540).page
    st.close()
