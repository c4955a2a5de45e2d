"""``--web.config.file`` (exporter-toolkit format): one clear line per mistake, basic auth against
bcrypt with a bounded cache, and /metrics over real TLS with real clients (urllib, raw sockets,
``openssl``-made certificates)."""

from __future__ import annotations

import base64
import http.client
import socket
import ssl
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import pytest
from tls_support import Certs, bcrypt_hash, make_certs

from triscope.agent.exporter import make_sources, serve
from triscope.core.samples import Sample
from triscope.web.auth import BasicAuth, parse_basic
from triscope.web.config import WebConfigError, load

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"))


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def _write(folder: Path, text: str) -> Path:
    p = folder / "web.yml"
    p.write_text(text)
    return p


# ---------------------------------------------------------------------------------------------- the file
def _error(tmp_path: Path, text: str) -> str:
    with pytest.raises(WebConfigError) as e:
        load(_write(tmp_path, text))
    return str(e.value)


def test_config_errors_name_file_line_and_field(tmp_path: Path, certs: Certs) -> None:
    f = str(tmp_path / "web.yml")
    tls = f"tls_server_config:\n  cert_file: {certs.cert}\n  key_file: {certs.key}\n"
    assert _error(tmp_path, tls + "  min_version: TLS9\n") == \
        f"{f}:4: tls_server_config.min_version: must be 'TLS10', 'TLS11', 'TLS12' or 'TLS13', not 'TLS9'"
    assert _error(tmp_path, tls + "  cert_fil: x\n").startswith(
        f"{f}:4: tls_server_config: unknown key 'cert_fil' (allowed: cert_file, key_file,")
    assert _error(tmp_path, "tls_server_config:\n  key_file: k\n") == \
        f"{f}:1: tls_server_config.cert_file: missing (required)"
    assert _error(tmp_path, tls + "  client_auth_type: RequireAndVerifyClientCert\n") == \
        (f"{f}:4: tls_server_config.client_auth_type: RequireAndVerifyClientCert needs client_ca_file "
         "(the CA that signs client certificates)")
    assert "is not supported" in _error(tmp_path, tls + f"  client_ca_file: {certs.ca}\n"
                                                        "  client_auth_type: RequireAnyClientCert\n")
    assert _error(tmp_path, "basic_auth_users:\n  alice: hunter2\n") == \
        (f"{f}:2: basic_auth_users.alice: must be a bcrypt hash ($2y$10$... , 60 characters; e.g. "
         "htpasswd -nBC 10 USER), not a password")
    # a cost start-up could never afford (2^31 rounds: days) is refused, at once, in one line
    dear = "$2y$31$" + "a" * 53
    t0 = time.monotonic()
    msg = _error(tmp_path, f"basic_auth_users:\n  alice: '{dear}'\n")
    assert time.monotonic() - t0 < 2
    assert msg.startswith(f"{f}:2: basic_auth_users.alice: bcrypt cost 31 is too dear to check") and "at most 14" in msg
    assert _error(tmp_path, "http_server_config:\n  headers:\n    Server: x\n").startswith(
        f"{f}:3: http_server_config.headers.Server: header 'Server' may not be set here")
    # files: missing, not a pair, not YAML
    assert _error(tmp_path, "tls_server_config:\n  cert_file: nope.crt\n  key_file: nope.key\n") == \
        f"{f}:2: tls_server_config.cert_file: {tmp_path / 'nope.crt'}: no such file"
    msg = _error(tmp_path, f"tls_server_config:\n  cert_file: {certs.cert}\n  key_file: {certs.client_key}\n")
    assert msg.startswith(f"{f}:2: tls_server_config.cert_file: the certificate and key do not load as a pair:")
    assert _error(tmp_path, "tls_server_config: [\n").startswith(f"{f}:")
    assert _error(tmp_path, "basic_auth_users: 3\n") == f"{f}:1: basic_auth_users: must be a mapping, not 3"


