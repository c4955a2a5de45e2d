"""The Alertmanager webhook: ``POST /api/v1/alerts`` (webhook payload version 4).

``Authorization: Bearer <token>`` is required (compared in constant time): missing or wrong →
401.  A body that is not JSON (or nested too deeply), does not follow the v4 schema → 400 with a
message; larger than ``max_body`` → 413; a missing, negative or repeated ``Content-Length`` →
411/400 before any body is read.  Accepted → 202 with the number of alerts and rule matches, once
the engine has recorded them in the store (so a crash after the 202 loses nothing); the decisions
run on the engine's workers, so Alertmanager never waits for an action.  When the alerts cannot be
recorded → 503, and Alertmanager retries.  A replica that is not the
leader answers 503 (Alertmanager retries; its ``GET /readyz`` is 503 too, so a Service with that
readiness probe sends deliveries to the leader only).  Also ``GET /healthz`` (engine status,
always 200) and ``GET /metrics`` (the engine's Prometheus metrics).
"""

from __future__ import annotations

import dataclasses
import hmac
import json
import logging
import time
from typing import Annotated, Literal, NamedTuple, Protocol, cast

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainValidator,
    ValidationError,
)

from triscope.core.configfile import describe, show
from triscope.core.textsafe import one_line
from triscope.core.timeparse import TimeParseError, parse_rfc3339
from triscope.remediation import metrics
from triscope.web.auth import RELOAD_EVERY, WebConfig
from triscope.web.httpd import HttpServer, Limits, Request, Response

log = logging.getLogger(__name__)

MAX_ALERTS = 1000


class PayloadError(ValueError):
    pass


def _version(value: object) -> str:
    if str(value) != "4":
        raise ValueError(f"unsupported webhook payload version {show(value, 'an object')} (expected \"4\")")
    return "4"


def _alert_list(value: object) -> object:
    if not isinstance(value, list) or not value:
        raise ValueError("must be a non-empty list")
    if len(value) > MAX_ALERTS:   # before any alert is looked at
        raise ValueError(f"too many alerts in one payload ({len(value)} > {MAX_ALERTS})")
    return value


class AlertTime(NamedTuple):
    """An alert's ``startsAt``: as Alertmanager wrote it (part of the delivery key) and as epoch seconds."""

    text: str
    ts: float


def _alert_time(value: object) -> AlertTime:
    """``startsAt``, read once: refused unless it is a string holding an RFC 3339 time (at most 64 characters)."""
    if not isinstance(value, str):
        raise ValueError(f"must be a string, not {show(value)}")
    try:
        if len(value) > 64:
            raise TimeParseError(value)
        return AlertTime(value, parse_rfc3339(value))
    except TimeParseError:
        raise ValueError(f"must be an RFC 3339 time, not {show(value)}") from None


def _has_alertname(labels: dict[str, str]) -> dict[str, str]:
    if not labels.get("alertname"):
        raise ValueError("has no alertname")
    return labels


Strings = dict[str, str]


class _Model(BaseModel):
    # Alertmanager's other fields (receiver, groupKey, endsAt, generatorURL, ...) are not checked
    # here and pass through untouched: a newer Alertmanager may add more.
    model_config = ConfigDict(extra="ignore", strict=True, frozen=True)


class WebhookAlert(_Model):
    """One alert of the payload: what the engine reads."""

    status: Literal["firing", "resolved"]
    labels: Annotated[Strings, AfterValidator(_has_alertname)]
    annotations: Strings | None = None
    startsAt: Annotated[AlertTime, PlainValidator(_alert_time)]
    endsAt: str = ""
    generatorURL: str = ""
    fingerprint: Annotated[str, Field(max_length=64)] | None = None


class WebhookPayload(_Model):
    """The Alertmanager webhook payload, version 4 (at most ``MAX_ALERTS`` alerts), as the engine takes it."""

    version: Annotated[str, PlainValidator(_version)]
    groupLabels: Strings | None = None
    commonLabels: Strings | None = None
    commonAnnotations: Strings | None = None
    alerts: Annotated[list[WebhookAlert], BeforeValidator(_alert_list)]


def validate_payload(obj: object) -> WebhookPayload:
    """An Alertmanager webhook v4 payload (``WebhookPayload``, Alertmanager's other fields ignored), or
    ``PayloadError`` with the first problem, one short line (``alerts[0].status: must be ...``)."""
    if not isinstance(obj, dict):
        raise PayloadError("the body must be a JSON object (Alertmanager webhook payload)")
    try:
        return WebhookPayload.model_validate(obj)
    except ValidationError as e:
        # the one Any on the way: pydantic types each error's offending input as Any (describe reads its place)
        _, where, what = describe(e.errors(include_url=False)[0], mapping="an object")  # type: ignore[misc]
        raise PayloadError(one_line(f"{where}: {what}" if where else what, 300)) from None


class AlertSink(Protocol):
    """What the webhook hands the alerts to (``triscope.remediation.engine.Engine``)."""

    @property
    def leader_now(self) -> bool:
        """Whether this replica may act (it holds the Lease, or runs alone)."""
        ...

    def submit_alerts(self, payload: WebhookPayload, received_ts: float | None = None) -> tuple[int, int]:
        ...

    def status(self) -> dict[str, object]:
        ...


MIN_TOKEN_LEN = 16
# Alertmanager posts one group per request and keeps connections alive; a request must arrive whole
# within 10 s of its first byte; 1,024 pending connections ride out a burst of notifications.
WEBHOOK_LIMITS = Limits(max_connections=512, idle_timeout=60.0, header_timeout=5.0, request_timeout=10.0,
                        write_timeout=10.0, max_header_bytes=16384, max_headers=64, max_body=1 << 20, backlog=1024)


