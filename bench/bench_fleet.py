"""Fleet scale on one PostgreSQL: ingest lag and the fleet page under load, retention by partition.

* ingest: bench/loadgen.py plays N nodes x 200 series at 1 Hz through ``Store.write_ticks``
  (full: 1,000 nodes for 5 minutes; quick: 100 nodes for 20 s) into a private PostgreSQL with
  fsync on; figure: the worst tick lag (timestamp -> committed), target < 2 s.
* fleet page: the dashboard's fleet page over all N nodes, rendered server-side while the load
  runs, target <= 2 s (it reads through ``Store.fleet_latest`` and ``Store.series_keys``: a few
  fleet-wide statements, not a few queries per node); baseline: one hand-written SQL query that
  fetches every node's latest mismatch state and score (what the page needs from the samples
  table), on the same data at the same time.
* retention: expiring one day of raw samples by dropping its partition, against the bulk DELETE
  of the same rows (the unpartitioned way), on the same server.
* storage: bytes on disk per stored sample (heap + primary key of the node-tick rows), from the
  load's partitions.
"""

from __future__ import annotations

import time

from bench.common import Row
from bench.loadgen import SAMPLES_STORED, PrivatePostgres, run_load

# the page's data in one hand-written statement: each node's newest row, the mismatch slots of it
FLEET_SQL = """
SELECT n.name, s.metric, s.labels, x.vals[s.slot + 1]
FROM nodes n
JOIN LATERAL (
    SELECT vals FROM sample_rows WHERE node_id = n.id AND ts > :since ORDER BY ts DESC LIMIT 1
) x ON true
JOIN series s ON s.node_id = n.id AND s.metric IN ('triscope_mismatch_state', 'triscope_mismatch_score')
"""


def fleet_sql_seconds(url: str) -> tuple[float, int]:
    """Seconds for the one-query fleet summary (the latest 5 minutes of data), nodes it returned."""
    from sqlalchemy import text

    from triscope.store import Store

    st = Store.open(url)
    try:
        with st.engine.connect() as c:
            newest = c.execute(text("SELECT max(last_seen) FROM nodes")).scalar() or time.time()
            t = time.perf_counter()
            rows = c.execute(text(FLEET_SQL), {"since": float(newest) - 300}).all()
            return time.perf_counter() - t, len({r[0] for r in rows})
    finally:
        st.close()


