"""What a listener holds of its ``--web.config.file`` at run time (loaded and checked by
``triscope.web.config``): the TLS context, basic auth against bcrypt hashes with bounded caches of
verified credentials, extra response headers.  No pydantic here: the agent imports this.

``WebConfig.refresh()`` (called every ``RELOAD_EVERY`` seconds from a thread of the HTTP server,
never on its event loop) picks up a changed file, certificate, key or CA, as exporter-toolkit
re-reads its file: a rotated certificate (cert-manager renewing a Secret), a new client CA, a new
``min_version`` or a new password needs no restart.  The new file is checked in full and a new
``SSLContext`` built from it; new connections get the new context (``ssl_context()``), open ones
keep the one they were made with.  A broken file is logged once and the running config stays.
Turning TLS on or off needs a restart (said in the log).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import hashlib
import logging
import os
import re
import ssl
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

RELOAD_EVERY = 15.0
"""Seconds between two looks at the web config's files (a ``stat`` of each; a changed one is then
parsed and checked again, off the server's loop)."""
CACHE_SIZE = 256
"""Verified credentials remembered by :class:`BasicAuth`, right ones and wrong ones each
(exporter-toolkit keeps 100): wrong ones never push a right one out."""
BCRYPT_MAX_BYTES = 72
"""bcrypt reads at most 72 bytes of a password; longer ones are cut there, as htpasswd and Go's
bcrypt (exporter-toolkit) do (the ``bcrypt`` package from 5.0 raises instead)."""

_COST = re.compile(r"^\$2[aby]\$(\d\d)\$")
_DUMMIES: dict[int, bytes] = {}
_DUMMIES_LOCK = threading.Lock()


def dummy_hash(cost: int) -> bytes:
    """A bcrypt hash of a password nobody sends, at ``cost``: what an unknown user is checked
    against, so that it takes as long as a known one.  Made once per process and cost."""
    with _DUMMIES_LOCK:
        h = _DUMMIES.get(cost)
        if h is None:
            import bcrypt

            h = _DUMMIES[cost] = bcrypt.hashpw(b"triscope-no-such-user", bcrypt.gensalt(cost))
        return h


def hash_cost(hashed: str | bytes) -> int:
    m = _COST.match(hashed.decode() if isinstance(hashed, bytes) else hashed)
    return int(m.group(1)) if m else 10


