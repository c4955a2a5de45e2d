"""``triscope dashboard``: serve the SRE dashboard (read-only) over a store."""

from __future__ import annotations

import argparse
import logging
import os

from triscope.commands.common import add_db_option, add_web_config_option, db_url

log = logging.getLogger(__name__)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "dashboard", help="serve the SRE dashboard (fleet, node lanes, mismatch, SLOs, remediation, root cause)",
        description="Serve the read-only Dash dashboard over a store. Bound to anything but loopback it refuses to "
        "start without authentication: set TRISCOPE_DASHBOARD_PASSWORD (HTTP basic auth, user 'triscope' or "
        "TRISCOPE_DASHBOARD_USER), or put an authenticating proxy such as oauth2-proxy in front and name its "
        "addresses with --trusted-proxies (its user header is believed from those addresses only). "
        "For production, serve 'triscope.dashboard.wsgi:server' with gunicorn (docs/dashboard.md).",
    )
    add_db_option(p)
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8050, help="port (default 8050; 0 picks a free one)")
    p.add_argument("--slo", metavar="FILE", default=os.environ.get("TRISCOPE_SLO_FILE"),
                   help="SLO file (Sloth prometheus/v1 YAML) for the SLOs page; default $TRISCOPE_SLO_FILE")
    p.add_argument("--live-interval", type=float, default=5.0, metavar="SECONDS",
                   help="how often live mode fetches new points (default 5)")
    p.add_argument("--trusted-proxies", metavar="CIDRS", default=None,
                   help="addresses or CIDRs of an authenticating proxy (oauth2-proxy), comma-separated: a request "
                        "from one of them carrying the user header is that user; the header from anywhere else "
                        "is ignored; 127.0.0.1 for a sidecar, 0.0.0.0/0 refused (default $TRISCOPE_DASHBOARD_TRUSTED_PROXIES)")
    p.add_argument("--proxy-user-header", metavar="NAME", default=None,
                   help="the proxy's user header (default $TRISCOPE_DASHBOARD_PROXY_USER_HEADER or X-Forwarded-User)")
    p.add_argument("--trust-proxy-auth", action="store_true", help=argparse.SUPPRESS)   # refused: see OLD_PROXY_SETTING
    add_web_config_option(p, "the dashboard (TLS only: basic_auth_users is refused; the dashboard's password "
                             "or trusted proxies are its auth)")
    p.set_defaults(func=cmd_dashboard)


def cmd_dashboard(args: argparse.Namespace) -> int:
    from triscope.core.errors import UserError
    from triscope.dashboard.app import (
        OLD_PROXY_SETTING,
        PASSWORD_ENV,
        check_bind,
        create_app,
        proxy_trust,
        serve_in_thread,
    )
    from triscope.web.config import load_for_cli

    if not 0 <= args.port <= 65535:
        raise UserError(f"--port {args.port} is out of range")
    if args.live_interval < 0.5:
        raise UserError("--live-interval must be at least 0.5 seconds")
    if args.trust_proxy_auth:
        raise UserError(OLD_PROXY_SETTING)
    # refuse before touching the database
    proxy = proxy_trust(args.trusted_proxies, args.proxy_user_header)
    check_bind(args.host, os.environ.get(PASSWORD_ENV), proxy)
    web = load_for_cli(args.web_config_file, allow_auth=False)
    app = create_app(db_url(args), slo_file=args.slo, live_interval_s=args.live_interval,
                     trusted_proxies=args.trusted_proxies, proxy_user_header=args.proxy_user_header)
    try:
        handle = serve_in_thread(app, args.host, args.port, ssl_context=web.ssl_context() if web else None)
    except OSError as e:
        raise UserError(f"cannot listen on {args.host}:{args.port}: {e.strerror or e}") from None
    print(f"triscope dashboard: {handle.url}", flush=True)
    try:
        handle.thread.join()
    except KeyboardInterrupt:
        handle.stop()
    return 0
