"""``examples/inference/report.py``'s alert column checked with the real ``promtool test rules``.

The report computes, per scenario, how long each shipped accelerator alert's expression held
(``alert_holds``: state and score > 0.3 on the accelerator's series) from the verdicts.  Here the
verdicts are h200-inference-1's recorded inputs replayed through today's tracker
(``triscope.commands.replay``), written out as promtool input series (one per published label set,
``stale`` where the agent stopped publishing it, as a scrape would mark it), and Debian's promtool
evaluates ``deploy/prometheus/triscope-rules.yaml`` over them:

* the shipped rules with each mismatch alert's ``for`` set to 0 s (annotations left out): the alert
  fires at exactly the seconds the report says its expression holds, with the workload it names;
* the shipped rules unchanged: none fires in a 45-second scenario, as the report says.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import REPO

from examples.inference.acceptance import replay_tracks
from examples.inference.report import ALERTS, alert_holds
from triscope.commands.replay import replay_trace
from triscope.core.trace import read_trace

pytestmark = pytest.mark.prometheus

TRACE = REPO / "examples" / "traces" / "h200-inference-1.jsonl.gz"
TIMELINE = REPO / "examples" / "traces" / "h200-inference-1.timeline.jsonl"
RULES = REPO / "deploy" / "prometheus" / "triscope-rules.yaml"
NODE = "h200-inference-1"
METRICS = ("triscope_mismatch_state", "triscope_mismatch_score")
SCENARIOS = ("pcie_saturation", "pageable", "net_drop")


def _span(name: str) -> tuple[float, float]:
    lines = [json.loads(ln) for ln in TIMELINE.read_text().splitlines() if ln.strip()]
    ln = next(x for x in lines if x["scenario"] == name and x.get("instance", "b") == "b")
    return float(ln["start"]), float(ln["end"])


def _promql_labels(labels: dict[str, str]) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()) if v) + "}"   # empty = absent


def _series(a: float, b: float) -> tuple[list[dict[str, str]], list[int], dict[int, float]]:
    """promtool input series of the accelerator's verdict over [a, b) at 1 s steps from ``a``; the
    step indices that hold a tick, and each one's tick time."""
    tr = replay_trace(read_trace(TRACE))
    want = {int(sid): (str(m), {**dict(lab), "node": NODE}) for sid, m, lab, _k in tr.header["series"]
            if m in METRICS and dict(lab).get("gpu")}
    ticks = [(t, {sid: v for sid, v in vals if sid in want}) for t, vals in tr.ticks if a <= t < b]
    n = int(b - a) + 1
    grid: dict[int, list[str]] = {sid: ["_"] * n for sid in want}
    steps: dict[int, float] = {}
    for t, vals in ticks:
        i = int(round(t - a))
        steps[i] = t
        for sid, row in grid.items():
            if sid in vals:
                row[i] = repr(float(vals[sid]))
            elif any(x not in ("_", "stale") for x in row[:i]):
                row[i] = "stale"
    out = [{"series": f"{m}{_promql_labels(lab)}", "values": " ".join(grid[sid])}
           for sid, (m, lab) in want.items() if any(x not in ("_", "stale") for x in grid[sid])]
    return out, sorted(steps), steps


def _rules(tmp: Path, for_zero: bool) -> Path:
    doc = yaml.safe_load(RULES.read_text())
    group = next(g for g in doc["groups"] if g["name"] == "triscope-mismatch")
    keep = []
    for r in group["rules"]:
        if "record" in r:
            keep.append(r)
        elif r.get("alert") in ALERTS:
            if for_zero:
                r = {k: v for k, v in r.items() if k != "annotations"} | {"for": "0s"}
            keep.append(r)
    path = tmp / ("rules-for-0.yaml" if for_zero else "rules.yaml")
    path.write_text(yaml.safe_dump({"groups": [{"name": group["name"], "rules": keep}]}))
    return path


def _promtool(tmp: Path, rules: Path, series: list[dict[str, str]], tests: list[dict[str, Any]]) -> None:
    spec = {"rule_files": [str(rules)], "evaluation_interval": "1s",
            "tests": [{"interval": "1s", "input_series": series, "alert_rule_test": tests}]}
    path = tmp / "test.yaml"
    path.write_text(yaml.safe_dump(spec, width=1 << 20))
    out = subprocess.run(["promtool", "test", "rules", str(path)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]


@pytest.fixture(scope="module")
def track() -> Any:
    return replay_tracks(TRACE)["gpu=0"]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_the_alert_fires_where_the_report_says_its_expression_holds(tmp_path: Path, track: Any,
                                                                    scenario: str) -> None:
    if shutil.which("promtool") is None:
        pytest.fail("promtool is missing (Debian package prometheus; make test installs it)")
    a, b = _span(scenario)
    series, idx, steps = _series(a, b)
    held = alert_holds(track, a, b)
    tests: list[dict[str, Any]] = []
    fired = {name: 0 for name in ALERTS}
    for i in idx:
        t = round(steps[i], 3)
        state, who = track.points.get(t, ("", ""))
        for name, (want, _for) in ALERTS.items():
            holds = state == want and track.scores.get(t, 0.0) > 0.3
            exp = []
            if holds:
                fired[name] += 1
                exp = [{"exp_labels": _alert_labels(series, i, name)}]
            tests.append({"eval_time": f"{i}s", "alertname": name, "exp_alerts": exp})
    # the report held an alert's expression where these ticks say it holds, and only there
    assert any(fired.values()), (scenario, held)
    assert {n for n, k in fired.items() if k} == {n for n in ALERTS if held[n]["held_s"] > 0}, (fired, held)
    _promtool(tmp_path, _rules(tmp_path, for_zero=True), series, tests)


def _alert_labels(series: list[dict[str, str]], i: int, name: str) -> dict[str, str]:
    """The labels the alert carries at step ``i``: the accelerator's score series published then
    (its labels but the name), the alert's own."""
    rule = next(r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"] if r.get("alert") == name)
    for s in series:
        if not s["series"].startswith("triscope_mismatch_score{"):
            continue
        if s["values"].split(" ")[i] not in ("_", "stale"):
            body = s["series"][len("triscope_mismatch_score{"):-1]
            labels = dict(kv.split("=", 1) for kv in body.split(","))
            return {k: v.strip('"') for k, v in labels.items()} | {str(k): str(v) for k, v in rule["labels"].items()}
    raise AssertionError(f"no score series published at step {i}")


def test_no_shipped_alert_fires_in_a_45_second_scenario(tmp_path: Path, track: Any) -> None:
    if shutil.which("promtool") is None:
        pytest.fail("promtool is missing (Debian package prometheus; make test installs it)")
    a, b = _span("pcie_saturation")
    series, idx, _steps = _series(a, b)
    assert not any(x["fires"] for x in alert_holds(track, a, b).values())
    tests = [{"eval_time": f"{idx[-1]}s", "alertname": name, "exp_alerts": []} for name in ALERTS]
    _promtool(tmp_path, _rules(tmp_path, for_zero=False), series, tests)
