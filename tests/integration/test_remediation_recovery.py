"""What an engine that died at a given point leaves behind, and how the next one picks it up.

The death is injected in-process: ``Crash`` is a ``BaseException`` raised where the process would
have died (nothing in the engine catches it; the store keeps exactly what was committed by then).
A fresh engine on the same store then resumes, as ``triscope remediate`` does when it starts.
``tests/e2e/test_faults_engine.py`` does the same with real SIGKILLs of the engine process.
SQLite and PostgreSQL.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kube_server import BASE_SETTINGS, KubeTestServer, open_store, policy_text, webhook_payload
from sqlalchemy import text

from triscope.remediation import actions as act
from triscope.remediation import dispatch
from triscope.remediation.decisions import IntakeError
from triscope.remediation.engine import Engine
from triscope.remediation.kube.adapter import KubeAdapter
from triscope.remediation.leader import LeaderElector
from triscope.remediation.params import CommandParams, RescheduleParams, RollingRestartParams
from triscope.remediation.reschedule import reschedule
from triscope.remediation.triggers import TriggerEvent
from triscope.store import audit

RESTART = """  - name: restart
    trigger: {alert: Storm}
    action: rolling_restart
    target: {namespace: inference, deployment: {label: deployment}}
    params: {timeout: 10s}
    limits: {cooldown: 0s}
"""
FALLBACK = """  - name: fb
    trigger: {alert: DepSlow}
    action: dependency_fallback
    target: {namespace: inference}
    params: {configmap: deps, key: mode, value: fallback, ttl: 2s, hold: 1h}
"""
MOVE = """  - name: move
    trigger: {alert: GpuBroken}
    action: reschedule
    target: {node: {label: node}, namespace: inference, deployment: llm}
    params: {eviction_timeout: 5s}
