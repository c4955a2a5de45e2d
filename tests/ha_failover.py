"""The failover scenario the HA tests and ``bench_ha`` share.

On a running ``HACluster``: a fresh database migrated with ``triscope db upgrade`` over the
multi-host URL; two real ``triscope agent`` processes (distinct node names, 1 Hz) and a real
``triscope remediate`` engine (acting, against the Kubernetes test server) on that URL; a sender
that posts a stream of distinct alerts to the engine's webhook (a failed post is retried, as
Alertmanager does); a poller that reads, four times a second through the same read-write URL,
the newest stored tick of each agent.  ``fault(cluster)`` runs in the middle; the run then goes on
until the agents finish, every alert is re-delivered (the de-duplication keys must have survived),
and the figures are read back: ticks per agent (gaps, doubles), decisions per alert, PATCHes that
reached the Kubernetes test server, the worst and steady-state staleness of the newest tick, and
the time from the fault to the first tick committed after it.
"""

from __future__ import annotations

import collections
import contextlib
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ha_cluster import HACluster
from kube_server import KubeTestServer
from test_faults_engine import POLICY, TOKEN, EngineProcess, _decisions, _deliver, _key, _wait_idle

from triscope.store import Store, audit

REPO = Path(__file__).resolve().parent.parent
NODES = ("ha-node-a", "ha-node-b")


@dataclass
class Poll:
    """The newest stored tick per agent, seen by a poller; and when the first tick after the fault landed."""

    url: str
    fault_at: float = 0.0
    rows_at_fault: int = -1
    first_commit_after_fault: float | None = None
    lag: list[tuple[float, float]] = field(default_factory=list)   # (wall time, staleness of the stalest agent)
    errors: int = 0
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        import psycopg
        from sqlalchemy.engine import make_url

        from triscope.store.db import make_engine, pg_connect_defaults

        eng = make_engine(self.url)
        _a, kw = eng.dialect.create_connect_args(make_url(eng.url))
        eng.dispose()
        # the reader gives up on a silent server itself (a connection to a cut-off leader would
        # otherwise block it, and the staleness it reports, for as long as the cut lasts)
        kw.update(pg_connect_defaults(kw), tcp_user_timeout=2000, options="-c statement_timeout=2000")
        conn: Any = None
        while not self.stop.wait(0.25):
            try:
                if conn is None:
                    conn = psycopg.connect(**kw, autocommit=True, connect_timeout=2)
                rows = conn.execute(
                    "SELECT n.name, max(r.ts), count(*) FROM sample_rows r JOIN nodes n ON n.id = r.node_id "
                    "GROUP BY n.name").fetchall()
            except Exception:  # noqa: BLE001 - the server is down or changing: the next poll tells
                self.errors += 1
                if conn is not None:
                    with contextlib.suppress(Exception):
                        conn.close()
                conn = None
                continue
            now = time.time()
            newest = {str(name): float(ts) for name, ts, _n in rows}
            total = sum(int(n) for *_x, n in rows)
            if len(newest) == len(NODES):
                self.lag.append((now, now - min(newest.values())))
            if self.fault_at and self.rows_at_fault >= 0 and self.first_commit_after_fault is None \
                    and total > self.rows_at_fault:
                self.first_commit_after_fault = now
            if not self.fault_at:
                self.rows_at_fault = total
        if conn is not None:
            conn.close()


