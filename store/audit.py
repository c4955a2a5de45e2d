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
re-run on restart).  The dashboard reads the audit log through :func:`audit_log`.

Dry-run keeps its own books: a dry-run decision (engine-wide or a rule's ``dry_run``) claims its
delivery key and stamps its target's cooldown under :func:`dry_run_key` (``KEY#dry-run``), and counts
in :class:`DecisionWindow` apart from acting decisions.  A dry-run decision changed nothing, so an
acting decision looks at acting claims, stamps and counts only; a dry-run decision looks at both, so a
dry-run still shows what a live engine would have done.  The audit rows keep the plain keys (their
``dry_run`` column says which decision it was).
"""

from __future__ import annotations

import bisect
import dataclasses
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, cast

from sqlalchemy import (
    JSON,
    Boolean,
    Float,
    Index,
    Integer,
    String,
    Text,
    delete,
    func,
    insert,
    select,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Mapped, MappedAsDataclass, Session, mapped_column

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


class RemediationAudit(MappedAsDataclass, Base, kw_only=True):
    """One row per decision: acted, dry-run, suppressed (``rail`` says by which), failed.

    The columns are spelled here only: the engine writes a decision as one of these (built with
    its keywords, typed: :func:`decide`, :func:`record_decision`), and the reads answer with them
    (``AuditRow`` is this class; ``as_dict()`` for JSON)."""

    __tablename__ = "remediation_audit"
    __table_args__ = (
        Index("ix_remediation_audit_ts", "ts"),
        Index("ix_remediation_audit_rule_ts", "rule", "ts"),
        Index("ix_remediation_audit_target_ts", "target_key", "ts"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True, init=False)
    ts: Mapped[float] = mapped_column(Float)
    engine_id: Mapped[str] = mapped_column(String(128), default="")
    rule: Mapped[str] = mapped_column(String(128))
    trigger_kind: Mapped[str] = mapped_column(String(32))
    trigger: Mapped[str] = mapped_column(Text, default="")
    trigger_key: Mapped[str] = mapped_column(String(512), default="")
    action: Mapped[str] = mapped_column(String(32))
    target: Mapped[str] = mapped_column(String(512), default="")
    target_key: Mapped[str] = mapped_column(String(512), default="")
    node: Mapped[str | None] = mapped_column(String(253), nullable=True, default=None)
    namespace: Mapped[str | None] = mapped_column(String(253), nullable=True, default=None)
    outcome: Mapped[str] = mapped_column(String(16))
    rail: Mapped[str | None] = mapped_column(String(32), nullable=True, default=None)
    reason: Mapped[str] = mapped_column(Text, default="")
    dry_run: Mapped[bool] = mapped_column(Boolean, default=False)
    params: Mapped[dict[str, object]] = mapped_column(JSON, default_factory=dict)
    response: Mapped[dict[str, object]] = mapped_column(JSON, default_factory=dict)
    received_ts: Mapped[float | None] = mapped_column(Float, nullable=True, default=None)
    issued_ts: Mapped[float | None] = mapped_column(Float, nullable=True, default=None)
    finished_ts: Mapped[float | None] = mapped_column(Float, nullable=True, default=None)

    def as_dict(self) -> dict[str, object]:
        return cast("dict[str, object]", dataclasses.asdict(self))


AuditRow = RemediationAudit
"""An audit row, read or about to be written (its ``id`` is set once stored)."""


class RemediationCooldown(MappedAsDataclass, Base, kw_only=True):
    """When each target was last acted on (per target, whatever rule acted)."""

    __tablename__ = "remediation_cooldowns"

    target_key: Mapped[str] = mapped_column(String(512), primary_key=True)
    rule: Mapped[str] = mapped_column(String(128))
    last_ts: Mapped[float] = mapped_column(Float)


class RemediationDelivery(MappedAsDataclass, Base, kw_only=True):
    """Trigger deliveries already handled (alert fingerprint + startsAt, threshold episodes, XID events)."""

    __tablename__ = "remediation_deliveries"
    __table_args__ = (Index("ix_remediation_deliveries_ts", "ts"),)

    key: Mapped[str] = mapped_column(String(512), primary_key=True)
    ts: Mapped[float] = mapped_column(Float)


class RemediationInbox(MappedAsDataclass, Base, kw_only=True):
    """Triggers accepted (the webhook answered 202, or a stored-data episode was queued) but not decided yet."""

    __tablename__ = "remediation_inbox"
    __table_args__ = (Index("ix_remediation_inbox_ts", "ts"),)

    key: Mapped[str] = mapped_column(String(512), primary_key=True)
    ts: Mapped[float] = mapped_column(Float)
    rule: Mapped[str] = mapped_column(String(128))
    kind: Mapped[str] = mapped_column(String(32))
    event: Mapped[dict[str, object]] = mapped_column(JSON, default_factory=dict)


InboxRow = RemediationInbox


class RemediationBreaker(MappedAsDataclass, Base, kw_only=True):
    """The circuit breaker: one row (id 1)."""

    __tablename__ = "remediation_breaker"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    state: Mapped[str] = mapped_column(String(8), default="closed")
    opened_at: Mapped[float | None] = mapped_column(Float, nullable=True, default=None)
    reason: Mapped[str] = mapped_column(Text, default="")
    reset_at: Mapped[float | None] = mapped_column(Float, nullable=True, default=None)
    reset_by: Mapped[str | None] = mapped_column(String(128), nullable=True, default=None)


class RemediationFallback(MappedAsDataclass, Base, kw_only=True):
    """A dependency switched to its fallback mode, until reverted (``FallbackRow``)."""

    __tablename__ = "remediation_fallbacks"
    __table_args__ = (Index("ix_remediation_fallbacks_state", "state"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True, init=False)
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
    clear_since: Mapped[float | None] = mapped_column(Float, nullable=True, default=None)
    state: Mapped[str] = mapped_column(String(16), default="active")
    reverted_at: Mapped[float | None] = mapped_column(Float, nullable=True, default=None)
    revert_reason: Mapped[str] = mapped_column(Text, default="")


FallbackRow = RemediationFallback

def _columns(model: type[RemediationAudit] | type[RemediationFallback]) -> tuple[str, ...]:
    """The columns of a table, from its dataclass (its ``id`` left to the database)."""
    return tuple(f.name for f in cast("tuple[dataclasses.Field[object], ...]", dataclasses.fields(model))
                 if f.name != "id")


_AUDIT_COLUMNS = _columns(RemediationAudit)
_FALLBACK_COLUMNS = _columns(RemediationFallback)
_JSON_DEFAULTS: tuple[tuple[str, object], ...] = (
    ("params", {}), ("response", {}), ("reason", ""), ("trigger", ""), ("trigger_key", ""), ("target", ""),
    ("target_key", ""), ("engine_id", ""), ("dry_run", False))


def _add(conn: Connection, row: RemediationAudit | RemediationFallback) -> int:
    """Insert ``row`` inside the caller's transaction (one statement, no ORM session); its id."""
    if isinstance(row, RemediationAudit):
        values = {c: cast(object, getattr(row, c)) for c in _AUDIT_COLUMNS}
        stmt = insert(RemediationAudit).values(values).returning(RemediationAudit.id)
    else:
        values = {c: cast(object, getattr(row, c)) for c in _FALLBACK_COLUMNS}
        stmt = insert(RemediationFallback).values(values).returning(RemediationFallback.id)
    return cast(int, conn.execute(stmt).scalar_one())


# audit -------------------------------------------------------------------------------------------
def _stamp_cooldown(conn: Connection, target_key: str, rule: str, ts: float) -> None:
    n = conn.execute(update(RemediationCooldown).where(RemediationCooldown.target_key == target_key)
                     .values(rule=rule, last_ts=ts)).rowcount
    if not n:
        conn.execute(insert(RemediationCooldown).values(target_key=target_key, rule=rule, last_ts=ts))


def _remove_inbox(conn: Connection, key: str) -> None:
    conn.execute(delete(RemediationInbox).where(RemediationInbox.key == key[:_KEY_LEN]))


def record_decision(store: Store, row: AuditRow) -> int:
    """Insert one audit row; returns its id."""
    with store.engine.begin() as conn:
        return _add(conn, row)


def import_decisions(store: Store, rows: Sequence[Mapping[str, object]]) -> int:
    """Insert recorded decisions (a trace's, already shifted in time: JSON objects with the audit
    columns); a row already there (same ``ts``, rule, target and outcome) is skipped, so importing
    twice adds nothing.  Returns how many were added."""
    if not rows:
        return 0
    values: list[dict[str, object]] = []
    for r in rows:
        v = {k: x for k, x in r.items() if k in _AUDIT_COLUMNS}
        for k, default in _JSON_DEFAULTS:
            if v.get(k) is None:
                v[k] = default
        values.append(v)
    stamps = [_number(v.get("ts")) for v in values]
    with store.engine.begin() as conn:
        have = {(round(ts, 3), rule, target_key, outcome) for ts, rule, target_key, outcome in conn.execute(
            select(RemediationAudit.ts, RemediationAudit.rule, RemediationAudit.target_key, RemediationAudit.outcome)
            .where(RemediationAudit.ts >= min(stamps) - 1.0, RemediationAudit.ts <= max(stamps) + 1.0))}
        fresh = []
        for ts, v in zip(stamps, values, strict=True):
            key = (round(ts, 3), str(v.get("rule")), str(v.get("target_key")), str(v.get("outcome")))
            if key not in have:
                have.add(key)
                fresh.append(v)
        if fresh:
            conn.execute(insert(RemediationAudit), fresh)
    return len(fresh)


def _texts(values: Iterable[str]) -> list[str]:
    return list(values)


def _number(x: object) -> float:
    return float(x) if isinstance(x, (int, float, str)) else 0.0


def decide(store: Store, key: str, row: AuditRow, *, stamp_cooldown: bool = False,
           open_breaker_reason: str | None = None) -> int | None:
    """One transaction: claim the delivery ``key``, insert the decision's audit ``row``, stamp the
    target's cooldown (a decision that goes ahead), open the breaker (a decision that trips it), and
    remove the key's inbox entry.  Returns the audit id, or None when the key was already claimed
    (nothing written).

    A dry-run decision (``row.dry_run``) claims and stamps dry-run's own keys (:func:`dry_run_key`)
    and is also a duplicate when an acting decision claimed ``key``; an acting decision is not stopped
    by a dry-run claim.
    """
    dry = row.dry_run
    with store.engine.begin() as conn:
        if dry and _is_claimed(conn, key, False):
            return None
        if not _claim(conn, _own_key(key, dry), row.received_ts or row.ts):
            return None
        audit_id = _add(conn, row)
        if stamp_cooldown and row.target_key:
            _stamp_cooldown(conn, _own_key(row.target_key, dry), row.rule, row.ts)
        if open_breaker_reason is not None:
            _open_breaker(conn, open_breaker_reason, row.ts)
        _remove_inbox(conn, key)
    return audit_id


def record_duplicate(store: Store, key: str, row: AuditRow) -> int:
    """The audit row of a delivery already handled, and its inbox entry (a re-delivery's) removed."""
    with store.engine.begin() as conn:
        audit_id = _add(conn, row)
        _remove_inbox(conn, key)
    return audit_id


def update_decision(store: Store, audit_id: int, *, outcome: str, reason: str | None = None,
                    rail: str | None = None, response: dict[str, object] | None = None,
                    issued_ts: float | None = None, finished_ts: float | None = None) -> None:
    """The final state of a decision's row: its ``outcome``, and each other column given (None: as it was)."""
    stmt = update(RemediationAudit).where(RemediationAudit.id == audit_id).values(outcome=outcome)
    if reason is not None:
        stmt = stmt.values(reason=reason)
    if rail is not None:
        stmt = stmt.values(rail=rail)
    if response is not None:
        stmt = stmt.values(response=response)
    if issued_ts is not None:
        stmt = stmt.values(issued_ts=issued_ts)
    if finished_ts is not None:
        stmt = stmt.values(finished_ts=finished_ts)
    with store.engine.begin() as conn:
        conn.execute(stmt)


def audit_log(store: Store, since: float | None = None, until: float | None = None, rule: str | None = None,
              outcome: str | Sequence[str] | None = None, limit: int = 500, action: str | None = None,
              target_key: str | None = None, newest_first: bool = True) -> list[AuditRow]:
    """Audit rows in [since, until], optionally one rule / outcome(s) / action / target, newest first."""
    a = RemediationAudit
    q = select(a)
    if since is not None:
        q = q.where(a.ts >= since)
    if until is not None:
        q = q.where(a.ts <= until)
    if rule is not None:
        q = q.where(a.rule == rule)
    if action is not None:
        q = q.where(a.action == action)
    if target_key is not None:
        q = q.where(a.target_key == target_key)
    if outcome is not None:
        q = q.where(a.outcome.in_(_texts([outcome] if isinstance(outcome, str) else outcome)))
    q = q.order_by(a.ts.desc(), a.id.desc()) if newest_first else q.order_by(a.ts, a.id)
    with Session(store.engine) as s:
        return list(s.scalars(q.limit(limit)).all())


# cooldowns ---------------------------------------------------------------------------------------
def _last_action(conn: Connection, target_key: str, dry_run: bool) -> float | None:
    c = RemediationCooldown
    v = conn.execute(select(func.max(c.last_ts)).where(c.target_key.in_(_seen_keys(target_key, dry_run)))
                     ).scalar_one_or_none()
    return None if v is None else float(v)


def last_action(store: Store, target_key: str, *, dry_run: bool = False) -> float | None:
    """When ``target_key`` was last acted on, as an acting decision sees it (acting stamps only) or,
    with ``dry_run``, as a dry-run decision does (the later of the acting and the dry-run stamp)."""
    with store.engine.connect() as conn:
        return _last_action(conn, target_key, dry_run)


# delivery dedupe ---------------------------------------------------------------------------------
def _insert_ignore(conn: Connection, table: type[RemediationDelivery] | type[RemediationInbox],
                   ) -> postgresql.Insert | sqlite.Insert:
    """``INSERT ... ON CONFLICT (key) DO NOTHING`` in the connection's dialect."""
    if conn.dialect.name == "postgresql":
        return postgresql.insert(table).on_conflict_do_nothing(index_elements=["key"])
    return sqlite.insert(table).on_conflict_do_nothing(index_elements=["key"])


def _claim(conn: Connection, key: str, ts: float) -> bool:
    """Insert the delivery key unless it exists, inside the caller's transaction; True when this call inserted it."""
    # executemany's and psycopg's rowcount are not reliable: ask for the inserted key back
    stmt = _insert_ignore(conn, RemediationDelivery).values(key=key[:_KEY_LEN], ts=ts)
    return conn.execute(stmt.returning(RemediationDelivery.key)).first() is not None


def _is_claimed(conn: Connection, key: str, dry_run: bool) -> bool:
    d = RemediationDelivery
    return conn.execute(select(d.key).where(d.key.in_(_seen_keys(key, dry_run)))).first() is not None


def is_claimed(store: Store, key: str, *, dry_run: bool = False) -> bool:
    """Whether an acting decision handled the delivery ``key`` or, with ``dry_run``, any decision did."""
    with store.engine.connect() as conn:
        return _is_claimed(conn, key, dry_run)


def prune(store: Store, deliveries_before: float) -> int:
    """Forget deliveries (and undecided inbox entries) older than ``deliveries_before``."""
    with store.engine.begin() as conn:
        n = int(conn.execute(delete(RemediationDelivery).where(RemediationDelivery.ts < deliveries_before)).rowcount
                or 0)
        conn.execute(delete(RemediationInbox).where(RemediationInbox.ts < deliveries_before))
    return n


# the inbox: triggers accepted, not decided yet ---------------------------------------------------
def accept_triggers(store: Store, entries: Sequence[InboxRow]) -> int:
    """Store accepted triggers in one transaction, each unless its key is already waiting.  When this
    returns, they survive a crash of the engine."""
    if not entries:
        return 0
    rows = [{"key": e.key[:_KEY_LEN], "ts": e.ts, "rule": e.rule, "kind": e.kind, "event": e.event} for e in entries]
    with store.engine.begin() as conn:
        # executemany's rowcount is not reliable (psycopg): count the keys the INSERT returns
        res = conn.execute(_insert_ignore(conn, RemediationInbox).returning(RemediationInbox.key), rows)
        return len(res.all())


def inbox(store: Store, before: float | None = None, limit: int = 10_000) -> list[InboxRow]:
    """Undecided triggers, oldest first (optionally only those accepted before ``before``)."""
    i = RemediationInbox
    q = select(i).order_by(i.ts, i.key).limit(limit)
    if before is not None:
        q = q.where(i.ts < before)
    with Session(store.engine) as s:
        return list(s.scalars(q).all())


def in_progress(store: Store, limit: int = 10_000) -> list[AuditRow]:
    """Decisions whose action was started and not finished (left so by a crash, or running now), oldest first."""
    return audit_log(store, outcome=IN_PROGRESS, limit=limit, newest_first=False)


# circuit breaker ---------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, slots=True)
class BreakerState:
    state: str
    opened_at: float | None
    reason: str
    reset_at: float | None
    reset_by: str | None

    @property
    def is_open(self) -> bool:
        return self.state == "open"


CLOSED = BreakerState("closed", None, "", None, None)


def _breaker_state(conn: Connection) -> BreakerState:
    b = RemediationBreaker
    r = conn.execute(select(b.state, b.opened_at, b.reason, b.reset_at, b.reset_by).where(b.id == 1)).first()
    if r is None:
        return CLOSED
    state, opened_at, reason, reset_at, reset_by = r
    return BreakerState(state, opened_at, reason or "", reset_at, reset_by)


def breaker_state(store: Store) -> BreakerState:
    with store.engine.connect() as conn:
        return _breaker_state(conn)


def _open_breaker(conn: Connection, reason: str, ts: float) -> None:
    b = RemediationBreaker
    n = conn.execute(update(b).where(b.id == 1, b.state != "open").values(state="open", opened_at=ts, reason=reason)
                     ).rowcount
    if not n and conn.execute(select(b.id).where(b.id == 1)).first() is None:
        conn.execute(insert(b).values(id=1, state="open", opened_at=ts, reason=reason))


def open_breaker(store: Store, reason: str, ts: float | None = None) -> None:
    with store.engine.begin() as conn:
        _open_breaker(conn, reason, time.time() if ts is None else ts)


def reset_breaker(store: Store, by: str = "operator", ts: float | None = None) -> BreakerState:
    """Close the breaker.  Triggers that started before ``reset_at`` are not replayed."""
    ts = time.time() if ts is None else ts
    b = RemediationBreaker
    with store.engine.begin() as conn:
        n = conn.execute(update(b).where(b.id == 1).values(state="closed", reset_at=ts, reset_by=by)).rowcount
        if not n:
            conn.execute(insert(b).values(id=1, state="closed", reason="", reset_at=ts, reset_by=by))
    return breaker_state(store)


# what one decision reads -------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, slots=True)
class DecisionState:
    """What one decision reads of the store, in one go: whether its delivery was claimed, the breaker,
    and its target's last action (cooldown)."""

    claimed: bool
    breaker: BreakerState
    last_action: float | None


def decision_state(store: Store, key: str, target_key: str | None, *, dry_run: bool = False) -> DecisionState:
    """:func:`is_claimed`, :func:`breaker_state` and :func:`last_action` (``target_key`` None: none) on
    one connection."""
    with store.engine.connect() as conn:
        return DecisionState(_is_claimed(conn, key, dry_run), _breaker_state(conn),
                             None if target_key is None else _last_action(conn, target_key, dry_run))


# dependency fallbacks ----------------------------------------------------------------------------
def add_fallback(store: Store, row: FallbackRow) -> int:
    with store.engine.begin() as conn:
        return _add(conn, row)


def active_fallbacks(store: Store, target_key: str | None = None) -> list[FallbackRow]:
    f = RemediationFallback
    q = select(f).where(f.state == "active").order_by(f.id)
    if target_key is not None:
        q = q.where(f.target_key == target_key)
    with Session(store.engine) as s:
        return list(s.scalars(q).all())


def set_fallback_clear(store: Store, fallback_id: int, since: float | None) -> None:
    """When the fallback's trigger was first seen clear (None: it holds again)."""
    f = RemediationFallback
    with store.engine.begin() as conn:
        conn.execute(update(f).where(f.id == fallback_id).values(clear_since=since))


def end_fallback(store: Store, fallback_id: int, state: str, at: float, reason: str) -> None:
    """The fallback is over: ``reverted``, or ``failed`` (never switched)."""
    f = RemediationFallback
    with store.engine.begin() as conn:
        conn.execute(update(f).where(f.id == fallback_id).values(state=state, reverted_at=at, revert_reason=reason))


def set_fallback_value(store: Store, fallback_id: int, value: str) -> None:
    """What the fallback wrote (a knobs file's SHA-256, rendered again after a restart)."""
    f = RemediationFallback
    with store.engine.begin() as conn:
        conn.execute(update(f).where(f.id == fallback_id).values(value=value))


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
        self.acting, self.dry = _Counted(), _Counted()
        a = RemediationAudit
        q = (select(a.rule, a.target_key, a.node, a.ts, a.dry_run)
             .where(a.ts >= now - self.horizon_s, a.outcome.in_(_texts(COUNTED))).order_by(a.ts, a.id))
        with store.engine.connect() as conn:
            for rule, target_key, node, ts, dry_run in conn.execute(q):
                self.add(rule, target_key, node, ts, dry_run=dry_run)

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