"""


class Crash(BaseException):
    """The process dies here."""


@dataclass
class Env:
    srv: KubeTestServer
    store: Any
    engines: list[Engine]

    def engine(self, rules: str = RESTART, settings: str = "", leader: LeaderElector | None = None) -> Engine:
        from triscope.remediation.policy import parse_policy

        e = Engine(self.store, parse_policy(policy_text(rules, settings), "t.yaml"),
                   kube=KubeAdapter.connect(url=self.srv.url), leader=leader)
        self.engines.append(e)
        return e

    def restart_patches(self, dep: str = "web") -> list[str]:
        return [r.body["spec"]["template"]["metadata"]["annotations"]["kubectl.kubernetes.io/restartedAt"]
                for r in self.srv.calls("PATCH", f"/deployments/{dep}") if r.code == 200]


@pytest.fixture
def env(db_url: str) -> Iterator[Env]:
    srv = KubeTestServer(rollout_delay=0.05).start()
    for n in ("node-a", "node-b", "node-c"):
        srv.add_node(n)
    srv.add_deployment("inference", "web", replicas=2)
    st = open_store(db_url)
    e = Env(srv, st, [])
    yield e
    for eng in e.engines:
        eng.close(2)
    st.close()
    srv.stop()


def storm(dep: str = "web") -> dict[str, Any]:
    return {"labels": {"alertname": "Storm", "deployment": dep}, "fingerprint": f"fp-{dep}",
            "startsAt": "2099-01-01T00:00:00Z"}


def dying(real: Callable[[act.ActionContext], act.ActionResult], after: bool) -> Callable[..., act.ActionResult]:
    def run(ctx: act.ActionContext) -> act.ActionResult:
        if after:
            real(ctx)
        raise Crash()
    return run


def non_duplicates(store: Any) -> list[audit.AuditRow]:
    return [r for r in audit.audit_log(store, limit=1000, newest_first=False) if r.rail != "duplicate"]


@pytest.mark.parametrize("after", [False, True], ids=["before-the-patch", "after-the-patch"])
def test_restart_left_in_progress_is_re_run_with_the_same_stamp(env: Env, monkeypatch: pytest.MonkeyPatch,
                                                                 after: bool) -> None:
    monkeypatch.setitem(dispatch.RUNNERS, RollingRestartParams, dying(act.rolling_restart, after))
    first = env.engine()
    first.submit_alerts(webhook_payload([storm()]))
    assert first.drain()
    [row] = audit.audit_log(env.store)
    stamp = row.params["restartedAt"]
    assert row.outcome == "in_progress" and stamp
    assert audit.is_claimed(env.store, row.trigger_key) and audit.inbox(env.store) == []
    assert env.restart_patches() == ([stamp] if after else [])
    monkeypatch.undo()

    second = env.engine()  # the engine starts again on the same store
    assert second.resume() == (1, 0)
    assert second.drain()
    [row] = audit.audit_log(env.store)
    assert row.outcome == "acted" and "re-run after the engine restarted" in row.reason
    assert row.response["rollout"]["complete"] is True
    # one restart, with the value fixed when the decision was taken: no second rollout
    assert env.restart_patches() == [stamp]
    tmpl = env.srv.get("deployments", "inference", "web")["spec"]["template"]["metadata"]["annotations"]
    assert tmpl["kubectl.kubernetes.io/restartedAt"] == stamp
    assert row.response["patch"].get("already") is (True if after else None)
    # Alertmanager delivers it again: a duplicate
    second.submit_alerts(webhook_payload([storm()]))
    assert second.drain()
    assert [(r.outcome, r.rail) for r in audit.audit_log(env.store, newest_first=False)] == [
        ("acted", None), ("suppressed", "duplicate")]
    assert env.restart_patches() == [stamp]


def test_accepted_alert_survives_a_death_right_after_the_202(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    first = env.engine()

    def die(ev: TriggerEvent) -> Any:
        raise Crash()

    monkeypatch.setattr(first, "handle", die)
    assert first.submit_alerts(webhook_payload([storm(), storm("api")])) == (2, 2)  # the webhook answers 202 now
    assert first.drain()
    # nothing decided, nothing claimed, both triggers in the inbox
    assert audit.audit_log(env.store) == []
    assert sorted(e.key.split(":")[2] for e in audit.inbox(env.store)) == ["fp-api", "fp-web"]
    assert not any(audit.is_claimed(env.store, e.key) for e in audit.inbox(env.store))
    env.srv.add_deployment("inference", "api", replicas=2)

    second = env.engine()
    assert second.resume() == (0, 2)
    assert second.drain()
    assert sorted((r.target, r.outcome) for r in non_duplicates(env.store)) == [
        ("deployment inference/api", "acted"), ("deployment inference/web", "acted")]
    assert audit.inbox(env.store) == []
    second.submit_alerts(webhook_payload([storm(), storm("api")]))  # re-delivered: duplicates, nothing acts twice
    assert second.drain()
    assert len(non_duplicates(env.store)) == 2 and len(env.restart_patches()) == 1


def test_claim_and_decision_commit_together(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    key = "alert:r:fp:2099-01-01T00:00:00Z:firing"
    audit.accept_triggers(env.store, [audit.InboxRow(key=key, ts=1.0, rule="r", kind="alert")])
    assert audit.accept_triggers(env.store, [audit.InboxRow(key=key, ts=2.0, rule="r", kind="alert")]) == 0

    def row() -> audit.AuditRow:
        return audit.AuditRow(ts=time.time(), rule="r", trigger_kind="alert", trigger_key=key, action="rolling_restart",
                              outcome="in_progress", target_key="deployment/inference/web")

    real = audit._add
    monkeypatch.setattr(audit, "_add", lambda conn, values: (_ for _ in ()).throw(RuntimeError("died")))
    with pytest.raises(RuntimeError):
        audit.decide(env.store, key, row(), stamp_cooldown=True)
    # the claim went with the failed transaction: a re-delivery still acts
    assert not audit.is_claimed(env.store, key) and [e.key for e in audit.inbox(env.store)] == [key]
    assert audit.last_action(env.store, "deployment/inference/web") is None
    monkeypatch.setattr(audit, "_add", real)
    aid = audit.decide(env.store, key, row(), stamp_cooldown=True)
    assert aid is not None and audit.is_claimed(env.store, key) and audit.inbox(env.store) == []
    assert audit.last_action(env.store, "deployment/inference/web") is not None
    assert audit.decide(env.store, key, row()) is None  # claimed: nothing written
    assert [r.id for r in audit.audit_log(env.store)] == [aid]


def test_fallback_written_before_the_death_is_recognised(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    env.srv.put("configmaps", {"metadata": {"name": "deps", "namespace": "inference"}, "data": {"mode": "normal"}})
    monkeypatch.setattr(audit, "add_fallback", lambda store, row: (_ for _ in ()).throw(Crash()))
    first = env.engine(FALLBACK)
    first.submit_alerts(webhook_payload([{"labels": {"alertname": "DepSlow"}, "fingerprint": "fp1"}]))
    assert first.drain()
    [row] = audit.audit_log(env.store)
    cm = env.srv.get("configmaps", "inference", "deps")
    assert row.outcome == "in_progress" and cm["data"]["mode"] == "fallback" and audit.active_fallbacks(env.store) == []
    ann = cm["metadata"]["annotations"]
    assert ann[act.FALLBACK_DECISION] == str(row.id) and json.loads(ann[act.FALLBACK_PREVIOUS]) == {"mode": "normal"}
    monkeypatch.undo()

    second = env.engine(FALLBACK)
    assert second.resume() == (1, 0)
    assert second.drain()
    [row] = audit.audit_log(env.store)
    assert row.outcome == "acted" and row.response["previous"] == "normal", row.reason
    [fb] = audit.active_fallbacks(env.store)
    assert fb.previous_value == "normal" and fb.switched_at == pytest.approx(row.ts)
    assert len(env.srv.calls("PUT", "/configmaps/deps")) == 1  # the re-run did not write again
    time.sleep(2.1)
    assert second.revert_fallbacks() == 1  # the TTL ran out: the value from before the switch comes back
    cm = env.srv.get("configmaps", "inference", "deps")
    assert cm["data"] == {"mode": "normal"}
    assert not any(a.startswith("triscope.io/fallback") for a in cm["metadata"]["annotations"])


def test_reschedule_finished_before_the_death_is_not_suppressed(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    env.srv.add_deployment("inference", "llm", replicas=2, nodes=["node-a"])
    settings = BASE_SETTINGS + "  node_names: [node-*]\n"
    monkeypatch.setitem(dispatch.RUNNERS, RescheduleParams, dying(reschedule, after=True))
    first = env.engine(MOVE, settings)
    first.submit_alerts(webhook_payload([{"labels": {"alertname": "GpuBroken", "node": "node-a"}}]))
    assert first.drain()
    assert env.srv.get("nodes", "", "node-a")["spec"]["unschedulable"] is True
    monkeypatch.undo()
    second = env.engine(MOVE, settings)
    assert second.resume() == (1, 0)
    assert second.drain()
    [row] = audit.audit_log(env.store)
    assert row.outcome == "acted" and "done before the engine restarted" in row.reason, row.reason
    assert len(env.srv.calls("PUT", "/api/v1/nodes/node-a")) == 1  # cordoned once


def test_command_is_not_re_run(env: Env, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    rules = f"""  - name: touch
    trigger: {{alert: Host}}
    action: command
    params: {{argv: [touch, "{marker}"]}}
