"""The fleet store's leader is cut off the network for real, for 60 s (tests/ha_cluster.py, netns mode).

Each Patroni + PostgreSQL node runs in a network namespace of its own on a bridge of the test's
own; etcd, the two ``triscope agent`` processes, the ``triscope remediate`` engine and the reader
that measures staleness are in the root namespace (tests/ha_failover.py).  The leader's link is
taken down: its clients get no reply and no reset, and neither do its standbys or the DCS.  What
a SIGSTOP of Patroni cannot show (PostgreSQL stays reachable there, and resets its clients when it
resumes): the agents' connections to the old leader must give up on their own (store/db.py
``PG_TCP_DEFAULTS``) and find the promoted standby.

Checked: every tick each agent took (its own count, from its exit line) is stored exactly once, the
first within 30 s of the cut; every alert decided once and acted; no commit the old leader
acknowledged is lost; after the heal the old leader rejoins and streams from the new one.
Prints ``HA partition {...}`` figures.  Without the keepalive defaults the agents stay on the old
leader until the heal, and the 30 s bound fails.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ha_cluster import HACluster, missing_parts, netns_refused

pytestmark = [pytest.mark.postgres, pytest.mark.slow, pytest.mark.timeout(420)]

PARTITION_S = 60.0


@pytest.fixture(scope="module")
def ha_net(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HACluster]:
    why = missing_parts() or netns_refused()
    if why:
        pytest.skip(why)
    cluster = HACluster(netns=True)
    try:
        yield cluster.start()
    finally:
        cluster.stop(logs_to=tmp_path_factory.mktemp("ha-net-logs"))


def partition_for(seconds: float, healed: dict[str, Any]) -> Any:
    """The fault: the leader's link down now, up again ``seconds`` later (on a timer)."""

    def fault(cluster: HACluster) -> dict[str, Any]:
        old = cluster.leader()
        assert old is not None
        node = cluster.node(old)
        cluster.partition(node)
        cut = time.monotonic()

        def heal() -> None:
            cluster.heal(node)
            healed["after_s"] = time.monotonic() - cut

        timer = threading.Timer(seconds, heal)
        timer.daemon = True
        timer.start()
        healed["timer"] = timer
        return {"old_leader": old, "partition_s": seconds}

    return fault


def test_a_leader_cut_off_for_60_s_loses_no_tick_and_rejoins(ha_net: HACluster, tmp_path: Path) -> None:
    from ha_failover import run_scenario, summary
    from test_store_failover import _check

    healed: dict[str, Any] = {}
    out = run_scenario(ha_net, tmp_path, partition_for(PARTITION_S, healed), db="ha_netpart",
                       duration=int(PARTITION_S) + 40)
    healed["timer"].join(PARTITION_S + 10)
    assert "after_s" in healed, "the partition was never healed"
    print("\nHA partition " + json.dumps(summary(out)))
    _check(out)   # every tick taken stored once, the first within 30 s of the cut; every alert acted once
    old, new = out["fault"]["old_leader"], out["new_leader"]
    assert new != old
    # the heal: the old leader comes back as a replica and streams from the new leader
    t = ha_net.wait_for(lambda: old in ha_net.streaming(), 180, f"{old} to rejoin as a replica after the heal")
    sender = ha_net.psql(ha_net.node(old), "SELECT sender_host FROM pg_stat_wal_receiver")
    assert sender == ha_net.node(ha_net.leader() or "").host, (sender, ha_net.leader())
    print(f"HA partition: {old} streaming again {t:.1f} s after the heal check began, from {sender}")
