"""Engine creation, URL handling and schema upgrades."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

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


# libpq's multi-host form, ``postgresql://u@h1:5432,h2:5432/db``: SQLAlchemy's URL parser refuses it
# (it reads one host and one port), so it becomes SQLAlchemy's spelling of the same thing,
# ``postgresql+psycopg://u@/db?host=h1:5432&host=h2:5432``, which psycopg 3 gets as libpq's
# ``host=h1,h2 port=5432,5432`` (libpq then tries each in turn; ``target_session_attrs`` chooses).
_MULTI_HOST = re.compile(r"^(?P<scheme>postgres(?:ql)?(?:\+\w+)?://)(?P<auth>[^@/?#]*@)?"
                         r"(?P<hosts>[^@/?#]*,[^/?#]*)(?P<rest>[/?#].*)?$")


def multi_host_as_query(url: str) -> str:
    """``scheme://user@h1:p1,h2:p2/db?opts`` → ``scheme://user@/db?host=h1:p1&host=h2:p2&opts``;
    any other URL unchanged."""
    m = _MULTI_HOST.match(url)
    if m is None:
        return url
    hosts = [h for h in m["hosts"].split(",") if h]
    path, _, query = (m["rest"] or "/").partition("?")
    params = "&".join(f"host={h}" for h in hosts)
    return f"{m['scheme']}{m['auth'] or ''}{path or '/'}?{params}{'&' + query if query else ''}"


def normalise_url(url: str) -> str:
    """Accept the URLs people paste: plain ``postgresql://`` means psycopg 3, a bare path SQLite,
    libpq's multi-host ``h1:p1,h2:p2`` becomes ``?host=h1:p1&host=h2:p2``."""
    url = multi_host_as_query(url.strip())
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


def sqlite_path(url: str) -> Path | None:
    """The file a ``sqlite:///FILE`` URL names (None for other databases and in-memory SQLite)."""
    u = make_url(normalise_url(url))
    if not u.drivername.startswith("sqlite") or not u.database or u.database == ":memory:" \
            or u.database.startswith("file:"):
        return None
    return Path(u.database)


SQLITE_MAGIC = b"SQLite format 3\x00"


