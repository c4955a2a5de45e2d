"""``--web.config.file`` at run time: what a reload changes (a new TLS context, users added where
there were none), the credential caches under a spray of wrong passwords, the dummy hash, bcrypt's
72-byte limit.  Real TLS clients against the real servers."""

from __future__ import annotations

import base64
import http.client
import logging
import os
import re
import ssl
import threading
import time
from pathlib import Path

import bcrypt
import pytest
from tls_support import Certs, bcrypt_hash, make_certs

from triscope.agent.exporter import make_sources, serve
from triscope.web.auth import BasicAuth
from triscope.web.config import WebConfigError, load
from triscope.web.httpd import HttpServer, Request, Response


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def _touch_later(path: Path, text: str) -> None:
    """Write ``text`` with an mtime surely different from the last one's."""
    before = path.stat().st_mtime_ns if path.exists() else 0
    path.write_text(text)
    os.utime(path, ns=(before + 2_000_000_000, before + 2_000_000_000))


def _mtls_client(server_ca: Path, certs: Certs, version: ssl.TLSVersion | None = None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(server_ca))
    ctx.load_cert_chain(str(certs.client_cert), str(certs.client_key))
    if version is not None:
        ctx.minimum_version = ctx.maximum_version = version
    return ctx


def _scrape(port: int, ctx: ssl.SSLContext, auth: str | None = None) -> int | str:
    """The HTTP status, or the TLS error's name."""
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=5)
    try:
        conn.request("GET", "/metrics", headers={"Authorization": auth} if auth else {})
        return conn.getresponse().status
    except (ssl.SSLError, ConnectionError) as e:
        return type(e).__name__
    finally:
        conn.close()


# ---------------------------------------------------------------------------------------------- reload
def test_reload_builds_a_new_context_client_ca_and_versions(tmp_path: Path) -> None:
    """A new client CA replaces the old one (a certificate of the old CA is refused), a raised
    min_version refuses the older clients: the reload builds a context from the new file alone."""
    a, b = make_certs(tmp_path / "a"), make_certs(tmp_path / "b")
    cfg = tmp_path / "web.yml"

    def write(ca: Path, min_version: str) -> None:
        _touch_later(cfg, f"tls_server_config:\n  cert_file: {a.cert}\n  key_file: {a.key}\n  client_ca_file: {ca}\n"
                          f"  client_auth_type: RequireAndVerifyClientCert\n  min_version: {min_version}\n")

    write(a.ca, "TLS12")
    web = load(cfg)
    process, tick = make_sources()
    server, _ = serve(process, "127.0.0.1", 0, tick, web=web)
    port = server.server_address[1]
    try:
        assert _scrape(port, _mtls_client(a.ca, a)) == 200
        assert _scrape(port, _mtls_client(a.ca, a, ssl.TLSVersion.TLSv1_2)) == 200
        assert _scrape(port, _mtls_client(a.ca, b)) != 200         # CA B not trusted yet
        write(b.ca, "TLS13")
        assert web.refresh() == "reloaded"
        assert _scrape(port, _mtls_client(a.ca, b)) == 200         # CA B now
        assert _scrape(port, _mtls_client(a.ca, a)) != 200         # CA A no more
        assert _scrape(port, _mtls_client(a.ca, b, ssl.TLSVersion.TLSv1_2)) != 200   # TLS 1.2 no more
        assert _scrape(port, _mtls_client(a.ca, b, ssl.TLSVersion.TLSv1_3)) == 200
        assert web.ssl_context() is not None and web.ssl_context().minimum_version == ssl.TLSVersion.TLSv1_3
    finally:
        server.shutdown()


