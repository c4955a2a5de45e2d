"""``triscope dashboard``: serve the SRE dashboard (read-only) over a store."""

from __future__ import annotations

import argparse
import logging
import os

from triscope.commands.common import add_db_option, db_url

log = logging.getLogger(__name__)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "dashboard", help="serve the SRE dashboard (fleet, node lanes, mismatch, SLOs, remediation, root cause)",
        description="Serve the read-only Dash dashboard over a store. Bound to anything but loopback it refuses to "
        "start without authentication: set TRISCOPE_DASHBOARD_PASSWORD (HTTP basic auth, user 'triscope' or "
        "TRISCOPE_DASHBOARD_USER), or put an authenticating proxy such as oauth2-proxy in front and pass "
        "--trust-proxy-auth. For production, serve 'triscope.dashboard.wsgi:server' with gunicorn (docs/dashboard.md).",
    )
    add_db_option(p)
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8050, help="port (default 8050; 0 picks a free one)")
    p.add_argument("--slo", metavar="FILE", default=os.environ.get("TRISCOPE_SLO_FILE"),
                   help="SLO file (Sloth prometheus/v1 YAML) for the SLOs page; default $TRISCOPE_SLO_FILE")
    p.add_argument("--live-interval", type=float, default=5.0, metavar="SECONDS",
                   help="how often live mode fetches new points (default 5)")
    p.add_argument("--trust-proxy-auth", action="store_true",
                   help="allow a non-loopback bind without a password because an authenticating proxy is in front")
    p.set_defaults(func=cmd_dashboard)


def cmd_dashboard(args: argparse.Namespace) -> int:
    from triscope.dashboard.app import PASSWORD_ENV, check_bind, create_app, serve_in_thread
    from triscope.errors import UserError

    if not 0 <= args.port <= 65535:
        raise UserError(f"--port {args.port} is out of range")
    if args.live_interval < 0.5:
        raise UserError("--live-interval must be at least 0.5 seconds")
    # refuse before touching the database
    check_bind(args.host, os.environ.get(PASSWORD_ENV), args.trust_proxy_auth)
    app = create_app(db_url(args), slo_file=args.slo, live_interval_s=args.live_interval)
    try:
        handle = serve_in_thread(app, args.host, args.port, trust_proxy_auth=args.trust_proxy_auth)
    except OSError as e:
        raise UserError(f"cannot listen on {args.host}:{args.port}: {e.strerror or e}") from None
    print(f"triscope dashboard: {handle.url}", flush=True)
    try:
        handle.thread.join()
    except KeyboardInterrupt:
        handle.stop()
    return 0