def test_relative_paths_are_relative_to_the_file(tmp_path: Path, certs: Certs) -> None:
    for p in (certs.cert, certs.key):
        (tmp_path / p.name).write_bytes(p.read_bytes())
    cfg = load(_write(tmp_path, "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n"))
    assert cfg.scheme == "https" and cfg.tls is not None
    assert (cfg.tls.cert_file, cfg.tls.key_file) == (str(tmp_path / "server.crt"), str(tmp_path / "server.key"))
    assert load(_write(tmp_path, "")).scheme == "http"   # an empty file: plain HTTP, no auth


def test_agent_refuses_a_bad_file_at_start_with_one_line(tmp_path: Path) -> None:
    web = _write(tmp_path, "basic_auth_users:\n  prometheus: not-a-hash\n")
    r = subprocess.run([sys.executable, "-m", "triscope", "agent", "--db", f"sqlite:///{tmp_path / 'a.db'}",
                        "--web.config.file", str(web), "--no-ebpf", "--no-nvml", "--no-npu", "--duration", "1"],
                       cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines()[-1].endswith(
        f"--web.config.file: {web}:2: basic_auth_users.prometheus: must be a bcrypt hash ($2y$10$... , "
        "60 characters; e.g. htpasswd -nBC 10 USER), not a password")
    assert not (tmp_path / "a.db").exists()   # refused before the store was touched


# ---------------------------------------------------------------------------------------------- the cache
def test_basic_auth_caches_verified_credentials_bounded() -> None:
    auth = BasicAuth({"prometheus": bcrypt_hash("s3cret"), "other": bcrypt_hash("x")}, cache_size=3)
    assert auth.check(_basic("prometheus", "s3cret"))
    assert auth.bcrypt_calls == 1
    for _ in range(20):   # repeated scrapes: no bcrypt
        assert auth.check(_basic("prometheus", "s3cret"))
    assert auth.bcrypt_calls == 1
    assert not auth.check(_basic("prometheus", "wrong"))   # failures are remembered too
    assert not auth.check(_basic("prometheus", "wrong"))
    assert auth.bcrypt_calls == 2
    assert not auth.check(_basic("nobody", "s3cret"))     # unknown user: bcrypt against a dummy, refused
    assert auth.bcrypt_calls == 3 and auth.cached == 3
    # right and wrong ones are bounded apart: a fourth wrong one evicts the oldest wrong one only
    assert not auth.check(_basic("other", "y"))
    assert not auth.check(_basic("other", "z"))
    assert auth.bcrypt_calls == 5 and auth.cached == 4
    assert auth.check(_basic("prometheus", "s3cret"))    # still cached
    assert not auth.check(_basic("prometheus", "wrong"))  # the oldest wrong one: evicted, bcrypt again
    assert auth.bcrypt_calls == 6
    # malformed headers never reach bcrypt
    for bad in (None, "", "Bearer abc", "Basic !!!", "Basic " + base64.b64encode(b"no-colon").decode()):
        assert not auth.check(bad)
        assert auth.lookup(bad) is False
    assert auth.bcrypt_calls == 6
    assert parse_basic(_basic("a", "b:c")) == ("a", "b:c")


def test_cached_check_is_much_cheaper_than_bcrypt() -> None:
    auth = BasicAuth({"prometheus": bcrypt_hash("s3cret", rounds=10)})
    t0 = time.perf_counter()
    assert auth.check(_basic("prometheus", "s3cret"))
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in range(100):
        assert auth.check(_basic("prometheus", "s3cret"))
    cached = (time.perf_counter() - t0) / 100
    assert cached * 50 < first, (first, cached)


# ---------------------------------------------------------------------------------------------- /metrics
def _tls_server(tmp_path: Path, certs: Certs, port: int, extra: str = "") -> tuple[object, str]:
    web = load(_write(tmp_path, f"tls_server_config:\n  cert_file: {certs.cert}\n  key_file: {certs.key}\n"
                                f"basic_auth_users:\n  prometheus: '{bcrypt_hash('s3cret')}'\n{extra}"))
    process, tick = make_sources()
    tick.update([Sample("triscope_tcp_retransmits_total", 42.0)])
    server, _ = serve(process, "127.0.0.1", port, tick, web=web)
    return server, f"127.0.0.1:{port}"


def _get(certs: Certs, port: int, auth: str | None, **ctx: bool) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=certs.client_context(**ctx), timeout=5)
    try:
        conn.request("GET", "/metrics", headers={"Authorization": auth} if auth else {})
        r = conn.getresponse()
        return r.status, dict(r.getheaders()), r.read()
    finally:
        conn.close()