def test_periodic_job_runs_off_the_loop() -> None:
    """The reload (YAML, pydantic, maybe a bcrypt hash) never holds the server's loop."""
    seen: list[str] = []

    def slow_job() -> None:
        seen.append(threading.current_thread().name)
        time.sleep(0.6)

    srv = HttpServer(("127.0.0.1", 0), lambda req: Response.text(200, "ok"), name="t-http", every=(0.05, slow_job))
    srv.start()
    try:
        deadline = time.monotonic() + 5
        while not seen and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.05)   # the job is now sleeping
        t0 = time.perf_counter()
        conn = http.client.HTTPConnection("127.0.0.1", srv.server_address[1], timeout=5)
        conn.request("GET", "/")
        assert conn.getresponse().status == 200
        took = time.perf_counter() - t0
        conn.close()
        assert took < 0.3, took
        assert seen and seen[0] != "t-http"
    finally:
        srv.shutdown()


def test_users_added_by_a_reload_are_checked_off_the_loop(tmp_path: Path) -> None:
    """Started without basic_auth_users, reloaded with them: a new wrong password (bcrypt) runs on
    a worker, a request without credentials is answered meanwhile."""
    c = make_certs(tmp_path / "c")
    cfg = tmp_path / "web.yml"
    base = f"tls_server_config:\n  cert_file: {c.cert}\n  key_file: {c.key}\n"
    _touch_later(cfg, base)
    web = load(cfg)
    process, tick = make_sources()
    server, _ = serve(process, "127.0.0.1", 0, tick, web=web)
    port = server.server_address[1]
    hashed = bcrypt_hash("pw", rounds=14)
    t0 = time.perf_counter()
    bcrypt.checkpw(b"nope", hashed.encode())
    one_bcrypt = time.perf_counter() - t0
    try:
        _touch_later(cfg, base + f"basic_auth_users:\n  prometheus: '{hashed}'\n")
        assert web.refresh() == "reloaded" and web.auth is not None
        res: dict[str, int | str] = {}
        th = threading.Thread(target=lambda: res.update(wrong=_scrape(port, c.client_context(), _basic("prometheus", "nope"))))
        th.start()
        deadline = time.monotonic() + 5
        while web.auth.bcrypt_calls == 0 and time.monotonic() < deadline:
            time.sleep(0.005)
        t0 = time.perf_counter()
        assert _scrape(port, c.client_context()) == 401   # no credentials: answered on the loop
        took = time.perf_counter() - t0
        th.join(10)
        assert res["wrong"] == 401
        assert took < one_bcrypt / 2, (took, one_bcrypt)
    finally:
        server.shutdown()


