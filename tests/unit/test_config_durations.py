"""One duration grammar (``triscope.core.durations``) for policies, SLO files, mismatch thresholds and
the command line's relative times: every form, every refusal, and each file reading it."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from kube_server import policy_text
from pydantic import ValidationError

from triscope.analysis.config import ConfigError, load_thresholds
from triscope.analysis.slo import SLOSpecError, parse_slo_text
from triscope.core import timeparse
from triscope.core.configfile import ConfigModel
from triscope.core.durations import Duration, DurationError, parse_duration, unit_seconds
from triscope.remediation.policy import PolicyError, parse_policy

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("value, seconds", [
    ("500ms", 0.5), ("30s", 30), ("5m", 300), ("1h", 3600), ("1d", 86400), ("7d", 604800), ("1w", 604800),
    ("1.5h", 5400), ("0.25s", 0.25), ("1h30m", 5400), ("1d12h", 129600), ("2m30s", 150), ("1s500ms", 1.5),
    ("1w1d", 691200), ("30m1h", 5400), ("5 m", 300), (" 30s ", 30), ("1h 30m", 5400), ("0s", 0),
    ("90", 90), ("0.5", 0.5), (" 15 ", 15), (90, 90), (0.5, 0.5), (0, 0),
])
def test_every_form(value: object, seconds: float) -> None:
    assert parse_duration(value) == pytest.approx(seconds)


@pytest.mark.parametrize("value, words", [
    ("", "is not a duration"), ("soon", "is not a duration"), ("5x", "is not a duration"),
    ("5mm", "is not a duration"), ("h", "is not a duration"), ("1e3", "is not a duration"),
    ("-5s", "is not a duration"), ("+5s", "is not a duration"), (".5h", "is not a duration"),
    ("2h ago", "is not a duration"), ("1h30", "is not a duration"), ("x" * 5000, "is not a duration"),
    (-1, "must not be negative"), (-0.5, "must not be negative"),
    (math.nan, "must be a finite duration"), (math.inf, "must be a finite duration"),
    (10 ** 400, "must be a finite duration"),
    (True, "must be a duration"), (None, "must be a duration"), ([1], "must be a duration"),
    ({"h": 1}, "must be a duration"),
])
def test_refusals_say_what_and_which_forms(value: object, words: str) -> None:
    with pytest.raises(DurationError) as ei:
        parse_duration(value)
    msg = str(ei.value)
    assert words in msg and "\n" not in msg and len(msg) < 200, msg
    if "not a duration" in words:
        assert "30s, 5m, 1h30m, 7d, 1w, 500ms" in msg


def test_command_line_times_share_the_unit_grammar() -> None:
    now = 1_800_000_000.0
    for text in ("90s", "1h30m", "1.5d", "1w", "500ms", "1d12h"):
        assert timeparse.parse_duration(text) == parse_duration(text) == unit_seconds(text)
        assert timeparse.parse_time(f"-{text}", now) == pytest.approx(now - parse_duration(text))
    # on the command line a bare number keeps its own meaning (epoch seconds or seconds ago) ...
    assert unit_seconds("600") is None and timeparse.parse_time("600", now) == now - 600
    assert timeparse.parse_time("1764400000", now) == 1764400000.0
    # ... and what no file accepts, it refuses too
    for bad in ("-5x", "--2h", "- 2h", "2h ago"):
        with pytest.raises(timeparse.TimeParseError):
            timeparse.parse_time(bad, now)


def test_duration_is_a_pydantic_field_type() -> None:
    class M(ConfigModel):
        timeout: Duration = 30.0

    assert M.model_validate({}).timeout == 30.0
    assert M.model_validate({"timeout": "1h30m"}).timeout == 5400.0
    assert M.model_validate({"timeout": 2}).timeout == 2.0
    with pytest.raises(ValidationError) as ei:
        M.model_validate({"timeout": "soon"})
    assert ei.value.errors()[0]["loc"] == ("timeout",)


# ---------------------------------------------------------------------------------------------- in the files
RESTART = """  - name: r1
    trigger: {metric: m, threshold: 1, for: 1h30m}
    action: rolling_restart
    target: {namespace: inference, deployment: web}
    params: {timeout: 500ms}
    limits: {cooldown: 1w, max_actions: 1, per: 1d12h}