"""
    monkeypatch.setitem(dispatch.RUNNERS, CommandParams, dying(act.command, after=False))
    first = env.engine(rules)
    first.submit_alerts(webhook_payload([{"labels": {"alertname": "Host"}}]))
    assert first.drain()
    monkeypatch.undo()
    second = env.engine(rules)
    assert second.resume() == (1, 0)
    assert second.drain()
    [row] = audit.audit_log(env.store)
    assert row.outcome == "failed" and "commands are not re-run" in row.reason
    assert not marker.exists()


def test_store_failure_at_intake_raises_and_queues_nothing(env: Env) -> None:
    eng = env.engine()
    with env.store.engine.begin() as conn:
        conn.execute(text("DROP TABLE remediation_inbox"))
    with pytest.raises(IntakeError, match="cannot store the accepted triggers"):
        eng.submit_alerts(webhook_payload([storm()]))
    assert eng.status()["pending"] == 0 and eng.drain(0.1)
    assert audit.audit_log(env.store) == [] and env.restart_patches() == []


def test_follower_leaves_the_trigger_to_the_leader(env: Env) -> None:
    kube = KubeAdapter.connect(url=env.srv.url)
    other = LeaderElector(kube, "default", "triscope-remediation", "other", 30)
    assert other.step()
    me = LeaderElector(kube, "default", "triscope-remediation", "me", 30)
    eng = env.engine(leader=me)
    eng.leader_step()
    eng.submit_alerts(webhook_payload([storm()]))  # reached it while it was not the leader
    assert eng.drain()
    assert [(r.outcome, r.rail) for r in audit.audit_log(env.store)] == [("suppressed", "leader")]
    assert len(audit.inbox(env.store)) == 1  # not swallowed
    other.release()
    eng.leader_step()  # becomes the leader: decides what waits in the inbox
    assert eng.drain()
    assert [(r.outcome, r.rail) for r in audit.audit_log(env.store, newest_first=False)] == [
        ("suppressed", "leader"), ("acted", None)]
    assert audit.inbox(env.store) == [] and len(env.restart_patches()) == 1


def test_an_outcome_the_store_could_not_take_is_re_run_without_a_restart(env: Env,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The database fails over while an action runs: its outcome cannot be stored, the row stays
    ``in_progress``.  The same engine (no restart) re-runs it from the periodic resume job once it
    is 30 s old: one PATCH, with the decision's own stamp."""
    from sqlalchemy.exc import OperationalError

    real = audit.update_decision
    fails = [1]

    def update_once_failing(*a: Any, **kw: Any) -> Any:
        if fails and fails.pop():
            raise OperationalError("COMMIT", {}, Exception("server closed the connection unexpectedly"))
        return real(*a, **kw)

    monkeypatch.setattr(audit, "update_decision", update_once_failing)
    eng = env.engine()
    eng.submit_alerts(webhook_payload([storm()]))
    assert eng.drain()
    [row] = audit.audit_log(env.store)
    assert row.outcome == "in_progress" and env.restart_patches() == [row.params["restartedAt"]]
    assert eng.resume_inbox() == 0 and eng.drain()
    assert audit.audit_log(env.store)[0].outcome == "in_progress"   # younger than 30 s: left alone
    with env.store.engine.begin() as c:
        c.execute(text("UPDATE remediation_audit SET ts = ts - 40"))
    eng.resume_inbox()
    assert eng.drain()
    [row] = audit.audit_log(env.store)
    assert row.outcome == "acted"
    assert env.restart_patches() == [row.params["restartedAt"]]