def retention_compare(url: str, rows_per_day: int) -> tuple[float, float]:
    """(seconds to DROP one day's partition, seconds to DELETE the same day's rows), for a day of
    ``rows_per_day`` samples."""
    from sqlalchemy import text

    from triscope.store import Store
    from triscope.store import partitions as P

    st = Store.open(url)
    try:
        base = P.day_start(time.time()) - 40 * P.DAY     # two old days, far from the live data
        P.ensure_partitions(st.engine, base, ahead_days=1)
        step = P.DAY / rows_per_day * 200
        with st.engine.begin() as c:
            for d in (0, 1):
                # one node of 200 series, its ticks evenly spread over the day
                c.execute(text(
                    "INSERT INTO sample_rows (node_id, ts, vals) SELECT 900000, :t0 + i * :step, "
                    "ARRAY(SELECT random() FROM generate_series(1, 200) WHERE i >= 0) "
                    "FROM generate_series(0, :n - 1) i"),
                    {"t0": base + d * P.DAY, "step": step, "n": rows_per_day // 200})
            c.execute(text("ANALYZE sample_rows"))
        with st.engine.begin() as c:
            t = time.perf_counter()
            c.execute(text("DELETE FROM sample_rows WHERE ts >= :a AND ts < :b"),
                      {"a": base + P.DAY, "b": base + 2 * P.DAY})
            delete_s = time.perf_counter() - t
        t = time.perf_counter()
        dropped = P.drop_expired_partitions(st.engine, base + P.DAY)
        drop_s = time.perf_counter() - t
        assert dropped == [P.partition_name(base)], dropped
        return drop_s, delete_s
    finally:
        st.close()


def storage_bytes_per_row(url: str) -> tuple[float, float]:
    """On-disk bytes per row (heap + indexes + TOAST) of the raw samples and of the 1-minute rollups."""
    from sqlalchemy import text

    from triscope.store import Store

    st = Store.open(url)
    try:
        with st.engine.connect() as c:
            c.execute(text("CHECKPOINT"))
            size = c.execute(text(
                "SELECT coalesce(sum(pg_total_relation_size(i.inhrelid)), 0) FROM pg_inherits i "
                "JOIN pg_class p ON p.oid = i.inhparent WHERE p.relname = 'sample_rows'")).scalar()
            n = c.execute(text(SAMPLES_STORED)).scalar()
            r_size = c.execute(text("SELECT pg_total_relation_size('rollup_1m')")).scalar()
            r_n = c.execute(text("SELECT count(*) FROM rollup_1m")).scalar()
        return float(size or 0) / max(int(n or 0), 1), (float(r_size or 0) / r_n if r_n else float("nan"))
    finally:
        st.close()


def run(quick: bool = False) -> list[Row]:
    nodes, duration = (100, 20.0) if quick else (1000, 300.0)
    series = 200
    pg = PrivatePostgres()
    try:
        res = run_load(pg.url, nodes, series, duration, fleet_every=duration / 2 if quick else 120.0)
        sql_s, sql_nodes = fleet_sql_seconds(pg.url)
        bps, rollup_bpr = storage_bytes_per_row(pg.url)
        drop_s, delete_s = retention_compare(pg.url, 200_000 if quick else 2_000_000)
    finally:
        pg.close()
    rows = [
        Row("fleet ingest", f"worst tick lag, {nodes} nodes x {series} series at 1 Hz for {duration:.0f} s",
            res.lag_max_s, "s", "< 2", ok=res.lag_max_s < 2.0 and res.write_errors == 0),
        Row("fleet ingest", f"p99 tick lag (p50 {res.lag_p50_s:.2f} s)", res.lag_p99_s, "s", "< 2",
            ok=res.lag_p99_s < 2.0),
        Row("fleet ingest", f"samples/s committed ({res.write_errors} write errors, {res.ticks_missed} ticks "
            f"missed, {res.wall_s:.0f} s wall)", res.samples_per_s, "samples/s", f">= {nodes * series:,}",
            ok=res.samples_per_s >= 0.99 * nodes * series and res.write_errors == 0 and res.ticks_missed == 0),
        Row("fleet ingest", "PostgreSQL CPU per committed sample (all its processes, rollups included)",
            res.server_cpu_us_per_sample if res.server_cpu_us_per_sample is not None else float("nan"), "us",
            baseline="the simulated agents' CPU per sample (the store's client side; on the nodes in production)",
            baseline_value=res.client_cpu_s / max(res.samples_written, 1) * 1e6),
    ]
    page = max(res.fleet_page_s) if res.fleet_page_s else float("nan")
    rows.append(Row("fleet page", f"server-side render, {res.fleet_page_rows} nodes, under the ingest load"
                    + (f" ({res.fleet_page_error})" if res.fleet_page_error else ""),
                    page, "s", "<= 2", f"one SQL: latest mismatch state/score of {sql_nodes} nodes", sql_s,
                    ok=bool(res.fleet_page_s) and page <= 2.0 and res.fleet_page_rows >= nodes))
    rows.append(Row("retention", "expire one day of raw samples: DROP its partition", drop_s * 1000, "ms",
                    "<= 1000", "bulk DELETE of the same day's rows", delete_s * 1000, ok=drop_s <= 1.0))
    per_day_gb = bps * nodes * series * 86400 / 1e9
    rows.append(Row("storage", f"bytes on disk per raw sample, node-tick rows + primary key (one raw day of {nodes} x "
                    f"{series} at 1 Hz = {per_day_gb:,.0f} GB)", bps, "B",
                    baseline="bytes per 1-minute rollup row (min/max/sum/count/last/increase)", baseline_value=rollup_bpr))
    return rows


if __name__ == "__main__":
    import sys

    for r in run(quick="--quick" in sys.argv):
        print(r)
