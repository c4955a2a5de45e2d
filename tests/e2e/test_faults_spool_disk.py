"""The real agent with its spool on a small disk that fills and empties while its PostgreSQL is
down (a tmpfs the test mounts and fills, a real server behind a forwarder the test opens later).

Every tick the agent took is stored once or counted as dropped, the pending-samples gauge it
exports is the samples in its spool files, and its exit line says what the files hold.  Before:
16 ticks missing and 15 counted as dropped, the gauge at 54 over an empty spool, the exit line
reporting 54 samples left in it.  ``-s`` prints the figures (``spool fault figures``)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import free_port, wait_for_port
from small_fs import fill, small_tmpfs
from sqlalchemy.engine import make_url
from tcp_relay import Forwarder

from triscope.agent.spool import spool_dir_for
from triscope.store import Store
from triscope.store.db import upgrade

pytestmark = [pytest.mark.postgres, pytest.mark.slow]
EXIT = re.compile(r"stopped: (\d+) ticks taken; (\d+) samples left in the spool \S+ for the next start "
                  r"\((\d+) ticks\); (\d+) ticks \((\d+) samples\) dropped")


def in_files(folder: Path) -> tuple[int, int, int]:
    """(whole ticks, their samples, torn or corrupt lines) in a spool folder's segments."""
    ticks = samples = bad = 0
    for p in sorted(folder.glob("seg-*.jsonl")):
        raw = p.read_bytes()
        bad += bool(raw) and not raw.endswith(b"\n")
        for line in raw.splitlines():
            try:
                samples += len(json.loads(line)["s"])
                ticks += 1
            except ValueError:
                bad += 1
    return ticks, samples, bad


def gauge(port: int) -> float:
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    m = re.search(r"^triscope_spool_pending_samples (\S+)$", body, re.M)
    assert m, body[:2000]
    return float(m.group(1))


def agent(url: str, spool: Path, port: int, log: Path, *extra: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "triscope", "agent", "--db", url, "--spool", str(spool), "--node", "n",
         "--interval", "0.2", "--write-every", "0.2", "--listen", f"127.0.0.1:{port}", "--no-ebpf", "--no-nvml",
         "--no-npu", *extra], stdout=log.open("wb"), stderr=subprocess.STDOUT)


def stop(p: subprocess.Popen[bytes], log: Path) -> str:
    p.terminate()
    p.wait(30)
    return log.read_text()


def test_a_spool_disk_that_fills_and_empties_loses_no_tick_uncounted(pg_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    real = make_url(pg_server.create_database("spool_disk"))
    direct = real.render_as_string(hide_password=False)
    upgrade(direct)
    fwd = Forwarder((real.host or "127.0.0.1", int(real.port or 5432)))
    url = real.set(host="127.0.0.1", port=fwd.port).render_as_string(hide_password=False)
    figures: dict[str, object] = {}
    with small_tmpfs(tmp_path / "small", 1 << 20) as disk:
        spool = disk / "spool"
        folder = spool_dir_for(spool, "n", url)
        port = free_port()
        log1 = tmp_path / "agent1.log"
        p = agent(url, spool, port, log1)
        try:
            wait_for_port(port, timeout=60)
            time.sleep(2.0)                                   # store down: spooled
            for cycle in range(3):                            # the disk fills (a tick torn), then frees
                filler = fill(disk)
                time.sleep(1.5)
                files = in_files(folder)
                g = gauge(port)                               # files are still while the disk is full
                assert in_files(folder) == files
                figures[f"full {cycle}: gauge / samples in files"] = f"{g:.0f} / {files[1]}"
                assert g == files[1], (g, files)
                assert files[2] == 0, f"a torn or corrupt record in the spool: {files}"
                filler.unlink()
                time.sleep(1.5)
        finally:
            out1 = stop(p, log1)
        m = EXIT.search(out1)
        assert m, out1[-3000:]
        taken1, left, left_ticks, dropped_ticks, dropped_samples = map(int, m.groups())
        files = in_files(folder)
        figures["run 1 (store down): ticks taken / in the spool / dropped"] = f"{taken1} / {files[0]} / {dropped_ticks}"
        figures["run 1 exit line: samples left / in files"] = f"{left} / {files[1]}"
        assert (left, left_ticks, files[2]) == (files[1], files[0], 0), (m.group(0), files)
        assert dropped_ticks > 0 and files[0] > 0, m.group(0)
        assert taken1 == files[0] + dropped_ticks, (m.group(0), files)
        # the store answers: a second run replays the first's ticks; each stored once
        fwd.open()
        try:
            log2 = tmp_path / "agent2.log"
            t_second = time.time()
            p = agent(url, spool, port, log2, "--duration", "6")
            p.wait(90)
            out2 = log2.read_text()
        finally:
            fwd.close()
        assert p.returncode == 0, out2[-3000:]
        m2 = EXIT.search(out2)
        assert m2 and int(m2.group(2)) == 0 and int(m2.group(4)) == 0, out2[-3000:]
        assert in_files(folder)[0] == 0
    st = Store.open(direct)
    try:
        got = st.query("triscope_ticks_total", node="n", start=0, end=time.time() + 10, max_points=None, rate=False)
        points = [(t, v) for sd in got for t, v in zip(sd.ts, sd.values, strict=True)]
    finally:
        st.close()
    first = sorted(v for t, v in points if t < t_second)
    assert len(first) == len(set(first)), "nothing doubled"
    figures["stored from run 1 / taken - dropped"] = f"{len(first)} / {taken1 - dropped_ticks}"
    assert len(first) == taken1 - dropped_ticks, (len(first), taken1, dropped_ticks)
    assert "store is back" not in out1
    print("spool fault figures", json.dumps(figures, indent=1))
