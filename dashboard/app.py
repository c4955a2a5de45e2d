"""Building and serving the dashboard.

``create_app(store_url, slo_file=None, ...)`` returns the Dash app (pages: Fleet, Node, Mismatch,
SLOs, Remediation, Root cause).  ``serve_in_thread(app, host, port)`` serves it from a background
thread (``triscope run`` uses it) and returns a handle with ``url`` and ``stop()``.
``triscope.dashboard.wsgi:server`` is the WSGI entry for gunicorn.

The dashboard is read-only: it reads through ``store.Store``'s query functions and
``analysis``, and never writes.  Bound to anything but loopback it refuses to start without
``TRISCOPE_DASHBOARD_PASSWORD`` (HTTP basic auth) or trusted proxy addresses
(``TRISCOPE_DASHBOARD_TRUSTED_PROXIES``: an authenticating proxy's user header is believed from
those addresses only; ``dashboard/auth.py``, docs/dashboard.md for oauth2-proxy).
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from triscope.core.errors import UserError
from triscope.core.textsafe import one_line
from triscope.dashboard import auth, registry, storerole, timeview
from triscope.dashboard.auth import ProxyTrust
from triscope.dashboard.components import error_note
from triscope.dashboard.context import CONFIG_KEY, DashboardContext
from triscope.store.api import Store
from triscope.store.db import READ_STATEMENT_TIMEOUT_S
from triscope.store.ha import server_role
from triscope.web.loopback import is_loopback

log = logging.getLogger(__name__)

PASSWORD_ENV = "TRISCOPE_DASHBOARD_PASSWORD"
USER_ENV = "TRISCOPE_DASHBOARD_USER"
PROXY_ENV = "TRISCOPE_DASHBOARD_TRUST_PROXY_AUTH"   # refused: it trusted every client (see proxy_trust)
TRUSTED_PROXIES_ENV = "TRISCOPE_DASHBOARD_TRUSTED_PROXIES"
PROXY_HEADER_ENV = "TRISCOPE_DASHBOARD_PROXY_USER_HEADER"
OLD_PROXY_SETTING = (
    f"{PROXY_ENV} / --trust-proxy-auth is no longer accepted: it let every client in without reading "
    f"any header. Set {TRUSTED_PROXIES_ENV}=ADDRESS-OR-CIDR,... (the authenticating proxy's addresses; "
    f"--trusted-proxies) and, if the proxy's user header is not X-Forwarded-User, {PROXY_HEADER_ENV}; "
    "or use the password (docs/dashboard.md)")
ASSETS = Path(__file__).resolve().parent / "assets"
PAGE_MODULES = ("fleet", "node", "mismatch", "slos", "remediation", "rootcause")


class DashboardConfigError(UserError):
    """A setting that keeps the dashboard from starting (one clear line)."""


def check_bind(host: str, password: str | None, proxy: Any = None) -> None:
    """Refuse a non-loopback bind without authentication (a password, or trusted proxies)."""
    if is_loopback(host) or password or proxy:
        return
    raise DashboardConfigError(
        f"refusing to serve the dashboard on {host} without authentication: set {PASSWORD_ENV} (HTTP basic auth), "
        f"or put an authenticating proxy (oauth2-proxy) in front and set {TRUSTED_PROXIES_ENV} to its addresses; "
        "or bind to 127.0.0.1")


def proxy_trust(trusted: str | None = None, header: str | None = None) -> Any:
    """The trusted proxies (``auth.ProxyTrust``) from the arguments, else the environment; None when
    none are set.  The old all-or-nothing setting is refused with what replaced it."""

    if os.environ.get(PROXY_ENV, "").strip():
        raise DashboardConfigError(OLD_PROXY_SETTING)
    trusted = trusted if trusted is not None else os.environ.get(TRUSTED_PROXIES_ENV)
    header = header if header is not None else os.environ.get(PROXY_HEADER_ENV)
    if not trusted or not trusted.strip():
        if header and header.strip():
            raise DashboardConfigError(f"{PROXY_HEADER_ENV} is set but {TRUSTED_PROXIES_ENV} is not: "
                                       "say which addresses the header is believed from")
        return None
    try:
        return ProxyTrust.parse(trusted, header or None)
    except ValueError as e:
        raise DashboardConfigError(f"{TRUSTED_PROXIES_ENV}: {e}") from None


def _import_pages() -> None:
    import dash

    from triscope.dashboard.pages import fleet, mismatch, node, remediation, rootcause, slos

    modules = {"fleet": fleet, "node": node, "mismatch": mismatch, "slos": slos, "remediation": remediation,
               "rootcause": rootcause}
    for name in PAGE_MODULES:
        mod = modules[name]
        # what Dash does for modules it finds in a pages folder: the registry entry gets the layout
        entry = dash.page_registry.get(mod.__name__)
        if entry is not None and not getattr(entry.get("layout"), "_triscope_guarded", False):
            entry["layout"] = _guarded(mod.layout, entry.get("name") or name)


def _guarded(layout: Any, page: str) -> Any:
    """A page layout that says what failed (store unreachable, ...) instead of a blank page."""
    import functools

    @functools.wraps(layout)
    def wrapper(**kwargs: Any) -> Any:
        from dash import html

        try:
            return layout(**kwargs)
        except Exception as e:  # noqa: BLE001 - one line in the page, the traceback in the log
            return html.Div([html.H2(page), error_note(f"the {page} page", e)])

    wrapper._triscope_guarded = True  # type: ignore[attr-defined]
    return wrapper


def create_app(store_url: str | None = None, slo_file: str | Path | None = None, *, store: Store | None = None,
               password: str | None = None, username: str | None = None, live_interval_s: float = 5.0,
               max_points: int = 1000, clock: Any = None, title: str = "triscope",
               trusted_proxies: str | None = None, proxy_user_header: str | None = None) -> Any:
    """The Dash app over the store at ``store_url`` (or an open ``store``).

    ``password`` (default ``$TRISCOPE_DASHBOARD_PASSWORD``) turns on HTTP basic auth for every
    request (user ``username``, default ``$TRISCOPE_DASHBOARD_USER`` or ``triscope``);
    ``trusted_proxies`` (default ``$TRISCOPE_DASHBOARD_TRUSTED_PROXIES``) believes the proxy's
    ``proxy_user_header`` (default ``$TRISCOPE_DASHBOARD_PROXY_USER_HEADER`` or X-Forwarded-User)
    from those addresses only (``dashboard/auth.py``).
    """
    import dash
    from dash import dcc, html

    proxy = proxy_trust(trusted_proxies, proxy_user_header)   # refused before the store is opened
    if store is None:
        store = Store.open(store_url, statement_timeout_s=READ_STATEMENT_TIMEOUT_S)   # it only reads
        store.require_schema()
    slo_path = Path(slo_file) if slo_file else None
    if slo_path is not None and not slo_path.is_file():
        raise DashboardConfigError(f"SLO file {slo_path} does not exist")
    app = dash.Dash(
        "dashboard", use_pages=True, pages_folder="", assets_folder=str(ASSETS), title=title,
        suppress_callback_exceptions=True, update_title=None,  # type: ignore[arg-type]
    )
    _import_pages()
    import time

    app.server.config[CONFIG_KEY] = DashboardContext(
        store=store, slo_file=slo_path, live_interval_s=live_interval_s, max_points=max_points,
        clock=clock or time.time)
    pages = [p for p in dash.page_registry.values() if p["module"].startswith("triscope.dashboard.pages.")]
    pages.sort(key=lambda p: p.get("order") or 0)
    nav = html.Nav([html.Span("triscope", className="brand")]
                   + [dcc.Link(p["name"], href=p["relative_path"], className="nav-link", id=f"nav-{p['module'].split('.')[-1]}")
                      for p in pages if not p.get("nav_hidden")]
                   + [storerole.badge(), timeview.toggle()], className="topnav")
    app.layout = html.Div([nav, html.Main(dash.page_container, className="page")], className="app")
    registry.attach(app)
    timeview.attach(app)
    storerole.attach(app, store)

    @app.server.route(auth.HEALTH_PATH)
    def _healthz() -> Any:  # for probes: 200 while the store answers, 503 with the reason otherwise

        try:
            store.nodes()
            role = server_role(store.engine)
        except Exception as e:  # noqa: BLE001
            # the probe needs no password: it says that the store does not answer, not the driver's
            # text (host names, user, paths); the reason goes to the log for the operator
            log.warning("healthz: store unavailable: %s", one_line(str(e).splitlines()[0][:200] if str(e) else
                                                                    type(e).__name__))
            return "store unavailable\n", 503, {"Content-Type": "text/plain"}
        head = {"Content-Type": "text/plain", "X-Triscope-Store-Role": "standby" if role.standby else "leader"}
        if not role.standby:
            return "ok\n", 200, head
        # reading from a replica (target_session_attrs=prefer-standby): how stale the pages may be
        lag = "unknown" if role.replay_lag_s is None else f"{role.replay_lag_s:.3f}"
        head["X-Triscope-Store-Replay-Lag-Seconds"] = lag
        return f"ok (standby, replay lag {lag} s)\n", 200, head
    pw = password if password is not None else os.environ.get(PASSWORD_ENV) or None
    if pw or proxy is not None:
        auth.install_auth(app.server, username=username or os.environ.get(USER_ENV) or "triscope", password=pw,
                          proxy=proxy)
    return app


@dataclass
class ServerHandle:
    host: str
    port: int
    thread: threading.Thread
    server: Any
    scheme: str = "http"

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}/"

    def stop(self, timeout: float = 5.0) -> None:
        self.server.shutdown()
        self.thread.join(timeout)
        self.server.server_close()


def serve_in_thread(app: Any, host: str = "127.0.0.1", port: int = 8050, *, password: str | None = None,
                    ssl_context: Any = None) -> ServerHandle:
    """Serve ``app`` from a daemon thread (werkzeug, threaded; HTTPS with ``ssl_context``, from
    ``--web.config.file``).  Port 0 picks a free port.  Refuses a non-loopback host without
    authentication (see ``check_bind``)."""
    from werkzeug.serving import WSGIRequestHandler, make_server

    class _Handler(WSGIRequestHandler):
        def log_request(self, code: Any = "-", size: Any = "-") -> None:  # access log at debug level only
            log.debug("%s %s %s", self.address_string(), self.requestline, code)

    pw = password if password is not None else os.environ.get(PASSWORD_ENV)
    has_auth = bool(pw) or bool(getattr(app.server, "triscope_basic_auth", False))
    check_bind(host, "set" if has_auth else None, bool(getattr(app.server, "triscope_proxy_auth", False)))
    srv = make_server(host, port, app.server, threaded=True, request_handler=_Handler, ssl_context=ssl_context)
    t = threading.Thread(target=srv.serve_forever, name="triscope-dashboard", daemon=True)
    t.start()
    return ServerHandle(host, int(srv.server_port), t, srv, "https" if ssl_context is not None else "http")
