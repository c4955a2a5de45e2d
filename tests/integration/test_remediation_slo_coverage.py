"""The ``slo`` remediation trigger does not fire on a window short of data: the real engine, a
real store, the SLO evaluated by ``triscope.analysis.slo``."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from kube_server import BASE_SETTINGS, policy_text

from triscope.core.samples import Sample, Tick
from triscope.remediation.conditions import evaluate_condition
from triscope.remediation.engine import Engine
from triscope.remediation.policy import load_policy
from triscope.store import audit

SLO_FILE = """version: "prometheus/v1"
service: "svc"
period: 30d
slos:
  - name: "avail"
    objective: 99.0
    sli:
      events:
        error_query: sum(rate(req_total{code="500"}[{{.window}}]))
        total_query: sum(rate(req_total[{{.window}}]))
    alerting:
      name: SvcAvail
      page_alert: {labels: {severity: page}}
      ticket_alert: {labels: {severity: ticket}}
"""

RULES = """  - name: slo-page
    trigger: {slo: avail, status: page}
    action: command
    params: {argv: ["true"]}
  - name: slo-ticket
    trigger: {slo: avail, status: ticket}
    action: command
    params: {argv: ["true"]}
"""


@pytest.fixture
def store(any_store: Any) -> Any:
    """These tests run on SQLite and on PostgreSQL: conftest's ``any_store``."""
    return any_store


def _errors(end: float, minutes: float, step: float = 10.0) -> list[Tick]:
    """Every request failing (100x the 1 % budget) for ``minutes`` up to ``end``."""
    n = int(minutes * 60 / step)
    return [Tick(end - (n - i) * step, [Sample("req_total", 0.0, {"code": "200"}, "counter"),
                                        Sample("req_total", 100.0 * i, {"code": "500"}, "counter")])
            for i in range(n + 1)]


def _engine(store: Any, tmp_path: Path) -> Engine:
    (tmp_path / "slo.yaml").write_text(SLO_FILE)
    (tmp_path / "policy.yaml").write_text(policy_text(RULES, BASE_SETTINGS + "  slo_file: slo.yaml\n"))
    return Engine(store, load_policy(tmp_path / "policy.yaml"), dry_run=True)


def test_three_minutes_of_errors_do_not_trigger(store: Any, tmp_path: Path) -> None:
    now = time.time()
    store.write_ticks("svc-node", _errors(now, 3))
    eng = _engine(store, tmp_path)
    try:
        ticket = next(r for r in eng.policy.rules if r.name == "slo-ticket").trigger
        cond = evaluate_condition(store, ticket, "svc-node", now, 120.0)
        assert not cond.holds
        assert "svc-avail on svc-node: not enough data yet" in cond.detail and "'3d': 'not enough data yet'" in cond.detail
        assert eng.evaluate_triggers(now) == 0
        assert eng.drain()
    finally:
        eng.close()
    assert audit.audit_log(store) == []


def test_a_covered_hour_of_errors_does_trigger(store: Any, tmp_path: Path) -> None:
    """The control: the same errors over 66 minutes cover the 1h page window (not the 3d one): the
    status is page, which both rules accept."""
    now = time.time()
    store.write_ticks("svc-node", _errors(now, 66))
    eng = _engine(store, tmp_path)
    try:
        assert eng.evaluate_triggers(now) == 2
        assert eng.drain()
    finally:
        eng.close()
    rows = audit.audit_log(store)
    assert sorted(r.rule for r in rows) == ["slo-page", "slo-ticket"]
    assert all("svc-avail on svc-node: page" in r.trigger and r.outcome == "dry_run" for r in rows)
