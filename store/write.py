"""The write path both back-ends share: ids, the general tick transaction, events, node labels.

``TickWriter.write_general`` writes ticks in one transaction: the node's id (created on its
first write), its series' ids and slots (created as new series appear), the points (the
back-end's ``insert_samples``: idempotent per (series, ts), a replay never doubles a point),
the tick's events, ``last_seen``, and the rollups of buckets that closed.  The back-ends
(``store/write_sqlite.py``, ``store/write_pg.py``) add a steady-state path that writes a tick
whose ids are all cached in one statement, without SQLAlchemy.

Every transaction runs in ``WriteCache.begin``: if it fails, everything the writer cached is
forgotten at once (``store/cache.py`` says why).
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Iterable, Mapping, Sequence
from itertools import chain, cycle, repeat
from operator import attrgetter
from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import IntegrityError

from triscope.core import names as _names
from triscope.core.samples import EventRecord, Sample, Tick, label_key
from triscope.store.cache import MAX_LABEL_KEYS, Point, WriteCache
from triscope.store.db import StoreError
from triscope.store.rollups import Rollups, rollup_delay

_log = logging.getLogger("triscope.store")
MAX_EVENT_KIND = 64          # the events.kind column
MAX_EVENT_MESSAGE = 4096     # characters of an event's message kept
MAX_EVENT_DETAILS = 65536    # bytes of an event's details (JSON) kept
LAST_SEEN_STEP_S = 10.0      # the steady-state path moves nodes.last_seen in steps of this
SLOT_ATTEMPTS = 6            # tries to create a node's new series when another writer takes their slots

# (ts, sample, label key) of every sample of a write
Pending = list[tuple[float, Sample, str]]
# each tick's points of a steady-state write, in time order, one entry a time: [(ts, {series id: value})]
TickPoints = list[tuple[float, dict[int, float]]]
# what the steady state writes: (node id, newest ts, each tick's points)
SteadyWrite = tuple[int, float, TickPoints]


_NAME, _LABELS, _VALUE = attrgetter("name"), attrgetter("labels"), attrgetter("value")
_INF = math.inf


def _first(item: tuple[float, dict[int, float]]) -> float:
    return item[0]


def sorted_rows(per: TickPoints) -> tuple[Iterable[Point], int]:
    """The (series id, ts, value) rows of ``per`` ordered by series id, then time (a series' points
    of the write go to its B-tree page together), and how many: built in C (``map``, ``zip``) when
    every tick has the same series, as a scrape's or a collector's ticks have."""
    first = per[0][1]
    k = len(per)
    if all(p.keys() == first.keys() for _, p in per):
        sids = sorted(first)
        if k == 1:
            return zip(sids, repeat(per[0][0]), map(first.__getitem__, sids)), len(sids)
        cols = [list(map(p.__getitem__, sids)) for _, p in per]
        return (zip(chain.from_iterable(map(repeat, sids, repeat(k))), cycle([ts for ts, _ in per]),
                    chain.from_iterable(zip(*cols, strict=True))), len(sids) * k)
    rows = [(sid, ts, v) for ts, p in per for sid, v in p.items()]
    rows.sort()
    return rows, len(rows)


class TickWriter:
    """One store's writer (one dialect's subclass of it).  The store holds its lock around every
    call."""

    direct: Any = None   # the steady-state path's own connection, once it has been taken

    def __init__(self, engine: Engine, cache: WriteCache, rollups: Rollups) -> None:
        self.engine = engine
        self.cache = cache
        self.rollups = rollups
        # ingest bounds (triscope/core/names.py): label values cut to MAX_LABEL_VALUE, samples whose metric
        # name is longer than the column dropped; each counted, and logged once per label set / metric
        self.truncated_label_values = 0
        self.dropped_samples = 0
        # node id -> its last steady tick's shape: (the cache's id lookup it was read from, metric names,
        # label sets, series ids), in sample order; a cleared cache has a new lookup: the shape is void
        self._shapes: dict[int, tuple[dict, list[str], list[Mapping[str, str]], list[int]]] = {}

    # ------------------------------------------------------------------ the back-end's part
    def write_ticks(self, node: str, ticks: Sequence[Tick], rollup: bool) -> int:
        """Write ticks of one node (at least one); returns the number of points written."""
        return self.write_general(node, ticks, rollup)

    def insert_samples(self, conn: Connection, node_id: int, rows: list[Point], fast: bool = False) -> int:
        """Insert the points of node ``node_id`` not stored yet (a stored point keeps its value);
        returns how many were new."""
        raise NotImplementedError

    def close(self) -> None:
        """Close any connection of the writer's own."""

    # ------------------------------------------------------------------ ids
    def node_id(self, conn: Connection, node: str, ts: float) -> int:
        """The node's id, the node created (first and last seen ``ts``) if it is new."""
        cache = self.cache.node_ids
        nid = cache.get(node)
        if nid is not None:
            return nid
        row = conn.execute(text("SELECT id FROM nodes WHERE name = :n"), {"n": node}).first()
        if row is None:
            problem = _names.node_name_problem(node)
            if problem:
                raise StoreError(problem)
            conn.execute(text("INSERT INTO nodes (name, labels, first_seen, last_seen) VALUES (:n, :l, :t, :t) "
                              "ON CONFLICT (name) DO NOTHING"), {"n": node, "l": "{}", "t": ts})
            row = conn.execute(text("SELECT id FROM nodes WHERE name = :n"), {"n": node}).first()
        assert row is not None
        cache[node] = int(row[0])
        return int(row[0])

    def series_id_map(self, conn: Connection, node_id: int,
                      keys: Iterable[tuple[str, str, str]]) -> dict[tuple[str, str], int]:
        """(metric, label key) -> series id for one node's (metric, label key, kind), creating the
        missing series at the node's next free slots."""
        ids = self.cache.series_ids
        keys = list(keys)
        missing = [(m, lk, k) for m, lk, k in keys if (node_id, m, lk) not in ids]
        if missing:
            self.load_series(conn, node_id)
        for attempt in range(SLOT_ATTEMPTS):
            missing = [(m, lk, k) for m, lk, k in missing if (node_id, m, lk) not in ids]
            if not missing:
                break
            if attempt == SLOT_ATTEMPTS - 1:
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
            self.load_series(conn, node_id)
        return {(m, lk): ids[(node_id, m, lk)] for m, lk, _ in keys}

    def load_series(self, conn: Connection, node_id: int) -> None:
        self.cache.add_series(node_id, conn.execute(
            text("SELECT id, metric, labels, kind, slot FROM series WHERE node_id = :n"), {"n": node_id}).all())

    # ------------------------------------------------------------------ the general path
    def write_general(self, node: str, ticks: Sequence[Tick], rollup: bool, fast: bool = False) -> int:
        """Ticks of one node in one transaction, every id looked up or created as needed.
        ``fast``: the back-end may assume no point is stored yet (and fail if one is)."""
        t_min = min(t.ts for t in ticks)
        t_max = max(t.ts for t in ticks)
        cache = self.cache
        with cache.begin(self.engine) as conn:
            nid = self.node_id(conn, node, t_min)
            pending, keys = self.prepare(ticks)
            sids = self.series_id_map(conn, nid, ((m, lk, k) for (m, lk), k in keys.items()))
            cache.remember_raw(nid, sids, pending)
            # one point per (series, ts): two sources reporting the same series in a tick, last wins
            dedup = {
                (sids[(s.name, lk)], ts): float(s.value)
                for ts, s, lk in pending
                if s.value == s.value and not math.isinf(s.value)
            }
            rows = [(sid, ts, v) for (sid, ts), v in dedup.items()]
            inserted = self.insert_samples(conn, nid, rows, fast) if rows else 0
            if inserted == len(rows):
                cache.feed(nid, rows)
            else:   # some points were stored already (a replay): the accumulator cannot tell which
                cache.drop_acc(nid, t_max)
            events = [(t.ts, e) for t in ticks for e in t.events]
            if events:
                self.insert_events(conn, nid, events)
            conn.execute(text("UPDATE nodes SET last_seen = :t WHERE id = :n AND last_seen < :t"), {"t": t_max, "n": nid})
            cache.last_seen[nid] = max(t_max, cache.last_seen.get(nid, -math.inf))
            if rollup:
                self.rollups.rollup_node(conn, nid, t_min, t_max, delay=rollup_delay(node))
        return len(rows)

    def prepare(self, ticks: Sequence[Tick]) -> tuple[Pending, dict[tuple[str, str], str]]:
        """(ts, sample, label key) of every sample, and (metric, label key) -> kind of each series."""
        # label sets repeat every tick: canonicalise each distinct one once
        lk_cache = self.cache.label_keys
        pending: Pending = []
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
                    if len(lk_cache) < MAX_LABEL_KEYS:
                        lk_cache[tk] = lk
                if (s.name, lk) not in keys:
                    keys[(s.name, lk)] = s.kind
                pending.append((t.ts, s, lk))
        return pending, keys

    def _label_key(self, s: Sample) -> str:
        """The series' label key, over-long label values (and names) bounded: counted and logged
        rather than failing the tick (triscope/core/names.py says how they are cut)."""
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

    # ------------------------------------------------------------------ the steady state
    # a back-end whose steady state writes the ticks' events itself (in its one transaction)
    steady_events = False
    # a back-end whose steady state first creates the series a tick brings that are not cached yet
    # (their own short transaction), rather than sending the whole write down the general path
    steady_new_series = False

    def steady_points(self, node: str, ticks: Sequence[Tick], rollup: bool) -> SteadyWrite | None:
        """The steady state, where a write needs no ORM: every id is cached (or, with
        ``steady_new_series``, created first), no events (unless ``steady_events``), no bucket to
        roll.  None when the write needs the general path."""
        cache = self.cache
        nid = cache.node_ids.get(node)
        if nid is None or (not self.steady_events and any(t.events for t in ticks)):
            return None
        t_min = min(t.ts for t in ticks)
        t_max = max(t.ts for t in ticks)
        if rollup:
            wm1 = cache.watermarks.get((nid, "1m"))
            wmh = cache.watermarks.get((nid, "1h"))
            if wm1 is None or wmh is None or t_min < wm1 or t_min < wmh:
                return None
            if math.floor((t_max - rollup_delay(node)) / 60.0) * 60.0 > wm1:
                return None
            if min(math.floor(t_max / 3600.0), math.floor(wm1 / 3600.0)) * 3600.0 > wmh:
                return None
        by_ts: dict[float, dict[int, float]] = {}
        created = False
        self.created_for_steady = []
        for t in ticks:
            points = self.tick_points(nid, t)
            if points is None and self.steady_new_series and not created:
                created = self.create_new_series(nid, ticks)
                points = self.tick_points(nid, t) if created else None
            if points is None:
                return None
            have = by_ts.get(t.ts)
            if have is None:
                by_ts[t.ts] = points
            else:          # two ticks at one time: one point per series, the last wins
                have.update(points)
        per = list(by_ts.items())
        if any(per[i][0] >= per[i + 1][0] for i in range(len(per) - 1)):
            per.sort(key=_first)
        return (nid, t_max, per) if any(p for _, p in per) else None

    def create_new_series(self, node_id: int, ticks: Sequence[Tick]) -> bool:
        """Create (or look up) the series of the ticks' samples that the steady-state cache does not
        know yet, in a short transaction of their own, and cache them; False when there is nothing
        the cache can learn that way (no cache for the node yet, or only samples the write path
        drops), so the write takes the general path.  The series it created (not merely found) are
        kept in ``created_for_steady``, for ``drop_created`` to remove if the write then fails.  The
        node's series are loaded first to tell the two apart (a second load when some are missing:
        only when new series appear)."""
        owner = self.cache.raw_sids.get(node_id)
        if owner is None:
            return False
        new = [s for t in ticks for s in t.samples
               if (s.name, tuple(s.labels.items()) if s.labels else ()) not in owner]
        if not new:
            return False
        pending, keys = self.prepare([Tick(ticks[-1].ts, new, ())])
        if not keys:
            return False
        ids = self.cache.series_ids
        with self.cache.begin(self.engine) as conn:
            self.load_series(conn, node_id)
            known = {k for k in keys if (node_id, *k) in ids}
            sids = self.series_id_map(conn, node_id, ((m, lk, k) for (m, lk), k in keys.items()))
        self.cache.remember_raw(node_id, sids, pending)
        self.created_for_steady = [sids[k] for k in keys if k not in known]
        return True

    # the series ``create_new_series`` created for the write under way: the back-end removes them
    # again if that write fails (``drop_created``), so a failed write leaves no series behind, as
    # the general path's one transaction leaves none
    created_for_steady: list[int] = []

    def drop_created(self) -> None:
        """After a failed steady-state write: the series created for it, none of whose points were
        stored, deleted again (the cache was cleared by the failure)."""
        created, self.created_for_steady = self.created_for_steady, []
        if not created:
            return
        with self.cache.begin(self.engine) as conn:
            conn.execute(text("DELETE FROM series WHERE id = :i AND NOT EXISTS "
                              "(SELECT 1 FROM samples WHERE series_id = :i)"), [{"i": i} for i in created])

    def tick_points(self, node_id: int, tick: Tick) -> dict[int, float] | None:
        """series id -> value of one tick's finite samples (the last wins), when every series id is
        cached; None otherwise.  A tick whose samples name the series of the node's last tick in the
        same order (names and label sets compared as two lists, in C) takes their ids as they are:
        its points are ``dict(zip(ids, values))``, no look-up per sample."""
        cache = self.cache
        owner = cache.raw_sids.get(node_id)
        if owner is None:
            return None
        samples = tick.samples
        names = list(map(_NAME, samples))
        labels = list(map(_LABELS, samples))
        shape = self._shapes.get(node_id)
        if shape is not None and shape[0] is owner and names == shape[1] and labels == shape[2]:
            values = list(map(float, map(_VALUE, samples)))
            total = sum(values)
            if total - total == 0.0:      # no NaN/Inf among them (those have no point): all of them
                return dict(zip(shape[3], values, strict=True))
        # the cache's look-up, sample by sample (``WriteCache.tick_points``), keeping each one's id
        get = owner.get
        points: dict[int, float] = {}
        ids: list[int] = []
        for s in samples:
            lb = s.labels
            sid = get((s.name, tuple(lb.items()) if lb else ()))
            if sid is None:
                return None
            ids.append(sid)
            v = float(s.value)
            if v == v and v != _INF and v != -_INF:
                points[sid] = v
        self._shapes[node_id] = (owner, names, labels, ids)
        return points

    def moves_last_seen(self, node_id: int, t_max: float) -> bool:
        """The steady state moves last_seen in steps of LAST_SEEN_STEP_S: one node row updated
        1,000 times a second across a fleet is a hot row that bloats between vacuums."""
        return t_max >= self.cache.last_seen.get(node_id, -math.inf) + LAST_SEEN_STEP_S

    def steady_written(self, node_id: int, t_max: float, moved: bool, per: TickPoints) -> None:
        """Account for a steady-state write that committed, every point of it new: each tick's
        points to the node's accumulator as they are (no regrouping by time)."""
        cache = self.cache
        if moved:
            cache.last_seen[node_id] = t_max
        acc = cache.acc.get(node_id)
        if acc is not None and per[0][0] > acc.last_ts:
            for ts, points in per:
                acc.add_tick(ts, points, cache.counters)
        elif len(per) == 1:
            cache.feed_tick(node_id, per[0][0], per[0][1])
        else:
            cache.feed(node_id, [(sid, ts, v) for ts, points in per for sid, v in points.items()])

    # ------------------------------------------------------------------ events and labels
    def insert_events(self, conn: Connection, node_id: int, events: list[tuple[float, EventRecord]]) -> None:
        conn.execute(
            text("INSERT INTO events (node_id, ts, kind, severity, message, details) VALUES (:n, :t, :k, :s, :m, :d)"),
            [dict(zip("ntksmd", row, strict=True)) for row in event_rows(node_id, events)],
        )

    def add_events(self, node: str, events: Sequence[EventRecord], ts: float | None = None) -> None:
        if not events:
            return
        now = ts if ts is not None else time.time()
        with self.cache.begin(self.engine) as conn:
            nid = self.node_id(conn, node, now)
            self.insert_events(conn, nid, [(now, e) for e in events])

    def set_node_labels(self, node: str, labels: Mapping[str, Any]) -> None:
        with self.cache.begin(self.engine) as conn:
            nid = self.node_id(conn, node, time.time())
            conn.execute(text("UPDATE nodes SET labels = :l WHERE id = :n"), {"l": json.dumps(dict(labels)), "n": nid})


