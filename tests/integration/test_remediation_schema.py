"""The remediation tables: migrations 0002, 0005 and 0006 match the models (alembic check) on SQLite and
PostgreSQL, and the store functions behave the same on both (durable dedupe, inbox, breaker, cooldowns,
the workloads table)."""

from __future__ import annotations

import time
from collections.abc import Iterable

from alembic import command
from kube_server import open_store
from sqlalchemy import delete, func, inspect, select

from triscope.store import audit
from triscope.store import workloads as wstore
from triscope.store.api import Store
from triscope.store.audit import (
    COUNTED,
    AuditRow,
    RemediationAudit,
    RemediationDelivery,
    _add,
    _claim,
    _is_claimed,
    _own_key,
    _stamp_cooldown,
    _texts,
)
from triscope.store.db import alembic_config


def reserve_action(store: Store, row: AuditRow) -> int:
    """One transaction: the audit row of a decision that goes ahead, and its target's cooldown stamp
    (dry-run's own for a ``dry_run`` decision)."""
    with store.engine.begin() as conn:
        audit_id = _add(conn, row)
        _stamp_cooldown(conn, _own_key(row.target_key, row.dry_run), row.rule, row.ts)
    return audit_id



def action_counts(store: Store, since: float | None = None, until: float | None = None) -> dict[tuple[str, str], int]:
    """Number of decisions per (action, outcome) in the window (dashboard summary)."""
    a = RemediationAudit
    q = select(a.action, a.outcome, func.count()).group_by(a.action, a.outcome)
    if since is not None:
        q = q.where(a.ts >= since)
    if until is not None:
        q = q.where(a.ts <= until)
    with store.engine.connect() as conn:
        return {(action, outcome): int(n) for action, outcome, n in conn.execute(q)}



def count_decisions(store: Store, since: float, *, rule: str | None = None,
                    outcomes: Iterable[str] = COUNTED, dry_run: bool = False) -> int:
    """Decisions that count against an acting decision's limits since ``since`` (one rule or all);
    ``dry_run``: against a dry-run decision's (dry-run decisions too)."""
    a = RemediationAudit
    q = select(func.count()).select_from(a).where(a.ts >= since, a.outcome.in_(_texts(outcomes)))
    if rule is not None:
        q = q.where(a.rule == rule)
    if not dry_run:
        q = q.where(a.dry_run.is_(False))
    with store.engine.connect() as conn:
        return int(conn.execute(q).scalar_one())



def targets_hit(store: Store, since: float, *, dry_run: bool = False) -> tuple[set[str], set[str]]:
    """Distinct (target keys, nodes) acted on (or failed, in progress) since ``since``, by acting
    decisions; ``dry_run``: by dry-run decisions too."""
    a = RemediationAudit
    q = select(a.target_key, a.node).distinct().where(a.ts >= since, a.outcome.in_(_texts(COUNTED)))
    if not dry_run:
        q = q.where(a.dry_run.is_(False))
    with store.engine.connect() as conn:
        rows = [(target_key, node) for target_key, node in conn.execute(q)]
    return {t for t, _ in rows if t}, {n for _, n in rows if n}



def set_last_action(store: Store, target_key: str, rule: str, ts: float, *, dry_run: bool = False) -> None:
    """Stamp ``target_key``'s cooldown (dry-run's own stamp with ``dry_run``)."""
    with store.engine.begin() as conn:
        _stamp_cooldown(conn, _own_key(target_key, dry_run), rule, ts)



def claim_delivery(store: Store, key: str, ts: float | None = None, *, dry_run: bool = False) -> bool:
    """Record a trigger delivery; False when it was already handled (durable dedupe).  With ``dry_run``
    the claim is dry-run's own, and a delivery an acting decision handled counts as handled too."""
    with store.engine.begin() as conn:
        if dry_run and _is_claimed(conn, key, False):
            return False
        return _claim(conn, _own_key(key, dry_run), time.time() if ts is None else ts)



def release_delivery(store: Store, key: str, *, dry_run: bool = False) -> None:
    """Forget a delivery (it was claimed but not handled, e.g. this engine lost leadership)."""
    with store.engine.begin() as conn:
        conn.execute(delete(RemediationDelivery).where(RemediationDelivery.key == _own_key(key, dry_run)))


