"""The triscope SRE dashboard (Dash + Plotly): ``dashboard.app.create_app``, ``serve_in_thread``;
WSGI entry ``dashboard.wsgi:server``.  Pages live in ``dashboard.pages``, figure builders in
``dashboard.figures``, data access (store + analysis only) in ``dashboard.data``."""