def _agent(url: str, node: str, tmp: Path, duration: int, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "triscope", "agent", "--db", url, "--interval", "1", "--duration", str(duration),
         "--listen", "off", "--no-ebpf", "--no-nvml", "--no-npu", "--node", node, "--spool", str(tmp / f"spool-{node}")],
        cwd=tmp, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def run_scenario(cluster: HACluster, tmp: Path, fault: Callable[[HACluster], dict[str, Any]], *,
                 db: str, before_s: float = 8.0, duration: int = 40, alerts: int = 60) -> dict[str, Any]:
    """Run the scenario; returns the figures and what the checks need (see the module doc)."""
    cluster.wait_for(lambda: cluster.sync_standby() is not None and len(cluster.streaming()) == 2, 90,
                     "a healthy cluster (a leader, two streaming replicas, one of them synchronous)")
    url = cluster.create_database(db)
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    # the migration and the first agent take libpq's spelling (h1:p1,h2:p2,...), the rest SQLAlchemy's (?host=...)
    libpq_url = cluster.libpq_url(db)
    up = subprocess.run([sys.executable, "-m", "triscope", "db", "upgrade", "--db", libpq_url], cwd=tmp, env=env,
                        capture_output=True, text=True, timeout=120)
    assert up.returncode == 0, up.stdout + up.stderr
    kube = KubeTestServer(rollout_delay=0.2).start()
    kube.add_node("node-a")
    for i in range(alerts):
        kube.add_deployment("inference", f"d{i:04d}", replicas=1)
    (tmp / "token").write_text(TOKEN + "\n")
    (tmp / "policy.yaml").write_text(POLICY.format(url=kube.url))
    eng = EngineProcess(url, tmp / "policy.yaml", tmp / "token", tmp / "engine.log")
    agents: list[subprocess.Popen[str]] = []
    poll = Poll(url)
    poller = threading.Thread(target=poll.run, daemon=True)
    out: dict[str, Any] = {"url": url}
    try:
        eng.start()
        agents = [_agent(libpq_url if i == 0 else url, n, tmp, duration, env) for i, n in enumerate(NODES)]
        poller.start()
        # alerts paced over the fault: a third before it, the rest during and after
        accepted: set[int] = set()
        stop = threading.Event()
        sender = threading.Thread(target=_deliver, args=(eng, [[i] for i in range(alerts)], accepted, stop,
                                                         (before_s * 3) / alerts))
        time.sleep(before_s * 0.5)
        sender.start()
        time.sleep(before_s * 0.5)
        steady = [lag for _t, lag in poll.lag]
        poll.fault_at = time.time()
        out["fault"] = fault(cluster)
        out["failover_s"] = cluster.wait_for(lambda: cluster.leader() not in (None, out["fault"]["old_leader"]),
                                             60, "a new leader")
        out["new_leader"] = cluster.leader()
        sender.join(150)
        stop.set()
        assert accepted == set(range(alerts)), f"alerts not accepted: {sorted(set(range(alerts)) - accepted)[:10]}"
        logs = [a.communicate(timeout=duration + 90)[0] for a in agents]
        poll.stop.set()
        poller.join(10)
        st = Store.open(url)
        try:
            _wait_idle(eng, st, timeout=120)
            by_key_a, _d = _decisions(st)
            redelivered: set[int] = set()
            _deliver(eng, [[i] for i in range(alerts)], redelivered, threading.Event(), 0.0)
            _wait_idle(eng, st, timeout=120)
            by_key, dups = _decisions(st)
            out["ticks"] = {}
            for node in NODES:
                [sd] = st.query("triscope_ticks_total", node=node, start=0, end=time.time() + 10, max_points=None,
                                rate=False)
                vals = [int(v) for v in sd.values]
                n = max(vals)
                c = collections.Counter(vals)
                # every tick the agent took (its own exit line), not only up to the highest one stored
                taken, spooled = _taken(logs[NODES.index(node)])
                out["ticks"][node] = {"n": n, "taken": taken, "left_in_spool": spooled,
                                      "missing": [i for i in range(1, max(n, taken) + 1) if i not in c],
                                      "doubled": [i for i, k in c.items() if k > 1]}
            decided = [rows[0] for k, rows in by_key.items() if k.startswith("alert:restart:")]
            stamps: dict[str, list[str]] = collections.defaultdict(list)
            for call in kube.calls("PATCH", "/apis/apps/v1/namespaces/inference/deployments/"):
                if call.code == 200:
                    stamps[call.path.rsplit("/", 1)[-1]].append(
                        call.body["spec"]["template"]["metadata"]["annotations"]["kubectl.kubernetes.io/restartedAt"])
            out["actions"] = {
                "alerts": alerts,
                "lost": [i for i in range(alerts) if not by_key.get(_key(i))],
                "doubled": [i for i in range(alerts) if len(by_key.get(_key(i), [])) > 1],
                "lost_before_redelivery": [i for i in range(alerts) if not by_key_a.get(_key(i))],
                "not_acted": [(r.trigger_key, r.outcome, r.reason) for r in decided if r.outcome != "acted"],
                "wrong_or_missing_patch": [r.target for r in decided
                                           if not stamps.get(r.target.rsplit("/", 1)[-1])
                                           or any(s != r.params["restartedAt"] for s in stamps[r.target.rsplit("/", 1)[-1]])],
                "duplicates_recognised": dups,
                "inbox": len(audit.inbox(st)), "in_progress": len(audit.in_progress(st)),
            }
        finally:
            st.close()
        out["agent_logs"] = logs
        out["agent_codes"] = [a.returncode for a in agents]
        out["engine_log"] = (tmp / "engine.log").read_text(errors="replace")
        after = [lag for t, lag in poll.lag if t >= poll.fault_at]
        out["steady_lag_max_s"] = max(steady) if steady else None
        out["steady_lag_median_s"] = statistics.median(steady) if steady else None
        out["worst_lag_s"] = max(after) if after else None
        out["first_commit_after_fault_s"] = (None if poll.first_commit_after_fault is None
                                             else poll.first_commit_after_fault - poll.fault_at)
        out["poll_errors"] = poll.errors
        return out
    finally:
        poll.stop.set()
        for a in agents:
            if a.poll() is None:
                a.kill()
                a.wait(10)
        eng.stop()
        kube.stop()


def _taken(log: str) -> tuple[int, int]:
    """(ticks taken, samples left in the spool) from an agent's exit line; (-1, -1) when it has none."""
    import re

    m = re.search(r"stopped: (\d+) ticks taken; (\d+) samples left in the spool", log)
    return (int(m.group(1)), int(m.group(2))) if m else (-1, -1)


def summary(out: dict[str, Any]) -> dict[str, Any]:
    """The figures of a run, for printing."""
    acts = out.get("actions", {})
    return {
        "old_leader": out.get("fault", {}).get("old_leader"), "new_leader": out.get("new_leader"),
        "failover_s": round(out.get("failover_s", float("nan")), 2),
        "first_commit_after_fault_s": out.get("first_commit_after_fault_s"),
        "worst_lag_s": out.get("worst_lag_s"), "steady_lag_max_s": out.get("steady_lag_max_s"),
        "ticks": {k: {"n": v["n"], "taken": v["taken"], "missing": len(v["missing"]), "doubled": len(v["doubled"])}
                  for k, v in out.get("ticks", {}).items()},
        "actions_lost": len(acts.get("lost", [])), "actions_doubled": len(acts.get("doubled", [])),
        "duplicates_recognised": acts.get("duplicates_recognised"), "poll_errors": out.get("poll_errors"),
        **{k: v for k, v in out.get("fault", {}).items() if k != "old_leader"},
    }
