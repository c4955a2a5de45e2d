"""The fleet store loses its server: real Patroni, real etcd, real PostgreSQL 15 (tests/ha_cluster.py).

Two ``triscope agent`` processes write 1 Hz ticks and a ``triscope remediate`` engine handles a
stream of alerts (tests/ha_failover.py), all through the multi-host URL with
``target_session_attrs=read-write``; then

* the leader's postmaster is SIGKILLed: Patroni promotes the synchronous standby;
* the leader's Patroni is SIGSTOPped (a partition from the DCS while its PostgreSQL lives on):
  its leader key expires, the synchronous standby is promoted, and a client still connected to the
  old leader acknowledges no commit once its standby is promoted (strict synchronous mode: its
  commits wait for a standby that no longer follows it); when its Patroni runs again it finds the
  key taken and demotes its server, which rejoins as a replica (on etcd's v2 API: with the etcd3
  client of Patroni 3.0.2 the resumed old leader overwrites the key instead, docs/scaling.md);
  every commit either leader acknowledged is on the leader that remains.

Afterwards every tick of every agent is stored exactly once (no gap, no double), every alert has
exactly one decision, acted, whose restart reached the Kubernetes test server with its own
``restartedAt``, the inbox and the actions in progress are empty, and every re-delivered alert is
recognised as a duplicate (the de-duplication keys survived).  The remediation circuit breaker
survives the kill too: opened by a real engine's trip before it (on a database of its own, so the
alert stream still acts), it is open for a fresh engine on the new leader, which rebuilds the same
breaker window from the audit log and suppresses the next alert; ``triscope remediate reset-breaker``
closes it there, and the next alert acts.  Prints ``HA {...}`` figures.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ha_cluster import HACluster, missing_parts

pytestmark = [pytest.mark.postgres, pytest.mark.slow, pytest.mark.timeout(300)]

_WHY = missing_parts()
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def ha(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HACluster]:
    if _WHY:
        pytest.skip(_WHY)
    cluster = HACluster()
    try:
        yield cluster.start()
    finally:
        cluster.stop(logs_to=tmp_path_factory.mktemp("ha-logs"))   # Patroni's and etcd's logs kept for a failure


def _check(out: dict[str, Any]) -> None:
    from ha_failover import NODES, summary

    print("\nHA " + json.dumps(summary(out)))
    assert out["agent_codes"] == [0, 0], out["agent_logs"]
    for node in NODES:
        t = out["ticks"][node]
        assert t["n"] >= 30, (node, t["n"])
        assert t["taken"] >= t["n"] > 0, (node, t)     # the agent's own count, from its exit line
        assert not t["missing"] and not t["doubled"], (node, t)
    joined = "\n".join(out["agent_logs"])
    # a write that failed went to the spool and came back from it (a write may also just have waited)
    assert joined.count("spooling ticks") == joined.count("store is back"), joined[-3000:]
    a = out["actions"]
    assert not a["lost"] and not a["doubled"] and not a["lost_before_redelivery"], a
    assert not a["not_acted"], a["not_acted"][:5]
    assert not a["wrong_or_missing_patch"], a["wrong_or_missing_patch"][:5]
    assert a["duplicates_recognised"] >= a["alerts"], a
    assert a["inbox"] == 0 and a["in_progress"] == 0, a
    tb = out["engine_log"].find("Traceback")
    assert tb < 0, "the engine logged a traceback:\n" + out["engine_log"][max(0, tb - 600):tb + 2500]
    assert out["first_commit_after_fault_s"] is not None and out["first_commit_after_fault_s"] <= 30


def test_leader_postgres_sigkill_loses_and_doubles_nothing(ha: HACluster, tmp_path: Path) -> None:
    from ha_failover import run_scenario

    from triscope.store import Store, audit

    breaker = BreakerCheck(ha)
    windows: dict[str, set[str]] = {}

    def kill(cluster: HACluster) -> dict[str, Any]:
        windows["before"] = _window_targets(cluster.url("ha_kill"))   # what the alert stream's breaker counts
        return {"old_leader": cluster.kill_leader_postgres()}

    try:
        breaker.trip()
        out = run_scenario(ha, tmp_path, kill, db="ha_kill")
        _check(out)
        # the breaker window the engine rebuilds from the audit log on the new leader holds every target
        # acted on before the kill, and every one of the stream's (one deployment per alert)
        after = _window_targets(out["url"])
        assert windows["before"] and windows["before"] <= after, windows["before"] - after
        assert len(after) == out["actions"]["alerts"], len(after)
        breaker.after_failover(out["fault"]["old_leader"])
    finally:
        breaker.close()
    st = Store.open(out["url"])
    try:
        assert not audit.breaker_state(st).is_open    # the stream never tripped its own (max_targets 10^6)
    finally:
        st.close()
    # the killed node comes back as a replica of the new leader (Patroni restarts it and rewinds)
    old = out["fault"]["old_leader"]
    ha.wait_for(lambda: old in ha.streaming(), 60, f"{old} to rejoin as a replica")


def _window_targets(url: str) -> set[str]:
    """The targets the engine's breaker counts, as an engine starting (or becoming leader) now loads them."""
    from triscope.store import Store
    from triscope.store.audit import DecisionWindow

    st = Store.open(url)
    try:
        w = DecisionWindow(3600.0)
        w.load(st, time.time())
        return w.hit(0.0)[0]
    finally:
        st.close()


