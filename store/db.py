"""Engine creation, URL handling and schema upgrades."""

from __future__ import annotations

import os
from pathlib import Path

from sqlalchemy import create_engine, event, text
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import ArgumentError, OperationalError, SQLAlchemyError

DEFAULT_DB_FILE = "triscope.db"
ENV_DB_URL = "TRISCOPE_DB_URL"


class StoreError(Exception):
    """A store problem worth one clear line to the user (unreachable, bad URL, not migrated)."""


def default_url() -> str:
    """``TRISCOPE_DB_URL`` or a SQLite file in the working directory."""
    return os.environ.get(ENV_DB_URL) or f"sqlite:///{Path.cwd() / DEFAULT_DB_FILE}"


def normalise_url(url: str) -> str:
    """Accept the URLs people paste: plain ``postgresql://`` means psycopg 3, a bare path SQLite."""
    url = url.strip()
    if "://" not in url:
        if url.endswith((".db", ".sqlite", ".sqlite3")) or "/" in url:
            return f"sqlite:///{Path(url).resolve()}"
        raise StoreError(f"database URL {url!r} is not a URL (expected sqlite:///FILE or postgresql://...)")
    try:
        u = make_url(url)
    except ArgumentError as e:
        raise StoreError(f"database URL {url!r} is malformed: {e}") from None
    if u.drivername in ("postgresql", "postgres"):
        u = u.set(drivername="postgresql+psycopg")
    if not u.drivername.startswith(("sqlite", "postgresql")):
        raise StoreError(f"database URL {url!r}: only sqlite and postgresql are supported")
    return u.render_as_string(hide_password=False)


def sqlite_on_connect(dbapi_conn, _record) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA busy_timeout=10000")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.close()


# Every connection: no JIT.  The store's statements are short (a tick's insert, a node's
# roll-up, a range read); JIT compiling them showed up in its profile under fleet load, for no gain.
PG_OPTIONS = "-c jit=off"


def make_engine(url: str | None = None, *, echo: bool = False) -> Engine:
    url = normalise_url(url or default_url())
    if url.startswith("sqlite"):
        engine = create_engine(url, echo=echo, connect_args={"timeout": 10, "check_same_thread": False})
        event.listen(engine, "connect", sqlite_on_connect)
    else:
        engine = create_engine(
            url, echo=echo, pool_pre_ping=True, pool_size=5, max_overflow=5,
            connect_args={"connect_timeout": 5, "options": PG_OPTIONS},
        )
    return engine


def check_reachable(engine: Engine) -> None:
    try:
        with engine.connect() as c:
            c.execute(text("SELECT 1"))
    except OperationalError as e:
        raise StoreError(f"database {engine.url.render_as_string(hide_password=True)} is unreachable: "
                         f"{str(e.orig).strip().splitlines()[0] if e.orig else e}") from None
    except SQLAlchemyError as e:
        raise StoreError(f"database {engine.url.render_as_string(hide_password=True)}: {e}") from None


def alembic_config(url: str):
    from alembic.config import Config

    import migrations

    cfg = Config()
    cfg.set_main_option("script_location", str(Path(migrations.__file__).parent))
    cfg.set_main_option("sqlalchemy.url", normalise_url(url).replace("%", "%%"))
    return cfg


def upgrade(url: str, revision: str = "head") -> None:
    """Bring the schema to ``revision`` (Alembic)."""
    from alembic import command

    engine = make_engine(url)
    check_reachable(engine)
    engine.dispose()
    command.upgrade(alembic_config(url), revision)
