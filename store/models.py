"""SQLAlchemy 2 typed models of the store.

Time series: ``series`` holds one row per distinct (node, metric, label set), with ``slot``, the
series' fixed position among its node's series.  Raw points, by dialect:

* SQLite (one node's local store): ``samples`` holds (series_id, ts, value) with the primary key
  in query order, so a range query on one series is an index range scan.
* PostgreSQL (the fleet store): ``sample_rows`` holds one row per node and tick, (node_id, ts,
  vals), where ``vals[slot + 1]`` is the series' value (NULL when the tick had none), partitioned
  by day (store/partitions.py).  A row per sample would put 200,000 insertion points into the
  primary key of a 1,000-node fleet, whose leaf pages then all split in the same second
  (docs/scaling.md); a row per node has 1,000.  ``samples`` is a view over it with the same
  columns as the SQLite table, so every read is the same SQL on both.  ``rollup_1m`` / ``rollup_1h`` keep min, max, sum,
count, last and the reset-aware counter increase per bucket.  ``events`` holds discrete
happenings with a JSON details column.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import ARRAY, JSON, Float, ForeignKey, Index, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    pass


class Node(Base):
    __tablename__ = "nodes"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(253), unique=True)
    labels: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    first_seen: Mapped[float] = mapped_column(Float)
    last_seen: Mapped[float] = mapped_column(Float)


class Series(Base):
    __tablename__ = "series"
    __table_args__ = (
        UniqueConstraint("node_id", "metric", "labels", name="uq_series_identity"),
        UniqueConstraint("node_id", "slot", name="uq_series_slot"),
        Index("ix_series_metric", "metric"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    node_id: Mapped[int] = mapped_column(ForeignKey("nodes.id", ondelete="CASCADE"))
    metric: Mapped[str] = mapped_column(String(200))
    # canonical JSON of the label set (sorted keys, no spaces): see triscope.core.samples.label_key
    labels: Mapped[str] = mapped_column(Text, default="{}")
    kind: Mapped[str] = mapped_column(String(16), default="gauge")
    # position of the series in its node's sample rows (0-based, never reused within the node)
    slot: Mapped[int] = mapped_column(Integer)


class Sample(Base):
    """One raw point.  Counters hold the cumulative value the source reported.  A table on
    SQLite; on PostgreSQL a view over ``sample_rows`` with these columns."""

    __tablename__ = "samples"
    __table_args__ = {"sqlite_with_rowid": False}

    series_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    ts: Mapped[float] = mapped_column(Float, primary_key=True)
    value: Mapped[float] = mapped_column(Float)


class SampleRow(Base):
    """PostgreSQL only: one node's tick, ``vals[slot + 1]`` per series (partitioned by day)."""

    __tablename__ = "sample_rows"

    node_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    ts: Mapped[float] = mapped_column(Float, primary_key=True)
    vals: Mapped[list[float | None]] = mapped_column(ARRAY(Float))


# which table each dialect does not have (migrations/env.py leaves it out of the comparison)
NOT_ON = {"sqlite": "sample_rows", "postgresql": "samples"}


class _RollupColumns:
    series_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    bucket: Mapped[float] = mapped_column(Float, primary_key=True)  # bucket start, epoch seconds
    min: Mapped[float] = mapped_column(Float)
    max: Mapped[float] = mapped_column(Float)
    sum: Mapped[float] = mapped_column(Float)
    count: Mapped[int] = mapped_column(Integer)
    last: Mapped[float] = mapped_column(Float)
    last_ts: Mapped[float] = mapped_column(Float)
    # counters: reset-aware increase inside the bucket (gauges: 0)
    increase: Mapped[float] = mapped_column(Float, default=0.0)


class Rollup1m(_RollupColumns, Base):
    __tablename__ = "rollup_1m"
    __table_args__ = {"sqlite_with_rowid": False}


class Rollup1h(_RollupColumns, Base):
    __tablename__ = "rollup_1h"
    __table_args__ = {"sqlite_with_rowid": False}


class RollupWatermark(Base):
    """How far each node's raw data has been rolled up, per tier (``1m`` / ``1h``)."""

    __tablename__ = "rollup_watermarks"

    node_id: Mapped[int] = mapped_column(ForeignKey("nodes.id", ondelete="CASCADE"), primary_key=True)
    tier: Mapped[str] = mapped_column(String(8), primary_key=True)
    rolled_until: Mapped[float] = mapped_column(Float)


class Event(Base):
    __tablename__ = "events"
    __table_args__ = (Index("ix_events_node_ts", "node_id", "ts"), Index("ix_events_ts", "ts"))

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    node_id: Mapped[int] = mapped_column(ForeignKey("nodes.id", ondelete="CASCADE"))
    ts: Mapped[float] = mapped_column(Float)
    kind: Mapped[str] = mapped_column(String(64))
    severity: Mapped[str] = mapped_column(String(16), default="info")
    message: Mapped[str] = mapped_column(Text, default="")
    details: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)


class VerdictRun(Base):
    """The verdict history: one row per run of one accelerator's published state (store/verdicts.py)."""

    __tablename__ = "verdict_runs"
    __table_args__ = (Index("ix_verdict_runs_node_end", "node_id", "end_ts"),
                      Index("ix_verdict_runs_node_acc_end", "node_id", "accelerator", "end_ts"))

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    node_id: Mapped[int] = mapped_column(ForeignKey("nodes.id", ondelete="CASCADE"))
    accelerator: Mapped[str] = mapped_column(String(64))       # "gpu=0", "chip=0,npu=1"; "" the node's roll-up
    namespace: Mapped[str] = mapped_column(String(253), default="")
    pod: Mapped[str] = mapped_column(String(253), default="")
    container: Mapped[str] = mapped_column(String(253), default="")
    workload: Mapped[str] = mapped_column(String(253), default="")
    state: Mapped[str] = mapped_column(String(32))
    start_ts: Mapped[float] = mapped_column(Float)
    end_ts: Mapped[float] = mapped_column(Float)
    ticks: Mapped[int] = mapped_column(Integer, default=1)
    score_sum: Mapped[float] = mapped_column(Float, default=0.0)
    score_max: Mapped[float] = mapped_column(Float, default=0.0)
