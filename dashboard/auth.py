"""HTTP basic auth for every request of the dashboard's Flask server (one shared password).

For single sign-on put an OIDC proxy (oauth2-proxy) in front instead: docs/dashboard.md.
"""

from __future__ import annotations

import base64
import hmac
from typing import Any

HEALTH_PATH = "/healthz"


def _check(header: str | None, username: str, password: str) -> bool:
    if not header or not header.lower().startswith("basic "):
        return False
    try:
        user, _, pw = base64.b64decode(header[6:].strip()).decode("utf-8").partition(":")
    except (ValueError, UnicodeDecodeError):
        return False
    # compare both, always, in constant time
    ok_user = hmac.compare_digest(user.encode(), username.encode())
    ok_pw = hmac.compare_digest(pw.encode(), password.encode())
    return ok_user and ok_pw


def install_basic_auth(server: Any, username: str, password: str) -> None:
    from flask import Response, request

    if not password:
        raise ValueError("empty dashboard password")

    @server.before_request
    def _require_auth() -> Any:
        if request.path == HEALTH_PATH:  # liveness/readiness probes, says nothing about the data
            return None
        if _check(request.headers.get("Authorization"), username, password):
            return None
        return Response("authentication required\n", 401, {"WWW-Authenticate": 'Basic realm="triscope", charset="UTF-8"'})

    server.triscope_basic_auth = True
