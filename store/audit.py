"""Remediation tables and their query functions: audit log, cooldowns, delivery dedupe, the trigger
inbox, circuit breaker, dependency fallbacks.

Everything the engine must not forget across a restart lives here: which triggers were accepted
but not decided yet (the inbox: written before the webhook answers 202), which deliveries were
already handled (Alertmanager delivers at least once), when each target was last acted on
(cooldowns), how many actions each rule took (rate limits and the hourly cap are counted from the
audit log), whether the circuit breaker is open, and which dependency fallbacks are active and
must be reverted.

Exactly once across a crash: :func:`decide` claims the delivery key, writes the decision's audit
row (``in_progress`` for an action about to run) and its cooldown stamp, and removes the inbox
entry, all in one transaction.  A crash leaves either nothing (the inbox entry is decided again,
a re-delivery acts) or a decision (a re-delivery is a duplicate; an ``in_progress`` action is
re-run on restart).  The dashboard reads the audit log through :func:`audit_log` and
:func:`action_counts`.

Dry-run keeps its own books: a dry-run decision (engine-wide or a rule's ``dry_run``) claims its
delivery key and stamps its target's cooldown under :func:`dry_run_key` (``KEY#dry-run``), and counts
in :class:`DecisionWindow` apart from acting decisions.  A dry-run decision changed nothing, so an
acting decision looks at acting claims, stamps and counts only; a dry-run decision looks at both, so a
dry-run still shows what a live engine would have done.  The audit rows keep the plain keys (their
``dry_run`` column says which decision it was).
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from sqlalchemy import (
    JSON,
    Boolean,
    Float,
    Index,
    Integer,
    String,
    Table,
    Text,
    delete,
    func,
    insert,
    select,
    update,
)
from sqlalchemy.orm import Mapped, mapped_column

from triscope.store.models import Base

if TYPE_CHECKING:
    from triscope.store.api import Store

# outcomes ----------------------------------------------------------------------------------------
ACTED = "acted"
DRY_RUN = "dry_run"
SUPPRESSED = "suppressed"
FAILED = "failed"
IN_PROGRESS = "in_progress"
OUTCOMES = (ACTED, DRY_RUN, SUPPRESSED, FAILED, IN_PROGRESS)
# decisions that count against cooldowns, rate limits, the hourly cap and the breaker window
# (a dry-run decision's only against other dry-run decisions: see dry_run_key and DecisionWindow)
COUNTED = (ACTED, DRY_RUN, FAILED, IN_PROGRESS)
DRY_RUN_SUFFIX = "#dry-run"
_KEY_LEN = 512   # the key columns' length: longer keys are cut, as the acting keys always were


def dry_run_key(key: str) -> str:
    """Dry-run's own delivery key / cooldown target key for ``key``: ``KEY#dry-run`` (a key too long
    for the column is cut before the suffix, so it never turns into the acting key)."""
    return key[:_KEY_LEN - len(DRY_RUN_SUFFIX)] + DRY_RUN_SUFFIX


def _own_key(key: str, dry_run: bool) -> str:
    """The key a decision claims / stamps: dry-run's own, or the acting one."""
    return dry_run_key(key) if dry_run else key[:_KEY_LEN]


def _seen_keys(key: str, dry_run: bool) -> list[str]:
    """The keys a decision looks at: an acting one the acting key only, a dry-run one both."""
    return [key[:_KEY_LEN], dry_run_key(key)] if dry_run else [key[:_KEY_LEN]]