def test_metrics_over_tls_with_basic_auth(tmp_path: Path, certs: Certs, unused_port: int) -> None:
    server, _ = _tls_server(tmp_path, certs, unused_port,
                            "http_server_config:\n  headers:\n    X-Content-Type-Options: nosniff\n")
    try:
        status, headers, body = _get(certs, unused_port, _basic("prometheus", "s3cret"))
        assert status == 200 and b"triscope_tcp_retransmits_total 42.0" in body
        assert headers["X-Content-Type-Options"] == "nosniff"
        for auth in (None, _basic("prometheus", "wrong"), _basic("nobody", "s3cret"), "Bearer s3cret"):
            status, headers, body = _get(certs, unused_port, auth)
            assert status == 401 and headers["WWW-Authenticate"] == "Basic" and b"triscope_" not in body
        # a HEAD without credentials (the DaemonSet's liveness probe): 401, a head and no body, and the
        # kept-alive connection then serves the next request whole
        with certs.client_context().wrap_socket(socket.create_connection(("127.0.0.1", unused_port), timeout=5),
                                                server_hostname="localhost") as tls:
            tls.sendall(b"HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            time.sleep(0.3)
            head = tls.recv(65536)
            assert head.startswith(b"HTTP/1.1 401 ") and head.endswith(b"\r\n\r\n"), head
            tls.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\nAuthorization: "
                        + _basic("prometheus", "s3cret").encode() + b"\r\n\r\n")
            got = _read_all(tls)
            assert got.startswith(b"HTTP/1.1 200 ") and b"triscope_tcp_retransmits_total 42.0" in got
        # plain HTTP to the TLS port: the handshake fails, no metrics, and the server lives on
        with socket.create_connection(("127.0.0.1", unused_port), timeout=5) as s:
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: " + _basic("prometheus", "s3cret").encode()
                      + b"\r\n\r\n")
            got = _read_all(s)
        assert b"triscope_" not in got and b"200 OK" not in got
        # a client that does not trust the CA refuses the server
        with pytest.raises(ssl.SSLCertVerificationError):
            http.client.HTTPSConnection("127.0.0.1", unused_port, context=ssl.create_default_context(),
                                        timeout=5).request("GET", "/metrics")
        assert _get(certs, unused_port, _basic("prometheus", "s3cret"))[0] == 200
    finally:
        server.shutdown()  # type: ignore[attr-defined]


def _read_all(s: socket.socket) -> bytes:
    got = b""
    try:
        while chunk := s.recv(4096):
            got += chunk
    except ConnectionError:   # reset after the failed handshake
        pass
    return got


def test_slow_wrong_passwords_do_not_stall_other_scrapes(tmp_path: Path, certs: Certs, unused_port: int) -> None:
    """bcrypt for new wrong passwords runs off the event loop, and a scrape with credentials already
    verified never waits for it: it keeps answering quickly while four clients spray wrong ones."""
    web = load(_write(tmp_path, f"tls_server_config:\n  cert_file: {certs.cert}\n  key_file: {certs.key}\n"
                                f"basic_auth_users:\n  prometheus: '{bcrypt_hash('s3cret', rounds=12)}'\n"))
    process, tick = make_sources()
    server, _ = serve(process, "127.0.0.1", unused_port, tick, web=web)
    stop = threading.Event()
    sprayers = [threading.Thread(target=lambda n=n: spray(n), daemon=True) for n in range(4)]

    def spray(n: int) -> None:
        i = 0
        while not stop.is_set():
            i += 1
            try:
                _get(certs, unused_port, _basic("prometheus", f"guess{n}-{i}"))
            except (OSError, http.client.HTTPException):   # the server stopping at the end
                return

    try:
        assert _get(certs, unused_port, _basic("prometheus", "s3cret"))[0] == 200   # cached from now on
        for t in sprayers:   # four at once: both workers busy with (or waiting for) bcrypt
            t.start()
        time.sleep(0.5)
        worst = 0.0
        for _ in range(5):
            t0 = time.perf_counter()
            assert _get(certs, unused_port, _basic("prometheus", "s3cret"))[0] == 200
            worst = max(worst, time.perf_counter() - t0)
        assert worst < 0.2, f"a cached scrape took {worst:.3f}s while wrong passwords were being checked"
    finally:
        stop.set()
        for t in sprayers:
            if t.is_alive():
                t.join(10)
        server.shutdown()


