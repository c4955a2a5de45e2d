"""What a listener holds of its ``--web.config.file`` at run time (loaded and checked by
``triscope.webconfig``): the TLS context, basic auth against bcrypt hashes with a bounded cache of
verified credentials, extra response headers.  No pydantic here: the agent imports this.

``WebConfig.refresh()`` (called by the HTTP server's loop every ``RELOAD_EVERY`` seconds) picks up
a changed file, certificate, key or CA, as exporter-toolkit re-reads its file: a rotated
certificate (cert-manager renewing a Secret) or a new password needs no restart.  The new file is
checked in full first; a broken one is logged once and the running config stays.  Turning TLS on
or off, or changing ``client_auth_type``, needs a restart (said in the log).
"""

from __future__ import annotations

import base64
import hashlib
import logging
import os
import ssl
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

RELOAD_EVERY = 15.0
"""Seconds between two looks at the web config's files (a few ``stat`` calls)."""
CACHE_SIZE = 256
"""Verified credentials remembered by :class:`BasicAuth` (exporter-toolkit keeps 100)."""


# ---------------------------------------------------------------------------------------------- basic auth
class BasicAuth:
    """``check(authorization_header) -> bool`` against bcrypt hashes, results cached (bounded)."""

    def __init__(self, users: dict[str, str], cache_size: int = CACHE_SIZE) -> None:
        import bcrypt

        self._bcrypt = bcrypt
        self.users = {u: h.encode() for u, h in users.items()}
        self.cache_size = cache_size
        self._cache: OrderedDict[bytes, bool] = OrderedDict()
        self._lock = threading.Lock()          # the cache
        self._bcrypt_lock = threading.Lock()   # one bcrypt at a time, as exporter-toolkit
        self._dummy = bcrypt.hashpw(b"triscope-no-such-user", bcrypt.gensalt(10))
        self.bcrypt_calls = 0                  # how often bcrypt actually ran (tests, the bench)

    def _key(self, user: str, password: str) -> tuple[bytes, bytes, bool]:
        hashed = self.users.get(user)
        known = hashed is not None
        hashed = hashed if hashed is not None else self._dummy
        key = hashlib.sha256(b"\0".join((user.encode("utf-8", "surrogatepass"), hashed,
                                         password.encode("utf-8", "surrogatepass")))).digest()
        return key, hashed, known

    def quick(self, header: str | None) -> bool:
        """Whether ``check(header)`` answers without bcrypt (malformed, or its result cached)."""
        creds = parse_basic(header)
        if creds is None:
            return True
        key = self._key(*creds)[0]
        with self._lock:
            return key in self._cache

    def check(self, header: str | None) -> bool:
        creds = parse_basic(header)
        if creds is None:
            return False
        user, password = creds
        key, hashed, known = self._key(user, password)
        with self._lock:
            ok = self._cache.get(key)
            if ok is not None:
                self._cache.move_to_end(key)
                return ok
        with self._bcrypt_lock:
            self.bcrypt_calls += 1
            try:
                ok = self._bcrypt.checkpw(password.encode("utf-8", "surrogatepass"), hashed) and known
            except ValueError:
                ok = False
        with self._lock:
            self._cache[key] = ok
            self._cache.move_to_end(key)
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        return ok

    @property
    def cached(self) -> int:
        return len(self._cache)


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


# ---------------------------------------------------------------------------------------------- loaded
@dataclass
class WebConfig:
    """A loaded, checked web config: what a listener needs."""

    file: str
    tls: Any = None     # triscope.webconfig.TLSServerConfig (paths resolved)
    auth: BasicAuth | None = None
    headers: list[tuple[str, str]] = field(default_factory=list)
    _context: ssl.SSLContext | None = None
    reloader: Any = None      # () -> WebConfig: the file loaded and checked again (triscope.webconfig)
    stamps: dict[str, tuple[int, int] | None] = field(default_factory=dict)
    reloads: int = 0

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
        if now == self.stamps:
            return None
        self.stamps = now
        try:
            new = self.reloader()
        except Exception as e:  # noqa: BLE001 - a broken new file never stops the listener
            log.error("%s changed but cannot be used, still serving the previous one: %s", self.file, e)
            return f"kept: {e}"
        if (new.tls is None) != (self.tls is None) or (
                new.tls is not None and new.tls.client_auth_type != self.tls.client_auth_type):
            log.error("%s: turning TLS on or off, or a new client_auth_type, needs a restart", self.file)
            return "kept: needs a restart"
        if new.tls is not None and self._context is not None:
            try:
                self._context.load_cert_chain(new.tls.cert_file, new.tls.key_file)
                if new.tls.client_ca_file:
                    self._context.load_verify_locations(cafile=new.tls.client_ca_file)
            except (ssl.SSLError, OSError) as e:   # changed again between the check and now
                log.error("%s: the new certificate did not load, still serving the previous one: %s", self.file, e)
                return f"kept: {e}"
            self.tls = new.tls
        self.auth, self.headers = new.auth, new.headers
        self.stamps = new.stamps or self.stamps
        self.reloads += 1
        log.warning("%s: reloaded (certificate, users and headers)", self.file)
        return "reloaded"

    @property
    def scheme(self) -> str:
        return "https" if self.tls is not None else "http"

    def ssl_context(self) -> ssl.SSLContext | None:
        return self._context

    def authorized(self, header: str | None) -> bool:
        return self.auth is None or self.auth.check(header)

    def quick(self, header: str | None) -> bool:
        """Whether ``authorized(header)`` answers without running bcrypt."""
        return self.auth is None or self.auth.quick(header)

    def cert_and_key(self) -> tuple[str, str] | None:
        """The certificate and key paths (resolved), for servers that take files (werkzeug)."""
        return (self.tls.cert_file, self.tls.key_file) if self.tls is not None else None
