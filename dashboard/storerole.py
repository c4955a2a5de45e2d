"""The top bar's store badge: when the dashboard reads a PostgreSQL standby (a ``prefer-standby``
URL on a Patroni cluster, docs/scaling.md#high-availability), how far behind the leader its pages
may be; nothing on the leader or SQLite.  Beside it, on every page, how many of the stored nodes
are recordings (imported traces, ``NodeInfo.recording``), with their names in its tooltip.
Refreshed every ``REFRESH_MS`` by two small queries (``triscope.store.ha.server_role``, the nodes
table); ``/healthz`` answers the role in its headers."""

from __future__ import annotations

from typing import Any

from dash import Input, Output, dcc, html

from triscope.store.ha import ServerRole, server_role

ROLE_ID = "store-role"
RECORDINGS_ID = "store-recordings"
TICK_ID = "store-role-tick"
REFRESH_MS = 15_000


def badge() -> html.Span:
    return html.Span([dcc.Interval(id=TICK_ID, interval=REFRESH_MS),
                      html.Span(id=RECORDINGS_ID, style={"marginRight": "12px"}), html.Span(id=ROLE_ID)],
                     className="store-role")


def describe_recordings(recs: dict[str, str], nodes: int) -> tuple[str, str]:
    """(badge text, its tooltip) for the recordings among ``nodes`` stored nodes: "" when none."""
    if not recs:
        return "", ""
    text = "recording" if nodes == 1 else f"{len(recs)} of {nodes} nodes: recordings"
    tip = ("imported traces, not live agents (triscope import-trace): "
           + ", ".join(f"{n} ({f})" for n, f in sorted(recs.items())[:20]) + (" ..." if len(recs) > 20 else ""))
    return text, tip


def describe(role: ServerRole | None, error: str = "") -> tuple[str, str]:
    """(badge text, its tooltip)."""
    if role is None:
        return "store unavailable", error
    if not role.standby:
        return "", "reading the leader"
    lag = "lag unknown" if role.replay_lag_s is None else f"{role.replay_lag_s:.1f} s behind"
    return (f"store: standby, {lag}",
            "this dashboard reads a standby (prefer-standby): the pages show what the leader had committed "
            "this long ago (seconds since the newest transaction the standby replayed)")


def attach(app: Any, store: Any) -> None:

    @app.callback(Output(ROLE_ID, "children"), Output(ROLE_ID, "title"), Input(TICK_ID, "n_intervals"))
    def _refresh(_n: int | None) -> tuple[str, str]:
        try:
            return describe(server_role(store.engine))
        except Exception as e:  # noqa: BLE001 - the badge says so; the pages say their own
            return describe(None, str(e).splitlines()[0][:200] if str(e) else type(e).__name__)

    @app.callback(Output(RECORDINGS_ID, "children"), Output(RECORDINGS_ID, "title"), Input(TICK_ID, "n_intervals"))
    def _recordings(_n: int | None) -> tuple[str, str]:
        try:
            nodes = store.nodes()
        except Exception:  # noqa: BLE001 - the role badge says the store is unavailable
            return "", ""
        return describe_recordings({n.name: r for n in nodes if (r := n.recording)}, len(nodes))
