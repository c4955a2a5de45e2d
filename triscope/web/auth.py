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

import base64
import hashlib
import logging
import os
import re
import ssl
import threading
import time
from collections import OrderedDict
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
        self._good: OrderedDict[bytes, None] = OrderedDict()
        self._bad: OrderedDict[bytes, None] = OrderedDict()
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
            cache[key] = None
            cache.move_to_end(key)
            while len(cache) > self.cache_size:
                cache.popitem(last=False)
        return ok

    @property
    def cached(self) -> int:
        return len(self._good) + len(self._bad)


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


class SourceLimiter:
    """Password checks (bcrypt) per client address: a token bucket of ``burst`` checks refilled at
    ``rate`` a second, and at most ``max_queued`` checks waiting at all.  A check refused here is
    answered ``429`` at once and its connection closed (``admit``), so a spray of wrong passwords
    holds no connection slot while it waits for bcrypt; credentials already verified never reach it
    (they are answered from the cache on the loop)."""

    def __init__(self, rate: float = 2.0, burst: float = 6.0, max_queued: int = 8, max_sources: int = 4096,
                 clock: Any = time.monotonic) -> None:
        self.rate, self.burst, self.max_queued, self.max_sources = rate, burst, max_queued, max_sources
        self.clock = clock
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()   # source -> (tokens, at)
        self.refused = 0

    def take(self, source: str, queued: int) -> str | None:
        """None when a check from ``source`` may be queued now, else why not."""
        if queued >= self.max_queued:
            self.refused += 1
            return f"{queued} password checks are waiting already"
        now = self.clock()
        tokens, at = self._buckets.pop(source, (self.burst, now))
        tokens = min(self.burst, tokens + (now - at) * self.rate)
        if tokens < 1.0:
            self._buckets[source] = (tokens, now)
            self.refused += 1
            return f"more than {self.rate:g} password checks a second from {source}"
        self._buckets[source] = (tokens - 1.0, now)
        while len(self._buckets) > self.max_sources:
            self._buckets.popitem(last=False)
        return None


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
