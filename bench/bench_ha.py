"""The fleet store losing its server: Patroni failover under agents and the remediation engine.

Setup: a real Patroni cluster (one etcd, three PostgreSQL 15 servers, synchronous mode strict,
ttl 10 s, loop_wait 1 s, retry_timeout 4 s; tests/ha_cluster.py), two ``triscope agent``
processes at 1 Hz and a ``triscope remediate`` engine handling a stream of 60 alerts, all on the
multi-host URL with ``target_session_attrs=read-write`` (tests/ha_failover.py, the scenario of
tests/test_store_failover.py).  After 8 s the leader's postmaster is SIGKILLed.  Each run uses a
fresh cluster; the figures are medians over the runs (3; ``quick``: 1).

Figures: time from the kill to the first tick committed on the new leader (a poller reading the
newest ticks four times a second through the read-write URL), the worst staleness of the stalest
agent's newest stored tick after the kill ("tick lag"), ticks missing or doubled, alert actions
lost or doubled.  Baseline, same runs: the worst tick lag in the 8 s before the kill (steady state).
"""

from __future__ import annotations

import statistics
import sys
import tempfile
from pathlib import Path

from bench.common import Row

REPO = Path(__file__).resolve().parent.parent


def run(quick: bool = False) -> list[Row]:
    sys.path.insert(0, str(REPO / "tests"))
    from ha_cluster import HACluster, missing_parts
    from ha_failover import run_scenario

    name = "ha failover (Patroni, leader postgres SIGKILL)"
    why = missing_parts()
    if why:
        return [Row(name, f"not run: {why}", float("nan"), "")]
    runs = []
    for i in range(1 if quick else 3):
        cluster = HACluster()
        try:
            cluster.start()
            with tempfile.TemporaryDirectory(prefix="triscope-bench-ha-") as tmp:
                runs.append(run_scenario(cluster, Path(tmp), lambda c: {"old_leader": c.kill_leader_postgres()},
                                         db=f"bench_ha_{i}"))
        finally:
            cluster.stop()
    first = [r["first_commit_after_fault_s"] for r in runs if r["first_commit_after_fault_s"] is not None]
    worst = [r["worst_lag_s"] for r in runs if r["worst_lag_s"] is not None]
    steady = [r["steady_lag_max_s"] for r in runs if r["steady_lag_max_s"] is not None]
    missing = sum(len(t["missing"]) for r in runs for t in r["ticks"].values())
    doubled = sum(len(t["doubled"]) for r in runs for t in r["ticks"].values())
    ticks = sum(t["n"] for r in runs for t in r["ticks"].values())
    lost_a = sum(len(r["actions"]["lost"]) for r in runs)
    doubled_a = sum(len(r["actions"]["doubled"]) for r in runs)
    alerts = sum(r["actions"]["alerts"] for r in runs)
    n = f"median of {len(runs)}"
    first_s = statistics.median(first) if len(first) == len(runs) else float("nan")
    worst_s = statistics.median(worst) if worst else float("nan")
    steady_s = statistics.median(steady) if steady else None
    spread = f" (runs: {', '.join(f'{x:.1f}' for x in first)})" if len(first) > 1 else ""
    return [
        Row(name, f"kill -> first tick committed on the new leader, {n}{spread}", round(first_s, 2), "s", "<= 30",
            ok=first_s <= 30),
        Row(name, f"worst tick lag through the failover, {n}", round(worst_s, 2), "s", "<= 45",
            "worst tick lag before the kill (steady state)", None if steady_s is None else round(steady_s, 2),
            ok=worst_s <= 45),
        Row(name, f"ticks lost (of {ticks}, 2 agents x {len(runs)} runs); doubled {doubled}", missing, "ticks", "0",
            ok=missing == 0 and doubled == 0),
        Row(name, f"alert actions lost or doubled (of {alerts})", lost_a + doubled_a, "actions", "0",
            ok=lost_a + doubled_a == 0),
    ]