def test_mutual_tls_requires_a_client_certificate(tmp_path: Path, certs: Certs, unused_port: int) -> None:
    web = load(_write(tmp_path, f"tls_server_config:\n  cert_file: {certs.cert}\n  key_file: {certs.key}\n"
                                f"  client_ca_file: {certs.ca}\n  client_auth_type: RequireAndVerifyClientCert\n"
                                "  min_version: TLS13\n"))
    process, tick = make_sources()
    srv, _ = serve(process, "127.0.0.1", unused_port, tick, web=web)
    try:
        assert _get(certs, unused_port, None, with_client_cert=True)[0] == 200
        with pytest.raises((ssl.SSLError, ConnectionError)):
            _get(certs, unused_port, None)
        old = certs.client_context()
        old.maximum_version = ssl.TLSVersion.TLSv1_2
        with pytest.raises(ssl.SSLError):
            http.client.HTTPSConnection("127.0.0.1", unused_port, context=old, timeout=5).request("GET", "/")
    finally:
        srv.shutdown()


# ---------------------------------------------------------------------------------------------- the webhook
def test_webhook_over_tls(tmp_path: Path, certs: Certs) -> None:
    """``triscope remediate --web.config.file``: Alertmanager posts over HTTPS with its bearer token."""
    import json

    from conftest import free_port, wait_for_port
    from kube_server import alert_payload, open_store, policy_text

    pol = tmp_path / "p.yaml"
    pol.write_text(policy_text("  - name: cmd\n    trigger: {alert: Storm}\n    action: command\n"
                               "    target: {node: {label: node}}\n    params: {argv: [\"true\"]}\n"))
    (tmp_path / "token").write_text("tls-token-0123456789\n")
    web = _write(tmp_path, f"tls_server_config:\n  cert_file: {certs.cert}\n  key_file: {certs.key}\n")
    db = f"sqlite:///{tmp_path / 't.db'}"
    open_store(db).close()
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "triscope", "remediate", "--db", db, "--policy", str(pol),
                             "--listen", f"127.0.0.1:{port}", "--token-file", str(tmp_path / "token"),
                             "--web.config.file", str(web)], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        wait_for_port(port, timeout=30)
        body = json.dumps(alert_payload([{"labels": {"alertname": "Storm", "node": "n1"}}])).encode()
        for token, want in (("wrong-token-0123456789", 401), ("tls-token-0123456789", 202)):
            conn = http.client.HTTPSConnection("127.0.0.1", port, context=certs.client_context(), timeout=10)
            conn.request("POST", "/api/v1/alerts", body=body,
                         headers={"Content-Type": "application/json", "Authorization": f"Bearer {token}"})
            assert conn.getresponse().status == want
            conn.close()
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:   # plain HTTP: nothing
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            assert b"HTTP/1.1 200" not in _read_all(s)
    finally:
        proc.terminate()
        out, err = proc.communicate(timeout=60)   # the engine bounds its own stop (20 s)
    if "did not stop within" in err:   # said in the run's summary with the stacks, which the stop tests own
        warnings.warn(f"triscope remediate hung in its stop: {err[-6000:]}", stacklevel=1)
    assert f"webhook: POST https://127.0.0.1:{port}/api/v1/alerts (bearer token)" in out


