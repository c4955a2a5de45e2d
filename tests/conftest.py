"""Shared fixtures: real servers the tests start themselves.

``pg_url`` starts a private PostgreSQL cluster (Debian's postgresql binaries, run as the
``postgres`` user when we are root) on a free loopback port for the whole session and stops it
at the end.  ``db_url`` runs a test on SQLite and on that PostgreSQL server.  ``store`` is a
migrated SQLite store, ``any_store`` a migrated store on both (closed after the test).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from triscope.store import Store

REPO = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _pg_bindir() -> Path | None:
    base = Path("/usr/lib/postgresql")
    if not base.is_dir():
        return None
    versions = sorted((p for p in base.iterdir() if (p / "bin" / "initdb").exists()), key=lambda p: int(p.name))
    return versions[-1] / "bin" if versions else None


FAST_SETTINGS = "fsync = off\nsynchronous_commit = off\nfull_page_writes = off\n"
"""Not durable: an acknowledged commit may be lost when the server crashes.  For tests that never
crash the server (the session's ``pg_server``)."""
DURABLE_SETTINGS = "fsync = on\nsynchronous_commit = on\nfull_page_writes = on\n"
"""As production runs it: for tests that crash the server and count what survived
(``durable_pg_server``)."""


class PostgresServer:
    """A throw-away PostgreSQL cluster in a temp dir.  ``stop()`` / ``start()`` for outage tests;
    ``durable``: configured as production (``DURABLE_SETTINGS``), else fast (``FAST_SETTINGS``)."""

    def __init__(self, durable: bool = False) -> None:
        bindir = _pg_bindir()
        if bindir is None:
            raise RuntimeError("PostgreSQL server binaries not found: run 'make test' (it installs postgresql)")
        self.bindir = bindir
        self.dir = Path(tempfile.mkdtemp(prefix="triscope-pg-"))
        self.data = self.dir / "data"
        self.port = free_port()
        self.as_user: list[str] = []
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres", "postgres")
            self.as_user = ["runuser", "-u", "postgres", "--"]
        self._run([str(bindir / "initdb"), "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8"])
        with open(self.data / "postgresql.conf", "a") as f:
            f.write(f"\nport = {self.port}\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '{self.dir}'\n"
                    + (DURABLE_SETTINGS if durable else FAST_SETTINGS) + "max_connections = 200\n"
                    "shared_buffers = 256MB\n")
        self.start()

    def _run(self, cmd: list[str]) -> None:
        subprocess.run(self.as_user + cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def start(self) -> None:
        self._run([str(self.bindir / "pg_ctl"), "-D", str(self.data), "-l", str(self.dir / "log"), "-w", "start"])

    def stop(self, mode: str = "fast") -> None:
        self._run([str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop"])

    def create_database(self, name: str) -> str:
        self._run([str(self.bindir / "createdb"), "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", name])
        return self.url(name)

    def url(self, name: str) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{name}"

    def destroy(self) -> None:
        with contextlib.suppress(Exception):
            self.stop("immediate")
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PostgresServer]:
    server = PostgresServer()
    yield server
    server.destroy()


@pytest.fixture(scope="session")
def durable_pg_server() -> Iterator[PostgresServer]:
    """A PostgreSQL configured as production (fsync, synchronous_commit, full_page_writes on): for
    the tests that crash it and count what an acknowledged commit kept."""
    server = PostgresServer(durable=True)
    yield server
    server.destroy()


@pytest.fixture
def pg_url(pg_server: PostgresServer) -> str:
    """A fresh, empty database on the session's PostgreSQL server."""
    return pg_server.create_database("t_" + uuid.uuid4().hex[:12])


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'triscope.db'}"


@pytest.fixture
def seeded_url(sqlite_url: str) -> str:
    """A SQLite store with the dashboard's demo seed (one cycle of 30 s phases, ending now)."""
    from demo_seed import seed_demo

    from triscope.store import Store

    st = Store.open(sqlite_url)
    st.upgrade()
    seed_demo(st, time.time(), phase_s=30, cycles=1)
    st.close()
    return sqlite_url


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Run the test on SQLite and on the real PostgreSQL server."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'triscope.db'}"
    server: PostgresServer = request.getfixturevalue("pg_server")
    return server.create_database("t_" + uuid.uuid4().hex[:12])


def _migrated(url: str) -> Iterator[Store]:
    from triscope.store import Store

    st = Store.open(url)
    st.upgrade()
    try:
        yield st
    finally:
        st.close()


@pytest.fixture
def store(sqlite_url: str) -> Iterator[Store]:
    """A migrated SQLite store, closed after the test."""
    yield from _migrated(sqlite_url)


@pytest.fixture
def any_store(db_url: str) -> Iterator[Store]:
    """A migrated store, the test run on SQLite and on the real PostgreSQL server (``db_url``)."""
    yield from _migrated(db_url)


def wait_for_port(port: int, host: str = "127.0.0.1", timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            s.settimeout(0.2)
            if s.connect_ex((host, port)) == 0:
                return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listening on {host}:{port} after {timeout}s")


@pytest.fixture
def unused_port() -> int:
    return free_port()


@pytest.fixture
def cgroups():  # type: ignore[no-untyped-def]
    """cgroup v2 directories a test makes under this machine's hierarchy (tests/workloads_helpers.py),
    removed afterwards; the tests that take it are skipped where none can be made (they say why)."""
    from workloads_helpers import Cgroups, cgroup_skip_reason, writable_cgroup_root

    root = writable_cgroup_root()
    if root is None:
        pytest.skip(cgroup_skip_reason())
    cg = Cgroups(root)
    yield cg
    cg.cleanup()
