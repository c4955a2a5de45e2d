"""What a listener holds of its ``--web.config.file`` at run time (loaded and checked by
``triscope.webconfig``): the TLS context, basic auth against bcrypt hashes with a bounded cache of
verified credentials, extra response headers.  No pydantic here: the agent imports this.
"""

from __future__ import annotations

import base64
import hashlib
import ssl
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

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

    def check(self, header: str | None) -> bool:
        creds = parse_basic(header)
        if creds is None:
            return False
        user, password = creds
        hashed = self.users.get(user)
        known = hashed is not None
        hashed = hashed if hashed is not None else self._dummy
        key = hashlib.sha256(b"\0".join((user.encode("utf-8", "surrogatepass"), hashed,
                                         password.encode("utf-8", "surrogatepass")))).digest()
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

    @property
    def scheme(self) -> str:
        return "https" if self.tls is not None else "http"

    def ssl_context(self) -> ssl.SSLContext | None:
        return self._context

    def authorized(self, header: str | None) -> bool:
        return self.auth is None or self.auth.check(header)

    def cert_and_key(self) -> tuple[str, str] | None:
        """The certificate and key paths (resolved), for servers that take files (werkzeug)."""
        return (self.tls.cert_file, self.tls.key_file) if self.tls is not None else None
