"""WSGI entry for production serving: ``gunicorn 'triscope.dashboard.wsgi:server'``.

Configuration from the environment (the app is built at import time, once per worker):

* ``TRISCOPE_DB_URL`` -- the store (required unless ./triscope.db is the store);
* ``TRISCOPE_SLO_FILE`` -- the SLO file (optional);
* ``TRISCOPE_DASHBOARD_PASSWORD`` / ``TRISCOPE_DASHBOARD_USER`` -- HTTP basic auth;
* ``TRISCOPE_DASHBOARD_TRUSTED_PROXIES`` / ``TRISCOPE_DASHBOARD_PROXY_USER_HEADER`` -- an
  authenticating proxy's user header, believed from those addresses only (dashboard/auth.py).

gunicorn binds where it is told and this module cannot see where, so it refuses to load without
a password or trusted proxies (docs/dashboard.md).  TLS is gunicorn's: ``--certfile`` and
``--keyfile``.  Example::

    TRISCOPE_DB_URL=postgresql://triscope@db/triscope TRISCOPE_DASHBOARD_PASSWORD=... \\
        gunicorn -w 4 -b 0.0.0.0:8050 --certfile tls.crt --keyfile tls.key 'triscope.dashboard.wsgi:server'
"""

from __future__ import annotations

import os

from triscope.dashboard.app import (
    PASSWORD_ENV,
    TRUSTED_PROXIES_ENV,
    DashboardConfigError,
    create_app,
    proxy_trust,
)
from triscope.store.db import default_url

if not os.environ.get(PASSWORD_ENV) and proxy_trust() is None:
    raise DashboardConfigError(f"triscope.dashboard.wsgi: set {PASSWORD_ENV} (basic auth) or {TRUSTED_PROXIES_ENV} "
                               "(the addresses of an authenticating proxy in front) before serving it")

app = create_app(default_url(), os.environ.get("TRISCOPE_SLO_FILE") or None)
server = app.server
