"""A bounded on-disk spool for ticks the store could not take.

Ticks are appended as JSON lines to segment files; ``segments()`` hands them back oldest first.
When the spool would exceed ``max_bytes`` the oldest segment is dropped and its samples counted
as dropped (the only way samples are ever lost, and it is counted and exported).

**A spooled tick belongs to the database it was meant for.**  The folder of one agent's spool is
``<root>/<node>/db-<id>/`` (``spool_dir_for``): ``<id>`` names the database by where its URL
connects, never by the URL's text (``database_identity``: for PostgreSQL the hosts and ports
wherever the URL writes them — the authority, ``?host=``, ``?port=``, ``?hostaddr=``, a
``?service=``'s entries — the database, ``?dbname=`` included, the user, ``?options=`` and
``?target_session_attrs=``, with libpq's defaults and ``PG*`` environment filled in; a SQLite file by
its absolute path; never the password), and ``db.json`` in the folder says which one in words.  An
agent replays only its own database's folder; ``survey`` lists what waits for other databases (and
segments of spools from before this layout, whose database is unknown), so the agent can say so
at start — never replayed, never deleted.  A folder an earlier version kept under its narrower
identity (host, port and database of the authority only) is taken over only where what it recorded
is what that version said of this URL and this URL leaves nothing to the query
(``adopt_legacy_spool``).  The same URL is the same database: a backup restored at that URL takes
what was spooled for it.

**Whole records or none.**  A tick is appended with one unbuffered write of whole JSON lines; a
write the disk cannot take (ENOSPC mid-record, a failed fsync) is cut back to the last whole record
before ``append`` returns False and counts the ticks as dropped, once.  A torn tail a crash left is
cut at start.  ``pending_samples`` is the samples the segment files hold.

The default root is a state directory, not the working directory of whoever started the agent
(``default_spool_root``): ``$TRISCOPE_SPOOL_DIR``, else ``/var/lib/triscope/spool`` as root (the
DaemonSet's hostPath), else ``$XDG_STATE_HOME/triscope/spool`` (``~/.local/state/triscope/spool``).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy.engine import make_url

from triscope.core.samples import EventRecord, Sample, Tick
from triscope.store.db import normalise_url

log = logging.getLogger(__name__)

SEGMENT_BYTES = 1 << 20
IDENTITY_FILE = "db.json"


# libpq's connection keywords that decide which server and database a connection reaches, and as
# whom (the rest, e.g. sslmode, keepalives, application_name, change how, not where)
_PG_WHERE = ("host", "hostaddr", "port", "dbname", "user", "service", "servicefile", "options",
             "target_session_attrs")
_PG_DEFAULT_PORT = "5432"


def database_identity(url: str) -> tuple[str, str]:
    """(id, description) of the database a URL points at: where a connection made from it arrives,
    credentials left out.  PostgreSQL: what libpq is handed (``create_connect_args`` of the URL's
    dialect, so a query's ``?host=``/``?port=``/``?dbname=`` wins over the authority exactly as it
    does when connecting), a service's entries from its service file, the ``PG*`` environment and
    libpq's defaults filled in (``localhost`` is ``localhost:5432``); its hosts and ports in order,
    user, database, ``options``, ``service`` and ``target_session_attrs``.  SQLite: the file's
    absolute path.  The password is never part of it."""
    try:
        u = make_url(normalise_url(url))
    except Exception:  # noqa: BLE001 - an unparsable URL is its own identity (the agent refuses it later)
        desc = url.split("@")[-1]
    else:
        if u.get_backend_name() == "sqlite":
            desc = _sqlite_description(u.database or "")
        elif u.get_backend_name() == "postgresql":
            desc = _pg_description(u)
        else:
            desc = u.set(password=None).render_as_string(hide_password=True)
    return hashlib.sha256(desc.encode()).hexdigest()[:12], desc


def _sqlite_description(db: str) -> str:
    if db.startswith("file:"):               # a URI filename (``?uri=true``): its path part
        db = db[5:].split("?", 1)[0]
    return f"sqlite:{os.path.realpath(db) if db and db != ':memory:' else db or ':memory:'}"


def pg_connect_params(u: object) -> dict[str, str]:
    """The libpq keywords a PostgreSQL URL connects with (as the store's driver receives them),
    with the service file, the environment and libpq's defaults applied as libpq applies them."""
    from sqlalchemy.engine import URL

    assert isinstance(u, URL)
    try:
        from psycopg.conninfo import conninfo_to_dict, make_conninfo

        _args, cparams = u.get_dialect()().create_connect_args(u)
        given = {k: str(v) for k, v in conninfo_to_dict(make_conninfo("", **cparams)).items() if v is not None}
    except Exception:  # noqa: BLE001 - another driver, or psycopg absent: the URL read as libpq reads it
        given = {k: (",".join(v) if isinstance(v, tuple) else str(v)) for k, v in u.query.items()}
        for key, val in (("host", u.host), ("port", u.port), ("dbname", u.database), ("user", u.username)):
            if val is not None and key not in given:
                given[key] = str(val)
    params = {k: v for k, v in given.items() if k in _PG_WHERE}
    service = params.get("service") or os.environ.get("PGSERVICE")
    if service:
        params["service"] = service
        for k, v in _pg_service(service, params.get("servicefile")).items():
            params.setdefault(k, v)          # what the connection string says wins over the service
    for k, v in _pg_defaults().items():
        params.setdefault(k, v)
    if not params.get("dbname"):
        params["dbname"] = params.get("user", "")
    return params


def _pg_defaults() -> dict[str, str]:
    """libpq's defaults for the keywords that decide where (its ``PG*`` environment variables, then
    its compiled-in values, e.g. port 5432 and the OS user)."""
    try:
        from psycopg import pq

        out = {d.keyword.decode(): d.val.decode() for d in pq.Conninfo.get_defaults()
               if d.val is not None and d.keyword.decode() in _PG_WHERE}
    except Exception:  # noqa: BLE001 - no libpq here: its documented environment and defaults
        import getpass

        env = {"host": "PGHOST", "hostaddr": "PGHOSTADDR", "port": "PGPORT", "dbname": "PGDATABASE",
               "user": "PGUSER", "options": "PGOPTIONS", "target_session_attrs": "PGTARGETSESSIONATTRS"}
        out = {k: os.environ[e] for k, e in env.items() if os.environ.get(e)}
        out.setdefault("port", _PG_DEFAULT_PORT)
        out.setdefault("user", getpass.getuser())
    return {k: v for k, v in out.items() if v != ""}


def _pg_service(name: str, servicefile: str | None) -> dict[str, str]:
    """The entries of service ``name`` as libpq finds them: the user's service file
    (``servicefile``, ``$PGSERVICEFILE`` or ``~/.pg_service.conf``) first, then the system one
    (``$PGSYSCONFDIR/pg_service.conf``); {} where none defines it."""
    user_file = servicefile or os.environ.get("PGSERVICEFILE") or os.path.expanduser("~/.pg_service.conf")
    sysconf = os.environ.get("PGSYSCONFDIR") or "/etc/postgresql-common"
    for path in (user_file, os.path.join(sysconf, "pg_service.conf")):
        try:
            text = Path(path).read_text(errors="replace")
        except OSError:
            continue
        section: str | None = None
        found: dict[str, str] = {}
        for raw in text.splitlines():
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            if line.startswith("[") and line.endswith("]"):
                if section == name:
                    break
                section = line[1:-1].strip()
                continue
            if section == name and "=" in line:
                k, _, v = line.partition("=")
                found[k.strip()] = v.strip()
        if section == name:
            return found
    return {}


def _pg_description(u: object) -> str:
    p = pg_connect_params(u)
    hosts = p.get("host", "").split(",")
    addrs = p.get("hostaddr", "").split(",") if p.get("hostaddr") else []
    n = max(len(hosts), len(addrs))
    hosts += [""] * (n - len(hosts))
    ports = p.get("port", "").split(",")
    if len(ports) == 1:
        ports = ports * n                    # one port: every host's
    ends = []
    for i in range(n):
        h = hosts[i].strip()
        h = h if h.startswith(("/", "@")) else h.lower()       # a socket directory keeps its case
        if not h and not (i < len(addrs) and addrs[i].strip()):
            h = "(default socket)"
        addr = f"[{addrs[i].strip()}]" if i < len(addrs) and addrs[i].strip() else ""
        port = ports[i].strip() if i < len(ports) and ports[i].strip() else _PG_DEFAULT_PORT
        ends.append(f"{h}{addr}:{port}")
    extra = []
    if p.get("options", "").strip():
        extra.append(f"options={' '.join(p['options'].split())}")
    if p.get("service"):
        extra.append(f"service={p['service']}")
    if p.get("target_session_attrs", "any") != "any":
        extra.append(f"target_session_attrs={p['target_session_attrs']}")
    return f"postgresql://{p.get('user', '')}@{','.join(ends)}/{p.get('dbname', '')}" + \
        (f"?{'&'.join(extra)}" if extra else "")


def legacy_database_identity(url: str) -> tuple[str, str] | None:
    """(id, description) the spool gave a URL's database before the identity was the whole URL
    (dialect, the authority's host and port, database; the query and the user left out), for
    PostgreSQL; None for SQLite (its identity has not changed) and an unparsable URL."""
    from sqlalchemy.engine import make_url

    try:
        u = make_url(url)
    except Exception:  # noqa: BLE001 - nothing to carry over
        return None
    backend = u.get_backend_name()
    if backend != "postgresql":
        return None
    host = (u.host or "").lower()
    hosts = u.query.get("host")
    if hosts and not host:
        host = ",".join(hosts) if isinstance(hosts, tuple) else str(hosts)
    desc = f"{backend}://{host}:{u.port or ''}/{u.database or ''}"
    return hashlib.sha256(desc.encode()).hexdigest()[:12], desc


def _legacy_is_unambiguous(url: str) -> bool:
    """Whether the legacy description of ``url`` said everything about where it connects: nothing
    in its query moves it (a ``?port=``, ``?dbname=``, ``?service=``, ``?options=``, ...), nor a
    ``?host=`` beside the authority's host (the legacy description read neither)."""
    try:
        u = make_url(normalise_url(url))
    except Exception:  # noqa: BLE001
        return False
    moving = set(u.query) & (set(_PG_WHERE) - {"host", "user"})
    return not moving and not (u.host and "host" in u.query)


def adopt_legacy_spool(root: str | os.PathLike[str], node: str, url: str) -> str | None:
    """An upgrade keeps what it can, and never sends to the wrong database: the folder an earlier
    version kept for this URL (``legacy_database_identity``) becomes this database's folder when
    the description recorded in it is the one that version gave this URL, and this URL's legacy
    description was unambiguous (``_legacy_is_unambiguous``).  Otherwise it stays where it is
    (``survey`` lists it at start).  Returns a line for the log when something was adopted."""
    legacy = legacy_database_identity(url)
    if legacy is None:
        return None
    old = Path(root) / safe_name(node) / f"db-{legacy[0]}"
    new = spool_dir_for(root, node, url)
    segs = sorted(old.glob("seg-*.jsonl")) if old.is_dir() else []
    if not segs or old == new:
        return None
    try:
        recorded = json.loads((old / IDENTITY_FILE).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(recorded, dict) or recorded.get("version") or recorded.get("database") != legacy[1]:
        return None
    if not _legacy_is_unambiguous(url):
        return None
    if new.is_dir():
        if any(new.glob("seg-*.jsonl")):
            return None                      # this database's own folder holds ticks already: not merged
        for f in new.iterdir():
            f.unlink()
        new.rmdir()
    try:
        os.rename(old, new)
    except OSError as e:
        log.warning("spool %s (kept for %s by an earlier version) could not become %s: %s", old, legacy[1], new, e)
        return None
    return (f"spool {old}, kept for {legacy[1]} by an earlier version, is this database's ({new}): "
            f"{len(segs)} segments, replayed in slices")


def safe_name(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in name) or "node"


def spool_dir_for(root: str | os.PathLike[str], node: str, url: str) -> Path:
    """The folder of one agent's spool: ``<root>/<node>/db-<id>``."""
    return Path(root) / safe_name(node) / f"db-{database_identity(url)[0]}"


def default_spool_root() -> Path:
    env = os.environ.get("TRISCOPE_SPOOL_DIR")
    if env:
        return Path(env)
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        return Path("/var/lib/triscope/spool")
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(state) / "triscope" / "spool"


@dataclass(frozen=True)
class Elsewhere:
    """Spooled ticks that are not this agent's database's."""

    path: Path
    database: str          # its description ("unknown": a spool from before the per-database layout)
    node: str
    segments: int
    bytes: int


def survey(root: str | os.PathLike[str], own: Path) -> list[Elsewhere]:
    """Every spool folder under ``root`` other than ``own`` that holds segments."""
    out: list[Elsewhere] = []
    base = Path(root)
    if not base.is_dir():
        return out
    own_r = own.resolve() if own.exists() else own
    for node_dir in sorted(p for p in base.iterdir() if p.is_dir()):
        legacy = sorted(node_dir.glob("seg-*.jsonl"))
        if legacy:
            out.append(Elsewhere(node_dir, "unknown (spooled before spools were kept per database)", node_dir.name,
                                 len(legacy), sum(_size(p) for p in legacy)))
        for d in sorted(node_dir.glob("db-*")):
            if not d.is_dir() or (d.resolve() == own_r):
                continue
            segs = sorted(d.glob("seg-*.jsonl"))
            if not segs:
                continue
            try:
                rec = json.loads((d / IDENTITY_FILE).read_text())
                desc = str(rec.get("database", "unknown"))
                if not rec.get("version"):
                    desc += " as an earlier version named it (the query and user not read)"
            except (OSError, ValueError, AttributeError):
                desc = "unknown"
            out.append(Elsewhere(d, desc, node_dir.name, len(segs), sum(_size(p) for p in segs)))
    return out


def _size(p: Path) -> int:
    try:
        return p.stat().st_size
    except OSError:
        return 0


def tick_to_json(t: Tick) -> str:
    return json.dumps({
        "ts": t.ts,
        "s": [[s.name, dict(s.labels), s.value, s.kind] for s in t.samples],
        "e": [[e.kind, e.message, e.severity, e.details, e.ts] for e in t.events],
    }, separators=(",", ":"), default=str)


def tick_from_json(line: str) -> Tick:
    d = json.loads(line)
    return Tick(
        float(d["ts"]),
        [Sample(n, float(v), lab, k) for n, lab, v, k in d["s"]],
        [EventRecord(k, m, sev, det, ts) for k, m, sev, det, ts in d["e"]],
    )


class Spool:
    """Segments of whole records: every tick handed to ``append`` is either in the files, whole, or
    counted in ``dropped_samples`` / ``dropped_ticks`` — once.  A write the disk cannot take is
    cut back to the last whole record before ``append`` returns (and, should even that fail, at the
    next write; a crash's torn tail at the next start), so the next record is never glued onto a
    torn one.  ``pending_samples`` is the samples the files hold, kept per segment."""

    def __init__(self, directory: str | os.PathLike[str], max_bytes: int = 256 << 20, database: str | None = None) -> None:
        """``database``: the URL this spool's ticks are for; its description is written to the
        folder's ``db.json`` (for ``survey``, for a later version's ``adopt_legacy_spool`` and for people)."""
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        if database is not None:
            self._record_database(database)
        self.max_bytes = max_bytes
        self.replayed_samples = 0
        self._last_error_log = -1e18
        self.dropped_samples = 0
        self.dropped_ticks = 0
        self.spooled_samples_total = 0
        self._lock = threading.Lock()
        # segments handed to a reader (``segments``): never appended to again, so that ``commit``
        # cannot remove ticks another thread appended after the reader read the file
        self._sealed: set[str] = set()
        # per segment: bytes of whole records, their ticks and samples (what ``pending_samples`` sums)
        self._whole: dict[str, int] = {}
        self._ticks: dict[str, int] = {}
        self._samples: dict[str, int] = {}
        for p in self._segments():
            self._load(p)

    def _record_database(self, database: str) -> None:
        ident, desc = database_identity(database)
        path = self.dir / IDENTITY_FILE
        record = {"id": ident, "database": desc, "version": 2}
        try:
            if path.exists() and json.loads(path.read_text()) == record:
                return
        except (OSError, ValueError):
            pass
        try:
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(record) + "\n")
            os.replace(tmp, path)
        except OSError as e:
            log.warning("spool %s: cannot record its database: %s", self.dir, e)

    def _segments(self) -> list[Path]:
        return sorted(self.dir.glob("seg-*.jsonl"))

    def _load(self, path: Path) -> None:
        """Count a segment found at start, its torn tail (a write a crash cut short) cut first."""
        try:
            raw = path.read_bytes()
        except OSError:
            return
        whole = raw.rfind(b"\n") + 1
        if whole < len(raw):
            try:
                os.truncate(path, whole)
                log.warning("spool segment %s ended in a torn record (%d bytes): cut at the last whole record",
                            path.name, len(raw) - whole)
            except OSError as e:
                log.error("spool segment %s ends in a torn record that cannot be cut yet: %s", path.name, e)
        ticks = samples = 0
        for line in raw[:whole].splitlines():  # a corrupt line (an older version's) counts nothing
            try:
                samples += len(json.loads(line)["s"])
                ticks += 1
            except (ValueError, KeyError, TypeError):
                continue
        self._whole[path.name] = whole
        self._ticks[path.name] = ticks
        self._samples[path.name] = samples

    @property
    def pending_samples(self) -> int:
        return sum(self._samples.values())

    @property
    def pending_ticks(self) -> int:
        return sum(self._ticks.values())

    def __len__(self) -> int:
        return len(self._segments())

    def empty(self) -> bool:
        return not self._segments()

    def size_bytes(self) -> int:
        return sum(_size(p) for p in self._segments())

    def append(self, ticks: list[Tick]) -> bool:
        """Keep ``ticks`` on disk, whole; False when they could not be kept (counted as dropped: the
        disk is full even after shedding the oldest segment, or the folder cannot be written).
        Never raises: the writer thread that calls it must outlive a full disk."""
        data = "".join(tick_to_json(t) + "\n" for t in ticks).encode()
        n = sum(len(t.samples) for t in ticks)
        with self._lock:
            for attempt in range(3):
                try:
                    self._write(data, len(ticks), n)
                    break
                except OSError as e:
                    full = e.errno in (errno.ENOSPC, errno.EDQUOT)
                    if full and attempt < 2 and len(self._segments()) > 1:
                        self._drop_oldest(f"disk full ({e.strerror})")    # shed the oldest, then try again
                        continue
                    self.dropped_samples += n
                    self.dropped_ticks += len(ticks)
                    now = time.monotonic()
                    if now - self._last_error_log >= 60.0:
                        self._last_error_log = now
                        log.error("spool %s cannot keep %d samples (%s): dropped and counted in "
                                  "triscope_dropped_samples_total", self.dir, n, e.strerror or e)
                    return False
            self.spooled_samples_total += n
            while self.size_bytes() > self.max_bytes and len(self._segments()) > 1:
                self._drop_oldest(f"spool over {self.max_bytes} bytes")
        return True

    def _write(self, data: bytes, ticks: int, samples: int) -> None:
        """Append ``data`` (whole records) to the current segment, or a new one, all of it or none:
        a short or failed write (or fsync) is cut back to the last whole record before raising."""
        segs = self._segments()
        cur = (segs[-1] if segs and segs[-1].name not in self._sealed and _size(segs[-1]) < SEGMENT_BYTES
               else None)
        if cur is None:
            seq = int(segs[-1].stem.split("-")[1]) + 1 if segs else 1
            cur = self.dir / f"seg-{seq:09d}.jsonl"
        fd = os.open(cur, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
        try:
            size = os.fstat(fd).st_size
            good = self._whole.setdefault(cur.name, size)
            if size > good:              # a tail an earlier failed write could not cut: cut now
                os.ftruncate(fd, good)
                log.warning("spool segment %s: cut a torn record of %d bytes", cur.name, size - good)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
                os.fsync(fd)
            except OSError:
                with contextlib.suppress(OSError):   # if this fails too, the next write cuts it (``good``)
                    os.ftruncate(fd, good)
                if good == 0:
                    with contextlib.suppress(OSError):
                        cur.unlink()                 # no empty segment left behind
                    self._forget(cur.name)
                raise
        finally:
            os.close(fd)
        self._whole[cur.name] = good + len(data)
        self._ticks[cur.name] = self._ticks.get(cur.name, 0) + ticks
        self._samples[cur.name] = self._samples.get(cur.name, 0) + samples

    def _forget(self, name: str) -> tuple[int, int]:
        """Stop counting a segment that is gone: (its ticks, its samples)."""
        self._whole.pop(name, None)
        self._sealed.discard(name)
        return self._ticks.pop(name, 0), self._samples.pop(name, 0)

    def _drop_oldest(self, why: str) -> None:
        oldest = self._segments()[0]
        oldest.unlink()
        ticks, lost = self._forget(oldest.name)
        self.dropped_samples += lost
        self.dropped_ticks += ticks
        log.error("%s: dropped the oldest spool segment (%d samples)", why, lost)

    def segments(self) -> Iterator[tuple[Path, list[Tick]]]:
        """Oldest segment first; the caller calls ``commit(path)`` after writing it to the store."""
        for p in self._segments():
            with self._lock:     # read whole and sealed: later appends go to a new segment
                try:
                    raw = p.read_bytes()
                except FileNotFoundError:
                    continue
                raw = raw[:self._whole.get(p.name, raw.rfind(b"\n") + 1)]   # whole records only
                self._sealed.add(p.name)
            ticks = []
            for i, line in enumerate(raw.decode(errors="replace").splitlines()):
                if not line.strip():
                    continue
                try:
                    ticks.append(tick_from_json(line))
                except (ValueError, KeyError, TypeError):
                    log.error("spool segment %s line %d is corrupt; skipped", p.name, i + 1)
            yield p, ticks

    def release(self) -> None:
        """The reader gave up (the store failed): the segments it read may be appended to again."""
        with self._lock:
            self._sealed.clear()

    def commit(self, path: Path, ticks: list[Tick], replayed: bool = False) -> None:
        """The segment at ``path`` is in the store: removed (``replayed``: counted as written back)."""
        n = sum(len(t.samples) for t in ticks)
        with self._lock:
            path.unlink(missing_ok=True)
            self._forget(path.name)
            if replayed:
                self.replayed_samples += n
