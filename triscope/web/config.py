"""``--web.config.file``: TLS and basic auth for triscope's HTTP listeners, in the format of the
Prometheus exporter-toolkit (node_exporter, Prometheus itself), so one file and one habit serve both::

    tls_server_config:
      cert_file: server.crt           # relative paths: relative to this file's folder
      key_file: server.key
      client_ca_file: ca.crt          # optional: client certificates (mutual TLS)
      client_auth_type: RequireAndVerifyClientCert
      min_version: TLS12
    basic_auth_users:                 # user: bcrypt hash  (htpasswd -nBC 10 "" | tr -d ':\\n')
      prometheus: $2y$10$...
    http_server_config:
      headers:
        Strict-Transport-Security: max-age=31536000

The file is read at start (``load``) by the project's YAML loader and pydantic models, so a
mistake is one line, ``FILE:LINE: field: what is wrong``, before anything listens; the agent and
the webhook read it again when it changes (``WebConfig.refresh``).  What it gives
is a ``triscope.web.auth.WebConfig``: ``ssl_context()`` for the listener (the certificate pair, the
client CA and the minimum version already loaded and checked) and ``BasicAuth``.  The models here
need pydantic; what a listener holds at run time (``triscope.web.auth``) does not.

``BasicAuth`` verifies ``Authorization: Basic`` against the bcrypt hashes as exporter-toolkit
does: a verified (user, hash, password) is cached, so Prometheus scraping every 15 s pays bcrypt
(tens of milliseconds at cost 10) once, not per scrape; the cache is bounded (``CACHE_SIZE``
entries, least recently used dropped), keyed by a SHA-256 of the three (no password is kept in
memory as given), and remembers failures too (in a cache of their own, so a spray of wrong
passwords never pushes the right one out), so a client repeating a wrong password costs nothing
either.  An unknown user is compared against a dummy hash of the highest configured cost, so a
probe cannot tell users apart by time; bcrypt itself runs one at a time (a lock), as in
exporter-toolkit.  A password is cut at 72 bytes, as htpasswd and Go's bcrypt do.  A changed file,
certificate, key or CA is picked up while running (``WebConfig.refresh``, every 15 s).

Differences from exporter-toolkit, all refused with a clear error rather than silently changed:
``RequestClientCert`` and ``RequireAnyClientCert`` (asking for a certificate without verifying it:
Python's ``ssl`` cannot), ``cipher_suites`` / ``curve_preferences`` (OpenSSL's defaults apply), and
inline ``cert`` / ``key``.  HTTP/2 is not served (``http2`` is accepted and means HTTP/1.1, as
exporter-toolkit does for clients that do not offer HTTP/2).
"""

from __future__ import annotations

import logging
import os
import re
import ssl
from pathlib import Path
from typing import Literal

from pydantic import field_validator, model_validator

from triscope.core import yamlsafe
from triscope.core.configfile import ConfigFileError, ConfigModel, fail, problem, validate
from triscope.core.errors import UserError
from triscope.web.auth import BasicAuth, WebConfig

log = logging.getLogger(__name__)

FLAG = "--web.config.file"
MAX_BCRYPT_COST = 14    # ~1 s a check at cost 14 on a server core; Prometheus' own docs use 10
_BCRYPT = re.compile(r"^\$2[aby]\$(0[4-9]|[12][0-9]|3[01])\$[./A-Za-z0-9]{53}$")
# the headers exporter-toolkit lets a web config set on every answer
ALLOWED_HEADERS = ("Strict-Transport-Security", "X-Content-Type-Options", "X-Frame-Options", "X-XSS-Protection",
                   "Content-Security-Policy")
_VERSIONS = {"TLS10": ssl.TLSVersion.TLSv1, "TLS11": ssl.TLSVersion.TLSv1_1, "TLS12": ssl.TLSVersion.TLSv1_2,
             "TLS13": ssl.TLSVersion.TLSv1_3}
