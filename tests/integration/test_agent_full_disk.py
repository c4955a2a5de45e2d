"""The writer never dies: its spool on a full disk and its store unreachable together (a tmpfs of
256 KiB under the spool, a real PostgreSQL behind a port that refuses, then answers).  The spool
sheds the oldest first and counts what it drops; the writer thread lives on; once the store answers,
every tick not counted as dropped is stored exactly once."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url
from tcp_relay import Forwarder

from triscope.agent.spool import Spool
from triscope.agent.writer import StoreWriter
from triscope.core.samples import Sample, Tick
from triscope.store import Store
from triscope.store.db import upgrade

pytestmark = [pytest.mark.postgres, pytest.mark.slow]
T0 = 1_800_000_000.0


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to mount a small tmpfs")
def test_a_full_spool_disk_and_a_store_outage_together(pg_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    real = make_url(pg_server.create_database("fulldisk"))
    upgrade(real.render_as_string(hide_password=False))
    fwd = Forwarder((real.host or "127.0.0.1", int(real.port or 5432)))
    url = real.set(host="127.0.0.1", port=fwd.port).render_as_string(hide_password=False)
    disk = tmp_path / "small"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(disk)], check=True)
    try:
        st = Store.open(url, check=False)
        spool = Spool(disk / "spool", 64 << 20)
        w = StoreWriter(st, "n", spool, retry_interval=0.2)
        w.start()
        ticks = [Tick(T0 + i, [Sample("triscope_ticks_total", float(i + 1), kind="counter")]
                      + [Sample("triscope_wide", float(i), {"k": str(j)}) for j in range(150)]) for i in range(80)]
        for t in ticks:
            w.submit(t)
            time.sleep(0.01)
        deadline = time.monotonic() + 20
        while spool.dropped_samples == 0 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert spool.dropped_samples > 0, "the disk should have filled"
        assert w._thread.is_alive(), "the writer thread died on the full disk"
        fwd.open()                                    # the store answers again
        assert w.flush(60), "the spool should drain once the store answers"
        w.close()
        st.close()
        stored = Store.open(real.render_as_string(hide_password=False))
        try:
            got = stored.query("triscope_ticks_total", node="n", start=0, end=T0 + 1e6, max_points=None, rate=False)
            values = sorted(v for sd in got for v in sd.values)
        finally:
            stored.close()
        assert len(values) == len(set(values)), "nothing doubled"
        kept = len(values)
        shed = round(spool.dropped_samples / 151)
        assert kept + shed == len(ticks), (kept, shed, spool.dropped_samples)
        assert kept > 0
    finally:
        fwd.close()
        subprocess.run(["umount", "-l", str(disk)], check=False)