BREAKER_SETTINGS = "  namespaces: [inference]\n  breaker: {window: 10m, max_targets: 2, max_percent: 100}\n"


class BreakerCheck:
    """An engine trips the breaker on its own database before the kill; after the promotion a fresh
    engine (as a restarted or newly elected replica would be) sees it open with the same window, and
    the CLI's reset-breaker works on the new leader."""

    def __init__(self, cluster: HACluster) -> None:
        from kube_server import KubeTestServer

        self.cluster = cluster
        self.srv = KubeTestServer(rollout_delay=0.05).start()
        for d in ("web", "api", "db", "cache", "queue"):
            self.srv.add_deployment("inference", d, replicas=1)
        self.engines: list[Any] = []
        self.stores: list[Any] = []

    def _engine(self) -> Any:
        from kube_server import open_store, policy_text
        from test_remediation_rails import RESTART

        from triscope.remediation.engine import Engine
        from triscope.remediation.kube.adapter import KubeAdapter
        from triscope.remediation.policy import parse_policy

        st = open_store(self.url)
        self.stores.append(st)
        pol = parse_policy(policy_text(RESTART.format(cooldown="0s", max_actions=100), BREAKER_SETTINGS), "ha.yaml")
        eng = Engine(st, pol, kube=KubeAdapter.connect(url=self.srv.url))
        self.engines.append(eng)
        return eng

    def trip(self) -> None:
        from test_remediation_rails import fire, storm

        from triscope.store import audit

        self.url = self.cluster.create_database("ha_breaker")
        eng = self._engine()
        rows = fire(eng, storm("web"), storm("api"), storm("db"))
        assert [(r.outcome, r.rail) for r in rows].count(("acted", None)) == 2, rows
        assert [r.rail for r in rows if r.outcome == "suppressed"] == ["breaker"], rows
        self.before = audit.breaker_state(eng.store)
        assert self.before.is_open and "3 targets" in self.before.reason, self.before
        self.targets = eng.window.hit(0.0)[0]
        assert len(self.targets) == 2, self.targets
        self.close_engines()                # the engine that tripped it is gone before the kill

    def after_failover(self, old_leader: str) -> None:
        from test_remediation_rails import fire, storm

        from triscope.store import audit

        assert self.cluster.leader() not in (None, old_leader)
        eng = self._engine()              # a fresh engine on the new leader
        st = eng.store
        assert audit.breaker_state(st) == self.before, (audit.breaker_state(st), self.before)
        assert eng.window.hit(0.0)[0] == self.targets
        rows = fire(eng, storm("cache"))
        assert [(r.outcome, r.rail) for r in rows] == [("suppressed", "breaker")], rows
        assert "circuit breaker open since" in rows[0].reason
        patches = len(self.srv.calls("PATCH", "/deployments/"))
        assert patches == 2
        res = subprocess.run([sys.executable, "-m", "triscope", "remediate", "reset-breaker",
                              "--db", self.cluster.libpq_url("ha_breaker"), "--by", "sre"],
                             capture_output=True, text=True, timeout=60,
                             env=dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")))
        assert res.returncode == 0 and "circuit breaker closed by sre" in res.stdout, res.stdout + res.stderr
        assert "was open since" in res.stdout, res.stdout
        state = audit.breaker_state(st)
        assert not state.is_open and state.reset_by == "sre", state
        rows = fire(eng, storm("queue"))   # a fresh window after the reset: one target, it acts
        assert [(r.outcome, r.rail) for r in rows] == [("acted", None)], rows[0].reason
        assert len(self.srv.calls("PATCH", "/deployments/")) == patches + 1

    def close_engines(self) -> None:
        while self.engines:
            self.engines.pop().close(2)
        while self.stores:
            self.stores.pop().close()

    def close(self) -> None:
        self.close_engines()
        self.srv.stop()


def _fence_writer(cluster: HACluster, node_name: str, acked: list[int], tried: list[float],
                  stop: threading.Event) -> None:
    """Insert rows straight into one server (no multi-host URL: a client stuck on the old leader),
    recording each row whose commit was acknowledged."""
    import psycopg

    n = cluster.node(node_name)
    i = 0
    try:
        with psycopg.connect(host=n.host, port=n.pg_port, user="postgres", dbname="ha_fence",
                             autocommit=True, connect_timeout=3) as conn:
            while not stop.is_set():
                i += 1
                tried.append(time.time())
                conn.execute("INSERT INTO fence (i) VALUES (%s)", (i,))
                acked.append(i)
                time.sleep(0.05)
    except psycopg.Error:
        return   # the old leader was demoted under it


def test_partitioned_leader_acknowledges_nothing_that_is_lost(ha: HACluster, tmp_path: Path) -> None:
    from ha_failover import run_scenario

    acked: list[int] = []
    tried: list[float] = []
    stop = threading.Event()
    state: dict[str, Any] = {}

    def partition(cluster: HACluster) -> dict[str, Any]:
        old = cluster.leader()
        assert old is not None
        leader = cluster.node(old)
        cluster.psql(leader, "CREATE DATABASE ha_fence")
        cluster.psql(leader, "CREATE TABLE fence (i int PRIMARY KEY)", db="ha_fence")
        w = threading.Thread(target=_fence_writer, args=(cluster, old, acked, tried, stop), daemon=True)
        w.start()
        time.sleep(1.0)
        timeline = max(int(m.get("timeline") or 0) for m in cluster.members())
        cluster.freeze_patroni(leader)
        t0 = time.monotonic()
        cluster.wait_for(lambda: cluster.leader() not in (None, old) and any(
            m.get("role") == "leader" and int(m.get("timeline") or 0) > timeline for m in cluster.members()),
            60, "a new leader on a new timeline while the old one is frozen")
        promoted_after = time.monotonic() - t0
        time.sleep(0.5)                       # a commit acknowledged just before the promotion is counted
        acked_at_promotion = len(acked)
        time.sleep(2.5)   # the old leader's PostgreSQL still runs, cut off; the new one may still lack its standby
        state["acked_while_cut"] = len(acked) - acked_at_promotion
        cluster.thaw_patroni(leader)
        # one leader again, both others streaming; which one leads is Patroni's call (see the docs)
        cluster.wait_for(lambda: cluster.leader() is not None and cluster.sync_standby() is not None
                         and len(cluster.streaming()) == 2, 90, "one leader and two streaming replicas after the thaw")
        stop.set()
        w.join(30)
        state["final_leader"], state["old"] = cluster.leader(), old
        return {"old_leader": old, "promoted_after_freeze_s": round(promoted_after, 2), "fence_acked": len(acked),
                "fence_acked_while_cut": state["acked_while_cut"], "leader_after_thaw": state["final_leader"]}

    out = run_scenario(ha, tmp_path, partition, db="ha_part")
    _check(out)
    final = ha.node(ha.leader() or "")
    stored = {int(x) for x in ha.psql(final, "SELECT i FROM fence", db="ha_fence").split()}
    lost = [i for i in acked if i not in stored]
    print(f"HA partition: fence rows acknowledged {len(acked)}, on the leader after it {len(stored)}, lost {len(lost)}; "
          f"acknowledged while cut off {state['acked_while_cut']}; leader after the thaw {state['final_leader']}")
    assert acked, "the fence writer never got a commit acknowledged before the partition"
    assert not lost, f"acknowledged by the old leader but missing on the leader after it: {lost[:10]}"
    # the cut-off old leader acknowledged nothing once its synchronous standby had been promoted
    assert state["acked_while_cut"] == 0
    # the old leader was demoted, the promoted one kept the key
    assert state["final_leader"] != state["old"], state


def test_a_standby_skips_upkeep_and_the_dashboard_says_its_lag(ha: HACluster) -> None:
    """Reads on a replica: retention and partition upkeep do nothing there (one log line), and the
    dashboard's /healthz names the role and the replay lag."""
    from triscope.dashboard.app import create_app
    from triscope.store import Store

    url = ha.create_database("ha_standby")
    Store.open(url, check=False).upgrade()
    leader = Store.open(url)
    standby_url = url.replace("target_session_attrs=read-write", "target_session_attrs=standby")
    st = Store.open(standby_url)
    try:
        assert leader.apply_retention().get("skipped_standby") is None
        assert st.apply_retention() == {"skipped_standby": 1}
        app = create_app(store=st)
        r = app.server.test_client().get("/healthz")
        assert r.status_code == 200, r.data
        assert r.headers["X-Triscope-Store-Role"] == "standby"
        assert r.data.startswith(b"ok (standby, replay lag ")
        lag = r.headers["X-Triscope-Store-Replay-Lag-Seconds"]
        assert lag == "unknown" or 0.0 <= float(lag) < 3600
        r = create_app(store=leader).server.test_client().get("/healthz")
        assert (r.status_code, r.data, r.headers["X-Triscope-Store-Role"]) == (200, b"ok\n", "leader")
    finally:
        st.close()
        leader.close()
