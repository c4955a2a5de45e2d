"""The triscope SRE dashboard (Dash + Plotly): ``triscope.dashboard.app.create_app``, ``serve_in_thread``;
WSGI entry ``triscope.dashboard.wsgi:server``.  Pages live in ``triscope.dashboard.pages``, figure builders in
``triscope.dashboard.figures``, data access (store + analysis only) in ``triscope.dashboard.data``."""