def test_a_decision_the_store_failed_under_is_decided_again_not_failed(env: Env,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The database fails over while a trigger is being decided, before its claim (seen in the HA
    failover test: an alert concluded ``failed`` with "server closed the connection unexpectedly", so
    it never acted).  Undecided, it stays in the inbox; the periodic resume decides it: one PATCH."""
    from sqlalchemy.exc import OperationalError

    real = audit.decision_state
    fails = [1]

    def read_once_failing(*a: Any, **kw: Any) -> Any:
        if fails and fails.pop():
            raise OperationalError("SELECT", {}, Exception("server closed the connection unexpectedly"))
        return real(*a, **kw)

    monkeypatch.setattr(audit, "decision_state", read_once_failing)
    eng = env.engine()
    eng.submit_alerts(webhook_payload([storm()]))
    assert eng.drain()
    assert audit.audit_log(env.store) == [] and env.restart_patches() == []      # no "failed" decision
    assert len(audit.inbox(env.store)) == 1
    with env.store.engine.begin() as c:
        c.execute(text("UPDATE remediation_inbox SET ts = ts - 40"))
    assert eng.resume_inbox() == 1 and eng.drain()
    [row] = audit.audit_log(env.store)
    assert row.outcome == "acted" and audit.inbox(env.store) == []
    assert env.restart_patches() == [row.params["restartedAt"]]
