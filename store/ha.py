"""High availability: which server a connection reached, and how stale a standby is.

triscope runs on a Patroni cluster in synchronous mode (docs/scaling.md#high-availability).  The
writers (agents, the remediation engine, ``triscope db upgrade``) connect with a multi-host URL and
``target_session_attrs=read-write``, so libpq picks whichever server is the leader; the dashboard
may read from a standby (``prefer-standby``) and says how far behind it is.  Upkeep that writes
(partitions, retention) runs only on the leader: on a standby it is skipped with a log line.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import text
from sqlalchemy.engine import Connection, Engine


@dataclass(frozen=True, slots=True)
class ServerRole:
    """``standby``: the server is a hot standby (read-only, replaying WAL).  ``replay_lag_s``: on a
    standby, seconds since the newest replayed transaction committed on the leader (None when
    nothing has been replayed yet, and on the leader)."""

    standby: bool
    replay_lag_s: float | None


def is_standby(conn: Connection) -> bool:
    """True on a PostgreSQL hot standby; False on the leader and on SQLite."""
    if conn.dialect.name != "postgresql":
        return False
    return bool(conn.execute(text("SELECT pg_is_in_recovery()")).scalar_one())


def server_role(engine: Engine) -> ServerRole:
    """What the server a new connection of ``engine`` reaches is (SQLite: a leader of one)."""
    if engine.dialect.name != "postgresql":
        return ServerRole(False, None)
    with engine.connect() as conn:
        standby, lag = conn.execute(text(
            "SELECT pg_is_in_recovery(), "
            "CASE WHEN pg_is_in_recovery() THEN extract(epoch FROM now() - pg_last_xact_replay_timestamp()) END"
        )).one()
    return ServerRole(bool(standby), None if lag is None else max(0.0, float(lag)))