# ---------------------------------------------------------------------------------------------- basic auth
class BasicAuth:
    """``check(header) -> bool`` against bcrypt hashes; ``lookup(header)`` answers from the caches
    alone (never bcrypt: what the event loop may call).

    Two bounded caches (least recently used dropped): verified right credentials and verified wrong
    ones.  A spray of wrong passwords fills the second only, so Prometheus's password stays
    cached and its scrapes stay on the loop."""

    def __init__(self, users: dict[str, str], cache_size: int = CACHE_SIZE) -> None:
        import bcrypt

        self._bcrypt = bcrypt
        self.users = {u: h.encode() for u, h in users.items()}
        self.cache_size = cache_size
        # key -> the hash it was checked against (a reload keeps the entries whose hash it keeps)
        self._good: OrderedDict[bytes, bytes] = OrderedDict()
        self._bad: OrderedDict[bytes, bytes] = OrderedDict()
        self._lock = threading.Lock()          # the caches
        self._bcrypt_lock = threading.Lock()   # one bcrypt at a time, as exporter-toolkit
        # an unknown user costs what the dearest known one does
        self._dummy = dummy_hash(max((hash_cost(h) for h in self.users.values()), default=10))
        self.bcrypt_calls = 0                  # how often bcrypt actually ran (tests, the bench)
        self._warned = False

    def _key(self, user: str, password: str) -> tuple[bytes, bytes, bool]:
        hashed = self.users.get(user)
        known = hashed is not None
        hashed = hashed if hashed is not None else self._dummy
        key = hashlib.sha256(b"\0".join((user.encode("utf-8", "surrogatepass"), hashed,
                                         password.encode("utf-8", "surrogatepass")))).digest()
        return key, hashed, known

    def lookup(self, header: str | None) -> bool | None:
        """The answer if known without bcrypt (malformed: False; cached: its result), else None."""
        creds = parse_basic(header)
        if creds is None:
            return False
        key = self._key(*creds)[0]
        with self._lock:
            if key in self._good:
                self._good.move_to_end(key)
                return True
            if key in self._bad:
                self._bad.move_to_end(key)
                return False
        return None

    def quick(self, header: str | None) -> bool:
        """Whether ``check(header)`` would answer without bcrypt (now)."""
        return self.lookup(header) is not None

    def check(self, header: str | None) -> bool:
        cached = self.lookup(header)
        if cached is not None:
            return cached
        creds = parse_basic(header)
        assert creds is not None
        user, password = creds
        key, hashed, known = self._key(user, password)
        raw = password.encode("utf-8", "surrogatepass")[:BCRYPT_MAX_BYTES]
        with self._bcrypt_lock:
            self.bcrypt_calls += 1
            try:
                ok = self._bcrypt.checkpw(raw, hashed) and known
            except ValueError as e:
                ok = False
                if not self._warned:
                    self._warned = True
                    log.warning("basic auth: bcrypt refused a check (answered 401): %s", e)
        with self._lock:
            cache = self._good if ok else self._bad
            cache[key] = hashed
            cache.move_to_end(key)
            while len(cache) > self.cache_size:
                cache.popitem(last=False)
        return ok

    @property
    def cached(self) -> int:
        return len(self._good) + len(self._bad)

    def adopt(self, old: BasicAuth) -> int:
        """Keep what ``old`` (the config before a reload) verified against a hash this one still
        has: a credential is keyed by (user, hash, password), so its answer holds while the user's
        hash is the same.  A reload that changes a certificate, a header or another user's password
        makes no scraper wait for bcrypt again; a changed hash starts empty.  Returns how many."""
        keep = set(self.users.values()) | {self._dummy}
        with old._lock:
            carried = [(k, h, True) for k, h in old._good.items() if h in keep] + \
                      [(k, h, False) for k, h in old._bad.items() if h in keep]
        with self._lock:
            for k, h, ok in carried:
                (self._good if ok else self._bad)[k] = h
        return len(carried)


def parse_basic(header: str | None) -> tuple[str, str] | None:
    """(user, password) of an ``Authorization: Basic`` value, or None."""
    if not header:
        return None
    scheme, _, value = header.strip().partition(" ")
    if scheme.lower() != "basic" or not value.strip():
        return None
    try:
        raw = base64.b64decode(value.strip(), validate=True).decode("utf-8")
    except (ValueError, UnicodeDecodeError):
        return None
    user, sep, password = raw.partition(":")
    return (user, password) if sep else None


UNAUTHORIZED_HEADERS = [("WWW-Authenticate", "Basic")]


class _Source:
    """What the check queue remembers of one client address (decayed counts: see ``CheckQueue``)."""

    __slots__ = ("asked", "at", "conn_at", "conn_tokens", "failed", "refused", "trusted", "waiting")

    def __init__(self, now: float) -> None:
        self.asked = 0.0      # checks asked for (queued, joined or refused), decayed
        self.failed = 0.0     # wrong passwords found by bcrypt, decayed
        self.refused = 0.0    # checks refused (429), decayed
        self.conn_tokens = 0.0   # new connections it may open while it is refused checks (``screen``)
        self.conn_at = now
        self.at = now         # when the counts were last decayed
        self.trusted = False  # a right password came from here once (kept across reloads)
        self.waiting = 0      # its checks waiting now


class _Check:
    __slots__ = ("futures", "header", "queued", "rank", "sources")

    def __init__(self, header: str | None, source: str, rank: tuple[int, float], now: float) -> None:
        self.header = header
        self.sources = [source]
        self.rank = rank
        self.queued = now
        self.futures: list[asyncio.Future[bool | str]] = []


