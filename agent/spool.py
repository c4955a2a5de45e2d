"""A bounded on-disk spool for ticks the store could not take.

Ticks are appended as JSON lines to segment files; ``segments()`` hands them back oldest first.
When the spool would exceed ``max_bytes`` the oldest segment is dropped and its samples counted
as dropped (the only way samples are ever lost, and it is counted and exported).

**A spooled tick belongs to the database it was meant for.**  The folder of one agent's spool is
``<root>/<node>/db-<id>/`` (``spool_dir_for``): ``<id>`` names the database by its URL without
credentials (``database_identity``: dialect, host, port and database name; a SQLite file by its
absolute path), and ``db.json`` in the folder says which one in words.  An agent replays only its
own database's folder; ``survey`` lists what waits for other databases (and segments of spools
from before this layout, whose database is unknown), so the agent can say so at start — never
replayed, never deleted.  The same URL is the same database: a backup restored at that URL takes
what was spooled for it.

The default root is a state directory, not the working directory of whoever started the agent
(``default_spool_root``): ``$TRISCOPE_SPOOL_DIR``, else ``/var/lib/triscope/spool`` as root (the
DaemonSet's hostPath), else ``$XDG_STATE_HOME/triscope/spool`` (``~/.local/state/triscope/spool``).
"""

from __future__ import annotations

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

from triscope.core.samples import EventRecord, Sample, Tick

log = logging.getLogger(__name__)

SEGMENT_BYTES = 1 << 20
IDENTITY_FILE = "db.json"


def database_identity(url: str) -> tuple[str, str]:
    """(id, description) of the database a URL points at, credentials left out: the same for every
    spelling of one database (user, password, query options, a relative SQLite path), different
    for another host, port, database or file."""
    from sqlalchemy.engine import make_url

    try:
        u = make_url(url)
    except Exception:  # noqa: BLE001 - an unparsable URL is its own identity (the agent refuses it later)
        desc = url.split("@")[-1]
    else:
        backend = u.get_backend_name()
        if backend == "sqlite":
            db = u.database or ""
            desc = f"sqlite:{os.path.realpath(db) if db and db != ':memory:' else db or ':memory:'}"
        else:
            host = (u.host or "").lower()
            hosts = u.query.get("host")      # libpq's multi-host form
            if hosts and not host:
                host = ",".join(hosts) if isinstance(hosts, tuple) else str(hosts)
            desc = f"{backend}://{host}:{u.port or ''}/{u.database or ''}"
    return hashlib.sha256(desc.encode()).hexdigest()[:12], desc


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
                desc = str(json.loads((d / IDENTITY_FILE).read_text()).get("database", "unknown"))
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
    def __init__(self, directory: str | os.PathLike[str], max_bytes: int = 256 << 20, database: str | None = None) -> None:
        """``database``: the URL this spool's ticks are for; its description is written to the
        folder's ``db.json`` (for ``survey`` and for people)."""
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        if database is not None:
            ident, desc = database_identity(database)
            path = self.dir / IDENTITY_FILE
            try:
                if not path.exists():
                    path.write_text(json.dumps({"id": ident, "database": desc}) + "\n")
            except OSError as e:
                log.warning("spool %s: cannot record its database: %s", self.dir, e)
        self.max_bytes = max_bytes
        self.replayed_samples = 0
        self._last_error_log = -1e18
        self.dropped_samples = 0
        self.spooled_samples_total = 0
        self._lock = threading.Lock()
        # segments handed to a reader (``segments``): never appended to again, so that ``commit``
        # cannot remove ticks another thread appended after the reader read the file
        self._sealed: set[str] = set()
        self._pending = sum(self._count_samples(p) for p in self._segments())

    def _segments(self) -> list[Path]:
        return sorted(self.dir.glob("seg-*.jsonl"))

    @staticmethod
    def _count_samples(path: Path) -> int:
        try:
            lines = path.read_text().splitlines()
        except OSError:
            return 0
        n = 0
        for line in lines:       # a corrupt line (a write cut short by a full disk) counts nothing
            try:
                n += len(json.loads(line)["s"])
            except (ValueError, KeyError, TypeError):
                continue
        return n

    @property
    def pending_samples(self) -> int:
        return self._pending

    def __len__(self) -> int:
        return len(self._segments())

    def empty(self) -> bool:
        return not self._segments()

    def size_bytes(self) -> int:
        return sum(p.stat().st_size for p in self._segments() if p.exists())

    def append(self, ticks: list[Tick]) -> bool:
        """Keep ``ticks`` on disk; False when they could not be kept (counted as dropped: the disk is
        full even after shedding the oldest segment, or the folder cannot be written).  Never raises:
        the writer thread that calls it must outlive a full disk."""
        data = "".join(tick_to_json(t) + "\n" for t in ticks)
        n = sum(len(t.samples) for t in ticks)
        with self._lock:
            for attempt in range(3):
                try:
                    self._write(data)
                    break
                except OSError as e:
                    full = e.errno in (errno.ENOSPC, errno.EDQUOT)
                    if full and attempt < 2 and len(self._segments()) > 1:
                        self._drop_oldest(f"disk full ({e.strerror})")    # shed the oldest, then try again
                        continue
                    self.dropped_samples += n
                    now = time.monotonic()
                    if now - self._last_error_log >= 60.0:
                        self._last_error_log = now
                        log.error("spool %s cannot keep %d samples (%s): dropped and counted in "
                                  "triscope_dropped_samples_total", self.dir, n, e.strerror or e)
                    return False
            self._pending += n
            self.spooled_samples_total += n
            while self.size_bytes() > self.max_bytes and len(self._segments()) > 1:
                self._drop_oldest(f"spool over {self.max_bytes} bytes")
        return True

    def _write(self, data: str) -> None:
        segs = self._segments()
        cur = (segs[-1] if segs and segs[-1].name not in self._sealed and segs[-1].stat().st_size < SEGMENT_BYTES
               else None)
        if cur is None:
            seq = int(segs[-1].stem.split("-")[1]) + 1 if segs else 1
            cur = self.dir / f"seg-{seq:09d}.jsonl"
        with open(cur, "a") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())

    def _drop_oldest(self, why: str) -> None:
        oldest = self._segments()[0]
        lost = self._count_samples(oldest)
        oldest.unlink()
        self._sealed.discard(oldest.name)
        self._pending -= lost
        self.dropped_samples += lost
        log.error("%s: dropped the oldest spool segment (%d samples)", why, lost)

    def segments(self) -> Iterator[tuple[Path, list[Tick]]]:
        """Oldest segment first; the caller calls ``commit(path)`` after writing it to the store."""
        for p in self._segments():
            with self._lock:     # read whole and sealed: later appends go to a new segment
                try:
                    lines = p.read_text().splitlines()
                except FileNotFoundError:
                    continue
                self._sealed.add(p.name)
            ticks = []
            for i, line in enumerate(lines):
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
            self._sealed.discard(path.name)
            self._pending -= n
            if replayed:
                self.replayed_samples += n