def check_sqlite_file(url: str) -> None:
    """Refuse, with the reason, a SQLite path that cannot work: a directory, a missing or read-only
    directory (SQLite writes its -wal and -shm files beside the database), a file this process
    cannot read and write, a file that is not a SQLite database.  A missing file is fine: it is
    created.  Nothing to check for PostgreSQL."""
    path = sqlite_path(url)
    if path is None:
        return
    parent = path.parent
    if path.is_dir():
        raise StoreError(f"database path {path} is a directory, not a SQLite file")
    if not parent.is_dir():
        raise StoreError(f"database path {path}: directory {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise StoreError(f"database path {path}: directory {parent} is not writable (SQLite keeps its "
                         "-wal and -shm files beside the database)")
    if not path.exists():
        return
    if not path.is_file():
        raise StoreError(f"database path {path} is not a regular file")
    try:
        with path.open("r+b") as f:
            head = f.read(len(SQLITE_MAGIC))
    except OSError as e:
        raise StoreError(f"database file {path} cannot be opened for reading and writing: "
                         f"{e.strerror or e}") from None
    if head and head != SQLITE_MAGIC:
        raise StoreError(f"database file {path} is not a SQLite database (it starts with {head[:16]!r})")


def error_line(e: BaseException) -> str:
    """The cause of a database error in one line: the driver's own message (``file is not a
    database``, ``connection refused``), not SQLAlchemy's wrapper with its SQL and help link."""
    orig = getattr(e, "orig", None)
    text_ = str(orig if orig is not None else e).strip()
    lines = [ln for ln in text_.splitlines() if ln.strip() and not ln.startswith(("(Background on", "[SQL:",
                                                                                   "[parameters:"))]
    return lines[0].strip() if lines else type(e).__name__


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

# Every connection gives up on a silent peer (a partitioned leader: no reply, no reset) instead of
# waiting for the kernel's ~15 minutes: libpq's TCP keepalives (an idle connection probed after 5 s,
# every 2 s, dropped after 2 unanswered probes: ~9 s) and ``tcp_user_timeout`` (data unacknowledged
# for 10 s: the connection is dropped).  A parameter in the URL wins (``?tcp_user_timeout=30000``).
# A commit cut this way is in doubt: the writer re-sends the tick, and a re-sent tick leaves one row.
PG_TCP_DEFAULTS: dict[str, int] = {"keepalives": 1, "keepalives_idle": 5, "keepalives_interval": 2,
                                   "keepalives_count": 2, "tcp_user_timeout": 10000}


def pg_connect_defaults(query: Mapping[str, Any]) -> dict[str, Any]:
    """The connect arguments every PostgreSQL connection gets, less those the URL sets itself."""
    return {k: v for k, v in PG_TCP_DEFAULTS.items() if k not in query}


# A reader's bound (the dashboard): a page's query that runs past it is cancelled by the server
# and the page says so, instead of holding a worker and a connection.  Readers only: a writer's
# statement is never cut (a synchronous commit waits for its standby, see docs/scaling.md).
READ_STATEMENT_TIMEOUT_S = 30.0


def make_engine(url: str | None = None, *, echo: bool = False, statement_timeout_s: float | None = None) -> Engine:
    """The store's SQLAlchemy engine; ``statement_timeout_s`` bounds every statement on PostgreSQL
    (readers only: ``READ_STATEMENT_TIMEOUT_S``; a setting in the URL's ``options`` wins)."""
    url = normalise_url(url or default_url())
    if url.startswith("sqlite"):
        engine = create_engine(url, echo=echo, connect_args={"timeout": 10, "check_same_thread": False})
        event.listen(engine, "connect", sqlite_on_connect)
    else:
        engine = create_engine(
            url, echo=echo, pool_pre_ping=True, pool_size=5, max_overflow=5,
            connect_args={"connect_timeout": 5, "options": with_url_options(_options(statement_timeout_s), make_url(url).query),
                          **pg_connect_defaults(make_url(url).query)},
        )
    return engine


def with_url_options(ours: str, query: Mapping[str, Any]) -> str:
    """Our ``options`` and then the URL's (``?options=-c statement_timeout=5000``): a later ``-c``
    wins, so a setting in the URL overrides ours (connect_args would otherwise replace the URL's)."""
    given = query.get("options")
    if isinstance(given, tuple | list):
        given = " ".join(str(x) for x in given)
    return f"{ours} {given}" if given else ours


def _options(statement_timeout_s: float | None) -> str:
    if statement_timeout_s is None:
        return PG_OPTIONS
    return f"{PG_OPTIONS} -c statement_timeout={int(statement_timeout_s * 1000)}"


def check_reachable(engine: Engine) -> None:
    try:
        with engine.connect() as c:
            c.execute(text("SELECT 1"))
    except OperationalError as e:
        raise StoreError(f"database {engine.url.render_as_string(hide_password=True)} is unreachable: "
                         f"{error_line(e)}") from None
    except SQLAlchemyError as e:
        raise StoreError(f"database {engine.url.render_as_string(hide_password=True)}: {error_line(e)}") from None


def alembic_config(url: str):
    from alembic.config import Config

    from triscope import migrations

    cfg = Config()
    cfg.set_main_option("script_location", str(Path(migrations.__file__).parent))
    cfg.set_main_option("sqlalchemy.url", normalise_url(url).replace("%", "%%"))
    return cfg


def upgrade(url: str, revision: str = "head") -> None:
    """Bring the schema to ``revision`` (Alembic)."""
    from alembic import command

    check_sqlite_file(url)
    engine = make_engine(url)
    check_reachable(engine)
    engine.dispose()
    try:
        command.upgrade(alembic_config(url), revision)
    except SQLAlchemyError as e:
        raise StoreError(f"schema upgrade of {make_url(normalise_url(url)).render_as_string(hide_password=True)} "
                         f"failed: {error_line(e)}") from None
