"""No lost samples: the real PostgreSQL server goes away in the middle of an agent run."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from triscope.store import Store
from triscope.store.db import upgrade

pytestmark = [pytest.mark.postgres, pytest.mark.slow]


def test_postgres_outage_loses_no_tick(durable_pg_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    # a server configured as production (fsync, synchronous_commit on): an acknowledged commit must
    # survive the crash below (an immediate stop: no checkpoint, no clean shutdown)
    pg_server = durable_pg_server
    url = pg_server.create_database("outage")
    upgrade(url)
    env = dict(os.environ, TRISCOPE_SPOOL_DIR=str(tmp_path / "spool"))
    agent = subprocess.Popen(
        [sys.executable, "-m", "triscope", "agent", "--db", url, "--interval", "0.5", "--duration", "14",
         "--listen", "off", "--no-ebpf", "--no-nvml", "--no-npu", "--node", "outage-node"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        time.sleep(4)
        pg_server.stop("immediate")  # the database vanishes mid-run
        time.sleep(5)
        spooled = list((tmp_path / "spool").rglob("seg-*.jsonl"))
        assert spooled, "ticks should be waiting in the spool while the database is down"
        pg_server.start()
        out, _ = agent.communicate(timeout=60)
    finally:
        if agent.poll() is None:
            agent.kill()
            pg_server.start()
    assert agent.returncode == 0, out
    assert "spooling ticks" in out and "store is back" in out, out
    st = Store.open(url)
    [sd] = st.query("triscope_ticks_total", node="outage-node", start=0, end=time.time() + 10, max_points=None,
                    rate=False)
    n = int(max(sd.values))
    assert n >= 25  # 14 s at 2 Hz
    assert sorted(sd.values) == [float(i) for i in range(1, n + 1)], "every tick, once, in the store"
    assert sd.ts == sorted(sd.ts)
    assert not list((tmp_path / "spool").rglob("seg-*.jsonl")), "spool drained"
    # the writer counted its failed writes, and nothing was dropped
    [errs] = st.query("triscope_dropped_samples_total", node="outage-node", start=0, end=time.time() + 10,
                      max_points=None, rate=False)
    assert max(errs.values) == 0.0