class RemediationAudit(Base):
    """One row per decision: acted, dry-run, suppressed (``rail`` says by which), failed."""

    __tablename__ = "remediation_audit"
    __table_args__ = (
        Index("ix_remediation_audit_ts", "ts"),
        Index("ix_remediation_audit_rule_ts", "rule", "ts"),
        Index("ix_remediation_audit_target_ts", "target_key", "ts"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    ts: Mapped[float] = mapped_column(Float)
    engine_id: Mapped[str] = mapped_column(String(128), default="")
    rule: Mapped[str] = mapped_column(String(128))
    trigger_kind: Mapped[str] = mapped_column(String(32))
    trigger: Mapped[str] = mapped_column(Text, default="")
    trigger_key: Mapped[str] = mapped_column(String(512), default="")
    action: Mapped[str] = mapped_column(String(32))
    target: Mapped[str] = mapped_column(String(512), default="")
    target_key: Mapped[str] = mapped_column(String(512), default="")
    node: Mapped[str | None] = mapped_column(String(253), nullable=True)
    namespace: Mapped[str | None] = mapped_column(String(253), nullable=True)
    outcome: Mapped[str] = mapped_column(String(16))
    rail: Mapped[str | None] = mapped_column(String(32), nullable=True)
    reason: Mapped[str] = mapped_column(Text, default="")
    dry_run: Mapped[bool] = mapped_column(Boolean, default=False)
    params: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    response: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    received_ts: Mapped[float | None] = mapped_column(Float, nullable=True)
    issued_ts: Mapped[float | None] = mapped_column(Float, nullable=True)
    finished_ts: Mapped[float | None] = mapped_column(Float, nullable=True)


class RemediationCooldown(Base):
    """When each target was last acted on (per target, whatever rule acted)."""

    __tablename__ = "remediation_cooldowns"

    target_key: Mapped[str] = mapped_column(String(512), primary_key=True)
    rule: Mapped[str] = mapped_column(String(128))
    last_ts: Mapped[float] = mapped_column(Float)


class RemediationDelivery(Base):
    """Trigger deliveries already handled (alert fingerprint + startsAt, threshold episodes, XID events)."""

    __tablename__ = "remediation_deliveries"
    __table_args__ = (Index("ix_remediation_deliveries_ts", "ts"),)

    key: Mapped[str] = mapped_column(String(512), primary_key=True)
    ts: Mapped[float] = mapped_column(Float)


class RemediationInbox(Base):
    """Triggers accepted (the webhook answered 202, or a stored-data episode was queued) but not decided yet."""

    __tablename__ = "remediation_inbox"
    __table_args__ = (Index("ix_remediation_inbox_ts", "ts"),)

    key: Mapped[str] = mapped_column(String(512), primary_key=True)
    ts: Mapped[float] = mapped_column(Float)
    rule: Mapped[str] = mapped_column(String(128))
    kind: Mapped[str] = mapped_column(String(32))
    event: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)


class RemediationBreaker(Base):
    """The circuit breaker: one row (id 1)."""

    __tablename__ = "remediation_breaker"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    state: Mapped[str] = mapped_column(String(8), default="closed")
    opened_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    reason: Mapped[str] = mapped_column(Text, default="")
    reset_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    reset_by: Mapped[str | None] = mapped_column(String(128), nullable=True)


class RemediationFallback(Base):
    """A dependency switched to its fallback mode, until reverted."""

    __tablename__ = "remediation_fallbacks"
    __table_args__ = (Index("ix_remediation_fallbacks_state", "state"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    rule: Mapped[str] = mapped_column(String(128))
    target_key: Mapped[str] = mapped_column(String(512))
    namespace: Mapped[str] = mapped_column(String(253))
    configmap: Mapped[str] = mapped_column(String(253))
    key: Mapped[str] = mapped_column(String(253))
    value: Mapped[str] = mapped_column(Text)
    previous_value: Mapped[str | None] = mapped_column(Text, nullable=True)
    trigger_key: Mapped[str] = mapped_column(String(512), default="")
    dry_run: Mapped[bool] = mapped_column(Boolean, default=False)
    switched_at: Mapped[float] = mapped_column(Float)
    expires_at: Mapped[float] = mapped_column(Float)
    hold_s: Mapped[float] = mapped_column(Float, default=0.0)
    clear_since: Mapped[float | None] = mapped_column(Float, nullable=True)
    state: Mapped[str] = mapped_column(String(16), default="active")
    reverted_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    revert_reason: Mapped[str] = mapped_column(Text, default="")


_AUDIT = cast(Table, RemediationAudit.__table__)
_COOL = cast(Table, RemediationCooldown.__table__)
_DELIV = cast(Table, RemediationDelivery.__table__)
_BREAKER = cast(Table, RemediationBreaker.__table__)
_INBOX = cast(Table, RemediationInbox.__table__)
_FALLBACK = cast(Table, RemediationFallback.__table__)


# audit -------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class AuditRow:
    id: int
    ts: float
    engine_id: str
    rule: str
    trigger_kind: str
    trigger: str
    trigger_key: str
    action: str
    target: str
    target_key: str
    node: str | None
    namespace: str | None
    outcome: str
    rail: str | None
    reason: str
    dry_run: bool
    params: dict[str, Any]
    response: dict[str, Any]
    received_ts: float | None
    issued_ts: float | None
    finished_ts: float | None

    def as_dict(self) -> dict[str, Any]:
        return {f: getattr(self, f) for f in self.__slots__}


def _row_defaults(values: dict[str, Any]) -> dict[str, Any]:
    values.setdefault("ts", time.time())
    for k, default in (("params", {}), ("response", {}), ("reason", ""), ("trigger", ""), ("trigger_key", ""),
                       ("target", ""), ("target_key", ""), ("engine_id", ""), ("dry_run", False)):
        if values.get(k) is None:
            values[k] = default
    return values


def _insert_audit(conn: Any, values: dict[str, Any]) -> int:
    return int(conn.execute(insert(_AUDIT).values(**values)).inserted_primary_key[0])


def _stamp_cooldown(conn: Any, target_key: str, rule: str, ts: float) -> None:
    n = conn.execute(update(_COOL).where(_COOL.c.target_key == target_key).values(rule=rule, last_ts=ts)).rowcount
    if not n:
        conn.execute(insert(_COOL).values(target_key=target_key, rule=rule, last_ts=ts))


def record_decision(store: Store, **values: Any) -> int:
    """Insert one audit row (``ts`` defaults to now); returns its id."""
    values = _row_defaults(values)
    with store.engine.begin() as conn:
        return _insert_audit(conn, values)


def import_decisions(store: Store, rows: Sequence[dict[str, Any]]) -> int:
    """Insert recorded decisions (a trace's, already shifted in time); a row already there (same
    ``ts``, rule, target and outcome) is skipped, so importing twice adds nothing.  Returns how
    many were added."""
    if not rows:
        return 0
    lo = min(float(r["ts"]) for r in rows) - 1.0
    hi = max(float(r["ts"]) for r in rows) + 1.0
    with store.engine.begin() as conn:
        have = {(round(float(r.ts), 3), r.rule, r.target_key, r.outcome)
                for r in conn.execute(select(_AUDIT.c.ts, _AUDIT.c.rule, _AUDIT.c.target_key, _AUDIT.c.outcome)
                                      .where(_AUDIT.c.ts >= lo, _AUDIT.c.ts <= hi))}
        added = 0
        for r in rows:
            values = _row_defaults({k: v for k, v in r.items() if k in _AUDIT.c and k != "id"})
            key = (round(float(values["ts"]), 3), values["rule"], values["target_key"], values["outcome"])
            if key in have:
                continue
            have.add(key)
            _insert_audit(conn, values)
            added += 1
    return added


def decide(store: Store, key: str, values: dict[str, Any], *, stamp_cooldown: bool = False,
           open_breaker_reason: str | None = None) -> int | None:
    """One transaction: claim the delivery ``key``, insert the decision's audit row, stamp the target's
    cooldown (a decision that goes ahead), open the breaker (a decision that trips it), and remove the
    key's inbox entry.  Returns the audit id, or None when the key was already claimed (nothing written).

    A dry-run decision (``values["dry_run"]``) claims and stamps dry-run's own keys (:func:`dry_run_key`)
    and is also a duplicate when an acting decision claimed ``key``; an acting decision is not stopped
    by a dry-run claim.
    """
    values = _row_defaults(dict(values))
    dry = bool(values["dry_run"])
    with store.engine.begin() as conn:
        if dry and _is_claimed(conn, key, False):
            return None
        if not _claim(conn, _own_key(key, dry), values.get("received_ts") or values["ts"]):
            return None
        audit_id = _insert_audit(conn, values)
        if stamp_cooldown and values.get("target_key"):
            _stamp_cooldown(conn, _own_key(values["target_key"], dry), values["rule"], values["ts"])
        if open_breaker_reason is not None:
            _open_breaker(conn, open_breaker_reason, values["ts"])
        conn.execute(delete(_INBOX).where(_INBOX.c.key == key[:512]))
    return audit_id


def record_duplicate(store: Store, key: str, values: dict[str, Any]) -> int:
    """The audit row of a delivery already handled, and its inbox entry (a re-delivery's) removed."""
    values = _row_defaults(dict(values))
    with store.engine.begin() as conn:
        audit_id = _insert_audit(conn, values)
        conn.execute(delete(_INBOX).where(_INBOX.c.key == key[:512]))
    return audit_id


def reserve_action(store: Store, target_key: str, **values: Any) -> int:
    """One transaction: the audit row of a decision that goes ahead, and the target's cooldown stamp
    (dry-run's own for a ``dry_run`` decision)."""
    values = _row_defaults({**values, "target_key": target_key})
    with store.engine.begin() as conn:
        audit_id = _insert_audit(conn, values)
        _stamp_cooldown(conn, _own_key(target_key, bool(values["dry_run"])), values["rule"], values["ts"])
    return audit_id


def update_decision(store: Store, audit_id: int, **values: Any) -> None:
    with store.engine.begin() as conn:
        conn.execute(update(_AUDIT).where(_AUDIT.c.id == audit_id).values(**values))


def audit_log(store: Store, since: float | None = None, until: float | None = None, rule: str | None = None,
              outcome: str | Sequence[str] | None = None, limit: int = 500, action: str | None = None,
              target_key: str | None = None, newest_first: bool = True) -> list[AuditRow]:
    """Audit rows in [since, until], optionally one rule / outcome(s) / action / target, newest first."""
    q = select(_AUDIT)
    if since is not None:
        q = q.where(_AUDIT.c.ts >= since)
    if until is not None:
        q = q.where(_AUDIT.c.ts <= until)
    if rule is not None:
        q = q.where(_AUDIT.c.rule == rule)
    if action is not None:
        q = q.where(_AUDIT.c.action == action)
    if target_key is not None:
        q = q.where(_AUDIT.c.target_key == target_key)
    if outcome is not None:
        q = q.where(_AUDIT.c.outcome.in_([outcome] if isinstance(outcome, str) else list(outcome)))
    q = q.order_by(_AUDIT.c.ts.desc() if newest_first else _AUDIT.c.ts, _AUDIT.c.id.desc() if newest_first else _AUDIT.c.id)
    q = q.limit(limit)
    with store.engine.connect() as conn:
        rows = conn.execute(q).mappings().all()
    out = []
    for r in rows:
        d: dict[str, Any] = dict(r)
        d["params"] = dict(d["params"] or {})
        d["response"] = dict(d["response"] or {})
        out.append(AuditRow(**d))
    return out


def action_counts(store: Store, since: float | None = None, until: float | None = None) -> dict[tuple[str, str], int]:
    """Number of decisions per (action, outcome) in the window (dashboard summary)."""
    q = select(_AUDIT.c.action, _AUDIT.c.outcome, func.count()).group_by(_AUDIT.c.action, _AUDIT.c.outcome)
    if since is not None:
        q = q.where(_AUDIT.c.ts >= since)
    if until is not None:
        q = q.where(_AUDIT.c.ts <= until)
    with store.engine.connect() as conn:
        return {(a, o): int(n) for a, o, n in conn.execute(q)}


def count_decisions(store: Store, since: float, *, rule: str | None = None,
                    outcomes: Iterable[str] = COUNTED, dry_run: bool = False) -> int:
    """Decisions that count against an acting decision's limits since ``since`` (one rule or all);
    ``dry_run``: against a dry-run decision's (dry-run decisions too)."""
    q = select(func.count()).select_from(_AUDIT).where(_AUDIT.c.ts >= since,
                                                       _AUDIT.c.outcome.in_(list(outcomes)))
    if rule is not None:
        q = q.where(_AUDIT.c.rule == rule)
    if not dry_run:
        q = q.where(_AUDIT.c.dry_run.is_(False))
    with store.engine.connect() as conn:
        return int(conn.execute(q).scalar_one())


def targets_hit(store: Store, since: float, *, dry_run: bool = False) -> tuple[set[str], set[str]]:
    """Distinct (target keys, nodes) acted on (or failed, in progress) since ``since``, by acting
    decisions; ``dry_run``: by dry-run decisions too."""
    q = (select(_AUDIT.c.target_key, _AUDIT.c.node).distinct()
         .where(_AUDIT.c.ts >= since, _AUDIT.c.outcome.in_(list(COUNTED))))
    if not dry_run:
        q = q.where(_AUDIT.c.dry_run.is_(False))
    with store.engine.connect() as conn:
        rows = conn.execute(q).all()
    return {r[0] for r in rows if r[0]}, {r[1] for r in rows if r[1]}


# cooldowns ---------------------------------------------------------------------------------------
def last_action(store: Store, target_key: str, *, dry_run: bool = False) -> float | None:
    """When ``target_key`` was last acted on, as an acting decision sees it (acting stamps only) or,
    with ``dry_run``, as a dry-run decision does (the later of the acting and the dry-run stamp)."""
    with store.engine.connect() as conn:
        v = conn.execute(select(func.max(_COOL.c.last_ts))
                         .where(_COOL.c.target_key.in_(_seen_keys(target_key, dry_run)))).scalar_one_or_none()
    return None if v is None else float(v)


def set_last_action(store: Store, target_key: str, rule: str, ts: float, *, dry_run: bool = False) -> None:
    """Stamp ``target_key``'s cooldown (dry-run's own stamp with ``dry_run``)."""
    with store.engine.begin() as conn:
        _stamp_cooldown(conn, _own_key(target_key, dry_run), rule, ts)


# delivery dedupe ---------------------------------------------------------------------------------
def _insert_ignore_stmt(dialect: str, table: Any, key_cols: list[str]) -> Any:
    if dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as pg_insert

        return pg_insert(table).on_conflict_do_nothing(index_elements=key_cols)
    from sqlalchemy.dialects.sqlite import insert as sqlite_insert

    return sqlite_insert(table).on_conflict_do_nothing(index_elements=key_cols)


def _claim(conn: Any, key: str, ts: float) -> bool:
    """Insert the delivery key unless it exists, inside the caller's transaction; True when this call inserted it."""
    stmt = _insert_ignore_stmt(conn.dialect.name, _DELIV, ["key"]).values(key=key[:512], ts=ts)
    if conn.dialect.name == "postgresql":
        # psycopg reports rowcount -1 here: ask for the inserted key back instead
        return conn.execute(stmt.returning(_DELIV.c.key)).first() is not None
    return bool(conn.execute(stmt).rowcount)


def _is_claimed(conn: Any, key: str, dry_run: bool) -> bool:
    return conn.execute(select(_DELIV.c.key).where(_DELIV.c.key.in_(_seen_keys(key, dry_run)))).first() is not None


def claim_delivery(store: Store, key: str, ts: float | None = None, *, dry_run: bool = False) -> bool:
    """Record a trigger delivery; False when it was already handled (durable dedupe).  With ``dry_run``
    the claim is dry-run's own, and a delivery an acting decision handled counts as handled too."""
    with store.engine.begin() as conn:
        if dry_run and _is_claimed(conn, key, False):
            return False
        return _claim(conn, _own_key(key, dry_run), time.time() if ts is None else ts)


def is_claimed(store: Store, key: str, *, dry_run: bool = False) -> bool:
    """Whether an acting decision handled the delivery ``key`` or, with ``dry_run``, any decision did."""
    with store.engine.connect() as conn:
        return _is_claimed(conn, key, dry_run)


def release_delivery(store: Store, key: str, *, dry_run: bool = False) -> None:
    """Forget a delivery (it was claimed but not handled, e.g. this engine lost leadership)."""
    with store.engine.begin() as conn:
        conn.execute(delete(_DELIV).where(_DELIV.c.key == _own_key(key, dry_run)))


def prune(store: Store, deliveries_before: float) -> int:
    """Forget deliveries (and undecided inbox entries) older than ``deliveries_before``."""
    with store.engine.begin() as conn:
        n = int(conn.execute(delete(_DELIV).where(_DELIV.c.ts < deliveries_before)).rowcount or 0)
        conn.execute(delete(_INBOX).where(_INBOX.c.ts < deliveries_before))
    return n


# the inbox: triggers accepted, not decided yet ---------------------------------------------------
@dataclass(frozen=True, slots=True)
class InboxRow:
    key: str
    ts: float
    rule: str
    kind: str
    event: dict[str, Any]


def accept_triggers(store: Store, entries: Sequence[dict[str, Any]]) -> int:
    """Store accepted triggers (``key``, ``ts``, ``rule``, ``kind``, ``event``) in one transaction, each
    unless its key is already waiting.  When this returns, they survive a crash of the engine."""
    if not entries:
        return 0
    rows = [{**e, "key": str(e["key"])[:512]} for e in entries]
    with store.engine.begin() as conn:
        # executemany's rowcount is not reliable (psycopg): count the keys the INSERT returns
        res = conn.execute(_insert_ignore_stmt(conn.dialect.name, _INBOX, ["key"]).returning(_INBOX.c.key), rows)
        return len(res.all())


def inbox(store: Store, before: float | None = None, limit: int = 10_000) -> list[InboxRow]:
    """Undecided triggers, oldest first (optionally only those accepted before ``before``)."""
    q = select(_INBOX).order_by(_INBOX.c.ts, _INBOX.c.key).limit(limit)
    if before is not None:
        q = q.where(_INBOX.c.ts < before)
    with store.engine.connect() as conn:
        return [InboxRow(r["key"], r["ts"], r["rule"], r["kind"], dict(r["event"] or {}))
                for r in conn.execute(q).mappings().all()]


def in_progress(store: Store, limit: int = 10_000) -> list[AuditRow]:
    """Decisions whose action was started and not finished (left so by a crash, or running now), oldest first."""
    return audit_log(store, outcome=IN_PROGRESS, limit=limit, newest_first=False)


# circuit breaker ---------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class BreakerState:
    state: str
    opened_at: float | None
    reason: str
    reset_at: float | None
    reset_by: str | None

    @property
    def is_open(self) -> bool:
        return self.state == "open"


def breaker_state(store: Store) -> BreakerState:
    with store.engine.connect() as conn:
        r = conn.execute(select(_BREAKER).where(_BREAKER.c.id == 1)).mappings().first()
    if r is None:
        return BreakerState("closed", None, "", None, None)
    return BreakerState(r["state"], r["opened_at"], r["reason"] or "", r["reset_at"], r["reset_by"])


def _open_breaker(conn: Any, reason: str, ts: float) -> None:
    n = conn.execute(update(_BREAKER).where(_BREAKER.c.id == 1, _BREAKER.c.state != "open")
                     .values(state="open", opened_at=ts, reason=reason)).rowcount
    if not n and conn.execute(select(_BREAKER.c.id).where(_BREAKER.c.id == 1)).first() is None:
        conn.execute(insert(_BREAKER).values(id=1, state="open", opened_at=ts, reason=reason))


def open_breaker(store: Store, reason: str, ts: float | None = None) -> None:
    with store.engine.begin() as conn:
        _open_breaker(conn, reason, time.time() if ts is None else ts)


def reset_breaker(store: Store, by: str = "operator", ts: float | None = None) -> BreakerState:
    """Close the breaker.  Triggers that started before ``reset_at`` are not replayed."""
    ts = time.time() if ts is None else ts
    with store.engine.begin() as conn:
        n = conn.execute(update(_BREAKER).where(_BREAKER.c.id == 1)
                         .values(state="closed", reset_at=ts, reset_by=by)).rowcount
        if not n:
            conn.execute(insert(_BREAKER).values(id=1, state="closed", reason="", reset_at=ts, reset_by=by))
    return breaker_state(store)


# dependency fallbacks ----------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class FallbackRow:
    id: int
    rule: str
    target_key: str
    namespace: str
    configmap: str
    key: str
    value: str
    previous_value: str | None
    trigger_key: str
    dry_run: bool
    switched_at: float
    expires_at: float
    hold_s: float
    clear_since: float | None
    state: str
    reverted_at: float | None
    revert_reason: str


def add_fallback(store: Store, **values: Any) -> int:
    with store.engine.begin() as conn:
        return int(conn.execute(insert(_FALLBACK).values(**values)).inserted_primary_key[0])  # type: ignore[index]


def active_fallbacks(store: Store, target_key: str | None = None) -> list[FallbackRow]:
    q = select(_FALLBACK).where(_FALLBACK.c.state == "active").order_by(_FALLBACK.c.id)
    if target_key is not None:
        q = q.where(_FALLBACK.c.target_key == target_key)
    with store.engine.connect() as conn:
        return [FallbackRow(**r) for r in conn.execute(q).mappings().all()]


def fallbacks(store: Store, limit: int = 200) -> list[FallbackRow]:
    with store.engine.connect() as conn:
        rows = conn.execute(select(_FALLBACK).order_by(_FALLBACK.c.id.desc()).limit(limit)).mappings().all()
    return [FallbackRow(**r) for r in rows]


def update_fallback(store: Store, fallback_id: int, **values: Any) -> None:
    with store.engine.begin() as conn:
        conn.execute(update(_FALLBACK).where(_FALLBACK.c.id == fallback_id).values(**values))


# the counted decisions of the recent past, in memory ---------------------------------------------
class _Counted:
    """One side's (acting or dry-run) counted decisions: their times, per rule, and the last per target / node."""

    def __init__(self) -> None:
        self.all: list[float] = []
        self.by_rule: dict[str, list[float]] = {}
        self.targets: dict[str, float] = {}
        self.nodes: dict[str, float] = {}

    def add(self, rule: str, target_key: str, node: str | None, ts: float) -> None:
        self.all.append(ts)
        self.by_rule.setdefault(rule, []).append(ts)
        if target_key:
            self.targets[target_key] = max(ts, self.targets.get(target_key, 0.0))
        if node:
            self.nodes[node] = max(ts, self.nodes.get(node, 0.0))

    def count(self, since: float, rule: str | None) -> int:
        xs = self.all if rule is None else self.by_rule.get(rule, [])
        return len(xs) - bisect.bisect_left(xs, since)

    def hit(self, since: float) -> tuple[set[str], set[str]]:
        return ({t for t, ts in self.targets.items() if ts >= since}, {n for n, ts in self.nodes.items() if ts >= since})

    def trim(self, cut: float) -> None:
        for xs in [self.all, *self.by_rule.values()]:
            i = bisect.bisect_left(xs, cut)
            if i:
                del xs[:i]
        for d in (self.targets, self.nodes):
            for key in [kk for kk, ts in d.items() if ts < cut]:
                del d[key]


class DecisionWindow:
    """Recent counted decisions (acted, dry-run, failed, in progress), rebuilt from the audit log.

    The audit log in the store is the durable record that rate limits, the hourly cap and the
    breaker window are counted from; this keeps the same counts in memory so a decision does not
    re-scan the log (the scans grew with the log: O(n) per decision).  It is rebuilt from the store
    when the engine starts and whenever this replica becomes the leader.

    Acting and dry-run decisions (the audit row's ``dry_run``) are kept apart: an acting decision
    counts acting decisions only (a dry-run changed nothing), a dry-run decision counts both.
    """

    def __init__(self, horizon_s: float) -> None:
        self.horizon_s = horizon_s
        self.acting = _Counted()
        self.dry = _Counted()

    def load(self, store: Store, now: float) -> None:
        self.__init__(self.horizon_s)  # type: ignore[misc]
        rows = audit_log(store, since=now - self.horizon_s, outcome=COUNTED, limit=10_000_000, newest_first=False)
        for r in rows:
            self.add(r.rule, r.target_key, r.node, r.ts, dry_run=r.dry_run)

    def add(self, rule: str, target_key: str, node: str | None, ts: float, *, dry_run: bool = False) -> None:
        (self.dry if dry_run else self.acting).add(rule, target_key, node, ts)

    def count(self, since: float, rule: str | None = None, *, dry_run: bool = False) -> int:
        """Counted decisions since ``since`` (of ``rule``, or all), as an acting decision sees them, or a
        dry-run one (``dry_run``: dry-run decisions too)."""
        n = self.acting.count(since, rule)
        return n + self.dry.count(since, rule) if dry_run else n

    def hit(self, since: float, *, dry_run: bool = False) -> tuple[set[str], set[str]]:
        """(target keys, nodes) hit since ``since``, as an acting decision sees them, or a dry-run one."""
        targets, nodes = self.acting.hit(since)
        if dry_run:
            dt, dn = self.dry.hit(since)
            targets, nodes = targets | dt, nodes | dn
        return targets, nodes

    def trim(self, now: float) -> None:
        cut = now - self.horizon_s
        self.acting.trim(cut)
        self.dry.trim(cut)