class CheckQueue:
    """Password checks that need bcrypt, run off the event loop on two threads of their own, in an
    order and at a CPU cost that a spray of wrong passwords cannot turn against the right one.

    A check that cannot be answered from the caches (``BasicAuth.lookup``) is queued here from the
    server's event loop (``await submit(source, header)``) and answered ``True``/``False``, or a
    string saying why it was refused (the server answers ``429``).  Three things decide:

    * **Order by source** (the client address; an IPv6 one is its /64): an address a right password
      came from before (trusted, remembered across reloads) goes first unless it has failed since;
      every other one in order of how much it asked: checks asked for plus four times the wrong
      passwords found, both halving every ``half_life`` seconds.  A sprayer asks many times a
      second; a scraper asks once per scrape interval, and only until its password is cached:
      its first check goes before the check of every address that asked more (64 addresses at
      160 wrong passwords a second ask ~2.5 times a second each).  Lane 0 runs any check; lane 1
      only a trusted address's or a first ask's (``first``), so such a check never waits for a
      sprayer's bcrypt to finish.
    * **Bounded waiting**: at most ``per_source`` checks of one address and ``max_waiting`` in all
      wait (each holds a connection); a check that ranks before the last one waiting takes its
      place (that one is refused), one that ranks after is refused at once; one that waited
      ``max_wait`` seconds is refused.  The same credentials asked again while a check of them
      waits or runs join it (no second bcrypt).
    * **A CPU budget for hashing**: ``budget`` of a core over time (the thread's own CPU time per
      check, measured), ``burst`` seconds of it at once.  A first ask (an address that asked less
      than ``first``, no wrong password found) or a trusted address may spend all of it; any other
      check only what lies above one check's cost plus a share of ``reserve`` that grows with its
      address's asks (``_needs``), so the reserve is there when a scraper's first check comes.

    ``screen(source)`` (asked by the server before a new connection's TLS handshake) lets an
    address whose checks keep being refused open one new connection a second; the handshakes of a
    spray's other connections are what it would cost beyond bcrypt.
    """

    def __init__(self, check: Callable[[str | None], bool], *, budget: float = 0.1, burst: float = 1.0,
                 reserve: float = 0.3, max_waiting: int = 8, per_source: int = 2, max_wait: float = 2.0,
                 half_life: float = 30.0, first: float = 1.5, full_reserve_at: float = 4.0, max_sources: int = 4096,
                 refused_at: float = 8.0, conn_rate: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.check = check
        self.budget, self.burst, self.reserve = budget, burst, reserve
        self.max_waiting, self.per_source, self.max_wait = max_waiting, per_source, max_wait
        self.half_life, self.first, self.full_reserve_at, self.max_sources = half_life, first, full_reserve_at, max_sources
        self.refused_at, self.conn_rate = refused_at, conn_rate
        self.clock = clock
        self._sources: OrderedDict[str, _Source] = OrderedDict()
        self._waiting: dict[str | None, _Check] = {}      # by header: joined when asked again
        self._running: dict[int, _Check] = {}            # lane -> the check running on it
        self._tokens, self._tokens_at = burst, clock()
        self.cost = 0.1                                    # CPU seconds of one check (a running mean)
        # lane 0 takes any check, lane 1 only a trusted address's or a first ask: a scraper's
        # first check never waits for a sprayer's to finish
        self._pools = (ThreadPoolExecutor(max_workers=1, thread_name_prefix="bcrypt"),
                       ThreadPoolExecutor(max_workers=1, thread_name_prefix="bcrypt-first"))
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.checked = 0                                   # checks run (bcrypt)
        self.refused = 0                                   # checks refused (answered 429)
        self.cpu = 0.0                                     # CPU seconds spent in checks
        self.screened = 0                                  # connections closed before TLS (``screen``)

    # sources -----------------------------------------------------------------------------------------
    def _source(self, key: str, now: float) -> _Source:
        src = self._sources.pop(key, None)
        if src is None:
            src = _Source(now)
        else:
            decay = 0.5 ** ((now - src.at) / self.half_life)
            src.asked *= decay
            src.failed *= decay
            src.refused *= decay
            src.at = now
        self._sources[key] = src
        while len(self._sources) > self.max_sources:
            old_key, old = next(iter(self._sources.items()))
            if old.waiting:   # a source with a check waiting stays (at most max_waiting of them)
                self._sources.move_to_end(old_key)
                continue
            del self._sources[old_key]
        return src

    def _rank(self, src: _Source) -> tuple[int, float]:
        """Lower goes first: (0 trusted and not failing since / 1 any other, how much it asked)."""
        load = src.asked + 4.0 * src.failed
        return (0 if src.trusted and src.failed < 1.0 else 1, load)

    def _rerank(self, now: float) -> None:
        """The waiting checks ranked by what their sources asked until now (a few at most)."""
        for chk in self._waiting.values():
            chk.rank = self._rank(self._source(chk.sources[0], now))

    # the budget --------------------------------------------------------------------------------------
    def _refill(self, now: float) -> float:
        cap = max(self.burst, self.reserve + 2.0 * self.cost)
        self._tokens = min(cap, self._tokens + (now - self._tokens_at) * self.budget)
        self._tokens_at = now
        return self._tokens

    def _needs(self, chk: _Check) -> float:
        """Tokens a check must find before it runs: none for a trusted address or a first ask (its
        load under ``first``); else one check's cost and a share of the reserve that grows with
        how much its address asked (all of it from ``full_reserve_at`` on).  So only first asks
        and trusted addresses ever spend the last of the budget, and a spray's later asks (most of
        them) leave the reserve whole for a scraper's first check."""
        cls, load = chk.rank
        if cls == 0 or load < self.first:
            return 0.0
        return self.cost + self.reserve * min(1.0, load / self.full_reserve_at)

    # the loop's side ---------------------------------------------------------------------------------
    async def submit(self, source: str, header: str | None) -> bool | str:
        """The check's answer (on the event loop): True / False, or why it was refused."""
        now = self.clock()
        src = self._source(source, now)
        src.asked += 1.0
        joined = self._waiting.get(header)
        if joined is None:
            joined = next((c for c in self._running.values() if c.header == header), None)
        fut: asyncio.Future[bool | str] = asyncio.get_running_loop().create_future()
        if joined is not None:               # the same credentials are being checked: one bcrypt for both
            joined.futures.append(fut)
            if source not in joined.sources:
                joined.sources.append(source)
            return await fut
        if src.waiting >= self.per_source:
            self.refused += 1
            src.refused += 1.0
            return f"{src.waiting} password checks from {source} are waiting already"
        chk = _Check(header, source, self._rank(src), now)
        if len(self._waiting) >= self.max_waiting:
            self._rerank(now)
            worst = max(self._waiting.values(), key=lambda c: (c.rank, -c.queued))
            if worst.rank <= chk.rank:
                self.refused += 1
                src.refused += 1.0
                return f"{len(self._waiting)} password checks are waiting already"
            self._drop(worst, f"{len(self._waiting)} password checks are waiting already")
        chk.futures.append(fut)
        self._waiting[header] = chk
        src.waiting += 1
        self._kick()
        return await fut

    def _drop(self, chk: _Check, why: str) -> None:
        del self._waiting[chk.header]
        self._done(chk, why)

    def _done(self, chk: _Check, answer: bool | str) -> None:
        for s in chk.sources[:1]:
            src = self._sources.get(s)
            if src is not None and src.waiting > 0:
                src.waiting -= 1
            if src is not None and isinstance(answer, str):
                src.refused += 1.0
        if isinstance(answer, str):
            self.refused += len(chk.futures)
        for f in chk.futures:
            if not f.done():
                f.set_result(answer)

    def screen(self, source: str) -> bool:
        """Whether a new connection from ``source`` is taken (on the loop, before its TLS handshake).

        An address whose checks keep being refused (``refused_at`` of them, decayed, at the moment)
        has nothing to gain from a new connection but a ``429``, and its TLS handshake is most of
        what a spray costs the agent beyond bcrypt (~2 ms of a core each here): it may open
        ``conn_rate`` a second (two at once); the others are closed as they come, before any TLS.
        Connections it holds already, every other address, and an address a right password came
        from (a scraper behind the same NAT as a sprayer) are untouched."""
        src = self._sources.get(source)
        if src is None or src.trusted or src.refused < self.refused_at:
            return True
        now = self.clock()
        src.conn_tokens = min(2.0, src.conn_tokens + (now - src.conn_at) * self.conn_rate)
        src.conn_at = now
        if src.conn_tokens >= 1.0:
            src.conn_tokens -= 1.0
            return True
        self.screened += 1
        return False

    def _kick(self) -> None:
        if self._task is None or self._task.done():
            self._wake = asyncio.Event()
            self._loop = asyncio.get_running_loop()
            self._task = self._loop.create_task(self._run())
        assert self._wake is not None
        self._wake.set()

    def _favoured(self, chk: _Check) -> bool:
        return chk.rank[0] == 0 or chk.rank[1] < self.first

    def _lane(self, chk: _Check) -> int | None:
        """A free lane for ``chk``: 0 for any check, 1 for a favoured one only."""
        if 0 not in self._running:
            return 0
        if 1 not in self._running and self._favoured(chk):
            return 1
        return None

    async def _run(self) -> None:
        """The dispatcher (a task on the loop): the best waiting check, when a lane is free and the
        budget allows, to a hashing thread; the loop never runs bcrypt.  Strict order: while the
        best cannot start, none after it does (they rank after it and need as much)."""
        assert self._wake is not None
        loop = asyncio.get_running_loop()
        while self._waiting or self._running:
            now = self.clock()
            self._rerank(now)
            for chk in [c for c in self._waiting.values() if now - c.queued >= self.max_wait]:
                self._drop(chk, f"no room to check a password within {self.max_wait:g} s")
            wait = self.max_wait
            if self._waiting:
                chk = min(self._waiting.values(), key=lambda c: (c.rank, c.queued))
                lane = self._lane(chk)
                short = self._needs(chk) - self._refill(now)
                if lane is not None and short <= 0:
                    del self._waiting[chk.header]
                    self._running[lane] = chk
                    self._tokens -= self.cost          # what it should cost; settled when it is done
                    fut = loop.run_in_executor(self._pools[lane], self._timed, chk.header)
                    fut.add_done_callback(functools.partial(self._finished, lane, chk, self.cost))
                    continue
                if lane is not None:
                    wait = min(wait, short / self.budget)
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), max(wait, 0.001))

    def _finished(self, lane: int, chk: _Check, due: float, fut: asyncio.Future[tuple[bool, float]]) -> None:
        """On the loop, when a check is done: its answer out, its real CPU time settled."""
        self._running.pop(lane, None)
        try:
            ok, cpu = fut.result()
        except Exception:  # noqa: BLE001 - a failed check is a wrong password, never a crash of the queue
            log.exception("basic auth: a password check failed")
            ok, cpu = False, due
        self._account(chk, ok, cpu, due)
        if self._wake is not None:
            self._wake.set()

    def _timed(self, header: str | None) -> tuple[bool, float]:
        t0 = time.thread_time()
        ok = self.check(header)
        return ok, time.thread_time() - t0

    def _account(self, chk: _Check, ok: bool, cpu: float, due: float) -> None:
        """A check's answer: its CPU time charged (``due`` was taken when it started), its
        addresses' standing, the futures waiting on it."""
        now = self.clock()
        self.checked += 1
        self.cpu += cpu
        self._refill(now)
        self._tokens += due - cpu
        self.cost = 0.8 * self.cost + 0.2 * cpu if self.checked > 1 else cpu
        for s in chk.sources:
            src = self._source(s, now)
            if ok:
                src.trusted = True
            else:
                src.failed += 1.0
        self._done(chk, ok)

    def close(self) -> None:
        """Stop the dispatcher (before the server's loop stops) and the hashing thread."""
        task, loop = self._task, self._loop
        if task is not None and loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(task.cancel)
        for pool in self._pools:
            pool.shutdown(wait=False, cancel_futures=True)


