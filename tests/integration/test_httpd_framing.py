"""Request framing of the shared HTTP server (``triscope.web.httpd``, HTTP/1.1 parsed by h11): what a
raw client sends byte by byte, and what comes back.  The real server on a real socket; the fault
suite (tests/test_faults_*.py) covers the same server under load and inside the agent and engine."""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator

import pytest

from triscope.web.httpd import HttpServer, Limits, Request, Response

SEEN: list[Request] = []


def _echo(req: Request) -> Response:
    SEEN.append(req)
    if req.path == "/close":
        return Response(200, b"bye\n", close=True)
    return Response(200, b"%s %s %d\n" % (req.method.encode(), req.target.encode(), len(req.body)),
                    head=req.method == "HEAD")


@pytest.fixture(scope="module")
def port() -> Iterator[int]:
    srv = HttpServer(("127.0.0.1", 0), _echo, name="framing",
                     limits=Limits(max_body=1000, max_headers=8, max_header_bytes=1024, header_timeout=1.0,
                                   request_timeout=2.0, idle_timeout=2.0))
    srv.start()
    try:
        yield srv.server_address[1]
    finally:
        srv.shutdown()


def split(buf: bytes, whole: bool = True) -> list[bytes]:
    """Responses in ``buf``, each head and the body its Content-Length gives (none for 1xx); with
    ``whole``, only those whose body is all there."""
    out = []
    while b"\r\n\r\n" in buf:
        head, _, rest = buf.partition(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n")[1:]:
            k, _, v = line.partition(b":")
            if k.lower() == b"content-length" and not head.startswith(b"HTTP/1.1 1"):
                length = int(v)
        if whole and len(rest) < length:
            break
        out.append(head + b"\r\n\r\n" + rest[:length])
        buf = rest[length:]
    return out


def exchange(port: int, *parts: bytes, gap: float = 0.0, want: int = 1, timeout: float = 3.0) -> list[bytes]:
    """Send ``parts`` (``gap`` seconds apart) on one connection; the responses read back until ``want``
    arrived whole, the server closed or ``timeout``."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        for i, p in enumerate(parts):
            if i and gap:
                time.sleep(gap)
            with contextlib.suppress(OSError):
                s.sendall(p)
        buf = b""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if len(split(buf)) >= want:
                break
            try:
                chunk = s.recv(65536)
            except (TimeoutError, ConnectionResetError):
                break
            if not chunk:
                break
            buf += chunk
        return split(buf, whole=False)


def status(resp: bytes) -> int:
    return int(resp.split(b" ", 2)[1])


def test_keep_alive_and_pipelined_requests_are_answered_in_order(port: int) -> None:
    a = b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n"
    b = b"POST /b HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nxyz"
    c = b"GET /c?q=1 HTTP/1.1\r\nHost: x\r\n\r\n"
    got = exchange(port, a + b + c, want=3)            # three requests in one segment
    assert [r.rsplit(b"\r\n\r\n", 1)[1] for r in got] == [b"GET /a 0\n", b"POST /b 3\n", b"GET /c?q=1 0\n"]
    got = exchange(port, a, b, c, gap=0.1, want=3)     # the same, one after the other
    assert [status(r) for r in got] == [200, 200, 200]
    assert all(b"connection: close" not in r.lower() for r in got)


def test_http10_and_connection_close_end_the_connection(port: int) -> None:
    got = exchange(port, b"GET /a HTTP/1.0\r\n\r\nGET /b HTTP/1.0\r\n\r\n", want=2)
    assert len(got) == 1 and status(got[0]) == 200 and b"connection: close" in got[0].lower()
    got = exchange(port, b"GET /a HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\nGET /b HTTP/1.1\r\nHost: x\r\n\r\n",
                   want=2)
    assert len(got) == 1 and b"connection: close" in got[0].lower()
    got = exchange(port, b"GET /close HTTP/1.1\r\nHost: x\r\n\r\nGET /b HTTP/1.1\r\nHost: x\r\n\r\n", want=2)
    assert len(got) == 1 and b"bye" in got[0]


def test_head_gets_the_length_and_no_body(port: int) -> None:
    [got] = exchange(port, b"HEAD /h HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    head, _, body = got.partition(b"\r\n\r\n")
    assert status(got) == 200 and b"Content-Length: 10" in head   # len(b"HEAD /h 0\n")
    assert body == b""


def test_chunked_body_with_extensions_and_trailers(port: int) -> None:
    body = b"5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nX-Trailer: t\r\n\r\n"
    [got] = exchange(port, b"POST /c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" + body)
    assert got.endswith(b"POST /c 11\n")
    assert SEEN[-1].body == b"hello world"


def test_expect_100_continue_is_answered_before_the_body(port: int) -> None:
    head = b"POST /e HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=3) as s:
        s.sendall(head)
        assert s.recv(100).startswith(b"HTTP/1.1 100 ")
        s.sendall(b"abcd")
        assert s.recv(1000).endswith(b"POST /e 4\n")
    # over the limit: the refusal instead of 100, the body never asked for
    [got] = exchange(port, b"POST /e HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\nExpect: 100-continue\r\n\r\n")
    assert status(got) == 413


@pytest.mark.parametrize(("raw", "code"), [
    (b"GET /x HTTP/2.0\r\nHost: x\r\n\r\n", 505),
    (b"GET /x HTTP/1.1x\r\nHost: x\r\n\r\n", 400),
    (b"GET x HTTP/1.1\r\nHost: x\r\n\r\n", 400),                        # not an origin-form target
    (b"G3T /x HTTP/1.1\r\nHost: x\r\n\r\n", 400),
    (b"GET /x HTTP/1.1\r\n\r\n", 400),                                  # HTTP/1.1 without Host
    (b"GET /\xff HTTP/1.1\r\nHost: x\r\n\r\n", 400),
    (b"GET /x HTTP/1.1\r\nHost: x\r\nBad Name: v\r\n\r\n", 400),
    (b"GET /x HTTP/1.1\r\nHost: x\r\nX: a\x00b\r\n\r\n", 400),
    (b"GET /x HTTP/1.1\r\nHost: x\r\n" + b"".join(b"X-%d: v\r\n" % i for i in range(9)) + b"\r\n", 431),
    (b"GET /x HTTP/1.1\r\nHost: x\r\nX-Big: " + b"b" * 2000 + b"\r\n\r\n", 431),   # whole in one read
    (b"POST /x HTTP/1.1\r\nHost: x\r\n\r\n", 411),
    (b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\nabc", 400),
    (b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 3, 3\r\n\r\nabc", 400),
    (b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabc", 400),
    (b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: -3\r\n\r\n", 400),
    (b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n", 400),
    # the same smuggling forms with bare \n line endings, which h11 accepts
    (b"POST /x HTTP/1.1\nHost: x\nContent-Length: 3\nTransfer-Encoding: chunked\n\n", 400),
    (b"POST /x HTTP/1.1\nHost: x\nContent-Length: 3\nContent-Length: 3\n\nabc", 400),
    (b"POST /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", 501),
    (b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 1001\r\n\r\n", 413),
    (b"POST /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3e9\r\n" + b"x" * 1001 + b"\r\n", 413),
    (b"POST /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", 400),
])
def test_bad_framing_gets_its_status_and_the_connection_closed(port: int, raw: bytes, code: int) -> None:
    got = exchange(port, raw + b"GET /after HTTP/1.1\r\nHost: x\r\n\r\n", want=2)
    assert [status(r) for r in got] == [code], got
    assert b"connection: close" in got[0].lower()


def test_a_head_over_the_limit_is_refused_as_it_trickles_in(port: int) -> None:
    """Sent in pieces, the head is refused once what is buffered passes ``max_header_bytes``, not
    when (if ever) it ends."""
    parts = [b"GET /x HTTP/1.1\r\nHost: x\r\nX-Big: "] + [b"b" * 300] * 6
    [got] = exchange(port, *parts, gap=0.05)
    assert status(got) == 431


def test_a_head_or_body_not_sent_in_time_is_a_408(port: int) -> None:
    t0 = time.monotonic()
    [got] = exchange(port, b"GET /x HTTP/1.1\r\nHost: x\r\n", timeout=5)
    assert status(got) == 408 and 0.9 < time.monotonic() - t0 < 2.0    # header_timeout 1 s
    t0 = time.monotonic()
    [got] = exchange(port, b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nabc", timeout=5)
    assert status(got) == 408 and 1.9 < time.monotonic() - t0 < 3.0    # request_timeout 2 s


def test_a_header_with_a_newline_is_never_sent() -> None:
    """A handler's header value carrying CR LF (a header injection) is refused by h11: the
    connection is closed with nothing sent, rather than a forged header."""
    srv = HttpServer(("127.0.0.1", 0), lambda req: Response(200, b"x\n", headers=[("X-Echo", "a\r\nSet-Cookie: s=1")]),
                     name="inject").start()
    try:
        got = exchange(srv.server_address[1], b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert got == []
    finally:
        srv.shutdown()


def test_a_body_framed_with_bare_newlines_is_read(port: int) -> None:
    """Bare ``\\n`` line endings (h11 takes them): the Content-Length is still seen, so the POST is
    served, not refused as unframed."""
    [got] = exchange(port, b"POST /e HTTP/1.1\nHost: x\nContent-Length: 4\n\nabcd")
    assert status(got) == 200 and got.endswith(b"POST /e 4\n"), got
