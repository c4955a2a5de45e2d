"""Scrape collector against real HTTP servers: prometheus_client's own exporter and bad endpoints."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from conftest import free_port
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Summary, start_http_server

from triscope.agent.collectors.base import CollectorUnavailable
from triscope.agent.collectors.scrape import ScrapeCollector, ScrapeError


@pytest.fixture
def app_server() -> Iterator[tuple[str, dict]]:
    """A real prometheus_client exporter with an inference server's kind of metrics."""
    reg = CollectorRegistry()
    m = {
        "requests": Counter("app_requests", "Requests served", ["route", "code"], registry=reg),
        "latency": Histogram("app_request_latency_seconds", "Latency", ["route"], registry=reg,
                             buckets=(0.05, 0.1, 0.5, 1.0)),
        "queue": Gauge("app_queue_depth", "Queue depth", registry=reg),
        "ttft": Summary("app_ttft_seconds", "Time to first token", registry=reg),
        "clash": Gauge("app_clash", "Has its own job label", ["job"], registry=reg),
    }
    port = free_port()
    server, thread = start_http_server(port, addr="127.0.0.1", registry=reg)
    try:
        yield f"http://127.0.0.1:{port}/metrics", m
    finally:
        server.shutdown()
        server.server_close()


def index(samples):
    return {(s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k not in ("job", "instance")))): s
            for s in samples}


def test_real_exporter_counters_histograms_gauges(app_server) -> None:
    url, m = app_server
    for _ in range(5):
        m["requests"].labels("/v1/completions", "200").inc()
    m["requests"].labels("/v1/completions", "503").inc(2)
    for v in (0.02, 0.07, 0.3, 0.3, 2.0):
        m["latency"].labels("/v1/completions").observe(v)
    m["queue"].set(7)
    m["clash"].labels("their-job").set(1)
    c = ScrapeCollector(url, job="vllm")
    assert c.name == f"scrape:{url.split('/')[2]}"
    assert c.check().ok
    samples = list(c.collect(time.time()))
    got = index(samples)
    req = got[("app_requests_total", (("code", "200"), ("route", "/v1/completions")))]
    assert req.value == 5 and req.kind == "counter"
    assert got[("app_requests_total", (("code", "503"), ("route", "/v1/completions")))].value == 2
    b = got[("app_request_latency_seconds_bucket", (("le", "0.1"), ("route", "/v1/completions")))]
    assert b.value == 2 and b.kind == "counter"
    assert got[("app_request_latency_seconds_bucket", (("le", "+Inf"), ("route", "/v1/completions")))].value == 5
    cnt = got[("app_request_latency_seconds_count", (("route", "/v1/completions"),))]
    assert cnt.value == 5 and cnt.kind == "counter"
    assert got[("app_request_latency_seconds_sum", (("route", "/v1/completions"),))].value == pytest.approx(2.69)
    q = got[("app_queue_depth", ())]
    assert q.value == 7 and q.kind == "gauge"
    assert got[("app_ttft_seconds_count", ())].kind == "counter"
    # _created timestamps are not series
    assert not any(s.name.endswith("_created") for s in samples)
    # every sample carries job and instance; the service's own job label is kept as exported_job
    assert all(s.labels["job"] == "vllm" and s.labels["instance"] == url.split("/")[2] for s in samples)
    clash = [s for s in samples if s.name == "app_clash"][0]
    assert clash.labels["exported_job"] == "their-job" and clash.labels["job"] == "vllm"
    # the counters move between scrapes
    m["requests"].labels("/v1/completions", "200").inc(10)
    again = index(c.collect(time.time()))
    assert again[("app_requests_total", (("code", "200"), ("route", "/v1/completions")))].value == 15


def test_default_job_and_path() -> None:
    c = ScrapeCollector("http://localhost:8000")
    assert c.url == "http://localhost:8000/metrics" and c.instance == "localhost:8000" and c.job == "scrape"
    assert ScrapeCollector("http://[::1]:9100/m").instance == "[::1]:9100"
    assert ScrapeCollector("https://svc.ns/metrics").instance == "svc.ns:443"