def event_rows(node_id: int, events: Iterable[tuple[float, EventRecord]]) -> list[tuple[int, float, str, str, str, str]]:
    """(node id, ts, kind, severity, message, details JSON) of each (tick ts, event), bounded as the
    events table's columns are (an event's own ts wins over its tick's)."""
    return [(node_id, e.ts or ts, str(e.kind)[:MAX_EVENT_KIND], str(e.severity)[:16],
             _names.shorten(e.message, MAX_EVENT_MESSAGE), details_json(e.details)) for ts, e in events]


def is_unique_violation(e: BaseException) -> bool:
    if isinstance(e, IntegrityError):
        return True
    return getattr(e, "sqlstate", None) == "23505"


def details_json(details: Any) -> str:
    """An event's details as JSON, at most MAX_EVENT_DETAILS bytes (else a note of what was cut)."""
    d = json.dumps(details, default=str)
    if len(d) <= MAX_EVENT_DETAILS:
        return d
    _log.warning("event details of %d bytes cut (limit %d)", len(d), MAX_EVENT_DETAILS)
    return json.dumps({"truncated": True, "bytes": len(d), "keys": [_names.shorten(str(k), 64) for k in details][:50]}
                      if isinstance(details, dict) else {"truncated": True, "bytes": len(d)})
