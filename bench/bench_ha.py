"""The fleet store losing its server: Patroni failover under agents and the remediation engine.

Setup: a real Patroni cluster (one etcd, three PostgreSQL 15 servers, synchronous mode strict,
ttl 10 s, loop_wait 1 s, retry_timeout 4 s; tests/ha_cluster.py), two ``triscope agent``
processes at 1 Hz and a ``triscope remediate`` engine handling a stream of 60 alerts, all on the
multi-host URL with ``target_session_attrs=read-write`` (tests/ha_failover.py, the scenario of
tests/e2e/test_store_failover.py).  Two faults, 8 s in, each run on a fresh cluster; the figures are
medians over the runs (3 per fault; ``quick``: 1):

* kill: the leader's postmaster is SIGKILLed (its clients get a reset at once);
* partition (root only): each node in a network namespace of its own, the leader's link taken
  down for 60 s, then restored (tests/e2e/test_store_partition.py): its clients get no reply and no
  reset, and give up on it through the store's TCP keepalives and ``tcp_user_timeout``.

Figures: time from the fault to the first tick committed on the new leader (a poller reading the
newest ticks four times a second through the read-write URL), the worst staleness of the stalest
agent's newest stored tick after the fault ("tick lag"), ticks missing (of every tick each agent
says it took) or doubled, alert actions lost or doubled.  Baseline, same runs: the worst tick lag
in the 8 s before the fault (steady state).
"""

from __future__ import annotations

import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.common import Row

REPO = Path(__file__).resolve().parent.parent


def run(quick: bool = False) -> list[Row]:
    sys.path.insert(0, str(REPO / "tests"))
    sys.path.insert(0, str(REPO / "tests" / "e2e"))   # the scenario (test_faults_engine, test_store_partition)
    from ha_cluster import missing_parts, netns_refused

    rows = []
    for case, why in (("kill", missing_parts()), ("partition", missing_parts() or netns_refused())):
        name = f"ha failover (Patroni, leader {CASES[case][0]})"
        if why:
            rows.append(Row(name, f"not run: {why}", float("nan"), ""))
            continue
        rows += _rows(name, case, [_one(case, i) for i in range(1 if quick else 3)])
    return rows


PARTITION_S = 60.0
# the fault's name in the rows, and the agents' run length (s) that outlasts it
CASES = {"kill": ("postgres SIGKILL", 40), "partition": (f"link down {PARTITION_S:g} s", int(PARTITION_S) + 40)}


def _one(case: str, i: int) -> dict[str, Any]:
    from ha_cluster import HACluster
    from ha_failover import run_scenario
    from test_store_partition import partition_for

    cluster = HACluster(netns=case == "partition")
    healed: dict[str, Any] = {}
    fault = ((lambda c: {"old_leader": c.kill_leader_postgres()}) if case == "kill"
             else partition_for(PARTITION_S, healed))
    try:
        cluster.start()
        with tempfile.TemporaryDirectory(prefix="triscope-bench-ha-") as tmp:
            out = run_scenario(cluster, Path(tmp), fault, db=f"bench_ha_{case}_{i}", duration=CASES[case][1])
        if "timer" in healed:
            healed["timer"].join(PARTITION_S + 10)
        print(f"  {case} run {i + 1}: first tick after {out['first_commit_after_fault_s']} s, "
              f"worst lag {out['worst_lag_s']} s", file=sys.stderr, flush=True)
        return out
    finally:
        cluster.stop()


def _rows(name: str, case: str, runs: list[dict[str, Any]]) -> list[Row]:
    first = [r["first_commit_after_fault_s"] for r in runs if r["first_commit_after_fault_s"] is not None]
    worst = [r["worst_lag_s"] for r in runs if r["worst_lag_s"] is not None]
    steady = [r["steady_lag_max_s"] for r in runs if r["steady_lag_max_s"] is not None]
    missing = sum(len(t["missing"]) for r in runs for t in r["ticks"].values())
    doubled = sum(len(t["doubled"]) for r in runs for t in r["ticks"].values())
    ticks = sum(max(t["n"], t["taken"]) for r in runs for t in r["ticks"].values())
    lost_a = sum(len(r["actions"]["lost"]) for r in runs)
    doubled_a = sum(len(r["actions"]["doubled"]) for r in runs)
    alerts = sum(r["actions"]["alerts"] for r in runs)
    n = f"median of {len(runs)}"
    first_s = statistics.median(first) if len(first) == len(runs) else float("nan")
    worst_s = statistics.median(worst) if worst else float("nan")
    steady_s = statistics.median(steady) if steady else None
    spread = f" (runs: {', '.join(f'{x:.1f}' for x in first)})" if len(first) > 1 else ""
    return [
        Row(name, f"{case} -> first tick committed on the new leader, {n}{spread}", round(first_s, 2), "s", "<= 30",
            ok=first_s <= 30),
        Row(name, f"worst tick lag through the failover, {n}", round(worst_s, 2), "s", "<= 45",
            f"worst tick lag before the {case} (steady state)", None if steady_s is None else round(steady_s, 2),
            ok=worst_s <= 45),
        Row(name, f"ticks lost (of {ticks} taken, 2 agents x {len(runs)} runs); doubled {doubled}", missing, "ticks",
            "0", ok=missing == 0 and doubled == 0),
        Row(name, f"alert actions lost or doubled (of {alerts})", lost_a + doubled_a, "actions", "0",
            ok=lost_a + doubled_a == 0),
    ]