TABLES = {"remediation_audit", "remediation_cooldowns", "remediation_deliveries", "remediation_breaker",
          "remediation_fallbacks", "remediation_inbox", "workloads"}


def test_migration_matches_models_and_store_functions(db_url: str) -> None:
    st = open_store(db_url)
    try:
        assert set(inspect(st.engine).get_table_names()) >= TABLES
        command.check(alembic_config(db_url))  # raises if the models and the migrations differ
        assert claim_delivery(st, "alert:r:fp:t:firing", 1.0)
        assert not claim_delivery(st, "alert:r:fp:t:firing", 2.0)
        assert audit.breaker_state(st).state == "closed"
        audit.open_breaker(st, "3 targets", 10.0)
        audit.open_breaker(st, "again", 11.0)  # stays open with its first reason
        b = audit.breaker_state(st)
        assert b.is_open and b.opened_at == 10.0 and b.reason == "3 targets"
        b = audit.reset_breaker(st, by="sre", ts=20.0)
        assert not b.is_open and b.reset_at == 20.0 and b.reset_by == "sre"
        set_last_action(st, "deployment/a/b", "r", 5.0)
        set_last_action(st, "deployment/a/b", "r", 6.0)
        assert audit.last_action(st, "deployment/a/b") == 6.0
        aid = reserve_action(st, audit.AuditRow(ts=30.0, rule="r", trigger_kind="alert", action="rolling_restart",
                                                      target_key="deployment/a/c", outcome=audit.IN_PROGRESS,
                                                      params={"timeout": 5}))
        audit.update_decision(st, aid, outcome="acted", response={"ok": True}, issued_ts=30.5)
        rows = audit.audit_log(st, since=0)
        assert [(r.outcome, r.response, r.params) for r in rows] == [("acted", {"ok": True}, {"timeout": 5})]
        assert action_counts(st, 0) == {("rolling_restart", "acted"): 1}
        assert audit.last_action(st, "deployment/a/c") == 30.0
        assert audit.prune(st, deliveries_before=1.5) == 1
        assert claim_delivery(st, "alert:r:fp:t:firing", 3.0)
        # the inbox: insert-if-absent, oldest first, pruned with the deliveries
        def entry(key: str = "alert:r:fp2:t:firing", ts: float = 1.0) -> audit.InboxRow:
            return audit.InboxRow(key=key, ts=ts, rule="r", kind="alert", event={"labels": {"a": "b"}})

        assert audit.accept_triggers(st, [entry(), entry("alert:r:fp3:t:firing", 5.0)]) == 2
        assert audit.accept_triggers(st, [entry(ts=9.0)]) == 0
        assert [(e.key, e.ts, e.event) for e in audit.inbox(st)] == [
            ("alert:r:fp2:t:firing", 1.0, {"labels": {"a": "b"}}), ("alert:r:fp3:t:firing", 5.0, {"labels": {"a": "b"}})]
        assert [e.key for e in audit.inbox(st, before=2.0)] == ["alert:r:fp2:t:firing"]
        audit.prune(st, deliveries_before=2.0)
        assert [e.key for e in audit.inbox(st)] == ["alert:r:fp3:t:firing"]
        # workloads: one row per (namespace, pod), refreshed in place, looked up in bulk, pruned by age
        assert wstore.upsert_workloads(st, [wstore.WorkloadRow("inference", "web-7c9-abcde", "Deployment", "web", 1.0),
                                            wstore.WorkloadRow("inference", "db-0", "StatefulSet", "db", 1.0)]) == 2
        wstore.record_workload(st, namespace="inference", pod="web-7c9-abcde", kind="Deployment", name="web2",
                               resolved_at=5.0)
        got = wstore.get_workload(st, "inference", "web-7c9-abcde")
        assert got is not None and (got.workload, got.resolved_at) == ("Deployment/web2", 5.0)
        assert wstore.owners(st, [("inference", "db-0"), ("inference", "nope"), ("other", "db-0")]) == {
            ("inference", "db-0"): "StatefulSet/db"}
        assert [w.pod for w in wstore.workloads(st, kind="StatefulSet")] == ["db-0"]
        assert wstore.prune_workloads(st, 2.0) == 1
        assert [w.pod for w in wstore.resolved_workloads(st)] == ["web-7c9-abcde"]
    finally:
        st.close()


