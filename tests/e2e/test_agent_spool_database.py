"""A spooled tick belongs to the database it was meant for: never replayed into another store.

The real agent (the console entry point), a real PostgreSQL behind a TCP forwarder the test opens
and closes (the database "down", then "back", at the same URL), and a SQLite file: agent A spools
while its PostgreSQL does not answer; agent B, on another database from the same spool folder,
stores none of A's ticks and says what it left; A started again with its database back replays
every one of its ticks once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url
from tcp_relay import Forwarder

from triscope.agent.spool import Spool, database_identity, default_spool_root, spool_dir_for
from triscope.store import Store
from triscope.store.db import upgrade

pytestmark = [pytest.mark.postgres, pytest.mark.slow]


def agent(db: str, spool: Path, node: str, seconds: int, cwd: Path) -> str:
    res = subprocess.run(
        [sys.executable, "-m", "triscope", "agent", "--db", db, "--spool", str(spool), "--node", node,
         "--interval", "0.5", "--duration", str(seconds), "--listen", "off", "--no-ebpf", "--no-nvml", "--no-npu"],
        cwd=cwd, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    return res.stdout + res.stderr


def ticks(url: str, node: str) -> list[float]:
    st = Store.open(url)
    try:
        got = st.query("triscope_ticks_total", node=node, start=0, end=time.time() + 10, max_points=None, rate=False)
        return sorted(v for sd in got for v in sd.values)
    finally:
        st.close()


def test_a_spooled_tick_is_replayed_only_into_its_own_database(pg_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    real = make_url(pg_server.create_database("spool_a"))
    fwd = Forwarder((real.host or "127.0.0.1", int(real.port or 5432)))
    url_a = real.set(host="127.0.0.1", port=fwd.port).render_as_string(hide_password=False)
    spool = tmp_path / "spool"
    # A: its database does not answer; its ticks wait in the spool, in A's database's folder
    out_a = agent(url_a, spool, "node-x", 4, tmp_path)
    mine = spool_dir_for(spool, "node-x", url_a)
    k1 = sum(len(t) for _p, t in Spool(mine).segments())
    assert k1 >= 4, out_a                                   # 4 s at 2 Hz, every tick kept
    # B: another database, same folder, same node name: none of A's ticks, and it says so
    url_b = f"sqlite:///{tmp_path / 'b.db'}"
    upgrade(url_b)
    out_b = agent(url_b, spool, "node-x", 3, tmp_path)
    got_b = ticks(url_b, "node-x")
    assert got_b == [float(i) for i in range(1, len(got_b) + 1)], got_b    # its own run only: 1..n once
    assert "spooled ticks for another database" in out_b and str(mine) in out_b, out_b
    assert sum(len(t) for _p, t in Spool(mine).segments()) == k1           # never touched, never deleted
    # A again with its database back: every spooled tick of A's stored once, beside the new run's
    fwd.open()
    try:
        upgrade(url_a)
        out_a2 = agent(url_a, spool, "node-x", 4, tmp_path)
    finally:
        fwd.close()
    got_a = ticks(real.render_as_string(hide_password=False), "node-x")
    k2 = len(got_a) - k1
    assert k2 >= 4 and sorted(got_a) == sorted([float(i) for i in range(1, k1 + 1)] +
                                               [float(i) for i in range(1, k2 + 1)]), (k1, got_a)
    assert Spool(mine).empty(), out_a2
    assert "replayed" in out_a2, out_a2


def test_ticks_spooled_for_a_query_port_are_not_replayed_into_another_port(pg_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The reported case: ticks spooled for ``…/t1?port=1`` (nothing listens) were replayed into the
    server at ``…/t1?port=<its port>``, and the log said "spool replayed"."""
    real = make_url(pg_server.create_database("spool_q"))
    upgrade(real.render_as_string(hide_password=False))
    base = real.set(port=None).render_as_string(hide_password=False)
    down, up = f"{base}?port=1", f"{base}?port={real.port}"
    spool = tmp_path / "spool"
    out_down = agent(down, spool, "node-q", 3, tmp_path)
    theirs = spool_dir_for(spool, "node-q", down)
    kept = sum(len(t) for _p, t in Spool(theirs).segments())
    assert kept >= 3, out_down
    assert spool_dir_for(spool, "node-q", up) != theirs
    out_up = agent(up, spool, "node-q", 3, tmp_path)
    got = ticks(real.render_as_string(hide_password=False), "node-q")
    assert got == [float(i) for i in range(1, len(got) + 1)], got      # its own run only: 1..n once
    assert "spool replayed" not in out_up, out_up
    assert "spooled ticks for another database" in out_up and str(theirs) in out_up, out_up
    assert sum(len(t) for _p, t in Spool(theirs).segments()) == kept   # kept, for its own database


def test_a_spool_an_earlier_version_kept_is_replayed_into_its_database(pg_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """An upgrade keeps what it can: the folder the earlier version named by host, port and database
    only is replayed where its record matches and the URL leaves nothing to its query."""
    from triscope.agent.spool import legacy_database_identity, tick_to_json
    from triscope.core.samples import Sample, Tick

    real = make_url(pg_server.create_database("spool_legacy"))
    url = real.render_as_string(hide_password=False)
    upgrade(url)
    ident, desc = legacy_database_identity(url) or ("", "")
    old = tmp_path / "spool" / "node-l" / f"db-{ident}"
    old.mkdir(parents=True)
    (old / "db.json").write_text(json.dumps({"id": ident, "database": desc}) + "\n")
    t0 = time.time() - 600
    (old / "seg-000000001.jsonl").write_text("".join(
        tick_to_json(Tick(t0 + i, [Sample("triscope_ticks_total", 1000.0 + i, kind="counter")])) + "\n"
        for i in range(5)))
    # the same folder for a URL whose query moves it is left alone
    out_q = agent(f"{url}?options=-c%20search_path%3Dpublic", tmp_path / "spool", "node-l", 2, tmp_path)
    assert old.is_dir() and "spool replayed" not in out_q, out_q
    out = agent(url, tmp_path / "spool", "node-l", 3, tmp_path)
    got = ticks(url, "node-l")
    assert [v for v in got if v >= 1000] == [1000.0 + i for i in range(5)], got
    assert not old.exists() and "earlier version" in out and "spool replayed" in out, out


def test_the_identity_of_a_database_leaves_out_its_password(tmp_path: Path) -> None:
    a = database_identity("postgresql://alice:secret@db.example:5432/triscope")
    b = database_identity("postgresql://alice:other@db.example:5432/triscope")
    c = database_identity("postgresql://alice:secret@db.example:5432/other")
    d = database_identity("postgresql://bob:secret@db.example:5432/triscope")
    assert a == b and a != c and a != d and "secret" not in a[1]
    s1 = database_identity(f"sqlite:///{tmp_path}/x.db")
    os.chdir(tmp_path)
    s2 = database_identity("sqlite:///x.db")
    assert s1 == s2                                      # the same file, however it is written
    assert spool_dir_for(tmp_path, "n", "sqlite:///x.db").name.startswith("db-")


def test_the_default_spool_folder_is_a_state_directory(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("TRISCOPE_SPOOL_DIR", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    if os.geteuid() == 0:
        assert default_spool_root() == Path("/var/lib/triscope/spool")
    else:
        assert default_spool_root() == tmp_path / "state" / "triscope" / "spool"
    monkeypatch.setenv("TRISCOPE_SPOOL_DIR", str(tmp_path / "mine"))
    assert default_spool_root() == tmp_path / "mine"