@pytest.mark.parametrize("url, msg", [
    ("localhost:8000/metrics", "scheme must be http or https"),
    ("ftp://host/metrics", "scheme must be http or https"),
    ("http:///metrics", "no host"),
    ("http://host:99999/metrics", "invalid scrape URL"),
    ("http://host:abc/metrics", "invalid scrape URL"),
    ("", "invalid scrape URL"),
    ("http://ho st:80/", "whitespace"),
])
def test_malformed_urls_fail_at_construction(url: str, msg: str) -> None:
    with pytest.raises(ValueError, match=msg):
        ScrapeCollector(url)
    with pytest.raises(ValueError, match="timeout"):
        ScrapeCollector("http://127.0.0.1:1/metrics", timeout=0)


class _Handler(BaseHTTPRequestHandler):
    body = b""
    status = 200
    delay = 0.0

    def do_GET(self) -> None:  # noqa: N802
        if self.delay:
            time.sleep(self.delay)
        self.send_response(self.status)
        self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args: object) -> None:
        pass


def serve(body: bytes, status: int = 200, delay: float = 0.0) -> tuple[ThreadingHTTPServer, str]:
    handler = type("H", (_Handler,), {"body": body, "status": status, "delay": delay})
    srv = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, f"http://127.0.0.1:{srv.server_address[1]}/metrics"


def test_malformed_body_is_a_clear_error() -> None:
    srv, url = serve(b"<html><body>Welcome to nginx!</body></html>\n")
    try:
        c = ScrapeCollector(url)
        with pytest.raises(ScrapeError, match="malformed Prometheus text") as e:
            list(c.collect(1.0))
        assert isinstance(e.value, CollectorUnavailable) and url in e.value.reason
        av = c.check()
        assert not av.ok and "malformed" in av.reason
    finally:
        srv.shutdown()
        srv.server_close()


def test_bad_value_and_nan_handling() -> None:
    srv, url = serve(b'# TYPE a gauge\na{x="1"} 1.5\nb NaN\nc +Inf\nd_total 3\n')
    try:
        got = {s.name: s for s in ScrapeCollector(url).collect(1.0)}
        assert got["a"].value == 1.5 and got["a"].kind == "gauge"
        assert "b" not in got and "c" not in got  # no store or JSON can carry NaN/Inf
        assert got["d_total"].kind == "counter"  # untyped, but named like a counter
    finally:
        srv.shutdown()
        srv.server_close()
    srv, url = serve(b"a{x=\"1\" 1\n")
    try:
        with pytest.raises(ScrapeError, match="malformed"):
            list(ScrapeCollector(url).collect(1.0))
    finally:
        srv.shutdown()
        srv.server_close()


def test_unreachable_http_error_timeout_and_limits() -> None:
    port = free_port()  # nothing listens there
    with pytest.raises(ScrapeError, match="connection refused"):
        list(ScrapeCollector(f"http://127.0.0.1:{port}/metrics").collect(1.0))
    av = ScrapeCollector(f"http://127.0.0.1:{port}/metrics").check()
    assert not av.ok and "connection refused" in av.reason and av.hint

    srv, url = serve(b"not found\n", status=404)
    try:
        with pytest.raises(ScrapeError, match="HTTP 404"):
            list(ScrapeCollector(url).collect(1.0))
    finally:
        srv.shutdown()
        srv.server_close()

    srv, url = serve(b"a 1\n", delay=1.5)
    try:
        t0 = time.monotonic()
        with pytest.raises(ScrapeError, match="timed out"):
            list(ScrapeCollector(url, timeout=0.3).collect(1.0))
        assert time.monotonic() - t0 < 1.2
    finally:
        srv.shutdown()
        srv.server_close()

    big = b"".join(b"m%d 1\n" % i for i in range(5000))
    srv, url = serve(big)
    try:
        with pytest.raises(ScrapeError, match="larger than 1000 bytes"):
            list(ScrapeCollector(url, max_bytes=1000).collect(1.0))
        with pytest.raises(ScrapeError, match="more than 100 samples"):
            list(ScrapeCollector(url, max_samples=100).collect(1.0))
        assert len(list(ScrapeCollector(url).collect(1.0))) == 5000
    finally:
        srv.shutdown()
        srv.server_close()


