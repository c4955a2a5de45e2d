"""Every store connection gives up on a silent peer: a real PostgreSQL behind a port that nftables
turns into a black hole mid-session (no reply, no reset: what a partitioned leader looks like), and
the pool's and the writer's own connections fail within their documented bound instead of waiting
for the kernel's ~15 minutes (store/db.py ``PG_TCP_DEFAULTS``)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time

import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url
from test_agent_spool_database import Forwarder

from triscope.samples import Sample, Tick
from triscope.store import Store
from triscope.store.db import PG_TCP_DEFAULTS, make_engine, pg_connect_defaults

pytestmark = [pytest.mark.postgres, pytest.mark.slow]
TABLE = f"triscope_silent_{os.getpid()}"


def nft(*args: str) -> None:
    subprocess.run(["nft", *args], check=True, capture_output=True)


@contextlib.contextmanager
def black_hole(port: int):  # type: ignore[no-untyped-def]
    """Packets to and from ``port`` dropped on arrival: the peer goes silent, nothing is reset."""
    nft("add", "table", "inet", TABLE)
    try:
        nft("add", "chain", "inet", TABLE, "in", "{ type filter hook input priority 0; }")
        for d in ("dport", "sport"):
            nft("add", "rule", "inet", TABLE, "in", "tcp", d, str(port), "drop")
        yield
    finally:
        nft("delete", "table", "inet", TABLE)


def test_the_defaults_are_on_every_connection_and_a_url_overrides_them() -> None:
    eng = make_engine("postgresql://u:p@127.0.0.1:1/x")
    args = eng.dialect.create_connect_args(eng.url)[1]
    assert all(k not in args for k in PG_TCP_DEFAULTS)           # they come as connect_args
    assert pg_connect_defaults({}) == PG_TCP_DEFAULTS
    assert pg_connect_defaults({"tcp_user_timeout": "30000"}) == {k: v for k, v in PG_TCP_DEFAULTS.items()
                                                                   if k != "tcp_user_timeout"}


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("nft") is None, reason="needs root and nftables")
def test_a_silent_leader_is_given_up_on_within_the_bound(pg_server) -> None:  # type: ignore[no-untyped-def]
    real = make_url(pg_server.create_database("silent"))
    fwd = Forwarder((real.host or "127.0.0.1", int(real.port or 5432)))
    fwd.open()
    url = real.set(host="127.0.0.1", port=fwd.port).render_as_string(hide_password=False)
    st = Store.open(url)
    try:
        st.upgrade()
        st.write_ticks("n", [Tick(1.0e9, [Sample("triscope_cpu_busy_ratio", 0.1)])])   # the writer's own connection
        with st.engine.connect() as c:                                                   # a pool connection
            c.execute(text("SELECT 1"))
        with black_hole(fwd.port):
            t0 = time.monotonic()
            with pytest.raises(Exception):   # noqa: B017 - the driver's error, whatever its class
                st.write_ticks("n", [Tick(1.0e9 + 1, [Sample("triscope_cpu_busy_ratio", 0.2)])])
            write_s = time.monotonic() - t0
            t0 = time.monotonic()
            with pytest.raises(Exception), st.engine.connect() as c:   # noqa: B017
                c.execute(text("SELECT 1"))
            read_s = time.monotonic() - t0
        # keepalives (5 s idle + 2 x 2 s) or tcp_user_timeout (10 s), and connect_timeout (5 s) for a new one
        assert write_s < 25 and read_s < 25, (write_s, read_s)
    finally:
        st.close()
        fwd.close()
