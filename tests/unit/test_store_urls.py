"""Database URLs: libpq's multi-host form is accepted and reaches psycopg as libpq's host list."""

from __future__ import annotations

from sqlalchemy.dialects.postgresql.psycopg import PGDialect_psycopg
from sqlalchemy.engine import make_url

from triscope.store.db import multi_host_as_query, normalise_url


def test_multi_host_urls_become_host_parameters() -> None:
    url = normalise_url("postgresql://u:p@h1:5432,h2:5433,h3:5434/triscope?target_session_attrs=read-write")
    u = make_url(url)
    assert u.drivername == "postgresql+psycopg" and u.database == "triscope" and u.host is None
    assert u.query["host"] == ("h1:5432", "h2:5433", "h3:5434")
    _args, kw = PGDialect_psycopg().create_connect_args(u)
    assert (kw["host"], kw["port"], kw["target_session_attrs"]) == ("h1,h2,h3", "5432,5433,5434", "read-write")
    assert (kw["user"], kw["password"], kw["dbname"]) == ("u", "p", "triscope")


def test_other_urls_are_unchanged() -> None:
    for url in ("postgresql+psycopg://u@h:5432/db", "sqlite:////tmp/x.db",
                "postgresql+psycopg://u@/db?host=h1:1&host=h2:2&target_session_attrs=prefer-standby"):
        assert multi_host_as_query(url) == url
    assert normalise_url("postgresql://u@h1,h2/db") == "postgresql+psycopg://u@/db?host=h1&host=h2"