def normalise_token(raw: str | None, where: str = "the webhook token") -> str | None:
    """The bearer token as it will be compared: surrounding whitespace (a file's trailing newline)
    removed; refused when empty, shorter than ``MIN_TOKEN_LEN`` or holding whitespace or control
    characters inside (a header value could never carry it, so no client could ever match)."""
    if raw is None:
        return None
    token = raw.strip()
    if not token:
        raise ValueError(f"{where} is empty")
    if any(ch.isspace() or not ch.isprintable() for ch in token):
        raise ValueError(f"{where} contains whitespace or control characters inside it: no "
                         "Authorization header can carry it")
    if len(token) < MIN_TOKEN_LEN:
        raise ValueError(f"{where} is {len(token)} characters: use at least {MIN_TOKEN_LEN} "
                         "(e.g. 'openssl rand -hex 24')")
    return token


class WebhookServer:
    """The webhook on the shared HTTP server (``triscope.web.httpd``): concurrent connections, a
    whole-request deadline, a bounded body counted as it arrives (chunked too), a listen backlog
    for bursts.  Decisions run on the engine's workers; the request handler only validates and
    records the alerts, on a small pool of its own."""

    def __init__(self, addr: tuple[str, int], engine: AlertSink, token: str | None, max_body: int,
                 limits: Limits | None = None, web: WebConfig | None = None) -> None:
        self.engine = engine
        self.token = normalise_token(token)
        self.max_body = max_body
        lim = limits or WEBHOOK_LIMITS
        lim = dataclasses.replace(lim, max_body=max_body)
        self.http = HttpServer(addr, self.handle, limits=lim, workers=8, name="remediation-webhook",
                               methods=("GET", "HEAD", "POST"), error=lambda code, msg: _json(code, {"error": msg}),
                               ssl_context=web.ssl_context if web is not None else None,
                               every=(RELOAD_EVERY, web.refresh) if web is not None and web.scheme == "https" else None)
        self.server_address = self.http.server_address
        self.scheme = web.scheme if web is not None else "http"

    def serve_forever(self) -> None:   # the server runs on its own thread once started
        self.http.start()

    def shutdown(self) -> None:
        self.http.shutdown()

    def server_close(self) -> None:
        self.http.shutdown()

    # requests ---------------------------------------------------------------------------------------
    def handle(self, req: Request) -> Response:
        if req.method in ("GET", "HEAD"):
            return self._get(req)
        received = time.time()
        if req.path != "/api/v1/alerts":
            return _json(404, {"error": f"no such path {one_line(req.path, 200)}; POST /api/v1/alerts"}, close=True)
        if self.token is not None:
            auth = req.header("authorization") or ""
            scheme, _, given = auth.partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), self.token.encode()):
                return _json(401, {"error": "missing or wrong bearer token"}, close=True,
                             headers=[("WWW-Authenticate", 'Bearer realm="triscope-remediation"')])
        ctype = (req.header("content-type") or "application/json").split(";")[0].strip().lower()
        if ctype not in ("application/json", "text/json", ""):
            return _json(415, {"error": f"Content-Type {one_line(ctype, 80)} is not JSON"})
        try:
            obj = cast(object, json.loads(req.body))   # any JSON value: validate_payload types it
        except RecursionError:
            return _json(400, {"error": "body is not valid JSON: nested too deeply"})
        except (ValueError, UnicodeDecodeError) as e:
            return _json(400, {"error": f"body is not valid JSON: {one_line(e, 200)}"})
        try:
            payload = validate_payload(obj)
        except PayloadError as e:
            return _json(400, {"error": str(e)})
        except RecursionError:
            return _json(400, {"error": "payload nested too deeply"})
        if not self.engine.leader_now:
            # a follower must not swallow the delivery: Alertmanager retries, and /readyz keeps the
            # Service pointing at the leader
            return _json(503, {"error": "this engine replica is not the leader; retry"}, headers=[("Retry-After", "1")])
        try:
            n, matched = self.engine.submit_alerts(payload, received)
        except Exception as e:  # noqa: BLE001 - not recorded, so not accepted: Alertmanager retries a 5xx
            log.error("webhook: could not record the alerts, answering 503 so Alertmanager retries: %s", one_line(e))
            return _json(503, {"error": "the alerts could not be recorded; retry"}, headers=[("Retry-After", "5")])
        return _json(202, {"status": "accepted", "alerts": n, "matched": matched})

    def _get(self, req: Request) -> Response:
        head = req.method == "HEAD"
        if req.path == "/healthz":
            return _json(200, self.engine.status(), head=head)
        if req.path == "/readyz":
            return _json(200 if self.engine.leader_now else 503, self.engine.status(), head=head)
        if req.path == "/metrics":
            return Response(200, generate_latest(metrics.REGISTRY), CONTENT_TYPE_LATEST, head=head)
        return _json(404, {"error": f"no such path {one_line(req.path, 200)}; POST /api/v1/alerts"}, head=head)


def _json(status: int, payload: dict[str, object], *, close: bool = False, head: bool = False,
          headers: list[tuple[str, str]] | None = None) -> Response:
    return Response(status, json.dumps(payload).encode(), "application/json", headers=headers or [], close=close,
                    head=head)


def serve(engine: AlertSink, host: str, port: int, *, token: str | None, max_body: int = 1 << 20,
          web: WebConfig | None = None) -> WebhookServer:
    """Start the webhook on its own thread (TLS with ``web``: ``--web.config.file``); ``shutdown()`` to stop."""
    srv = WebhookServer((host, port), engine, token, max_body, web=web)
    srv.http.start()
    return srv