_CLIENT_AUTH = {"NoClientCert": ssl.CERT_NONE, "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
                "RequireAndVerifyClientCert": ssl.CERT_REQUIRED}
_UNSUPPORTED_CLIENT_AUTH = ("RequestClientCert", "RequireAnyClientCert")


class WebConfigError(ConfigFileError):
    """A web config file that cannot be used: ``FILE:LINE: field: what is wrong``."""


# ---------------------------------------------------------------------------------------------- the file
class TLSServerConfig(ConfigModel):
    cert_file: str
    key_file: str
    client_ca_file: str | None = None
    client_auth_type: str = "NoClientCert"
    min_version: Literal["TLS10", "TLS11", "TLS12", "TLS13"] = "TLS12"
    max_version: Literal["TLS10", "TLS11", "TLS12", "TLS13"] | None = None

    @field_validator("cert_file", "key_file", "client_ca_file")
    @classmethod
    def _not_empty(cls, v: str | None) -> str | None:
        if v is not None and not v.strip():
            raise ValueError("must not be empty")
        return v

    @field_validator("client_auth_type")
    @classmethod
    def _client_auth(cls, v: str) -> str:
        if v in _UNSUPPORTED_CLIENT_AUTH:
            raise ValueError(f"{v} (a client certificate asked for but not verified) is not supported: use "
                             "RequireAndVerifyClientCert or VerifyClientCertIfGiven with client_ca_file")
        if v not in _CLIENT_AUTH:
            raise ValueError(f"must be one of {', '.join(_CLIENT_AUTH)}, not {v!r}")
        return v

    @model_validator(mode="after")
    def _ca_and_policy(self) -> TLSServerConfig:
        if self.client_auth_type != "NoClientCert" and not self.client_ca_file:
            raise problem(f"{self.client_auth_type} needs client_ca_file (the CA that signs client certificates)",
                          "client_auth_type")
        if self.client_ca_file and self.client_auth_type == "NoClientCert":
            raise problem("client_ca_file is set but client_auth_type is NoClientCert: say how client "
                          "certificates are checked (RequireAndVerifyClientCert)", "client_ca_file")
        if self.max_version and _VERSIONS[self.max_version] < _VERSIONS[self.min_version]:
            raise problem(f"is below min_version {self.min_version}", "max_version")
        return self


class HTTPServerConfig(ConfigModel):
    http2: bool = True     # accepted for files written for exporter-toolkit; HTTP/1.1 is what is served
    headers: dict[str, str] | None = None

    @field_validator("headers")
    @classmethod
    def _headers(cls, v: dict[str, str] | None) -> dict[str, str] | None:
        for name, value in (v or {}).items():
            if name not in ALLOWED_HEADERS:
                raise problem(f"header {name!r} may not be set here (allowed: {', '.join(ALLOWED_HEADERS)})", name)
            if any(c in value for c in "\r\n\0"):
                raise problem("a header value must be one line", name)
        return v


class WebConfigFile(ConfigModel):
    tls_server_config: TLSServerConfig | None = None
    http_server_config: HTTPServerConfig | None = None
    basic_auth_users: dict[str, str] | None = None

    @field_validator("basic_auth_users")
    @classmethod
    def _users(cls, v: dict[str, str] | None) -> dict[str, str] | None:
        for user, hashed in (v or {}).items():
            if not user or ":" in user or any(not c.isprintable() for c in user):
                raise problem("a user name must be non-empty, printable, without ':'", user)
            if hashed.startswith("$2$"):
                raise problem("a $2$ hash (the first bcrypt version) cannot be checked here: make it again "
                              "with htpasswd -nBC 10 USER ($2y$) or Python's bcrypt ($2b$)", user)
            if not _BCRYPT.match(hashed):
                raise problem("must be a bcrypt hash ($2y$10$... , 60 characters; e.g. htpasswd -nBC 10 USER), "
                              "not a password", user)
            cost = int(hashed[4:6])
            if cost > MAX_BCRYPT_COST:
                raise problem(f"bcrypt cost {cost} is too dear to check: one check takes ~{2 ** (cost - 10) * 0.06:,.0f} s "
                              f"(cost 10 ~0.06 s, each step doubles it), and start-up checks it once; make it again "
                              f"with a cost of at most {MAX_BCRYPT_COST} (htpasswd -nBC 10 USER)", user)
        return v


