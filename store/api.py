"""The store's API: batched tick writes, rollups, retention and the read functions.

Writes: ``write_ticks(node, ticks)`` inserts each tick's samples in one transaction (idempotent
per (series, ts): a replayed spool never doubles a point; on PostgreSQL one row per node and tick
in ``sample_rows``, on SQLite one row per sample, see store/models.py) and rolls closed buckets up into
``rollup_1m`` and ``rollup_1h`` with set-based SQL.  Reads: ``query`` serves a range from raw
samples or a rollup tier, whichever keeps the row count small, and downsamples in SQL to at most
``max_points`` (the min and the max of each bucket survive, so spikes do).  Counters come back
as per-second rates with resets handled.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import threading
import time
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import bindparam, text
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import IntegrityError

from triscope import names as _names
from triscope.samples import EventRecord, Sample, label_key, parse_label_key
from triscope.store.db import (
    PG_OPTIONS,
    StoreError,
    check_reachable,
    make_engine,
    normalise_url,
    sqlite_on_connect,
)
from triscope.store.minute_acc import MinuteAccumulator

_log = logging.getLogger("triscope.store")
MAX_EVENT_KIND = 64          # the events.kind column
MAX_EVENT_MESSAGE = 4096     # characters of an event's message kept
MAX_EVENT_DETAILS = 65536    # bytes of an event's details (JSON) kept

TIERS = (("raw", 0.0), ("1m", 60.0), ("1h", 3600.0))


@dataclass(slots=True)
class Tick:
    ts: float
    samples: Sequence[Sample] = ()
    events: Sequence[EventRecord] = ()


@dataclass(frozen=True, slots=True)
class NodeInfo:
    name: str
    labels: dict[str, Any]
    first_seen: float
    last_seen: float


@dataclass(frozen=True, slots=True)
class SeriesInfo:
    id: int
    node: str
    metric: str
    labels: dict[str, str]
    kind: str


@dataclass(slots=True)
class SeriesData:
    info: SeriesInfo
    ts: list[float] = field(default_factory=list)
    values: list[float] = field(default_factory=list)
    tier: str = "raw"


@dataclass(frozen=True, slots=True)
class LatestValue:
    info: SeriesInfo
    ts: float
    value: float


@dataclass(frozen=True, slots=True)
class EventRow:
    id: int
    node: str
    ts: float
    kind: str
    severity: str
    message: str
    details: dict[str, Any]


@dataclass(frozen=True, slots=True)
class RetentionPolicy:
    """How long each tier is kept (seconds).  Defaults: raw 7 d, 1-minute 90 d, hourly 2 years."""

    raw: float = 7 * 86400
    rollup_1m: float = 90 * 86400
    rollup_1h: float = 730 * 86400


class Store:
    """One database.  Thread-safe for one writer and many readers."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.dialect = engine.dialect.name
        self._node_ids: dict[str, int] = {}
        self._series_ids: dict[tuple[int, str, str], int] = {}
        self._watermarks: dict[tuple[int, str], float] = {}
        self._label_keys: dict[tuple[tuple[str, str], ...], str] = {}
        self._lock = threading.RLock()
        self._direct: Any = None     # PostgreSQL: the steady-state tick's own autocommit connection
        self._last_seen: dict[int, float] = {}   # node id -> last_seen this store last wrote
        # 1-minute rollups built in memory from the ticks this store writes (store/minute_acc.py)
        self._acc: dict[int, MinuteAccumulator] = {}
        self._acc_after: dict[int, float] = {}   # node id -> no accumulator until a tick later than this
        self._counters: set[int] = set()          # series ids of kind 'counter'
        self._slots: dict[int, int] = {}          # series id -> slot (its position in the node's sample rows)
        self._nslots: dict[int, int] = {}         # node id -> slots in use (the length of a full sample row)
        # node id -> (metric, label pairs as given) -> series id: the steady-state tick's lookup
        self._raw_sids: dict[int, dict[tuple[str, tuple[tuple[str, str], ...]], int]] = {}
        # ingest bounds (triscope/names.py): label values cut to MAX_LABEL_VALUE, samples whose metric
        # name is longer than the column dropped; each counted, and logged once per label set / metric
        self.truncated_label_values = 0
        self.dropped_samples = 0

    # ------------------------------------------------------------------ lifecycle
    @classmethod
    def open(cls, url: str | None = None, *, check: bool = True) -> Store:
        engine = make_engine(url)
        if check:
            check_reachable(engine)
        return cls(engine)

    @property
    def url(self) -> str:
        return self.engine.url.render_as_string(hide_password=False)

    def upgrade(self) -> None:
        from triscope.store.db import upgrade

        upgrade(self.url)

    def is_migrated(self) -> bool:
        from sqlalchemy import inspect

        return inspect(self.engine).has_table("samples")

    def require_schema(self) -> None:
        if not self.is_migrated():
            raise StoreError(f"database {self.engine.url.render_as_string(hide_password=True)} has no triscope "
                             "schema: run 'triscope db upgrade --db URL'")

    def close(self) -> None:
        with self._lock:
            self._close_direct()
        self.engine.dispose()

    # ------------------------------------------------------------------ ids
    def _node_id(self, conn: Connection, node: str, ts: float) -> int:
        nid = self._node_ids.get(node)
        if nid is not None:
            return nid
        row = conn.execute(text("SELECT id FROM nodes WHERE name = :n"), {"n": node}).first()
        if row is None:
            problem = _names.node_name_problem(node)
            if problem:
                raise StoreError(problem)
            conn.execute(text(self._insert_ignore("nodes", "(name, labels, first_seen, last_seen)",
                                                  "(:n, :l, :t, :t)", "(name)")),
                         {"n": node, "l": "{}", "t": ts})
            row = conn.execute(text("SELECT id FROM nodes WHERE name = :n"), {"n": node}).first()
        assert row is not None
        self._node_ids[node] = int(row[0])
        return int(row[0])

    def _insert_ignore(self, table: str, cols: str, values: str, conflict: str) -> str:
        return f"INSERT INTO {table} {cols} VALUES {values} ON CONFLICT {conflict} DO NOTHING"

    def _series_id_map(self, conn: Connection, node_id: int, keys: Iterable[tuple[str, str, str]]) -> dict[tuple[str, str], int]:
        """(metric, labelkey) -> series id for one node, creating the missing series."""
        keys = list(keys)
        missing = [(m, lk, k) for m, lk, k in keys if (node_id, m, lk) not in self._series_ids]
        if missing:
            self._load_series(conn, node_id)
        for attempt in range(6):
            missing = [(m, lk, k) for m, lk, k in missing if (node_id, m, lk) not in self._series_ids]
            if not missing:
                break
            if attempt == 5:
                raise StoreError(f"could not create {len(missing)} series of node id {node_id}: their slots "
                                 "kept being taken by another writer")
            # new series take the next free slots of the node; a slot or identity another writer took
            # in the meantime is skipped (DO NOTHING) and the series tries again with the next ones
            first = int(conn.execute(text("SELECT coalesce(max(slot), -1) + 1 FROM series WHERE node_id = :n"),
                                     {"n": node_id}).scalar_one())
            conn.execute(
                text("INSERT INTO series (node_id, metric, labels, kind, slot) VALUES (:n, :m, :l, :k, :s) "
                     "ON CONFLICT DO NOTHING"),
                [{"n": node_id, "m": m, "l": lk, "k": k, "s": first + i} for i, (m, lk, k) in enumerate(missing)],
            )
            self._load_series(conn, node_id)
        return {(m, lk): self._series_ids[(node_id, m, lk)] for m, lk, _ in keys}

    def _load_series(self, conn: Connection, node_id: int) -> None:
        rows = conn.execute(text("SELECT id, metric, labels, kind, slot FROM series WHERE node_id = :n"), {"n": node_id})
        width = 0
        for sid, metric, lk, kind, slot in rows:
            self._series_ids[(node_id, metric, lk)] = int(sid)
            self._slots[int(sid)] = int(slot)
            width = max(width, int(slot) + 1)
            if kind == "counter":
                self._counters.add(int(sid))
        self._nslots[node_id] = width

    # ------------------------------------------------------------------ writes
    def write_ticks(self, node: str, ticks: Sequence[Tick], *, rollup: bool = True) -> int:
        """Write ticks for one node in one transaction.  Returns the number of samples written."""
        if not ticks:
            return 0
        with self._lock:
            try:
                if self.dialect == "sqlite":
                    n = self._write_direct_sqlite(node, ticks, rollup)
                    if n is not None:
                        return n
                if self.dialect == "postgresql":
                    n = self._write_direct(node, ticks, rollup)
                    if n is not None:
                        return n
                    try:
                        return self._write_ticks(node, ticks, rollup, fast=True)
                    except Exception as e:  # noqa: BLE001
                        if not _is_unique_violation(e):
                            raise
                        # some points are stored already (a replay): take the idempotent path, with
                        # no id cached from the transaction that just rolled back (a new series)
                        self._forget(node)
                return self._write_ticks(node, ticks, rollup)
            except Exception:
                # ids may have been cached from a transaction that rolled back
                self._node_ids.pop(node, None)
                self._series_ids.clear()
                self._slots.clear()
                self._nslots.clear()
                self._raw_sids.clear()
                self._watermarks.clear()
                self._last_seen.clear()
                self._acc.clear()
                raise

    def _forget(self, node: str) -> None:
        """Drop the node's cached ids: some may come from a transaction that rolled back."""
        nid = self._node_ids.pop(node, None)
        if nid is None:
            return
        for key in [k for k in self._series_ids if k[0] == nid]:
            self._slots.pop(self._series_ids.pop(key), None)
        self._nslots.pop(nid, None)
        self._raw_sids.pop(nid, None)

    def _write_ticks(self, node: str, ticks: Sequence[Tick], rollup: bool, fast: bool = False) -> int:
        t_min = min(t.ts for t in ticks)
        t_max = max(t.ts for t in ticks)
        with self.engine.begin() as conn:
            nid = self._node_id(conn, node, t_min)
            pending, keys = self._prepare(ticks)
            sids = self._series_id_map(conn, nid, ((m, lk, k) for (m, lk), k in keys.items()))
            self._remember_raw(nid, sids, pending)
            # one point per (series, ts): two sources reporting the same series in a tick, last wins
            dedup = {
                (sids[(s.name, lk)], ts): float(s.value)
                for ts, s, lk in pending
                if s.value == s.value and not math.isinf(s.value)
            }
            rows = [(sid, ts, v) for (sid, ts), v in dedup.items()]
            inserted = self._insert_samples(conn, nid, rows, fast)
            if inserted == len(rows):
                self._feed(nid, rows)
            else:   # some points were stored already (a replay): the accumulator cannot tell which
                self._drop_acc(nid, t_max)
            events = [(t.ts, e) for t in ticks for e in t.events]
            if events:
                self._insert_events(conn, nid, events)
            conn.execute(text("UPDATE nodes SET last_seen = :t WHERE id = :n AND last_seen < :t"), {"t": t_max, "n": nid})
            self._last_seen[nid] = max(t_max, self._last_seen.get(nid, -math.inf))
            if rollup:
                self._rollup_node(conn, nid, t_min, t_max, delay=rollup_delay(node))
        return len(rows)

    def _prepare(self, ticks: Sequence[Tick]) -> tuple[list[tuple[float, Sample, str]], dict[tuple[str, str], str]]:
        """(ts, sample, labelkey) of every sample, and (metric, labelkey) -> kind of each series."""
        # label sets repeat every tick: canonicalise each distinct one once
        lk_cache = self._label_keys
        pending: list[tuple[float, Sample, str]] = []
        keys: dict[tuple[str, str], str] = {}
        for t in ticks:
            for s in t.samples:
                if len(s.name) > _names.MAX_METRIC_NAME:
                    self._drop_sample(s)
                    continue
                tk = tuple(sorted(s.labels.items())) if s.labels else ()
                lk = lk_cache.get(tk)
                if lk is None:
                    lk = self._label_key(s)
                    if len(lk_cache) < 200_000:
                        lk_cache[tk] = lk
                if (s.name, lk) not in keys:
                    keys[(s.name, lk)] = s.kind
                pending.append((t.ts, s, lk))
        return pending, keys

    def _label_key(self, s: Sample) -> str:
        """The series' label key, over-long label values (and names) bounded: counted and logged
        rather than failing the tick (triscope/names.py says how they are cut)."""
        if not s.labels or all(len(str(v)) <= _names.MAX_LABEL_VALUE and len(str(k)) <= _names.MAX_LABEL_NAME
                               for k, v in s.labels.items()):
            return label_key(s.labels)
        labels, cut = _names.bound_labels(s.labels)
        self.truncated_label_values += cut
        _log.warning("%s: %d label value(s) longer than %d characters cut (%s)", s.name, cut, _names.MAX_LABEL_VALUE,
                     ", ".join(k for k, v in s.labels.items() if len(str(v)) > _names.MAX_LABEL_VALUE)[:200])
        return label_key(labels)

    def _drop_sample(self, s: Sample) -> None:
        self.dropped_samples += 1
        if self.dropped_samples in (1, 10, 100, 1000) or self.dropped_samples % 10000 == 0:
            _log.warning("dropped %d sample(s) whose metric name is longer than %d characters (%s)",
                         self.dropped_samples, _names.MAX_METRIC_NAME, _names.shorten(s.name, 80))

    def _direct_points(self, node: str, ticks: Sequence[Tick], rollup: bool
                       ) -> tuple[int, float, dict[int, float] | None, list[tuple[int, float, float]] | None] | None:
        """The steady state, where a write needs no ORM: every id is cached, no events, no bucket
        to roll.  Returns (node id, newest ts, {series id: value} of a single tick or None, rows
        of several ticks or None), or None when the write needs the general path."""
        nid = self._node_ids.get(node)
        if nid is None or any(t.events for t in ticks):
            return None
        t_min = min(t.ts for t in ticks)
        t_max = max(t.ts for t in ticks)
        if rollup:
            wm1 = self._watermarks.get((nid, "1m"))
            wmh = self._watermarks.get((nid, "1h"))
            if wm1 is None or wmh is None or t_min < wm1 or t_min < wmh:
                return None
            if math.floor((t_max - rollup_delay(node)) / 60.0) * 60.0 > wm1:
                return None
            if min(math.floor(t_max / 3600.0), math.floor(wm1 / 3600.0)) * 3600.0 > wmh:
                return None
        if len(ticks) == 1:
            points = self._tick_points(nid, ticks[0])
            return (nid, t_max, points, None) if points else None
        rows = self._cached_rows(nid, ticks)
        return (nid, t_max, None, rows) if rows else None

    def _feed_direct(self, nid: int, t_max: float, points: dict[int, float] | None,
                     rows: list[tuple[int, float, float]] | None) -> None:
        if points is not None:
            acc = self._acc.get(nid)
            if acc is not None and t_max > acc.last_ts:
                acc.add(t_max, points.items(), self._counters)
            else:
                self._feed(nid, [(sid, t_max, v) for sid, v in points.items()])
        elif rows is not None:
            self._feed(nid, rows)

    def _write_direct_sqlite(self, node: str, ticks: Sequence[Tick], rollup: bool) -> int | None:
        """The steady-state tick on SQLite: one transaction on the store's own sqlite3
        connection, no ORM (an agent writes one tick a second and must cost next to nothing)."""
        got = self._direct_points(node, ticks, rollup)
        if got is None:
            return None
        nid, t_max, points, rows = got
        if rows is None:
            assert points is not None
            rows = [(sid, t_max, v) for sid, v in points.items()]
        rows.sort()
        move = t_max >= self._last_seen.get(nid, -math.inf) + LAST_SEEN_STEP_S
        con = self._sqlite_conn()
        if con is None:
            return None
        con.execute("BEGIN IMMEDIATE")
        try:
            cur = con.executemany("INSERT OR IGNORE INTO samples (series_id, ts, value) VALUES (?, ?, ?)", rows)
            new = cur.rowcount
            if move:
                con.execute("UPDATE nodes SET last_seen = ? WHERE id = ? AND last_seen < ?", (t_max, nid, t_max))
            con.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(Exception):
                con.execute("ROLLBACK")
            raise
        if move:
            self._last_seen[nid] = t_max
        if new == len(rows):
            self._feed_direct(nid, t_max, points, None if points is not None else rows)
        else:   # some points were stored already (a replay)
            self._drop_acc(nid, t_max)
        return len(rows)

    def _sqlite_conn(self) -> Any:
        if self._direct is None:
            import sqlite3

            path = self.engine.url.database
            if not path or path == ":memory:" or path.startswith("file:"):
                return None
            con = sqlite3.connect(path, timeout=10, isolation_level=None, check_same_thread=False)
            sqlite_on_connect(con, None)
            self._direct = con
        return self._direct

    def _write_direct(self, node: str, ticks: Sequence[Tick], rollup: bool) -> int | None:
        """The steady-state tick on PostgreSQL in one statement and one round trip.  A
        data-modifying CTE moves the node's last_seen and the tick goes in as one row of
        ``sample_rows``, on a connection of its own in autocommit mode (one statement is one
        transaction: no BEGIN, no COMMIT, no pool checkout ping).  Returns None when the tick
        needs the general path (which then writes it)."""
        got = self._direct_points(node, ticks, rollup)
        if got is None:
            return None
        nid, t_max, points, rows = got
        params: dict[str, Any]
        if points is not None:
            params = {"ts": repr(t_max), "v": self._row_literal(nid, points)}
            n = len(points)
        else:
            assert rows is not None
            by_ts = _by_ts(rows)
            order = sorted(by_ts)
            params = {"ts": "{" + ",".join(map(repr, order)) + "}",
                      "v": "{" + ",".join(['"' + self._row_literal(nid, by_ts[t]) + '"' for t in order]) + "}"}
            n = len(rows)
        # last_seen moves in steps of LAST_SEEN_STEP_S on this path: one node row updated 1,000
        # times a second across a fleet is a hot row that bloats between vacuums
        move = t_max >= self._last_seen.get(nid, -math.inf) + LAST_SEEN_STEP_S
        params["t"], params["n"] = t_max, nid
        try:
            conn = self._direct_conn()
            conn.execute(_DIRECT_SQL[move, points is not None], params)
        except Exception as e:  # noqa: BLE001
            if _is_unique_violation(e):
                # some points are stored already (a replay): nothing was written, take the idempotent path
                return self._write_ticks(node, ticks, rollup)
            # a broken connection (a restarted server) or anything else: drop it, the general path
            # (pool with a liveness check) writes the tick or raises
            self._close_direct()
            return None
        if move:
            self._last_seen[nid] = t_max
        self._feed_direct(nid, t_max, points, rows)
        return n

    def _row_literal(self, nid: int, points: Mapping[int, float]) -> str:
        """The node's sample row for these points as a float8[] literal: one element per slot,
        NULL where the tick has no value.  repr() of a float round-trips exactly, and joining
        strings costs a fraction of dumping 200 Python numbers one by one."""
        slots = self._slots
        arr = ["NULL"] * self._nslots[nid]
        for sid, v in points.items():
            arr[slots[sid]] = repr(v)
        return "{" + ",".join(arr) + "}"

    def _tick_points(self, nid: int, tick: Tick) -> dict[int, float] | None:
        """series id -> value of one tick's finite samples (the last wins), when every series id is
        cached; None otherwise.  The cache is keyed by the metric and the label pairs in the order
        the collector gave them, so the steady state never sorts or serialises a label set."""
        cache = self._raw_sids.get(nid)
        if cache is None:
            return None
        points: dict[int, float] = {}
        for s in tick.samples:
            lb = s.labels
            sid = cache.get((s.name, tuple(lb.items()) if lb else ()))
            if sid is None:
                return None
            v = float(s.value)
            if v == v and v != _INF and v != -_INF:
                points[sid] = v
        return points

    def _cached_rows(self, nid: int, ticks: Sequence[Tick]) -> list[tuple[int, float, float]] | None:
        rows: dict[tuple[int, float], float] = {}
        for t in ticks:
            points = self._tick_points(nid, t)
            if points is None:
                return None
            for sid, v in points.items():
                rows[(sid, t.ts)] = v
        return [(sid, ts, v) for (sid, ts), v in rows.items()]

    def _remember_raw(self, nid: int, sids: Mapping[tuple[str, str], int],
                      pending: list[tuple[float, Sample, str]]) -> None:
        cache = self._raw_sids.setdefault(nid, {})
        if len(cache) > 50_000:   # label sets that never repeat (a collector bug): start over
            cache.clear()
        for _, smp, lk in pending:
            lb = smp.labels
            cache[(smp.name, tuple(lb.items()) if lb else ())] = sids[(smp.name, lk)]

    def _direct_conn(self) -> Any:
        if self._direct is None:
            import psycopg

            url = self.engine.url.set(drivername="postgresql")
            self._direct = psycopg.connect(url.render_as_string(hide_password=False), autocommit=True,
                                           connect_timeout=5, options=PG_OPTIONS)
        return self._direct

    def _close_direct(self) -> None:
        conn, self._direct = self._direct, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()

    def _insert_samples(self, conn: Connection, nid: int, rows: list[tuple[int, float, float]],
                        fast: bool = False) -> int:
        """Insert the (series id, ts, value) points of node ``nid`` that are not stored yet (a
        point stored already keeps its value); returns how many points were new."""
        if not rows:
            return 0
        raw = conn.connection.dbapi_connection
        assert raw is not None
        cur = raw.cursor()
        try:
            if self.dialect == "sqlite":
                cur.executemany("INSERT OR IGNORE INTO samples (series_id, ts, value) VALUES (?, ?, ?)", rows)
                return int(cur.rowcount)
            by_ts = _by_ts(rows)
            if fast:
                # the common case: nothing of this batch is stored yet, COPY straight into the table
                with cur.copy("COPY sample_rows (node_id, ts, vals) FROM STDIN") as cp:
                    for ts in sorted(by_ts):
                        cp.write_row((nid, ts, self._row_literal(nid, by_ts[ts])))
                return len(rows)
            # a replay (spool drain, re-import): merge into the rows stored already.  The count of new
            # points comes from the rows as read here; the upsert merges element by element again in
            # SQL, so a row another writer inserted or filled in the meantime keeps its points too
            cur.execute("SELECT ts, vals FROM sample_rows WHERE node_id = %s AND ts = ANY(%s::float8[]) FOR UPDATE",
                        (nid, "{" + ",".join(map(repr, by_ts)) + "}"))
            stored = {float(ts): list(vals) for ts, vals in cur.fetchall()}
            slots = self._slots
            new = 0
            upserts: list[tuple[int, float, str]] = []
            for ts, points in by_ts.items():
                arr = stored.get(ts, [])
                fresh = False
                for sid, v in points.items():
                    k = slots[sid]
                    if k < len(arr) and arr[k] is not None:
                        continue
                    arr.extend([None] * (k + 1 - len(arr)))
                    arr[k] = v
                    new += 1
                    fresh = True
                if fresh:
                    upserts.append((nid, ts, "{" + ",".join(["NULL" if v is None else repr(float(v)) for v in arr]) + "}"))
            if upserts:
                upserts.sort()   # rows locked in one order by every writer: no deadlock between two replays
                cur.executemany("INSERT INTO sample_rows (node_id, ts, vals) VALUES (%s, %s, %s::float8[]) "
                                "ON CONFLICT (node_id, ts) DO UPDATE SET vals = ARRAY(SELECT coalesce(o, n) FROM "
                                "unnest(sample_rows.vals, excluded.vals) WITH ORDINALITY AS u(o, n, i) ORDER BY i)",
                                upserts)
            return new
        finally:
            cur.close()

    # ------------------------------------------------------------------ in-memory 1-minute rollups
    def _feed(self, nid: int, rows: list[tuple[int, float, float]]) -> None:
        """Newly stored (series id, ts, value) rows of one node into its accumulator."""
        if not rows:
            return
        by_ts = _by_ts(rows)
        t_lo, t_hi = min(by_ts), max(by_ts)
        acc = self._acc.get(nid)
        if acc is None:
            if t_lo <= self._acc_after.get(nid, -math.inf):
                self._acc_after[nid] = max(t_hi, self._acc_after[nid])
                return
            acc = self._acc[nid] = MinuteAccumulator(t_lo)
        elif t_lo <= acc.last_ts:   # out of order: rolled from the raw samples in SQL from now on
            self._drop_acc(nid, t_hi)
            return
        counters = self._counters
        for ts in sorted(by_ts):
            acc.add(ts, by_ts[ts].items(), counters)

    def _drop_acc(self, nid: int, t: float) -> None:
        acc = self._acc.pop(nid, None)
        last = acc.last_ts if acc is not None else -math.inf
        self._acc_after[nid] = max(t, last, self._acc_after.get(nid, -math.inf))

    def _roll_1m(self, conn: Connection, nid: int, lo: float, hi: float) -> None:
        """Roll the 1-minute buckets in [lo, hi): from the accumulator where it vouches for them,
        from the raw samples in SQL before that."""
        acc = self._acc.get(nid)
        if acc is None:
            self._roll(conn, nid, "1m", 60.0, "samples", lo, hi)
            return
        start, rows = acc.take(lo, hi)
        if start > lo:
            self._roll(conn, nid, "1m", 60.0, "samples", lo, start)
        if rows:
            self._upsert_rollup(conn, "rollup_1m", rows)

    def _upsert_rollup(self, conn: Connection, table: str, rows: list[tuple[int, float, list[float]]]) -> None:
        update = _ROLLUP_UPSERT
        raw = conn.connection.dbapi_connection
        assert raw is not None
        cur = raw.cursor()
        try:
            if self.dialect == "sqlite":
                cur.executemany(
                    f"INSERT INTO {table} (series_id, bucket, min, max, sum, count, last, last_ts, increase) "
                    f"VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) {update}",
                    [(sid, b, r[0], r[1], r[2], int(r[3]), r[4], r[5], r[6]) for sid, b, r in rows])
            else:
                cols = list(zip(*[(sid, b, r[0], r[1], r[2], int(r[3]), r[4], r[5], r[6]) for sid, b, r in rows],
                                strict=True))
                arrays = ["{" + ",".join(map(repr, c)) + "}" for c in cols]
                cur.execute(
                    f"INSERT INTO {table} (series_id, bucket, min, max, sum, count, last, last_ts, increase) "
                    "SELECT * FROM unnest(%s::integer[], %s::float8[], %s::float8[], %s::float8[], %s::float8[], "
                    f"%s::integer[], %s::float8[], %s::float8[], %s::float8[]) {update}", arrays)
        finally:
            cur.close()

    def _insert_events(self, conn: Connection, node_id: int, events: list[tuple[float, EventRecord]]) -> None:
        conn.execute(
            text("INSERT INTO events (node_id, ts, kind, severity, message, details) VALUES (:n, :t, :k, :s, :m, :d)"),
            [{"n": node_id, "t": e.ts or ts, "k": str(e.kind)[:MAX_EVENT_KIND], "s": str(e.severity)[:16],
              "m": _names.shorten(e.message, MAX_EVENT_MESSAGE), "d": _details_json(e.details)} for ts, e in events],
        )

    def add_events(self, node: str, events: Sequence[EventRecord], ts: float | None = None) -> None:
        if not events:
            return
        now = ts if ts is not None else time.time()
        with self._lock, self.engine.begin() as conn:
            nid = self._node_id(conn, node, now)
            self._insert_events(conn, nid, [(now, e) for e in events])

    def set_node_labels(self, node: str, labels: Mapping[str, Any]) -> None:
        with self._lock, self.engine.begin() as conn:
            nid = self._node_id(conn, node, time.time())
            conn.execute(text("UPDATE nodes SET labels = :l WHERE id = :n"), {"l": json.dumps(dict(labels)), "n": nid})

    # ------------------------------------------------------------------ rollups
    def _watermark(self, conn: Connection, node_id: int, tier: str, cached: bool = False) -> float | None:
        if cached and (node_id, tier) in self._watermarks:
            return self._watermarks[(node_id, tier)]
        row = conn.execute(text("SELECT rolled_until FROM rollup_watermarks WHERE node_id = :n AND tier = :t"),
                           {"n": node_id, "t": tier}).first()
        if row is None:
            return None
        self._watermarks[(node_id, tier)] = float(row[0])
        return float(row[0])

    def _set_watermark(self, conn: Connection, node_id: int, tier: str, until: float) -> None:
        conn.execute(text("INSERT INTO rollup_watermarks (node_id, tier, rolled_until) VALUES (:n, :t, :u) "
                          "ON CONFLICT (node_id, tier) DO UPDATE SET rolled_until = excluded.rolled_until"),
                     {"n": node_id, "t": tier, "u": until})
        self._watermarks[(node_id, tier)] = until

    def _rollup_node(self, conn: Connection, node_id: int, t_min: float, t_max: float, delay: float = 0.0) -> None:
        """Roll closed buckets of this node up; re-roll buckets that late (spooled) samples touched.

        ``delay``: a 1-minute bucket is rolled by the first write whose newest tick is at least
        ``delay`` seconds past the bucket's end (the hourly tier follows the 1-minute watermark),
        so a fleet whose agents tick in the same second does not roll up in the same second.
        Until then the reads serve the bucket from raw samples (the watermark says how far the
        rollups are complete)."""
        for tier, width, source in (("1m", 60.0, "samples"), ("1h", 3600.0, "rollup_1m")):
            wm = self._watermark(conn, node_id, tier, cached=True)
            # buckets before this are closed (and, for 1m, at least `delay` seconds old)
            closed_until = math.floor((t_max - (delay if tier == "1m" else 0.0)) / width) * width
            if tier == "1h":
                # hourly is built from 1-minute rollups, which are complete up to their own watermark
                wm1 = self._watermark(conn, node_id, "1m", cached=True) or 0.0
                closed_until = min(closed_until, math.floor(wm1 / width) * width)
            if wm is None:
                first = conn.execute(text(
                    "SELECT min(ts) FROM sample_rows WHERE node_id = :n" if self.dialect == "postgresql" else
                    "SELECT min(ts) FROM samples WHERE series_id IN (SELECT id FROM series WHERE node_id = :n)"
                ), {"n": node_id}).scalar()
                if first is None:
                    continue
                wm = math.floor(float(first) / width) * width
                self._set_watermark(conn, node_id, tier, wm)
            if t_min < wm:  # late (spooled) data below the watermark: re-roll the buckets it touched
                lo = math.floor(t_min / width) * width
                hi = min(wm, math.floor(t_max / width) * width + width)
                if hi > lo:
                    self._roll(conn, node_id, tier, width, source, lo, hi)
            if closed_until > wm:
                if tier == "1m":
                    self._roll_1m(conn, node_id, wm, closed_until)
                else:
                    self._roll(conn, node_id, tier, width, source, wm, closed_until)
                self._set_watermark(conn, node_id, tier, closed_until)

    def _roll(self, conn: Connection, node_id: int, tier: str, width: float, source: str, lo: float, hi: float) -> None:
        table = f"rollup_{tier}"
        upsert = " " + _ROLLUP_UPSERT
        params = {"n": node_id, "lo": lo, "hi": hi, "w": width}
        if source == "samples":
            # window over [lo - width, hi) so the first sample of the range has its predecessor
            sql = f"""
            INSERT INTO {table} (series_id, bucket, min, max, sum, count, last, last_ts, increase)
            SELECT series_id, bucket, min(value), max(value), sum(value), count(*),
                   {self._last_expr('value', 'ts')}, max(ts),
                   sum(CASE WHEN kind = 'counter' AND prev IS NOT NULL
                            THEN CASE WHEN value >= prev THEN value - prev ELSE value END ELSE 0 END)
            FROM (
                SELECT s.series_id, s.ts, s.value, se.kind,
                       {self._floor('s.ts', ':w')} AS bucket,
                       lag(s.value) OVER (PARTITION BY s.series_id ORDER BY s.ts) AS prev
                FROM samples s JOIN series se ON se.id = s.series_id
                WHERE se.node_id = :n AND s.ts >= :lo - :w AND s.ts < :hi
            ) w
            WHERE w.ts >= :lo
            GROUP BY series_id, bucket
            {upsert}"""
        else:
            sql = f"""
            INSERT INTO {table} (series_id, bucket, min, max, sum, count, last, last_ts, increase)
            SELECT r.series_id, {self._floor('r.bucket', ':w')} AS b, min(r.min), max(r.max), sum(r.sum),
                   sum(r.count), {self._last_expr('r.last', 'r.last_ts')}, max(r.last_ts), sum(r.increase)
            FROM rollup_1m r JOIN series se ON se.id = r.series_id
            WHERE se.node_id = :n AND r.bucket >= :lo AND r.bucket < :hi
            GROUP BY r.series_id, b
            {upsert}"""
        conn.execute(text(sql), params)

    def _floor(self, expr: str, width: str) -> str:
        if self.dialect == "sqlite":
            return f"(CAST({expr} / {width} AS INTEGER) * {width})"
        return f"(floor({expr} / {width}) * {width})"

    def _last_expr(self, value: str, ts: str) -> str:
        if self.dialect == "sqlite":
            # SQLite: a bare column next to max() comes from the row holding the max
            return self._sqlite_last(value, ts)
        return f"(array_agg({value} ORDER BY {ts} DESC))[1]"

    @staticmethod
    def _sqlite_last(value: str, ts: str) -> str:
        # json trick: the value of the row with the greatest ts, without a bare-column dependency
        return f"CAST(substr(max(printf('%020.6f', {ts}) || '|' || {value}), 22) AS REAL)"

    def rollup_all(self) -> None:
        """Roll every node up to now (used after imports and by the retention job)."""
        now = time.time()
        with self._lock, self.engine.begin() as conn:
            for (nid,) in conn.execute(text("SELECT id FROM nodes")).all():
                self._rollup_node(conn, int(nid), now, now)

    # ------------------------------------------------------------------ retention
    def apply_retention(self, policy: RetentionPolicy | None = None, now: float | None = None) -> dict[str, int]:
        """Remove data older than the policy allows.  Returns rows (or partitions) removed per table
        (``samples``: raw rows deleted; on PostgreSQL those are node-tick rows).

        On PostgreSQL, raw samples expire by dropping whole daily partitions of ``sample_rows``
        (never a bulk DELETE) and the partitions for the next days are created ahead; raw data is
        then kept up to one day longer than configured, never shorter.
        """
        from triscope.store import partitions

        policy = policy or RetentionPolicy()
        now = now if now is not None else time.time()
        out: dict[str, int] = {}
        partitioned = False
        if self.dialect == "postgresql":
            with self.engine.connect() as conn:
                partitioned = partitions.is_partitioned(conn)
        tables = [("rollup_1m", policy.rollup_1m, "bucket"), ("rollup_1h", policy.rollup_1h, "bucket"),
                  ("events", policy.rollup_1h, "ts")]
        if partitioned:
            partitions.ensure_partitions(self.engine, now)
            out["samples_partitions_dropped"] = len(partitions.drop_expired_partitions(self.engine, now - policy.raw))
            with self.engine.begin() as conn:  # rows that sat in the default partition
                res = conn.execute(text(f"DELETE FROM {partitions.DEFAULT} WHERE ts < :cut"), {"cut": now - policy.raw})
                out["samples"] = int(res.rowcount or 0)
        else:
            tables.insert(0, ("samples" if self.dialect == "sqlite" else partitions.PARENT, policy.raw, "ts"))
        out_key = {partitions.PARENT: "samples"}   # raw rows are reported as "samples" on both dialects
        with self._lock, self.engine.begin() as conn:
            for table, keep, col in tables:
                res = conn.execute(text(f"DELETE FROM {table} WHERE {col} < :cut"), {"cut": now - keep})
                out[out_key.get(table, table)] = int(res.rowcount or 0)
        return out

    # ------------------------------------------------------------------ reads
    def nodes(self) -> list[NodeInfo]:
        with self.engine.connect() as conn:
            rows = conn.execute(text("SELECT name, labels, first_seen, last_seen FROM nodes ORDER BY name")).all()
        return [NodeInfo(r[0], _json(r[1]), float(r[2]), float(r[3])) for r in rows]

    def series(self, node: str | None = None, metric: str | None = None, prefix: str | None = None,
               labels: Mapping[str, str] | None = None) -> list[SeriesInfo]:
        where, params = ["1=1"], {}
        if node is not None:
            where.append("n.name = :node")
            params["node"] = node
        _metric_filter(where, params, metric, prefix)
        sql = (f"SELECT s.id, n.name, s.metric, s.labels, s.kind FROM series s JOIN nodes n ON n.id = s.node_id "
               f"WHERE {' AND '.join(where)} ORDER BY n.name, s.metric, s.labels")
        with self.engine.connect() as conn:
            rows = conn.execute(text(sql), params).all()
        out = [SeriesInfo(int(r[0]), r[1], r[2], parse_label_key(r[3]), r[4]) for r in rows]
        if labels:
            out = [s for s in out if all(s.labels.get(k) == v for k, v in labels.items())]
        return out

    def metric_names(self, node: str | None = None) -> list[str]:
        sql = "SELECT DISTINCT s.metric FROM series s"
        params: dict[str, Any] = {}
        if node is not None:
            sql += " JOIN nodes n ON n.id = s.node_id WHERE n.name = :node"
            params["node"] = node
        with self.engine.connect() as conn:
            return sorted(r[0] for r in conn.execute(text(sql), params))

    def time_bounds(self, node: str | None = None) -> tuple[float, float] | None:
        params: dict[str, Any] = {}
        if self.dialect == "postgresql":
            sql = "SELECT min(r.ts), max(r.ts) FROM sample_rows r"
            if node is not None:
                sql += " JOIN nodes n ON n.id = r.node_id WHERE n.name = :node"
                params["node"] = node
        else:
            sql = "SELECT min(s.ts), max(s.ts) FROM samples s"
            if node is not None:
                sql += " JOIN series se ON se.id = s.series_id JOIN nodes n ON n.id = se.node_id WHERE n.name = :node"
                params["node"] = node
        with self.engine.connect() as conn:
            row = conn.execute(text(sql), params).first()
        if row is None or row[0] is None:
            return None
        return float(row[0]), float(row[1])

    def query(self, metric: str, node: str | None = None, labels: Mapping[str, str] | None = None,
              start: float | None = None, end: float | None = None, max_points: int | None = 2000,
              rate: bool | None = None, tier: str | None = None) -> list[SeriesData]:
        """Every series of ``metric`` (on ``node``, matching ``labels``) over [start, end].

        Counters come back as per-second rates (``rate=None``) unless ``rate=False``.
        ``max_points=None`` returns every raw point.  ``tier`` forces ``raw``, ``1m`` or ``1h``.
        """
        infos = self.series(node=node, metric=metric, labels=labels)
        end = time.time() if end is None else end
        start = end - 3600 if start is None else start
        out: list[SeriesData] = []
        with self.engine.connect() as conn:
            for info in infos:
                as_rate = (info.kind == "counter") if rate is None else rate
                out.append(self._query_one(conn, info, start, end, max_points, as_rate, tier))
        return out

    def query_series(self, info: SeriesInfo, start: float, end: float, max_points: int | None = 2000,
                     rate: bool | None = None, tier: str | None = None) -> SeriesData:
        with self.engine.connect() as conn:
            as_rate = (info.kind == "counter") if rate is None else rate
            return self._query_one(conn, info, start, end, max_points, as_rate, tier)

    def _choose_tier(self, start: float, end: float, max_points: int | None) -> str:
        if max_points is None:
            return "raw"
        span = end - start
        # raw while the range holds at most ~50 raw points per output point (1 Hz assumed), then rollups
        if span <= 50 * max_points:
            return "raw"
        if span <= 60 * 50 * max_points:
            return "1m"
        return "1h"

    def _query_one(self, conn: Connection, info: SeriesInfo, start: float, end: float,
                   max_points: int | None, as_rate: bool, tier: str | None) -> SeriesData:
        tier = tier or self._choose_tier(start, end, max_points)
        if tier == "raw":
            ts, vals = self._raw(conn, info.id, start, end, as_rate, max_points)
            return SeriesData(info, ts, vals, "raw")
        # rollup tier, with the not-yet-rolled tail served from the next finer tier
        width = 60.0 if tier == "1m" else 3600.0
        wm = self._watermark(conn, self._node_id_of(conn, info.id), tier)
        ts = []
        vals = []
        roll_end = min(end, wm) if wm is not None else start
        if roll_end > start:
            ts, vals = self._rollup_points(conn, tier, width, info.id, start, roll_end, as_rate)
        if roll_end < end:
            finer = "raw" if tier == "1m" else "1m"
            if finer == "raw":
                t2, v2 = self._raw(conn, info.id, max(start, roll_end), end, as_rate, None)
            else:
                wm1 = self._watermark(conn, self._node_id_of(conn, info.id), "1m")
                mid = min(end, wm1) if wm1 is not None else max(start, roll_end)
                t2, v2 = self._rollup_points(conn, "1m", 60.0, info.id, max(start, roll_end), mid, as_rate)
                if mid < end:
                    t3, v3 = self._raw(conn, info.id, max(start, mid), end, as_rate, None)
                    t2, v2 = t2 + t3, v2 + v3
            ts, vals = ts + t2, vals + v2
        if max_points is not None and len(ts) > max_points:
            ts, vals = minmax_downsample(ts, vals, max_points)
        return SeriesData(info, ts, vals, tier)

    def _node_id_of(self, conn: Connection, series_id: int) -> int:
        return int(conn.execute(text("SELECT node_id FROM series WHERE id = :s"), {"s": series_id}).scalar_one())

    def _raw(self, conn: Connection, sid: int, start: float, end: float, as_rate: bool,
             max_points: int | None) -> tuple[list[float], list[float]]:
        params = {"s": sid, "a": start, "b": end}
        if as_rate:
            inner = ("SELECT ts, CASE WHEN prev IS NULL OR ts <= pts THEN NULL "
                     "WHEN value >= prev THEN (value - prev) / (ts - pts) ELSE value / (ts - pts) END AS value "
                     "FROM (SELECT ts, value, lag(value) OVER (ORDER BY ts) AS prev, lag(ts) OVER (ORDER BY ts) AS pts "
                     "FROM samples WHERE series_id = :s AND ts >= :a AND ts <= :b) r")
            base = f"SELECT ts, value FROM ({inner}) q WHERE value IS NOT NULL"
        else:
            base = "SELECT ts, value FROM samples WHERE series_id = :s AND ts >= :a AND ts <= :b"
        if max_points is not None and max_points >= 4:
            count = conn.execute(text("SELECT count(*) FROM samples WHERE series_id = :s AND ts >= :a AND ts <= :b"),
                                 params).scalar_one()
            if count > max_points:
                return self._sql_downsample(conn, base, params, start, end, max_points)
        rows = conn.execute(text(base + " ORDER BY ts"), params).all()
        return [float(r[0]) for r in rows], [float(r[1]) for r in rows]

    def _sql_downsample(self, conn: Connection, base: str, params: dict[str, Any], start: float, end: float,
                        max_points: int) -> tuple[list[float], list[float]]:
        """Min/max per bucket in SQL: at most ``max_points`` rows leave the database."""
        nb = max(1, max_points // 2)
        width = max((end - start) / nb, 1e-9)
        p = dict(params, w=width, a0=start)
        sub = f"SELECT ts, value, {self._floor('(ts - :a0)', ':w')} AS b FROM ({base}) x"
        if self.dialect == "sqlite":
            # SQLite documents that a bare column beside a single min()/max() comes from that row
            lows = conn.execute(text(f"SELECT b, min(value), ts FROM ({sub}) y GROUP BY b"), p).all()
            highs = {r[0]: r for r in conn.execute(text(f"SELECT b, max(value), ts FROM ({sub}) y GROUP BY b"), p)}
            rows: Sequence[Any] = [(b, vmin, tmin, highs[b][1], highs[b][2]) for b, vmin, tmin in lows]
        else:
            rows = conn.execute(text(
                f"SELECT b, min(value), (array_agg(ts ORDER BY value ASC, ts))[1], "
                f"max(value), (array_agg(ts ORDER BY value DESC, ts))[1] FROM ({sub}) y GROUP BY b"), p).all()
        ts: list[float] = []
        vals: list[float] = []
        for _b, vmin, tmin, vmax, tmax in sorted(rows, key=lambda r: r[0]):
            for t, v in sorted({(float(tmin), float(vmin)), (float(tmax), float(vmax))}):
                ts.append(t)
                vals.append(v)
        return ts, vals

    def _rollup_points(self, conn: Connection, tier: str, width: float, sid: int, start: float, end: float,
                       as_rate: bool) -> tuple[list[float], list[float]]:
        table = f"rollup_{tier}"
        a = math.floor(start / width) * width
        rows = conn.execute(text(f"SELECT bucket, min, max, sum, count, increase FROM {table} "
                                 f"WHERE series_id = :s AND bucket >= :a AND bucket < :b ORDER BY bucket"),
                            {"s": sid, "a": a, "b": end}).all()
        ts: list[float] = []
        vals: list[float] = []
        for bucket, vmin, vmax, _vsum, cnt, inc in rows:
            if as_rate:
                ts.append(float(bucket) + width / 2)
                vals.append(float(inc) / width)
            elif cnt == 1 or vmin == vmax:
                ts.append(float(bucket) + width / 2)
                vals.append(float(vmin))
            else:
                ts.extend((float(bucket) + width * 0.25, float(bucket) + width * 0.75))
                vals.extend((float(vmin), float(vmax)))
        return ts, vals

    def latest(self, node: str, metric: str | None = None, prefix: str | None = None,
               since: float | None = None) -> list[LatestValue]:
        infos = self.series(node=node, metric=metric, prefix=prefix)
        out: list[LatestValue] = []
        if self.dialect == "postgresql":
            if not infos:
                return out
            with self.engine.connect() as conn:
                got = self._pg_latest(conn, "s.id = ANY(CAST(:ids AS integer[]))", {"ids": [i.id for i in infos]}, since)
            for info in infos:
                p = got.get(info.id)
                if p is not None:
                    out.append(LatestValue(info, p[3], p[4]))
            return out
        with self.engine.connect() as conn:
            for info in infos:
                row = conn.execute(text("SELECT ts, value FROM samples WHERE series_id = :s "
                                        + ("AND ts >= :since " if since is not None else "")
                                        + "ORDER BY ts DESC LIMIT 1"), {"s": info.id, "since": since}).first()
                if row is None and since is None:
                    row = conn.execute(text("SELECT last_ts, last FROM rollup_1m WHERE series_id = :s "
                                            "ORDER BY bucket DESC LIMIT 1"), {"s": info.id}).first()
                if row is not None:
                    out.append(LatestValue(info, float(row[0]), float(row[1])))
        return out

    def fleet_latest(self, metrics: Sequence[str], since: float | None = None,
                     nodes: Sequence[str] | None = None) -> dict[str, dict[tuple[str, str], tuple[float, float]]]:
        """The newest point of every series of ``metrics`` on every node (or on ``nodes``), in a
        few fleet-wide statements: node -> {(metric, labelkey): (ts, value)}.

        ``since``: only raw points at or after it (on PostgreSQL the day partitions before it are
        not touched).  Without ``since`` a series with no raw point left falls back to its newest
        1-minute rollup (``last_ts``, ``last``), as ``latest()`` does.  On SQLite each series
        costs one backward probe of the samples primary key (series_id, ts); on PostgreSQL each
        node one probe of its newest row (``_pg_latest``)."""
        metrics = list(metrics)
        out: dict[str, dict[tuple[str, str], tuple[float, float]]] = {}
        if not metrics or (nodes is not None and not nodes):
            return out
        params: dict[str, Any] = {"metrics": metrics}
        where = "s.metric IN :metrics"
        if nodes is not None:
            where += " AND n.name IN :nodes"
            params["nodes"] = list(nodes)
        if self.dialect == "postgresql":
            with self.engine.connect() as conn:
                for name, metric, lk, ts, value in self._pg_latest(conn, where, params, since).values():
                    out.setdefault(name, {})[(metric, lk)] = (ts, value)
            return out
        bound = ""
        if since is not None:
            bound = " AND ts >= :since"
            params["since"] = float(since)
        sql = (f"SELECT n.name, s.metric, s.labels, s.id, x.ts, x.value FROM series s "
               f"JOIN nodes n ON n.id = s.node_id "
               f"LEFT JOIN samples x ON x.series_id = s.id AND x.ts = "
               f"(SELECT max(ts) FROM samples WHERE series_id = s.id{bound}) WHERE {where}")
        stmt = text(sql).bindparams(bindparam("metrics", expanding=True))
        if nodes is not None:
            stmt = stmt.bindparams(bindparam("nodes", expanding=True))
        missing: dict[int, tuple[str, str, str]] = {}
        with self.engine.connect() as conn:
            for name, metric, lk, sid, ts, value in conn.execute(stmt, params):
                if ts is None:
                    missing[int(sid)] = (name, metric, lk)
                else:
                    out.setdefault(name, {})[(metric, lk)] = (float(ts), float(value))
            if since is None and missing:
                ids = list(missing)
                for i in range(0, len(ids), 5000):
                    rows = conn.execute(text(
                        "SELECT r.series_id, r.last_ts, r.last FROM rollup_1m r WHERE r.series_id IN :ids AND r.bucket = "
                        "(SELECT max(bucket) FROM rollup_1m WHERE series_id = r.series_id)"
                    ).bindparams(bindparam("ids", expanding=True)), {"ids": ids[i:i + 5000]})
                    for sid, ts, value in rows:
                        name, metric, lk = missing[int(sid)]
                        out.setdefault(name, {})[(metric, lk)] = (float(ts), float(value))
        return out

    def _pg_latest(self, conn: Connection, where: str, params: dict[str, Any], since: float | None
                   ) -> dict[int, tuple[str, str, str, float, float]]:
        """PostgreSQL: series id -> (node, metric, labelkey, ts, value) of the newest point of every
        series matching ``where`` (on ``series s JOIN nodes n``), at or after ``since`` if given.

        Bounded steps instead of a backward probe per series (a series' points are spread over
        its node's rows, so "its newest" is not one index descent any more): each node's newest
        row, which holds every live series; for the rest, the node's rows at or after ``since``.
        Without ``since``: the node's rows not yet rolled up (at or after its 1-minute watermark,
        about two minutes of them), then the newest 1-minute rollup, whose ``last_ts``/``last``
        are the newest raw point before the watermark, so a series that stopped reporting days
        ago costs one rollup probe, not a scan of its node's rows.  Only a series with no rollup
        row at all (rollups kept shorter than raw samples) is looked for in all its node's rows."""
        p = dict(params)
        bound = ""
        if since is not None:
            bound = " AND r.ts >= :since"
            p["since"] = float(since)
        stmt = text(
            f"WITH w AS MATERIALIZED (SELECT s.id, s.node_id, s.slot, n.name, s.metric, s.labels FROM series s "
            f"JOIN nodes n ON n.id = s.node_id WHERE {where}) "
            f"SELECT w.id, w.node_id, w.slot, w.name, w.metric, w.labels, x.ts, x.vals[w.slot + 1] "
            f"FROM (SELECT DISTINCT node_id FROM w) q "
            f"LEFT JOIN LATERAL (SELECT r.ts, r.vals FROM sample_rows r WHERE r.node_id = q.node_id{bound} "
            f"ORDER BY r.ts DESC LIMIT 1) x ON true JOIN w ON w.node_id = q.node_id")
        for key in ("metrics", "nodes"):
            if key in p:
                stmt = stmt.bindparams(bindparam(key, expanding=True))
        out: dict[int, tuple[str, str, str, float, float]] = {}
        rest: dict[int, tuple[int, int, str, str, str]] = {}
        for sid, nid, slot, name, metric, lk, ts, value in conn.execute(stmt, p):
            if value is None:
                rest[int(sid)] = (int(nid), int(slot), name, metric, lk)
            else:
                out[int(sid)] = (name, metric, lk, float(ts), float(value))
        if not rest:
            return out
        ids = list(rest)
        if since is not None:
            lows = [float(since)] * len(ids)
        else:
            wms: dict[int, float] = dict(conn.execute(text(
                "SELECT node_id, rolled_until FROM rollup_watermarks WHERE tier = '1m' "
                "AND node_id = ANY(CAST(:n AS integer[]))"), {"n": sorted({v[0] for v in rest.values()})}).all())
            lows = [float(wms.get(rest[i][0], -math.inf)) for i in ids]
        rows = conn.execute(text(
            "SELECT m.id, x.ts, x.v FROM unnest(CAST(:ids AS integer[]), CAST(:nids AS integer[]), "
            "CAST(:slots AS integer[]), CAST(:lo AS float8[])) AS m(id, nid, slot, lo) "
            "CROSS JOIN LATERAL (SELECT r.ts, r.vals[m.slot + 1] AS v FROM sample_rows r WHERE r.node_id = m.nid "
            "AND r.ts >= m.lo AND r.vals[m.slot + 1] IS NOT NULL ORDER BY r.ts DESC LIMIT 1) x"),
            {"ids": ids, "nids": [rest[i][0] for i in ids], "slots": [rest[i][1] for i in ids],
             "lo": lows}).all()
        for sid, ts, value in rows:
            _nid, _slot, name, metric, lk = rest.pop(int(sid))
            out[int(sid)] = (name, metric, lk, float(ts), float(value))
        if rest and since is None:
            ids = list(rest)
            rows = conn.execute(text(
                "SELECT r.series_id, r.last_ts, r.last FROM rollup_1m r WHERE r.series_id = ANY(CAST(:ids AS integer[])) "
                "AND r.bucket = (SELECT max(bucket) FROM rollup_1m WHERE series_id = r.series_id)"), {"ids": ids}).all()
            for sid, ts, value in rows:
                _nid, _slot, name, metric, lk = rest.pop(int(sid))
                out[int(sid)] = (name, metric, lk, float(ts), float(value))
            # no rollup at all (rollups kept shorter than raw samples, or never rolled): the raw rows
            for sid, (nid, slot, name, metric, lk) in rest.items():
                row = conn.execute(text("SELECT ts, vals[:k] FROM sample_rows WHERE node_id = :n "
                                        "AND vals[:k] IS NOT NULL ORDER BY ts DESC LIMIT 1"),
                                   {"n": nid, "k": slot + 1}).first()
                if row is not None:
                    out[sid] = (name, metric, lk, float(row[0]), float(row[1]))
        return out

    def series_keys(self, prefix: str | None = None, metric: str | None = None) -> dict[str, set[tuple[str, str]]]:
        """node -> {(metric, labelkey)} of every stored series (of ``metric``, or whose name starts
        with ``prefix``) over the whole fleet, in one statement; labels stay in their canonical
        text form (``triscope.samples.parse_label_key``), so a fleet-wide listing stays cheap."""
        where: list[str] = ["1=1"]
        params: dict[str, Any] = {}
        _metric_filter(where, params, metric, prefix)
        out: dict[str, set[tuple[str, str]]] = {}
        with self.engine.connect() as conn:
            rows = conn.execute(text(f"SELECT n.name, s.metric, s.labels FROM series s JOIN nodes n ON n.id = s.node_id "
                                     f"WHERE {' AND '.join(where)}"), params)
            for name, m, lk in rows:
                out.setdefault(name, set()).add((m, lk))
        return out

    def events(self, node: str | None = None, start: float | None = None, end: float | None = None,
               kinds: Sequence[str] | None = None, limit: int = 10000) -> list[EventRow]:
        where: list[str] = ["1=1"]
        params: dict[str, Any] = {"lim": limit}
        if node is not None:
            where.append("n.name = :node")
            params["node"] = node
        if start is not None:
            where.append("e.ts >= :a")
            params["a"] = start
        if end is not None:
            where.append("e.ts <= :b")
            params["b"] = end
        if kinds:
            names = []
            for i, k in enumerate(kinds):
                params[f"k{i}"] = k
                names.append(f":k{i}")
            where.append(f"e.kind IN ({', '.join(names)})")
        sql = (f"SELECT e.id, n.name, e.ts, e.kind, e.severity, e.message, e.details FROM events e "
               f"JOIN nodes n ON n.id = e.node_id WHERE {' AND '.join(where)} ORDER BY e.ts, e.id LIMIT :lim")
        with self.engine.connect() as conn:
            rows = conn.execute(text(sql), params).all()
        return [EventRow(int(r[0]), r[1], float(r[2]), r[3], r[4], r[5], _json(r[6])) for r in rows]


ROLLUP_SPREAD_S = 45
LAST_SEEN_STEP_S = 10.0
_INF = math.inf
# a rollup row computed again (a late sample, an in-memory minute after a SQL one) replaces the old
_ROLLUP_UPSERT = ("ON CONFLICT (series_id, bucket) DO UPDATE SET min = excluded.min, max = excluded.max, "
                  "sum = excluded.sum, count = excluded.count, last = excluded.last, last_ts = excluded.last_ts, "
                  "increase = excluded.increase")
_MOVE_LAST_SEEN = "WITH u AS (UPDATE nodes SET last_seen = %(t)s WHERE id = %(n)s AND last_seen < %(t)s) "
# several ticks: their timestamps and their rows (each a float8[] literal) as two parallel arrays
_INSERT_MANY_TS = ("INSERT INTO sample_rows (node_id, ts, vals) SELECT %(n)s, t, v::double precision[] "
                   "FROM unnest(%(ts)s::double precision[], %(v)s::text[]) AS x(t, v)")
_INSERT_ONE_TS = ("INSERT INTO sample_rows (node_id, ts, vals) "
                  "VALUES (%(n)s, %(ts)s::double precision, %(v)s::double precision[])")
# (move last_seen?, one timestamp?) -> the steady-state tick's statement
_DIRECT_SQL = {(False, False): _INSERT_MANY_TS, (False, True): _INSERT_ONE_TS,
               (True, False): _MOVE_LAST_SEEN + _INSERT_MANY_TS, (True, True): _MOVE_LAST_SEEN + _INSERT_ONE_TS}


def _by_ts(rows: Iterable[tuple[int, float, float]]) -> dict[float, dict[int, float]]:
    """(series id, ts, value) points -> ts -> {series id: value}."""
    out: dict[float, dict[int, float]] = {}
    for sid, ts, v in rows:
        pts = out.get(ts)
        if pts is None:
            out[ts] = {sid: v}
        else:
            pts[sid] = v
    return out


def _metric_filter(where: list[str], params: dict[str, Any], metric: str | None, prefix: str | None) -> None:
    """SQL conditions on ``series s`` for one metric and/or a metric-name prefix (matched literally)."""
    if metric is not None:
        where.append("s.metric = :metric")
        params["metric"] = metric
    if prefix is not None:
        where.append("s.metric LIKE :prefix ESCAPE '\\'")
        params["prefix"] = prefix.replace("\\", "\\\\").replace("_", r"\_").replace("%", r"\%") + "%"


def rollup_delay(node: str) -> float:
    """Seconds after a 1-minute bucket closes at which ``node``'s writes roll it up: 1 to
    ``ROLLUP_SPREAD_S``, stable per node name (CRC-32), so a fleet's rollups spread over the minute."""
    return float(1 + zlib.crc32(node.encode()) % ROLLUP_SPREAD_S)


def _is_unique_violation(e: BaseException) -> bool:
    if isinstance(e, IntegrityError):
        return True
    return getattr(e, "sqlstate", None) == "23505"


def _details_json(details: Any) -> str:
    """An event's details as JSON, at most MAX_EVENT_DETAILS bytes (else a note of what was cut)."""
    d = json.dumps(details, default=str)
    if len(d) <= MAX_EVENT_DETAILS:
        return d
    _log.warning("event details of %d bytes cut (limit %d)", len(d), MAX_EVENT_DETAILS)
    return json.dumps({"truncated": True, "bytes": len(d), "keys": [_names.shorten(str(k), 64) for k in details][:50]}
                      if isinstance(details, dict) else {"truncated": True, "bytes": len(d)})


def _json(v: Any) -> dict[str, Any]:
    if v is None:
        return {}
    if isinstance(v, dict):
        return v
    return dict(json.loads(v))


def minmax_downsample(ts: list[float], vals: list[float], max_points: int) -> tuple[list[float], list[float]]:
    """Keep the min and the max of each of ``max_points // 2`` equal-count buckets, in time order."""
    n = len(ts)
    if n <= max_points:
        return ts, vals
    nb = max(1, max_points // 2)
    out_t: list[float] = []
    out_v: list[float] = []
    for b in range(nb):
        lo, hi = b * n // nb, (b + 1) * n // nb
        if hi <= lo:
            continue
        seg = range(lo, hi)
        imin = min(seg, key=vals.__getitem__)
        imax = max(seg, key=vals.__getitem__)
        for i in sorted({imin, imax}):
            out_t.append(ts[i])
            out_v.append(vals[i])
    return out_t, out_v


__all__ = ["EventRow", "LatestValue", "NodeInfo", "RetentionPolicy", "SeriesData", "SeriesInfo", "Store",
           "StoreError", "Tick", "minmax_downsample", "normalise_url"]