"""


def test_a_week_and_compounds_work_in_a_policy() -> None:
    """``1w`` worked in SLO files and not in policies; now every form works in every file."""
    pol = parse_policy(policy_text(RESTART, settings="  namespaces: [inference]\n  evaluate_interval: 1m30s\n"
                                                     "  dedupe_retention: 2w\n  breaker: {window: 0.5h}\n"),
                       "p.yaml")
    r = pol.rule("r1")
    assert r.cooldown_s == 604800 and r.per_s == 129600 and r.trigger.for_s == 5400
    assert r.params.model_dump()["timeout"] == 0.5
    s = pol.settings
    assert s.evaluate_interval_s == 90 and s.dedupe_retention_s == 1209600 and s.breaker.window_s == 1800
    # the forms of the shipped example and of the tests still read the same
    plain = parse_policy(policy_text(RESTART.replace("1h30m", "90").replace("500ms", "0.5").replace("1w", "604800")
                                     .replace("1d12h", "129600s"), settings="  namespaces: [inference]\n"), "p.yaml")
    assert plain.rule("r1").cooldown_s == 604800 and plain.rule("r1").trigger.for_s == 90
    with pytest.raises(PolicyError) as ei:
        parse_policy(policy_text(RESTART.replace("cooldown: 1w", "cooldown: 1 week"),
                                 settings="  namespaces: [inference]\n"), "p.yaml")
    assert str(ei.value).startswith("p.yaml:10: rules[0].limits.cooldown: '1 week' is not a duration (e.g. ")


SLO = """version: prometheus/v1
service: app
period: {period}
slos:
  - name: avail
    objective: 99.9
    sli:
      events:
        error_query: sum(rate(errors_total[{{{{.window}}}}]))
        total_query: sum(rate(requests_total[{{{{.window}}}}]))
"""


@pytest.mark.parametrize("period, seconds", [("30d", 30 * 86400), ("4w", 28 * 86400), ("720h", 30 * 86400),
                                             ("3d", 3 * 86400), ("1w3d", 10 * 86400), ("604800", 7 * 86400)])
def test_slo_period_takes_every_form(period: str, seconds: float) -> None:
    slo = parse_slo_text(SLO.format(period=period), "s.yaml")[0]
    assert slo.period_s == seconds


def test_slo_period_refusals_name_their_line() -> None:
    for period, words in (("30m", "must be at least 1h"), ("soon", "is not a duration"), ("-3d", "is not a duration")):
        with pytest.raises(SLOSpecError) as ei:
            parse_slo_text(SLO.format(period=period), "s.yaml")
        assert ei.value.line == 3 and str(ei.value).startswith("s.yaml:3: period: ") and words in str(ei.value)


def test_threshold_durations(tmp_path: Path) -> None:
    p = tmp_path / "th.yaml"
    p.write_text("window_s: 20s\nstate_dwell_s: 500ms\n")
    th = load_thresholds(p, environ={"TRISCOPE_MISMATCH_WINDOW_S": "1m"})
    assert th.window_s == 60 and th.state_dwell_s == 0.5
    assert load_thresholds(p, environ={}).window_s == 20
    p.write_text("window_s: 12\n")                       # a plain number is still seconds
    assert load_thresholds(p, environ={}).window_s == 12
    p.write_text("idle_busy: 0.1\nwindow_s: 10 sec\n")
    with pytest.raises(ConfigError) as ei:
        load_thresholds(p, environ={})
    assert str(ei.value).startswith(f"{p}:2: window_s: '10 sec' is not a duration")
