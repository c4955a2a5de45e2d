"""The Alertmanager webhook: ``POST /api/v1/alerts`` (webhook payload version 4).

``Authorization: Bearer <token>`` is required (compared in constant time): missing or wrong →
401.  A body that is not JSON, does not follow the v4 schema, or is larger than ``max_body``
→ 400 with a message.  Accepted → 202 with the number of alerts and rule matches; the decisions
run on the engine's workers, so Alertmanager never waits for an action.  A replica that is not the
leader answers 503 (Alertmanager retries; its ``GET /readyz`` is 503 too, so a Service with that
readiness probe sends deliveries to the leader only).  Also ``GET /healthz`` (engine status,
always 200) and ``GET /metrics`` (the engine's Prometheus metrics).
"""

from __future__ import annotations

import hmac
import json
import logging
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from remediation import metrics
from remediation.triggers import parse_rfc3339

log = logging.getLogger(__name__)

MAX_ALERTS = 1000


class PayloadError(ValueError):
    pass


def validate_payload(obj: Any) -> dict[str, Any]:
    """Check an Alertmanager webhook v4 payload; raise ``PayloadError`` with the first problem."""
    if not isinstance(obj, dict):
        raise PayloadError("the body must be a JSON object (Alertmanager webhook payload)")
    if str(obj.get("version", "")) != "4":
        raise PayloadError(f"unsupported webhook payload version {obj.get('version')!r} (expected \"4\")")
    for key in ("groupLabels", "commonLabels", "commonAnnotations"):
        v = obj.get(key, {})
        if v is not None and not isinstance(v, dict):
            raise PayloadError(f"{key} must be an object")
    alerts = obj.get("alerts")
    if not isinstance(alerts, list) or not alerts:
        raise PayloadError("alerts must be a non-empty list")
    if len(alerts) > MAX_ALERTS:
        raise PayloadError(f"too many alerts in one payload ({len(alerts)} > {MAX_ALERTS})")
    for i, a in enumerate(alerts):
        if not isinstance(a, dict):
            raise PayloadError(f"alerts[{i}] must be an object")
        if a.get("status") not in ("firing", "resolved"):
            raise PayloadError(f"alerts[{i}].status must be 'firing' or 'resolved', not {a.get('status')!r}")
        labels = a.get("labels")
        if not isinstance(labels, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items()):
            raise PayloadError(f"alerts[{i}].labels must be an object of strings")
        if not labels.get("alertname"):
            raise PayloadError(f"alerts[{i}].labels has no alertname")
        if a.get("annotations") is not None and not isinstance(a.get("annotations"), dict):
            raise PayloadError(f"alerts[{i}].annotations must be an object")
        if parse_rfc3339(a.get("startsAt", "")) is None:
            raise PayloadError(f"alerts[{i}].startsAt must be an RFC 3339 time, not {a.get('startsAt')!r}")
        fp = a.get("fingerprint")
        if fp is not None and (not isinstance(fp, str) or len(fp) > 64):
            raise PayloadError(f"alerts[{i}].fingerprint must be a short string")
    return obj


class WebhookServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, addr: tuple[str, int], engine: Any, token: str | None, max_body: int) -> None:
        self.engine, self.token, self.max_body = engine, token, max_body
        super().__init__(addr, _Handler)


class _Handler(BaseHTTPRequestHandler):
    server: WebhookServer
    protocol_version = "HTTP/1.1"
    server_version = "triscope-remediation"

    def setup(self) -> None:
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, fmt: str, *args: Any) -> None:
        log.debug("webhook %s - %s", self.address_string(), fmt % args)

    def _send(self, code: int, payload: dict[str, Any] | bytes, ctype: str = "application/json",
              extra: dict[str, str] | None = None, close: bool = False) -> None:
        data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        if close:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path == "/healthz":
            self._send(200, self.server.engine.status())
        elif self.path == "/readyz":
            st = self.server.engine.status()
            self._send(200 if st["leader"] else 503, st)
        elif self.path == "/metrics":
            from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

            self._send(200, generate_latest(metrics.REGISTRY), CONTENT_TYPE_LATEST)
        else:
            self._send(404, {"error": f"no such path {self.path}; POST /api/v1/alerts"})

    def do_POST(self) -> None:
        received = time.time()
        if self.path.split("?")[0] != "/api/v1/alerts":
            self._send(404, {"error": f"no such path {self.path}; POST /api/v1/alerts"}, close=True)
            return
        token = self.server.token
        if token is not None:
            auth = self.headers.get("Authorization", "")
            scheme, _, given = auth.partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), token.encode()):
                self._send(401, {"error": "missing or wrong bearer token"},
                           extra={"WWW-Authenticate": 'Bearer realm="triscope-remediation"'}, close=True)
                return
        length_h = self.headers.get("Content-Length")
        if length_h is None:
            self._send(400, {"error": "Content-Length is required"}, close=True)
            return
        try:
            length = int(length_h)
        except ValueError:
            self._send(400, {"error": "bad Content-Length"}, close=True)
            return
        if length > self.server.max_body:
            self._send(400, {"error": f"body too large ({length} bytes > {self.server.max_body})"}, close=True)
            return
        raw = self.rfile.read(length)
        try:
            obj = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as e:
            self._send(400, {"error": f"body is not valid JSON: {e}"})
            return
        try:
            payload = validate_payload(obj)
        except PayloadError as e:
            self._send(400, {"error": str(e)})
            return
        leader = getattr(self.server.engine, "leader", None)
        if leader is not None and not leader.is_leader:
            # a follower must not swallow the delivery: Alertmanager retries, and /readyz keeps the
            # Service pointing at the leader
            self._send(503, {"error": "this engine replica is not the leader; retry"}, extra={"Retry-After": "1"})
            return
        n, matched = self.server.engine.submit_alerts(payload, received)
        self._send(202, {"status": "accepted", "alerts": n, "matched": matched})

    def do_PUT(self) -> None:
        self._send(405, {"error": "use POST /api/v1/alerts"}, close=True)

    do_DELETE = do_PATCH = do_PUT


def serve(engine: Any, host: str, port: int, *, token: str | None, max_body: int = 1 << 20) -> WebhookServer:
    """Start the webhook in a background thread; ``shutdown()`` + ``server_close()`` to stop."""
    srv = WebhookServer((host, port), engine, token, max_body)
    threading.Thread(target=srv.serve_forever, name="remediation-webhook", daemon=True).start()
    return srv
