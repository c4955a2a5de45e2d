"""Every store connection gives up on a silent peer: a real PostgreSQL behind a port that nftables
turns into a black hole mid-session (no reply, no reset: what a partitioned leader looks like), and
the pool's and the writer's own connections fail within their documented bound instead of waiting
for the kernel's ~15 minutes (store/db.py ``PG_TCP_DEFAULTS``)."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import struct
import subprocess
import threading
import time

import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url
from tcp_relay import Forwarder

from triscope.core.samples import Sample, Tick
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


class ReplyCutter(Forwarder):
    """A forwarder that, once armed, lets the next request reach the server and cuts the connection
    (a reset) before the server's answer gets back: the commit happened, the client cannot know."""

    def __init__(self, target: tuple[str, int]) -> None:
        super().__init__(target)
        self.armed = threading.Event()
        self.cut = threading.Event()

    def _relay(self, c: socket.socket, u: socket.socket) -> None:
        mine = threading.Event()      # set: this connection's answers are swallowed
        threading.Thread(target=self._up, args=(c, u, mine), daemon=True).start()
        threading.Thread(target=self._down, args=(u, c, mine), daemon=True).start()

    def _up(self, c: socket.socket, u: socket.socket, mine: threading.Event) -> None:
        marked = False
        try:
            while data := c.recv(65536):
                if self.armed.is_set() and not self.cut.is_set():
                    marked = True
                    self.armed.clear()
                    mine.set()                    # the answer to this is never delivered
                u.sendall(data)
                if marked:
                    time.sleep(0.5)               # the server runs (and commits) what it got
                    c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    c.close()                     # a reset: what a dropped connection looks like
                    self.cut.set()
                    return
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                u.shutdown(socket.SHUT_RDWR)

    def _down(self, u: socket.socket, c: socket.socket, mine: threading.Event) -> None:
        try:
            while data := u.recv(65536):
                if mine.is_set():
                    continue                      # swallowed: the client never hears of its commit
                c.sendall(data)
        except OSError:
            pass


@pytest.mark.parametrize("n_ticks", [1, 3])
def test_a_commit_cut_before_its_answer_is_sent_again_and_stored_once(pg_server, n_ticks: int) -> None:  # type: ignore[no-untyped-def]
    """The tick's INSERT reaches the server and commits, the answer is lost with the connection: the
    commit is in doubt, the writer sends the tick again (a fresh connection), and the store keeps
    one row per timestamp with every point."""
    real = make_url(pg_server.create_database(f"resent{n_ticks}"))
    cutter = ReplyCutter((real.host or "127.0.0.1", int(real.port or 5432)))
    cutter.open()
    url = real.set(host="127.0.0.1", port=cutter.port).render_as_string(hide_password=False)
    st = Store.open(url)
    base = 1.0e9
    try:
        st.upgrade()
        names = ("triscope_cpu_busy_ratio", "triscope_tcp_retransmits_total")
        for i in range(3):   # the writer warm: the next tick takes the one-statement steady path
            st.write_ticks("n", [Tick(base + i, [Sample(m, float(i)) for m in names])])
        cut_ts = [base + 3 + k for k in range(n_ticks)]
        cutter.armed.set()
        st.write_ticks("n", [Tick(t, [Sample(m, t - base + j) for j, m in enumerate(names)]) for t in cut_ts])
        assert cutter.cut.is_set(), "the forwarder never cut a request: the test did not test the doubt"
        st.write_ticks("n", [Tick(base + 10, [Sample(m, 10.0) for m in names])])
        with st.engine.connect() as c:
            rows = c.execute(text("SELECT ts, count(*) FROM sample_rows GROUP BY ts ORDER BY ts")).all()
        assert [(float(ts), int(k)) for ts, k in rows] == [(base + i, 1) for i in (0, 1, 2, *range(3, 3 + n_ticks), 10)]
        for j, m in enumerate(names):
            [sd] = st.query(m, node="n", start=base - 1, end=base + 20, max_points=None, rate=False)
            got = dict(zip(sd.ts, sd.values, strict=True))
            assert all(got[t] == t - base + j for t in cut_ts), (m, got)
    finally:
        st.close()
        cutter.close()


def test_the_dashboard_reads_under_a_statement_bound_and_writers_under_none(pg_server) -> None:  # type: ignore[no-untyped-def]
    """A page's query past the reader's bound is cancelled by the server; a writer's statement (a
    synchronous commit waiting for its standby) is never cut."""
    from sqlalchemy.exc import OperationalError

    from triscope.dashboard.app import CONFIG_KEY, create_app
    from triscope.store.db import READ_STATEMENT_TIMEOUT_S

    url = pg_server.create_database("bounded")
    writer = Store.open(url)
    try:
        writer.upgrade()
        with writer.engine.connect() as c:
            assert c.execute(text("SHOW statement_timeout")).scalar() == "0"
        app = create_app(url)
        reader = app.server.config[CONFIG_KEY].store
        with reader.engine.connect() as c:
            assert c.execute(text("SHOW statement_timeout")).scalar() == f"{int(READ_STATEMENT_TIMEOUT_S)}s"
        short = Store.open(url, statement_timeout_s=0.3)
        try:
            t0 = time.monotonic()
            with pytest.raises(OperationalError, match="statement timeout"), short.engine.connect() as c:
                c.execute(text("SELECT pg_sleep(5)"))
            assert time.monotonic() - t0 < 3
        finally:
            short.close()
        reader.close()
        # a setting in the URL's options wins over ours, on the pool and on the writer's own connection
        own = Store.open(url + ("&" if "?" in url else "?") + "options=-c%20statement_timeout%3D1234",
                         statement_timeout_s=READ_STATEMENT_TIMEOUT_S)
        try:
            with own.engine.connect() as c:
                assert c.execute(text("SHOW statement_timeout")).scalar() == "1234ms"
                assert c.execute(text("SHOW jit")).scalar() == "off"          # ours still there
            assert own.writer.connection().execute("SHOW statement_timeout").fetchone()[0] == "1234ms"
        finally:
            own.close()
    finally:
        writer.close()
