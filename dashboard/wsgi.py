"""WSGI entry for production serving: ``gunicorn 'triscope.dashboard.wsgi:server'``.

Configuration from the environment (the app is built at import time, once per worker):

* ``TRISCOPE_DB_URL`` -- the store (required unless ./triscope.db is the store);
* ``TRISCOPE_SLO_FILE`` -- the SLO file (optional);
* ``TRISCOPE_DASHBOARD_PASSWORD`` / ``TRISCOPE_DASHBOARD_USER`` -- HTTP basic auth.

gunicorn binds where it is told and this module cannot see where, so it refuses to load without
``TRISCOPE_DASHBOARD_PASSWORD`` or ``TRISCOPE_DASHBOARD_TRUST_PROXY_AUTH=1`` (an authenticating
proxy such as oauth2-proxy in front; docs/dashboard.md).  Example::

    TRISCOPE_DB_URL=postgresql://triscope@db/triscope TRISCOPE_DASHBOARD_PASSWORD=... \\
        gunicorn -w 4 -b 0.0.0.0:8050 'triscope.dashboard.wsgi:server'
"""

from __future__ import annotations

import os

from triscope.dashboard.app import PASSWORD_ENV, PROXY_ENV, DashboardConfigError, _env_flag, create_app
from triscope.store.db import default_url

if not os.environ.get(PASSWORD_ENV) and not _env_flag(PROXY_ENV):
    raise DashboardConfigError(f"triscope.dashboard.wsgi: set {PASSWORD_ENV} (basic auth) or {PROXY_ENV}=1 "
                               "(an authenticating proxy in front) before serving it")

app = create_app(default_url(), os.environ.get("TRISCOPE_SLO_FILE") or None)
server = app.server