def test_tls_keeps_the_slow_client_cuts(tmp_path: Path, certs: Certs, unused_port: int) -> None:
    """A client that opens the TLS port and never says hello, and one that shakes hands and then
    trickles its request a byte at a time, are both cut at their deadlines while scrapes go on."""
    from triscope.agent.exporter import EXPORTER_LIMITS, MetricsServer
    from triscope.web.httpd import Limits

    web = load(_write(tmp_path, f"tls_server_config:\n  cert_file: {certs.cert}\n  key_file: {certs.key}\n"))
    lim = Limits(**{**EXPORTER_LIMITS.__dict__, "header_timeout": 1.0, "request_timeout": 1.5})
    process, tick = make_sources()
    server = MetricsServer(("127.0.0.1", unused_port), process, tick, limits=lim, web=web)
    server.http.start()
    try:
        silent = socket.create_connection(("127.0.0.1", unused_port), timeout=5)
        hello = certs.client_context().wrap_socket(socket.create_connection(("127.0.0.1", unused_port), timeout=5),
                                                   server_hostname="localhost")
        t0 = time.monotonic()
        trickled = 0
        try:
            for b in b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 100:
                hello.sendall(bytes([b]))
                trickled += 1
                assert _get(certs, unused_port, None)[0] == 200 if trickled % 20 == 0 else True
                time.sleep(0.1)
        except (ConnectionError, ssl.SSLError):
            pass
        assert time.monotonic() - t0 < 4.0 and trickled < 40, (trickled, time.monotonic() - t0)
        assert _read_all(silent) == b""     # closed without a byte once the handshake deadline passed
        assert time.monotonic() - t0 < 5.0
        silent.close()
        hello.close()
        with socket.create_connection(("127.0.0.1", unused_port), timeout=5) as quiet:   # the cut is the deadline
            t1 = time.monotonic()
            assert _read_all(quiet) == b""
            assert 0.8 <= time.monotonic() - t1 < 3.0, time.monotonic() - t1
        assert _get(certs, unused_port, None)[0] == 200
    finally:
        server.shutdown()


def _served_cert(port: int) -> bytes:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    with ctx.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=5)) as s:
        der = s.getpeercert(binary_form=True)
    assert der is not None
    return der


def test_rotated_certificate_and_password_are_picked_up_without_a_restart(
        tmp_path: Path, certs: Certs, unused_port: int, monkeypatch: pytest.MonkeyPatch) -> None:
    import triscope.agent.exporter as exporter

    monkeypatch.setattr(exporter, "RELOAD_EVERY", 0.2)
    other = make_certs(tmp_path / "renewed")
    live = tmp_path / "live"
    live.mkdir()
    (live / "tls.crt").write_bytes(certs.cert.read_bytes())
    (live / "tls.key").write_bytes(certs.key.read_bytes())
    cfg = live / "web.yml"
    tls = "tls_server_config:\n  cert_file: tls.crt\n  key_file: tls.key\n"
    cfg.write_text(tls + f"basic_auth_users:\n  prometheus: '{bcrypt_hash('one')}'\n")
    web = load(cfg)
    process, tick = make_sources()
    server, _ = serve(process, "127.0.0.1", unused_port, tick, web=web)
    insecure = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    insecure.check_hostname, insecure.verify_mode = False, ssl.CERT_NONE

    def status(pw: str) -> int:
        conn = http.client.HTTPSConnection("127.0.0.1", unused_port, context=insecure, timeout=5)
        conn.request("GET", "/metrics", headers={"Authorization": _basic("prometheus", pw)})
        code = conn.getresponse().status
        conn.close()
        return code

    try:
        first = _served_cert(unused_port)
        assert first == ssl.PEM_cert_to_DER_cert(certs.cert.read_text()) and status("one") == 200
        # cert-manager renews: new pair and a new password, written in place
        (live / "tls.key").write_bytes(other.key.read_bytes())
        (live / "tls.crt").write_bytes(other.cert.read_bytes())
        cfg.write_text(tls + f"basic_auth_users:\n  prometheus: '{bcrypt_hash('two')}'\n")
        renewed = ssl.PEM_cert_to_DER_cert(other.cert.read_text())
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and _served_cert(unused_port) != renewed:
            time.sleep(0.1)
        assert _served_cert(unused_port) == renewed and web.reloads == 1
        assert (status("one"), status("two")) == (401, 200)
        # a broken file: logged, the running config stays
        cfg.write_text(tls + "basic_auth_users:\n  prometheus: plain-text\n")
        time.sleep(1.0)
        assert web.reloads == 1 and status("two") == 200 and _served_cert(unused_port) == renewed
    finally:
        server.shutdown()