def load(path: str | os.PathLike[str], *, allow_auth: bool = True) -> WebConfig:
    """The web config at ``path``, validated and its TLS files loaded; ``WebConfigError`` else.

    ``allow_auth=False``: a listener with an authentication of its own (the webhook's bearer token,
    the dashboard's) refuses ``basic_auth_users`` rather than ignoring it."""
    name = str(path)
    try:
        doc = yamlsafe.load(path)
    except yamlsafe.YAMLFileError as e:
        raise WebConfigError(e.file, e.line, e.reason) from None
    if doc.root is None:
        doc.root = {}
    model = validate(WebConfigFile, doc, error=WebConfigError)
    if model.basic_auth_users and not allow_auth:
        raise fail(doc, ("basic_auth_users",), "not used by this listener, which has its own authentication: "
                   "leave it out of this file", error=WebConfigError)
    base = Path(os.path.abspath(name)).parent   # not resolved: a Secret volume links the file into a dated folder
    cfg = WebConfig(file=name)
    if model.tls_server_config is not None:
        tls = model.tls_server_config
        resolved = {k: str(base / v) for k in ("cert_file", "key_file", "client_ca_file")
                    if (v := getattr(tls, k)) is not None}
        tls = tls.model_copy(update=resolved)
        cfg.tls = tls
        cfg._context = _context(tls, doc)
    if model.basic_auth_users:
        cfg.auth = BasicAuth(dict(model.basic_auth_users))
        if cfg.tls is None:
            log.warning("%s: basic_auth_users without tls_server_config: passwords cross the network in "
                        "the clear", name)
    if model.http_server_config and model.http_server_config.headers:
        cfg.headers = list(model.http_server_config.headers.items())
    cfg.reloader = lambda: load(path, allow_auth=allow_auth)
    cfg.stamps = cfg.stamp()
    return cfg


def _context(tls: TLSServerConfig, doc: yamlsafe.Document) -> ssl.SSLContext:
    at = ("tls_server_config",)
    for key in ("cert_file", "key_file", "client_ca_file"):
        p = getattr(tls, key)
        if p is not None and not os.access(p, os.R_OK):
            why = "no such file" if not os.path.exists(p) else "not readable"
            raise fail(doc, (*at, key), f"{p}: {why}", error=WebConfigError)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = _VERSIONS[tls.min_version]
    if tls.max_version:
        ctx.maximum_version = _VERSIONS[tls.max_version]
    try:
        ctx.load_cert_chain(tls.cert_file, tls.key_file)
    except (ssl.SSLError, OSError) as e:
        raise fail(doc, (*at, "cert_file"), f"the certificate and key do not load as a pair: {_ssl_reason(e)}",
                   error=WebConfigError) from None
    if tls.client_ca_file:
        try:
            ctx.load_verify_locations(cafile=tls.client_ca_file)
        except (ssl.SSLError, OSError) as e:
            raise fail(doc, (*at, "client_ca_file"), f"not a PEM CA certificate: {_ssl_reason(e)}",
                       error=WebConfigError) from None
    ctx.verify_mode = _CLIENT_AUTH[tls.client_auth_type]
    return ctx


def _ssl_reason(e: BaseException) -> str:
    if isinstance(e, ssl.SSLError):
        return str(e.reason or e).lower().replace("_", " ")
    return str(getattr(e, "strerror", None) or e)


def load_for_cli(path: str | None, *, allow_auth: bool = True) -> WebConfig | None:
    """For a command's ``--web.config.file``: None without a file; a ``UserError`` line for a bad one."""
    if not path:
        return None
    try:
        return load(path, allow_auth=allow_auth)
    except WebConfigError as e:
        raise UserError(f"{FLAG}: {e}") from None