# ---------------------------------------------------------------------------------------------- loaded
@dataclass
class WebConfig:
    """A loaded, checked web config: what a listener needs."""

    file: str
    tls: Any = None     # triscope.web.config.TLSServerConfig (paths resolved)
    auth: BasicAuth | None = None
    headers: list[tuple[str, str]] = field(default_factory=list)
    _context: ssl.SSLContext | None = None
    reloader: Any = None      # () -> WebConfig: the file loaded and checked again (triscope.web.config)
    stamps: dict[str, tuple[int, int] | None] = field(default_factory=dict)
    reloads: int = 0
    retry_s: float = 10.0     # a reload that failed is tried again this often, changed files or not
    _failed_at: float | None = None
    _failed_logged: float = -1e18

    def files(self) -> list[str]:
        extra = [] if self.tls is None else [self.tls.cert_file, self.tls.key_file, self.tls.client_ca_file]
        return [self.file, *(f for f in extra if f)]

    def stamp(self) -> dict[str, tuple[int, int] | None]:
        out: dict[str, tuple[int, int] | None] = {}
        for f in self.files():
            try:
                st = os.stat(f)
                out[f] = (st.st_mtime_ns, st.st_size)
            except OSError:
                out[f] = None
        return out

    def refresh(self) -> str | None:
        """Reload when a file changed; returns what happened (None: nothing changed)."""
        if self.reloader is None:
            return None
        now = self.stamp()
        t = time.monotonic()
        if now == self.stamps and (self._failed_at is None or t - self._failed_at < self.retry_s):
            return None
        changed = now != self.stamps
        self.stamps = now
        try:
            new = self.reloader()
        except Exception as e:  # noqa: BLE001 - a broken new file never stops the listener
            # tried again every retry_s: what failed may not show in a file's mtime or size (a
            # permission fixed, a certificate and key written one after the other, a CA file created)
            self._failed_at = t
            if changed or t - self._failed_logged >= 300.0:
                self._failed_logged = t
                log.error("%s changed but cannot be used, still serving the previous one (tried again every "
                          "%gs): %s", self.file, self.retry_s, e)
            return f"kept: {e}"
        self._failed_at = None
        if (new.tls is None) != (self.tls is None):
            log.error("%s: turning TLS on or off needs a restart, still serving the previous config", self.file)
            return "kept: needs a restart"
        # a new context, built from the new file alone (certificate, client CA, versions, client
        # auth): taken by the next connection; nothing of the old one carries over
        self.tls, self._context = new.tls, new._context
        if new.auth is not None and self.auth is not None:
            new.auth.adopt(self.auth)   # what was verified against a hash the new file keeps
        self.auth, self.headers = new.auth, new.headers
        self.stamps = new.stamps or self.stamps
        self.reloads += 1
        log.warning("%s: reloaded (certificate, client CA, TLS versions, users, headers)", self.file)
        return "reloaded"

    @property
    def scheme(self) -> str:
        return "https" if self.tls is not None else "http"

    def ssl_context(self) -> ssl.SSLContext | None:
        """The context for a new connection: the latest loaded (ask again for each connection)."""
        return self._context

    def authorized(self, header: str | None) -> bool:
        return self.auth is None or self.auth.check(header)

    def quick(self, header: str | None) -> bool:
        """Whether ``authorized(header)`` would answer without running bcrypt."""
        return self.lookup(header) is not None

    def lookup(self, header: str | None) -> bool | None:
        """``authorized(header)`` if known without bcrypt (no auth, malformed, cached), else None."""
        auth = self.auth
        return True if auth is None else auth.lookup(header)