def test_a_target_down_at_start_stays_in_the_agent(unused_port: int) -> None:
    """The agent keeps retrying a scraped service that is not up yet instead of switching it off."""
    from triscope.agent.registry import UnavailableCollector, split_available

    c = ScrapeCollector(f"http://127.0.0.1:{unused_port}/metrics", timeout=0.5)
    av = c.check()
    assert not av.ok and av.transient
    kept, off = split_available([c])
    assert kept == [c] and not isinstance(kept[0], UnavailableCollector) and off == []


def raw_target(answer: bytes) -> tuple[str, threading.Event]:
    """A one-connection-at-a-time TCP target that reads the request and sends ``answer`` as is, then
    closes; the request it got is kept for the test (``stop.request``)."""
    import socket

    sock = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()
    stop.request = b""  # type: ignore[attr-defined]

    def run() -> None:
        sock.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = sock.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(2)
                data = b""
                while b"\r\n\r\n" not in data:
                    chunk = conn.recv(4096)
                    if not chunk:
                        break
                    data += chunk
                stop.request = data  # type: ignore[attr-defined]
                conn.sendall(answer)
        sock.close()

    threading.Thread(target=run, daemon=True).start()
    return f"http://127.0.0.1:{sock.getsockname()[1]}/metrics?x=1", stop


BODY = b"a 1\nb_total 2\n"


@pytest.mark.parametrize(("answer", "expect"), [
    (b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(BODY) + BODY, BODY),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4;x=y\r\na 1\n\r\na\r\nb_total 2\n\r\n0\r\nT: t\r\n\r\n", BODY),
    (b"HTTP/1.0 200 OK\r\n\r\n" + BODY, BODY),                                # the body ends with the connection
    (b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 14\r\n\r\n" + BODY, BODY),
    (b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; charset=latin-1\r\nContent-Length: 5\r\n\r\nc 1\xe9\n",
     b"c 1\xe9\n"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 40\r\n\r\n" + BODY, "malformed HTTP response: peer closed"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n" + BODY, "malformed HTTP response"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n" + BODY, "malformed HTTP response"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "malformed HTTP response"),
    (b"HTTP/1.1 200 OK\r\nX-Big: " + b"x" * (70 << 10) + b"\r\n\r\n", "response head larger than 65536 bytes"),
    (b"\x16\x03\x01\x00\x05hello", "malformed HTTP response: illegal status line"),   # TLS where HTTP was asked
    (b"", "connection closed before the response head"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 99999\r\n\r\n", "body larger than 1000 bytes"),   # at once, from the head
    (b"HTTP/1.1 301 Moved\r\nLocation: /elsewhere\r\nContent-Length: 0\r\n\r\n", "redirect to '/elsewhere'"),
    (b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: 3\r\n\r\nabc", "Content-Encoding 'gzip'"),
])
def test_response_framing(answer: bytes, expect: bytes | str) -> None:
    """What the h11-driven client makes of each framing a target may send: the body, or the error."""
    url, stop = raw_target(answer)
    try:
        c = ScrapeCollector(url, timeout=2.0, max_bytes=1000)
        if isinstance(expect, bytes):
            assert c.fetch() == expect.decode("latin-1" if b"\xe9" in expect else "utf-8")
            assert c.last_bytes == len(expect)
        else:
            with pytest.raises(ScrapeError, match=expect.replace("(", r"\(")):
                c.fetch()
        req = stop.request  # type: ignore[attr-defined]
        assert req.startswith(b"GET /metrics?x=1 HTTP/1.1\r\nHost: 127.0.0.1:") and b"Connection: close" in req
    finally:
        stop.set()


def test_a_non_ascii_path_goes_out_percent_encoded() -> None:
    """A URL the collector accepts with non-ASCII in its path or query is scraped: the request
    target is its UTF-8 percent-encoding, never an encoding error that ends the agent's check."""
    url, stop = raw_target(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(BODY) + BODY)
    try:
        c = ScrapeCollector(url.replace("/metrics?x=1", "/métriques?q=é"), timeout=2.0)
        assert c.fetch() == BODY.decode()
        req = stop.request  # type: ignore[attr-defined]
        assert req.startswith(b"GET /m%C3%A9triques?q=%C3%A9 HTTP/1.1\r\n"), req
    finally:
        stop.set()
