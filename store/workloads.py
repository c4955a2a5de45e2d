"""The ``workloads`` table: which workload owns each pod, as the remediation engine resolved it.

The agent labels per-accelerator series with ``namespace``, ``pod`` and ``container`` and leaves
``workload`` empty on Kubernetes (it has no API access, docs/workloads.md section 1).  The
remediation engine resolves a pod's owner through ownerReferences (Pod -> ReplicaSet ->
Deployment, StatefulSet, DaemonSet, Job, or the bare ``Pod``) and keeps the answer here, one row
per (namespace, pod): the dashboard groups by it, and the engine reads it back for alerts that
carry only a pod (also after the pod is gone: a pod's name is unique to its owner while it lives).

``kind`` and ``name`` are the owner (``Deployment`` / ``llm-server``); :attr:`WorkloadRow.workload`
is the ``Kind/name`` form the series' ``workload`` label uses.  ``resolved_at`` is when the API
last answered for the pod; rows not refreshed for a while are pruned (:func:`prune_workloads`).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from sqlalchemy import Float, Index, String, Table, delete, select, tuple_
from sqlalchemy.orm import Mapped, mapped_column

from triscope.store.models import Base

if TYPE_CHECKING:
    from triscope.store.api import Store


class Workload(Base):
    """The owning workload of one pod."""

    __tablename__ = "workloads"
    __table_args__ = (Index("ix_workloads_owner", "namespace", "kind", "name"),)

    namespace: Mapped[str] = mapped_column(String(253), primary_key=True)
    pod: Mapped[str] = mapped_column(String(253), primary_key=True)
    kind: Mapped[str] = mapped_column(String(64))
    name: Mapped[str] = mapped_column(String(253))
    resolved_at: Mapped[float] = mapped_column(Float)


_WL = cast(Table, Workload.__table__)


@dataclass(frozen=True, slots=True)
class WorkloadRow:
    namespace: str
    pod: str
    kind: str
    name: str
    resolved_at: float

    @property
    def workload(self) -> str:
        """``Kind/name``, as the series' ``workload`` label writes it (``Deployment/llm-server``)."""
        return f"{self.kind}/{self.name}"


def _row(r: Any) -> WorkloadRow:
    return WorkloadRow(r["namespace"], r["pod"], r["kind"], r["name"], float(r["resolved_at"]))


def upsert_workloads(store: Store, rows: Sequence[WorkloadRow]) -> int:
    """Insert or refresh rows (keyed by namespace and pod) in one transaction; returns how many."""
    if not rows:
        return 0
    values = [{"namespace": r.namespace, "pod": r.pod, "kind": r.kind, "name": r.name,
               "resolved_at": r.resolved_at} for r in rows]
    with store.engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            from sqlalchemy.dialects.postgresql import insert as pg_insert

            stmt: Any = pg_insert(_WL)
        else:
            from sqlalchemy.dialects.sqlite import insert as sqlite_insert

            stmt = sqlite_insert(_WL)
        stmt = stmt.on_conflict_do_update(index_elements=["namespace", "pod"], set_={
            "kind": stmt.excluded.kind, "name": stmt.excluded.name, "resolved_at": stmt.excluded.resolved_at})
        conn.execute(stmt, values)
    return len(values)


def get_workload(store: Store, namespace: str, pod: str) -> WorkloadRow | None:
    """The stored owner of one pod, or None."""
    with store.engine.connect() as conn:
        r = conn.execute(select(_WL).where(_WL.c.namespace == namespace, _WL.c.pod == pod)).mappings().first()
    return None if r is None else _row(r)


def workloads(store: Store, *, namespace: str | None = None, kind: str | None = None, name: str | None = None,
              pods: Iterable[tuple[str, str]] | None = None, limit: int = 100_000) -> list[WorkloadRow]:
    """Stored rows, by namespace and pod: of one ``namespace``, of one owner (``kind``, ``name``), or
    of the given (namespace, pod) pairs."""
    q = select(_WL)
    if namespace is not None:
        q = q.where(_WL.c.namespace == namespace)
    if kind is not None:
        q = q.where(_WL.c.kind == kind)
    if name is not None:
        q = q.where(_WL.c.name == name)
    if pods is not None:
        pairs = sorted(set(pods))
        if not pairs:
            return []
        out: list[WorkloadRow] = []
        for i in range(0, len(pairs), 500):   # bounded IN lists
            chunk = q.where(tuple_(_WL.c.namespace, _WL.c.pod).in_(pairs[i:i + 500]))
            with store.engine.connect() as conn:
                out.extend(_row(r) for r in conn.execute(chunk).mappings().all())
        return sorted(out, key=lambda w: (w.namespace, w.pod))[:limit]
    q = q.order_by(_WL.c.namespace, _WL.c.pod).limit(limit)
    with store.engine.connect() as conn:
        return [_row(r) for r in conn.execute(q).mappings().all()]


def owners(store: Store, pods: Iterable[tuple[str, str]]) -> dict[tuple[str, str], str]:
    """(namespace, pod) -> ``Kind/name`` for the pairs that are stored (the dashboard's lookup)."""
    return {(w.namespace, w.pod): w.workload for w in workloads(store, pods=pods)}


def record_workload(store: Store, *, namespace: str, pod: str, kind: str, name: str,
                    resolved_at: float | None = None) -> None:
    """Insert or refresh one pod's owner (``resolved_at`` defaults to now)."""
    upsert_workloads(store, [WorkloadRow(namespace, pod, kind, name, time.time() if resolved_at is None else resolved_at)])


def resolved_workloads(store: Store, namespace: str | None = None) -> list[WorkloadRow]:
    """Every stored row (of one ``namespace``), by namespace and pod: what the dashboard reads."""
    return workloads(store, namespace=namespace)


def prune_workloads(store: Store, before: float) -> int:
    """Forget pods not resolved since ``before``; returns how many rows went."""
    with store.engine.begin() as conn:
        return int(conn.execute(delete(_WL).where(_WL.c.resolved_at < before)).rowcount or 0)


__all__ = ["Workload", "WorkloadRow", "get_workload", "owners", "prune_workloads", "record_workload",
           "resolved_workloads", "upsert_workloads", "workloads"]
