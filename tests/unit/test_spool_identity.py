"""A database's identity (the spool folder it names, where spooled ticks are replayed) is where its
URL connects, however the URL writes it: one test per form libpq accepts, and the folders an
earlier version kept under its narrower identity taken over only where that cannot be wrong."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from triscope.agent.spool import (
    Spool,
    adopt_legacy_spool,
    database_identity,
    legacy_database_identity,
    spool_dir_for,
    survey,
)
from triscope.core.samples import Sample, Tick

PG = "postgresql://alice@db.example"


def same(a: str, b: str) -> bool:
    return database_identity(a) == database_identity(b)


@pytest.fixture(autouse=True)
def _no_libpq_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for var in ("PGHOST", "PGHOSTADDR", "PGPORT", "PGDATABASE", "PGUSER", "PGOPTIONS", "PGSERVICE",
                "PGSERVICEFILE", "PGTARGETSESSIONATTRS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("PGSYSCONFDIR", str(tmp_path / "no-sysconf"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


def test_a_query_port_is_the_port() -> None:
    # the reported case: ticks spooled for ?port=1 were replayed into the server at ?port=19530
    assert not same(f"{PG}/t1?port=1", f"{PG}/t1?port=19530")
    assert same(f"{PG}/t1?port=19530", f"{PG}:19530/t1")
    assert same(f"{PG}:5/t1?port=19530", f"{PG}:19530/t1")        # libpq: the query's port wins
    assert not same(f"{PG}/t1?port=1", f"{PG}/t1")


def test_a_query_host_is_the_host() -> None:
    assert not same("postgresql://alice@/t1?host=a", "postgresql://alice@/t1?host=b")
    assert same("postgresql://alice@x/t1?host=a", "postgresql://alice@a/t1")      # the query's host wins
    assert same("postgresql://alice@/t1?host=a&port=7", "postgresql://alice@a:7/t1")
    assert same("postgresql://alice@h1:1,h2:2/t1", "postgresql://alice@/t1?host=h1:1&host=h2:2")
    assert not same("postgresql://alice@h1:1,h2:2/t1", "postgresql://alice@h1:1,h2:3/t1")
    assert not same(f"{PG}/t1?hostaddr=10.0.0.1", f"{PG}/t1?hostaddr=10.0.0.2")
    assert not same("postgresql://alice@/t1?host=/run/a", "postgresql://alice@/t1?host=/run/b")


def test_a_query_dbname_is_the_database() -> None:
    assert same(f"{PG}/t1?dbname=other", f"{PG}/other")
    assert not same(f"{PG}/t1?dbname=other", f"{PG}/t1")


def test_a_service_is_where_its_entries_say(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    services = tmp_path / "pg_service.conf"
    services.write_text("# services\n[one]\nhost=db1.example\nport=6001\ndbname=prod\n\n"
                        "[two]\nhost=db2.example\nport=6002\ndbname=prod\n")
    monkeypatch.setenv("PGSERVICEFILE", str(services))
    one, two = database_identity("postgresql://alice@/?service=one"), database_identity("postgresql://alice@/?service=two")
    assert one != two
    assert "db1.example:6001/prod" in one[1] and "db2.example:6002/prod" in two[1]
    assert not same("postgresql://alice@/?service=one", "postgresql://alice@/?service=three")
    # what the URL says wins over the service's entry, as in libpq
    assert "db1.example:7000/prod" in database_identity("postgresql://alice@/?service=one&port=7000")[1]


def test_options_and_target_session_attrs_are_part_of_it() -> None:
    assert not same(f"{PG}/t1?options=-c%20search_path%3Da", f"{PG}/t1?options=-c%20search_path%3Db")
    assert not same(f"{PG}/t1?options=-c%20search_path%3Da", f"{PG}/t1")
    assert not same(f"{PG}/t1?target_session_attrs=read-write", f"{PG}/t1?target_session_attrs=standby")
    # how it connects is not where: TLS, timeouts, the application name
    assert same(f"{PG}/t1?sslmode=require&connect_timeout=3&application_name=x", f"{PG}/t1")


def test_user_and_default_port() -> None:
    assert not same("postgresql://alice@db/t", "postgresql://bob@db/t")
    assert same("postgresql://alice:secret@db/t", "postgresql://alice:other@db/t")
    assert "secret" not in database_identity("postgresql://alice:secret@db/t")[1]
    assert same("postgresql://alice@localhost/t", "postgresql://alice@localhost:5432/t")
    assert same("postgresql://alice@LocalHost/t", "postgres://alice@localhost:5432/t")
    assert same("postgresql://alice@localhost/t", "postgresql+psycopg://alice@localhost:5432/t")


def test_the_environment_libpq_reads_is_part_of_it(monkeypatch: pytest.MonkeyPatch) -> None:
    plain = database_identity("postgresql://alice@db/t")
    monkeypatch.setenv("PGPORT", "6000")
    assert database_identity("postgresql://alice@db/t") != plain
    assert same("postgresql://alice@db/t", "postgresql://alice@db:6000/t")


def tick(i: int) -> Tick:
    return Tick(1_800_000_000.0 + i, [Sample("triscope_ticks_total", float(i + 1), kind="counter")])


def legacy_folder(root: Path, node: str, url: str, recorded: str | None = None) -> Path:
    """A spool folder as the earlier version kept it for ``url``: named by its legacy identity,
    its db.json recording the legacy description, three ticks in it."""
    ident, desc = legacy_database_identity(url) or ("", "")
    d = root / node / f"db-{ident}"
    sp = Spool(d)
    sp.append([tick(i) for i in range(3)])
    (d / "db.json").write_text(json.dumps({"id": ident, "database": recorded or desc}) + "\n")
    return d


def test_a_legacy_folder_is_taken_over_when_its_record_matches_and_the_url_is_plain(tmp_path: Path) -> None:
    url = "postgresql://alice@db.example:5432/t1"
    old = legacy_folder(tmp_path, "n", url)
    assert adopt_legacy_spool(tmp_path, "n", url) is not None
    new = spool_dir_for(tmp_path, "n", url)
    assert not old.exists() and new.is_dir()
    sp = Spool(new, database=url)
    assert [t.ts for _p, ts in sp.segments() for t in ts] == [tick(i).ts for i in range(3)]
    assert json.loads((new / "db.json").read_text())["database"] == database_identity(url)[1]
    assert survey(tmp_path, new) == []


@pytest.mark.parametrize("query", ["port=19530", "dbname=other", "service=prod", "options=-c%20search_path%3Dx",
                                   "host=elsewhere", "hostaddr=10.0.0.9", "target_session_attrs=standby"])
def test_a_legacy_folder_is_left_where_the_url_puts_anything_in_its_query(tmp_path: Path, query: str) -> None:
    # the earlier version named ?port=1 and ?port=19530 alike: what it kept may be for either
    url = f"postgresql://alice@db.example/t1?{query}"
    old = legacy_folder(tmp_path, "n", url)
    assert adopt_legacy_spool(tmp_path, "n", url) is None
    assert old.is_dir() and len(list(old.glob("seg-*.jsonl"))) == 1
    left = survey(tmp_path, spool_dir_for(tmp_path, "n", url))
    assert [e.path for e in left] == [old] and "earlier version" in left[0].database


def test_a_legacy_folder_whose_record_differs_is_left(tmp_path: Path) -> None:
    url = "postgresql://alice@db.example/t1"
    old = legacy_folder(tmp_path, "n", url, recorded="postgresql://other.example:/t1")
    assert adopt_legacy_spool(tmp_path, "n", url) is None
    assert old.is_dir()


def test_a_sqlite_folder_keeps_its_name(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/x.db"
    assert database_identity(url)[1] == f"sqlite:{tmp_path}/x.db"
    assert legacy_database_identity(url) is None