def test_dry_run_claims_cooldowns_and_counts_are_its_own(db_url: str) -> None:
    """A dry-run decision claims and stamps under ``KEY#dry-run``: acting decisions do not see it, dry-run
    decisions see both; the audit rows keep the plain keys."""
    st = open_store(db_url)
    try:
        key, long_key = "metric:hot:n1:gpu0:100", "alert:" + "x" * 600
        assert audit.dry_run_key(key) == key + "#dry-run"
        assert len(audit.dry_run_key(long_key)) == 512 and audit.dry_run_key(long_key) != long_key[:512]
        # deliveries
        assert claim_delivery(st, key, 1.0, dry_run=True)
        assert not claim_delivery(st, key, 1.5, dry_run=True)     # dry-run's own duplicate
        assert audit.is_claimed(st, key, dry_run=True) and not audit.is_claimed(st, key)
        assert claim_delivery(st, key, 2.0)                        # acting ignores the dry-run claim
        assert audit.is_claimed(st, key)
        other = "metric:hot:n2:gpu0:100"
        assert claim_delivery(st, other, 2.0)
        assert audit.is_claimed(st, other, dry_run=True)                 # dry-run sees acting claims
        assert not claim_delivery(st, other, 2.5, dry_run=True)
        assert claim_delivery(st, long_key, 3.0, dry_run=True) and claim_delivery(st, long_key, 3.0)
        release_delivery(st, long_key)   # the acting claim goes, dry-run's stays
        assert not audit.is_claimed(st, long_key) and audit.is_claimed(st, long_key, dry_run=True)
        release_delivery(st, long_key, dry_run=True)
        assert not audit.is_claimed(st, long_key, dry_run=True)
        # cooldowns
        set_last_action(st, "node/n1", "r", 10.0, dry_run=True)
        assert audit.last_action(st, "node/n1") is None and audit.last_action(st, "node/n1", dry_run=True) == 10.0
        set_last_action(st, "node/n1", "r", 8.0)
        assert audit.last_action(st, "node/n1") == 8.0 and audit.last_action(st, "node/n1", dry_run=True) == 10.0
        set_last_action(st, "node/n1", "r", 12.0)
        assert audit.last_action(st, "node/n1", dry_run=True) == 12.0
        # decide: the claim and the cooldown stamp of a dry-run decision are dry-run's own
        def row(ts: float, dry_run: bool = True) -> audit.AuditRow:
            return audit.AuditRow(ts=ts, rule="r", trigger_kind="metric", action="command", target="node n2",
                                  target_key="node/n2", outcome=audit.IN_PROGRESS, dry_run=dry_run)

        k2 = "metric:hot:n2:gpu1:100"
        assert audit.decide(st, k2, row(20.0), stamp_cooldown=True) is not None
        assert audit.decide(st, k2, row(21.0), stamp_cooldown=True) is None
        assert audit.last_action(st, "node/n2") is None and audit.last_action(st, "node/n2", dry_run=True) == 20.0
        live = audit.decide(st, k2, row(22.0, dry_run=False), stamp_cooldown=True)
        assert live is not None and audit.last_action(st, "node/n2") == 22.0
        assert audit.decide(st, k2, row(23.0, dry_run=False)) is None
        k3 = "metric:hot:n2:gpu2:100"
        assert audit.decide(st, k3, row(24.0, dry_run=False)) is not None
        assert audit.decide(st, k3, row(25.0)) is None          # dry-run after acting: a duplicate
        assert {(r.trigger_key, r.target_key) for r in audit.audit_log(st)} == {("", "node/n2")}
        # the counts: an acting decision counts acting decisions only, a dry-run one both
        assert count_decisions(st, 0) == 2 and count_decisions(st, 0, dry_run=True) == 3
        w = audit.DecisionWindow(3600.0)
        w.load(st, 30.0)
        assert w.count(0) == 2 and w.count(0, dry_run=True) == 3
        w.add("r", "node/n3", "n3", 31.0, dry_run=True)
        assert w.hit(0) == ({"node/n2"}, set()) and w.hit(0, dry_run=True) == ({"node/n2", "node/n3"}, {"n3"})
        assert targets_hit(st, 0) == ({"node/n2"}, set())
    finally:
        st.close()
