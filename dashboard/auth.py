"""Who may read the dashboard: HTTP basic auth (one shared password) and/or an authenticating
proxy's user header, trusted only from the proxy's own addresses.

* ``TRISCOPE_DASHBOARD_PASSWORD`` (user ``TRISCOPE_DASHBOARD_USER``, default ``triscope``): every
  request needs ``Authorization: Basic``.
* ``TRISCOPE_DASHBOARD_TRUSTED_PROXIES`` (``127.0.0.1`` for a proxy sidecar: addresses and CIDRs;
  ``0.0.0.0/0`` and ``::/0`` are refused, they would trust every client) and
  ``TRISCOPE_DASHBOARD_PROXY_USER_HEADER`` (default ``X-Forwarded-User``): a request whose TCP peer
  is one of those addresses and that carries the header is the header's user.  The same header
  from any other address is ignored: such a request needs the password, or gets 401.  The peer is
  the socket's address (``REMOTE_ADDR``), never an ``X-Forwarded-For`` a client can write.  The
  proxy must set the header itself and drop a client's (oauth2-proxy does: docs/dashboard.md).

``/healthz`` stays open for probes (it says whether the store answers, nothing about the data).
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from triscope.web.auth import parse_basic

HEALTH_PATH = "/healthz"
DEFAULT_USER_HEADER = "X-Forwarded-User"
_Net = ipaddress.IPv4Network | ipaddress.IPv6Network


def _check(header: str | None, username: str, password: str) -> bool:
    creds = parse_basic(header)   # the agent's parser: one reading of Authorization: Basic
    if creds is None:
        return False
    user, pw = creds
    # compare both, always, in constant time
    ok_user = hmac.compare_digest(user.encode(), username.encode())
    ok_pw = hmac.compare_digest(pw.encode(), password.encode())
    return ok_user and ok_pw


@dataclass(frozen=True)
class ProxyTrust:
    """The proxies whose user header is believed, and that header's name."""

    networks: tuple[_Net, ...]
    header: str = DEFAULT_USER_HEADER

    @classmethod
    def parse(cls, addresses: str | Sequence[str], header: str | None = None) -> ProxyTrust:
        """``"127.0.0.1, ::1"`` (or a list); ValueError naming the bad entry (or trusting every address)."""
        items = [a.strip() for a in (addresses.split(",") if isinstance(addresses, str) else addresses)]
        nets = []
        for item in filter(None, items):
            try:
                nets.append(ipaddress.ip_network(item, strict=False))
            except ValueError:
                raise ValueError(f"{item!r} is not an IP address or CIDR") from None
            if nets[-1].prefixlen == 0:
                raise ValueError(f"{item!r} trusts every address: any client could send the user header and be "
                                 "that user; name the proxy's own addresses (127.0.0.1 for a sidecar)")
        if not nets:
            raise ValueError("no proxy address given")
        name = (header or DEFAULT_USER_HEADER).strip()
        if not name or any(not (c.isalnum() or c == "-") for c in name):
            raise ValueError(f"{name!r} is not an HTTP header name")
        return cls(tuple(nets), name)

    def trusts(self, peer: str | None) -> bool:
        if not peer:
            return False
        try:
            addr = ipaddress.ip_address(peer.split("%", 1)[0])
        except ValueError:
            return False
        if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
            addr = addr.ipv4_mapped
        return any(addr.version == n.version and addr in n for n in self.networks)

    def user(self, peer: str | None, headers: Any) -> str | None:
        """The proxy's user for a request from ``peer`` with ``headers``, or None (not trusted)."""
        if not self.trusts(peer):
            return None
        value = (headers.get(self.header) or "").strip()
        return value if value and value.isprintable() and len(value) <= 256 else None


def install_auth(server: Any, *, username: str = "triscope", password: str | None = None,
                 proxy: ProxyTrust | None = None) -> None:
    """Every request but ``/healthz`` needs the proxy's user header from a trusted proxy, or the
    password; else 401 (with a basic-auth challenge where a password is set)."""
    from flask import Response, g, request

    if not password and proxy is None:
        raise ValueError("neither a dashboard password nor trusted proxies")

    @server.before_request
    def _require_auth() -> Any:
        if request.path == HEALTH_PATH:  # liveness/readiness probes, says nothing about the data
            return None
        if proxy is not None:
            user = proxy.user(request.remote_addr, request.headers)
            if user is not None:
                g.triscope_user = user
                request.environ["REMOTE_USER"] = user
                return None
        if password and _check(request.headers.get("Authorization"), username, password):
            g.triscope_user = username
            return None
        if password:
            return Response("authentication required\n", 401,
                            {"WWW-Authenticate": 'Basic realm="triscope", charset="UTF-8"'})
        return Response("authentication required: sign in through the dashboard's proxy\n", 401)

    server.triscope_basic_auth = bool(password)
    server.triscope_proxy_auth = proxy is not None
