"""Serving the dashboard: the CLI, the auth guard on non-loopback binds, basic auth, the WSGI entry
under a real gunicorn, several apps in one process, read-only."""

from __future__ import annotations

import base64
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import Any

import pytest
from conftest import REPO, free_port, wait_for_port

TRISCOPE = os.path.join(os.path.dirname(sys.executable), "triscope")  # the console script


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRISCOPE_DASHBOARD_")}
    env.update(extra)
    return env


def _get(url: str, auth: tuple[str, str] | None = None, timeout: float = 20) -> tuple[int, bytes]:
    req = urllib.request.Request(url)
    if auth:
        req.add_header("Authorization", "Basic " + base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode())
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_check_bind() -> None:
    from triscope.dashboard.app import DashboardConfigError, check_bind, is_loopback

    for host in ("127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost"):
        assert is_loopback(host)
        check_bind(host, None)
    for host in ("0.0.0.0", "::", "10.1.2.3", "dash.example.com"):
        assert not is_loopback(host)
        with pytest.raises(DashboardConfigError, match="without authentication"):
            check_bind(host, None)
        check_bind(host, "pw")
        check_bind(host, None, proxy=True)


def test_cli_refuses_public_bind_without_password(seeded_url: str) -> None:
    r = subprocess.run([TRISCOPE, "dashboard", "--db", seeded_url, "--host", "0.0.0.0",
                        "--port", str(free_port())], cwd=REPO, env=_env(), capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "refusing to serve the dashboard on 0.0.0.0 without authentication" in lines[0]
    assert "TRISCOPE_DASHBOARD_PASSWORD" in lines[0] and "Traceback" not in r.stderr


def test_cli_bad_database_is_one_line(tmp_path: Any) -> None:
    empty = f"sqlite:///{tmp_path / 'empty.db'}"
    r = subprocess.run([TRISCOPE, "dashboard", "--db", empty, "--port", str(free_port())],
                       cwd=REPO, env=_env(), capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "no triscope schema" in r.stderr and "Traceback" not in r.stderr


def test_cli_serves_on_loopback(seeded_url: str) -> None:
    port = free_port()
    p = subprocess.Popen([TRISCOPE, "dashboard", "--db", seeded_url, "--port", str(port)],
                         cwd=REPO, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for_port(port, timeout=60)
        assert p.stdout is not None
        assert p.stdout.readline().strip() == f"triscope dashboard: http://127.0.0.1:{port}/"
        code, body = _get(f"http://127.0.0.1:{port}/")
        assert code == 200 and b"_dash-config" in body
        code, _ = _get(f"http://127.0.0.1:{port}/_dash-layout")
        assert code == 200
    finally:
        p.terminate()
        p.wait(10)


def test_basic_auth_on_a_public_bind(seeded_url: str) -> None:
    from triscope.dashboard.app import create_app, serve_in_thread

    app = create_app(seeded_url, password="s3cret", username="sre")
    h = serve_in_thread(app, "0.0.0.0", 0)
    try:
        base = f"http://127.0.0.1:{h.port}"
        code, _ = _get(base + "/")
        assert code == 401
        assert _get(base + "/_dash-layout", ("sre", "wrong"))[0] == 401
        assert _get(base + "/_dash-layout", ("other", "s3cret"))[0] == 401
        code, body = _get(base + "/", ("sre", "s3cret"))
        assert code == 200 and b"_dash-config" in body
        assert _get(base + "/healthz") == (200, b"ok\n")  # probes need no password
    finally:
        h.stop()


def test_serve_in_thread_refuses_public_bind_without_auth(seeded_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from triscope.dashboard.app import DashboardConfigError, create_app, serve_in_thread

    monkeypatch.delenv("TRISCOPE_DASHBOARD_PASSWORD", raising=False)
    monkeypatch.delenv("TRISCOPE_DASHBOARD_TRUST_PROXY_AUTH", raising=False)
    app = create_app(seeded_url)
    with pytest.raises(DashboardConfigError):
        serve_in_thread(app, "0.0.0.0", 0)
    h = serve_in_thread(app, "127.0.0.1", 0)
    try:
        assert _get(h.url)[0] == 200
    finally:
        h.stop()


def test_two_apps_in_one_process_both_have_their_callbacks(seeded_url: str) -> None:
    from triscope.dashboard.app import create_app

    a, b = create_app(seeded_url), create_app(seeded_url)
    ca, cb = a.server.test_client(), b.server.test_client()
    deps_a, deps_b = ca.get("/_dash-dependencies").json, cb.get("/_dash-dependencies").json
    assert len(deps_a) == len(deps_b) >= 10
    assert any("node-graph.figure" in d["output"] for d in deps_b)


def test_dashboard_is_read_only(seeded_url: str) -> None:
    """Render every page and run the node callbacks: nothing in the store changes."""
    from triscope.dashboard.app import create_app
    from triscope.dashboard.pages import node
    from triscope.store import Store

    st = Store.open(seeded_url)

    def snapshot() -> tuple[Any, ...]:
        return (len(st.nodes()), len(st.series()), st.time_bounds(), len(st.events()),
                [(n.name, n.last_seen) for n in st.nodes()])

    before = snapshot()
    app = create_app(seeded_url)
    c = app.server.test_client()
    for path in ("/", "/node/h200-node", "/mismatch", "/slos", "/remediation", "/rootcause"):
        assert c.get(path).status_code == 200
    with app.server.test_request_context("/"):
        for page in ("fleet", "node", "mismatch", "slos", "remediation", "rootcause"):
            __import__(f"triscope.dashboard.pages.{page}", fromlist=["layout"]).layout(node="h200-node")
        fig, meta, *_ = node.render("1h", 0, "h200-node", None, None)
        assert meta and fig["data"]
        node.live_append(1, meta, None)
    assert snapshot() == before


def test_wsgi_entry_under_gunicorn(seeded_url: str, tmp_path: Any) -> None:
    # without an auth setting the module refuses to load
    r = subprocess.run([sys.executable, "-c", "import triscope.dashboard.wsgi"], cwd=REPO,
                       env=_env(TRISCOPE_DB_URL=seeded_url), capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "TRISCOPE_DASHBOARD_PASSWORD" in r.stderr
    port = free_port()
    gunicorn = os.path.join(os.path.dirname(sys.executable), "gunicorn")
    p = subprocess.Popen([gunicorn, "-w", "2", "-b", f"127.0.0.1:{port}", "triscope.dashboard.wsgi:server"], cwd=REPO,
                         env=_env(TRISCOPE_DB_URL=seeded_url, TRISCOPE_DASHBOARD_PASSWORD="pw",
                                  TRISCOPE_SLO_FILE=str(REPO / "deploy" / "slo.example.yaml")),
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        wait_for_port(port, timeout=60)
        deadline = time.monotonic() + 60
        code = 0
        while time.monotonic() < deadline:  # workers import the app after the port opens
            code, _ = _get(f"http://127.0.0.1:{port}/_dash-layout", ("triscope", "pw"))
            if code == 200:
                break
            time.sleep(0.5)
        assert code == 200
        assert _get(f"http://127.0.0.1:{port}/")[0] == 401
    finally:
        p.terminate()
        p.wait(20)


@pytest.mark.postgres
def test_database_outage_is_said_in_the_page(pg_server: Any, pg_url: str) -> None:
    """PostgreSQL goes away under a running dashboard: pages say so in one line, /healthz is 503,
    and everything comes back with the database."""
    from demo_seed import seed_demo

    from triscope.dashboard.app import create_app
    from triscope.store import Store

    st = Store.open(pg_url)
    st.upgrade()
    seed_demo(st, time.time(), phase_s=20, cycles=1)
    app = create_app(pg_url, store=st)
    c = app.server.test_client()
    layout_of = {p: __import__("dash").page_registry[f"triscope.dashboard.pages.{p}"]["layout"] for p in ("fleet", "node")}
    pg_server.stop()
    try:
        r = c.get("/healthz")
        assert r.status_code == 503 and r.data == b"store unavailable\n"     # no driver text to anyone who asks
        with app.server.test_request_context("/"):
            for page, fn in layout_of.items():
                text = str(fn(node="h200-node"))
                assert "failed" in text and "OperationalError" in text, (page, text[:500])
    finally:
        pg_server.start()
    deadline = time.monotonic() + 30
    while c.get("/healthz").status_code != 200 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert c.get("/healthz").status_code == 200
    with app.server.test_request_context("/"):
        assert "failed" not in str(layout_of["fleet"]())


def test_the_store_badge_says_how_stale_a_standby_is() -> None:
    """The top bar's badge: empty on the leader (and SQLite), the replay lag on a standby; the real
    standby is exercised by tests/e2e/test_store_failover.py's /healthz check of the same query."""
    from triscope.dashboard.storerole import describe
    from triscope.store.ha import ServerRole

    assert describe(ServerRole(False, None))[0] == ""
    assert describe(ServerRole(True, 2.345))[0] == "store: standby, 2.3 s behind"
    assert describe(ServerRole(True, None))[0] == "store: standby, lag unknown"
    assert describe(None, "connection refused") == ("store unavailable", "connection refused")