def test_a_failed_reload_is_tried_again_without_a_file_change(tmp_path: Path,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    """What made a reload fail need not show in a file's mtime or size (a key made readable, a client
    CA created behind a symlink, a certificate and key written one after the other): the reload is
    tried again every ``retry_s``, logged once, and taken as soon as it works."""
    c = make_certs(tmp_path / "c")
    cfg = tmp_path / "web.yml"
    base = f"tls_server_config:\n  cert_file: {c.cert}\n  key_file: {c.key}\n"
    _touch_later(cfg, base)
    web = load(cfg)
    web.retry_s = 0.2
    real = web.reloader
    calls = {"n": 0}

    def flaky():  # type: ignore[no-untyped-def]
        calls["n"] += 1
        if calls["n"] <= 2:
            raise WebConfigError(str(cfg), 1, "key file not readable yet")
        return real()

    web.reloader = flaky
    hashed = bcrypt_hash("pw", rounds=4)
    _touch_later(cfg, base + f"basic_auth_users:\n  prometheus: '{hashed}'\n")
    with caplog.at_level(logging.ERROR):
        assert web.refresh().startswith("kept:")
        assert web.refresh() is None                 # within retry_s: not tried again yet
        time.sleep(0.25)
        assert web.refresh().startswith("kept:")     # tried again, no file changed
        time.sleep(0.25)
        assert web.refresh() == "reloaded" and web.auth is not None
    assert calls["n"] == 3
    assert len([r for r in caplog.records if "cannot be used" in r.getMessage()]) == 1
    assert web.refresh() is None                     # working again: no more retries


# ---------------------------------------------------------------------------------------------- caches
def test_a_spray_of_wrong_passwords_keeps_the_right_one_cached(tmp_path: Path) -> None:
    c = make_certs(tmp_path / "c")
    cfg = tmp_path / "web.yml"
    _touch_later(cfg, f"tls_server_config:\n  cert_file: {c.cert}\n  key_file: {c.key}\n"
                      f"basic_auth_users:\n  prometheus: '{bcrypt_hash('right', rounds=4)}'\n")
    web = load(cfg)
    process, tick = make_sources()
    server, _ = serve(process, "127.0.0.1", 0, tick, web=web)
    port = server.server_address[1]
    good = _basic("prometheus", "right")
    try:
        assert _scrape(port, c.client_context(), good) == 200
        assert web.auth is not None and web.auth.bcrypt_calls == 1
        assert server.checks is not None
        server.checks.budget = 1e6   # the cache alone here (the queue's budget and order: the spray tests)
        conn = http.client.HTTPSConnection("127.0.0.1", port, context=c.client_context(), timeout=10)
        for i in range(300):   # distinct wrong credentials, known and unknown users, on one connection
            conn.request("GET", "/metrics", headers={"Authorization": _basic("prometheus" if i % 2 else f"u{i}",
                                                                             f"wrong{i}")})
            r = conn.getresponse()
            r.read()
            assert r.status == 401
        conn.close()
        calls = web.auth.bcrypt_calls
        assert web.quick(good)                    # answered on the loop, from the cache
        t0 = time.perf_counter()
        assert _scrape(port, c.client_context(), good) == 200
        took = time.perf_counter() - t0
        assert web.auth.bcrypt_calls == calls     # no bcrypt for the right password
        assert took < 0.5, took
    finally:
        server.shutdown()


def test_a_password_spray_holds_no_slot_and_never_starves_the_right_password(tmp_path: Path) -> None:
    """20 clients each sending a wrong password on a fresh TLS connection and closing at once, as fast as
    they can: checks past 2 a second per source (6 at once) or 8 waiting get 429 at once and their
    connection closed, so no slot waits on bcrypt; Prometheus's verified password, on fresh connections
    throughout, is answered (it made 59-84 % 503s before)."""
    import secrets

    c = make_certs(tmp_path / "c")
    cfg = tmp_path / "web.yml"
    _touch_later(cfg, f"tls_server_config:\n  cert_file: {c.cert}\n  key_file: {c.key}\n"
                      f"basic_auth_users:\n  prometheus: '{bcrypt_hash('right', rounds=10)}'\n")
    web = load(cfg)
    process, tick = make_sources()
    server, _ = serve(process, "127.0.0.1", 0, tick, web=web)
    port = server.server_address[1]
    good = _basic("prometheus", "right")
    stop = threading.Event()
    sent = [0]

    def spray() -> None:
        ctx = c.client_context()
        while not stop.is_set():
            try:
                conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=5)
                conn.request("GET", "/metrics", headers={"Authorization": _basic("prometheus", secrets.token_hex(8))})
                sent[0] += 1
                conn.close()              # gone without waiting for the answer
            except (OSError, ssl.SSLError, http.client.HTTPException):
                time.sleep(0.01)

    try:
        assert _scrape(port, c.client_context(), good) == 200          # verified once: cached
        threads = [threading.Thread(target=spray, daemon=True) for _ in range(20)]
        for t in threads:
            t.start()
        time.sleep(0.5)
        got = []
        deadline = time.monotonic() + 4.0
        while time.monotonic() < deadline:
            got.append(_scrape(port, c.client_context(), good))
            time.sleep(0.02)
        stop.set()
        for t in threads:
            t.join(10)
        ok = got.count(200) / len(got)
        assert ok >= 0.99, (ok, {x: got.count(x) for x in set(got)})
        assert sent[0] > 200                                          # the spray was real
        assert server.turned_away > 0 and server.checks is not None and server.checks.refused > 0
        assert web.auth is not None and web.auth.bcrypt_calls < sent[0] / 2   # most never reached bcrypt
    finally:
        stop.set()
        server.shutdown()


