"""The dashboard over TLS (``triscope dashboard --web.config.file``, and gunicorn with
``--certfile/--keyfile`` as the shipped Deployment runs it), and the proxy's user header believed
only from the trusted proxy addresses: real HTTP clients from different loopback source addresses
(127.0.0.2 is the proxy, 127.0.0.3 a direct client)."""

from __future__ import annotations

import base64
import http.client
import os
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import REPO, free_port, wait_for_port
from tls_support import Certs, make_certs

PROXY, DIRECT = "127.0.0.2", "127.0.0.3"


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"))


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRISCOPE_DASHBOARD_")}
    env.update(extra)
    return env


def _request(port: int, path: str = "/_dash-layout", *, source: str = "127.0.0.1", headers: dict[str, str] | None = None,
             tls: ssl.SSLContext | None = None) -> tuple[int, dict[str, str]]:
    conn: http.client.HTTPConnection
    if tls is not None:
        conn = http.client.HTTPSConnection("127.0.0.1", port, context=tls, timeout=20, source_address=(source, 0))
    else:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=20, source_address=(source, 0))
    try:
        conn.request("GET", path, headers=headers or {})
        r = conn.getresponse()
        r.read()
        return r.status, dict(r.getheaders())
    finally:
        conn.close()


def _basic(user: str, pw: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{pw}".encode()).decode()


@pytest.fixture
def dashboard(seeded_url: str, tmp_path: Path) -> Iterator[object]:
    procs: list[subprocess.Popen[str]] = []

    def start(*args: str, env: dict[str, str] | None = None) -> int:
        port = free_port()
        p = subprocess.Popen([sys.executable, "-m", "triscope", "dashboard", "--db", seeded_url, "--port", str(port),
                              *args], cwd=REPO, env=env or _env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True)
        procs.append(p)
        wait_for_port(port, timeout=60)
        return port

    yield start
    for p in procs:
        p.terminate()
        p.wait(20)


def test_dashboard_serves_https_with_web_config(dashboard, certs: Certs, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    web = tmp_path / "web.yml"
    web.write_text(f"tls_server_config:\n  cert_file: {certs.cert}\n  key_file: {certs.key}\n")
    port = dashboard("--web.config.file", str(web))
    assert _request(port, "/healthz", tls=certs.client_context())[0] == 200
    status, headers = _request(port, "/", tls=certs.client_context())
    assert status == 200 and headers["Content-Type"].startswith("text/html")
    with pytest.raises((http.client.HTTPException, ConnectionError)):   # plain HTTP to the TLS port
        _request(port, "/healthz")


def test_dashboard_refuses_basic_auth_users_and_the_old_proxy_setting(seeded_url: str, tmp_path: Path) -> None:
    web = tmp_path / "web.yml"
    web.write_text("basic_auth_users:\n  a: '$2y$04$abcdefghijklmnopqrstuuJ3Qm7C6yJq3sB8GBDhz6J0T1wJmH9wO'\n")
    base = [sys.executable, "-m", "triscope", "dashboard", "--db", seeded_url, "--port", str(free_port())]
    r = subprocess.run([*base, "--web.config.file", str(web)], cwd=REPO, env=_env(), capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2 and f"{web}:1: basic_auth_users: not used by this listener" in r.stderr, r.stderr
    for args, env in (([], _env(TRISCOPE_DASHBOARD_TRUST_PROXY_AUTH="1")), (["--trust-proxy-auth"], _env())):
        r = subprocess.run([*base, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
        assert r.returncode == 2
        assert "is no longer accepted" in r.stderr and "TRISCOPE_DASHBOARD_TRUSTED_PROXIES" in r.stderr, r.stderr
    r = subprocess.run([*base, "--trusted-proxies", "10.0.0.0/33"], cwd=REPO, env=_env(), capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2 and "'10.0.0.0/33' is not an IP address or CIDR" in r.stderr


def test_proxy_user_header_is_believed_from_trusted_addresses_only(dashboard) -> None:  # type: ignore[no-untyped-def]
    # bound beyond loopback with nothing but trusted proxies: allowed (they are an authentication)
    port = dashboard("--host", "0.0.0.0", "--trusted-proxies", f"10.0.0.0/8,{PROXY}")
    user = {"X-Forwarded-User": "alice@example.com"}
    assert _request(port, source=PROXY, headers=user)[0] == 200
    assert _request(port, source=DIRECT, headers=user)[0] == 401               # the same header, not from the proxy
    assert _request(port, source=DIRECT, headers={**user, "X-Forwarded-For": PROXY})[0] == 401
    assert _request(port, source=PROXY)[0] == 401                              # the proxy without a user
    assert _request(port, source=PROXY, headers={"X-Forwarded-User": ""})[0] == 401
    assert _request(port, "/healthz", source=DIRECT)[0] == 200                  # probes stay open


def test_proxy_or_password_custom_header(dashboard) -> None:  # type: ignore[no-untyped-def]
    port = dashboard("--trusted-proxies", PROXY, "--proxy-user-header", "X-Auth-Request-User",
                     env=_env(TRISCOPE_DASHBOARD_PASSWORD="pw"))
    assert _request(port, source=PROXY, headers={"X-Auth-Request-User": "bob"})[0] == 200
    assert _request(port, source=PROXY, headers={"X-Forwarded-User": "bob"})[0] == 401   # not the configured header
    status, headers = _request(port, source=DIRECT, headers={"X-Auth-Request-User": "bob"})
    assert status == 401 and headers["WWW-Authenticate"].startswith("Basic")          # falls to basic auth
    assert _request(port, source=DIRECT, headers={"Authorization": _basic("triscope", "pw")})[0] == 200


def test_gunicorn_with_certfile_and_trusted_proxies(seeded_url: str, certs: Certs) -> None:
    """As deploy/kustomize/base/dashboard-deployment.yaml runs it: gunicorn --certfile/--keyfile."""
    port = free_port()
    gunicorn = os.path.join(os.path.dirname(sys.executable), "gunicorn")
    p = subprocess.Popen([gunicorn, "-w", "1", "-b", f"127.0.0.1:{port}", f"--certfile={certs.cert}",
                          f"--keyfile={certs.key}", "triscope.dashboard.wsgi:server"], cwd=REPO,
                         env=_env(TRISCOPE_DB_URL=seeded_url, TRISCOPE_DASHBOARD_TRUSTED_PROXIES=PROXY),
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        wait_for_port(port, timeout=60)
        deadline = time.monotonic() + 60
        code = 0
        while time.monotonic() < deadline:   # the worker imports the app after the port opens
            try:
                code = _request(port, source=PROXY, headers={"X-Forwarded-User": "carol"}, tls=certs.client_context())[0]
            except (OSError, http.client.HTTPException):
                code = 0
            if code == 200:
                break
            time.sleep(0.5)
        assert code == 200
        assert _request(port, source=DIRECT, headers={"X-Forwarded-User": "carol"}, tls=certs.client_context())[0] == 401
    finally:
        p.terminate()
        p.wait(20)


# ---------------------------------------------------------------------------------------------- dashboard proxies
@pytest.mark.parametrize("everything", ["0.0.0.0/0", "::/0", "127.0.0.1, 0.0.0.0/0"])
def test_trusting_every_address_is_refused(everything: str) -> None:
    from triscope.dashboard.app import DashboardConfigError, proxy_trust
    from triscope.dashboard.auth import ProxyTrust

    with pytest.raises(ValueError, match="trusts every address"):
        ProxyTrust.parse(everything)
    with pytest.raises(DashboardConfigError, match="trusts every address"):
        proxy_trust(everything)
    assert ProxyTrust.parse("127.0.0.1").trusts("127.0.0.1")


def test_dashboard_password_uses_the_shared_parser() -> None:
    from triscope.dashboard.auth import _check

    def _basic(user: str, password: str) -> str:
        return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()

    assert _check(_basic("triscope", "pw:with:colons"), "triscope", "pw:with:colons")
    assert not _check(_basic("triscope", "other"), "triscope", "pw")
    assert not _check("Basic !!!", "triscope", "pw") and not _check(None, "triscope", "pw")
    assert not _check("basic  " + base64.b64encode(b"no-colon").decode(), "triscope", "no-colon")