def test_lookup_never_runs_bcrypt() -> None:
    auth = BasicAuth({"prometheus": bcrypt_hash("right")})
    assert auth.lookup(_basic("prometheus", "right")) is None and auth.bcrypt_calls == 0
    assert auth.check(_basic("prometheus", "right")) and auth.bcrypt_calls == 1
    assert auth.lookup(_basic("prometheus", "right")) is True
    assert auth.lookup(_basic("prometheus", "new-wrong")) is None and auth.bcrypt_calls == 1
    req = Request("GET", "/metrics", "HTTP/1.1", [], b"", None)
    assert req.verdict is None


# ---------------------------------------------------------------------------------------------- dummy hash
def test_dummy_hash_made_once_and_as_dear_as_the_dearest_user() -> None:
    users = {"a": bcrypt_hash("x", rounds=4), "b": bcrypt_hash("y", rounds=11)}
    first = BasicAuth(users)
    assert re.match(r"^\$2[aby]\$11\$", first._dummy.decode())   # an unknown user costs what "b" does
    t0 = time.perf_counter()
    for _ in range(5):
        again = BasicAuth(users)                                  # a reload: no new bcrypt hash
    assert time.perf_counter() - t0 < 0.05
    assert again._dummy == first._dummy


# ---------------------------------------------------------------------------------------------- bcrypt limits
def test_a_password_longer_than_72_bytes_is_cut_as_htpasswd_does(caplog: pytest.LogCaptureFixture) -> None:
    long_pw = "p" * 72 + "-and-more-than-bcrypt-reads"
    auth = BasicAuth({"prometheus": bcrypt.hashpw(long_pw.encode()[:72], bcrypt.gensalt(4)).decode()})
    assert auth.check(_basic("prometheus", long_pw))
    assert auth.check(_basic("prometheus", "p" * 72))
    assert not auth.check(_basic("prometheus", "p" * 71))
    # a hash bcrypt cannot use: 401 and one log line, not one per request
    broken = BasicAuth({"old": "$2$04$" + "a" * 53})
    with caplog.at_level(logging.WARNING, logger="triscope.web.auth"):
        assert not broken.check(_basic("old", "x"))
        assert not broken.check(_basic("old", "y"))
    assert len([r for r in caplog.records if "bcrypt refused" in r.getMessage()]) == 1


def test_a_2_hash_is_refused_at_load_with_its_line(tmp_path: Path) -> None:
    cfg = tmp_path / "web.yml"
    cfg.write_text("basic_auth_users:\n  ok: '" + bcrypt_hash("x") + "'\n  old: '$2$10$" + "a" * 53 + "'\n")
    with pytest.raises(WebConfigError) as e:
        load(cfg)
    assert f"{cfg}:3:" in str(e.value) and "old" in str(e.value) and "$2$" in str(e.value)


def test_a_tls_client_refused_at_capacity_gets_its_503_over_tls(tmp_path: Path) -> None:
    """TLS starts per connection (for the reloaded context): a refusal still speaks TLS."""
    from triscope.web.httpd import Limits

    c = make_certs(tmp_path / "c")
    cfg = tmp_path / "web.yml"
    _touch_later(cfg, f"tls_server_config:\n  cert_file: {c.cert}\n  key_file: {c.key}\n")
    web = load(cfg)
    srv = HttpServer(("127.0.0.1", 0), lambda req: Response.text(200, "ok"), limits=Limits(max_connections=1),
                     ssl_context=web.ssl_context).start()
    port = srv.server_address[1]
    try:
        import socket

        with c.client_context().wrap_socket(socket.create_connection(("127.0.0.1", port), 5),
                                            server_hostname="127.0.0.1") as busy:
            busy.sendall(b"GET / HTTP/1.1\r\n")   # a request under way: not idle, not evicted
            time.sleep(0.2)
            assert _scrape(port, c.client_context()) == 503
        deadline = time.monotonic() + 5
        while srv.connections and time.monotonic() < deadline:
            time.sleep(0.02)
        assert _scrape(port, c.client_context()) == 200
    finally:
        srv.shutdown()
