"""Slots at capacity: clients that trickle a request head in cannot keep out the ones that send whole
requests (the shared HTTP server of /metrics, the webhook and OTLP, ``triscope.web.httpd``)."""

from __future__ import annotations

import http.client
import time

from hostile import Slowloris

from triscope.web.httpd import HttpServer, Limits, Request, Response


def _get(port: int, path: str = "/metrics", source: str = "127.0.0.1", timeout: float = 5) -> int | str:
    """The status of one request on a fresh connection from ``source``, or the error's name."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout, source_address=(source, 0))
    try:
        conn.request("GET", path)
        r = conn.getresponse()
        r.read()
        return r.status
    except (OSError, http.client.HTTPException) as e:
        return type(e).__name__
    finally:
        conn.close()


def test_trickling_clients_give_their_slots_to_whole_requests() -> None:
    """40 clients each sending a request head a byte a second, on a server of 16 slots: every slot is
    taken by one within a second, and none of them is idle; a scrape that sends its whole request at
    once still gets its answer (each time the longest trickler is closed for it), where it got 503
    for up to the 5 s request deadline before."""
    srv = HttpServer(("127.0.0.1", 0), lambda req: Response(200, b"ok\n", "text/plain"),
                     limits=Limits(max_connections=16, header_timeout=5.0, request_timeout=5.0),
                     name="slots").start()
    port = srv.server_address[1]
    slow = []
    try:
        for _ in range(40):
            slow.append(Slowloris("127.0.0.1", port, gap=1.0))
            time.sleep(0.01)
        time.sleep(1.0)                       # every slot now holds a trickler past slow_head
        got = []
        for _ in range(60):
            got.append(_get(port))
            time.sleep(0.03)
        ok = got.count(200) / len(got)
        assert ok >= 0.99, {x: got.count(x) for x in set(got)}
        assert srv.evicted_slow > 0
        assert srv.connections <= 16
    finally:
        for s in slow:
            s.close()
        srv.shutdown()


def test_a_prompt_client_is_never_evicted() -> None:
    """Only a request still arriving after slow_head gives up its slot: requests that arrive whole
    are never cut, even at capacity."""
    seen: list[str] = []

    def handler(req: Request) -> Response:
        seen.append(req.path)
        return Response(200, b"ok\n", "text/plain")

    srv = HttpServer(("127.0.0.1", 0), handler, limits=Limits(max_connections=4), name="slots2").start()
    port = srv.server_address[1]
    try:
        assert [_get(port) for _ in range(20)] == [200] * 20
        assert srv.evicted_slow == 0 and len(seen) == 20
    finally:
        srv.shutdown()


def test_one_source_holds_at_most_its_share_of_the_slots() -> None:
    """16 slots; one address sends 16 whole requests that each keep the server busy 2 s (not idle,
    not trickling: nothing to evict once they run).  Past half the slots it is held to its share (4):
    8 are served, and a scrape from any other address is answered meanwhile; without the per-source
    bound it is refused."""
    import threading

    def handler(req: Request) -> Response:
        if req.path == "/slow":
            time.sleep(2.0)
        return Response(200, b"ok\n", "text/plain")

    for per_source, other_answered in ((0, True), (16, False)):
        srv = HttpServer(("127.0.0.1", 0), handler, limits=Limits(max_connections=16, per_source=per_source),
                         workers=24, name="per-source").start()
        port = srv.server_address[1]
        flood: list[int | str] = []
        threads = [threading.Thread(target=lambda f=flood, p=port: f.append(_get(p, "/slow", timeout=10)))
                   for _ in range(16)]
        try:
            for t in threads:
                t.start()
            time.sleep(0.5)                             # the flood holds what it could get
            others = [_get(port, source=f"127.0.0.{2 + i}") for i in range(5)]
            for t in threads:
                t.join(10)
            if other_answered:
                assert others == [200] * 5, others
                # half the slots served; the others refused (503), or closed while still idle to make
                # room for a newer connection of the same source
                assert flood.count(200) == 8, flood
                assert len(flood) == 16
            else:
                assert others == [503] * 5, others     # the same flood without the bound: everyone else out
        finally:
            srv.shutdown()


def test_an_ipv6_source_is_its_slash_64() -> None:
    from triscope.web.httpd import source_key as _source_key

    assert _source_key("2001:db8:1:2::1") == _source_key("2001:db8:1:2:ffff::9") == "2001:db8:1:2::/64"
    assert _source_key("2001:db8:1:3::1") != _source_key("2001:db8:1:2::1")
    assert _source_key("::ffff:10.0.0.7") == "10.0.0.7" and _source_key("10.0.0.7") == "10.0.0.7"
    assert _source_key("fe80::1%eth0") == "fe80::/64"


def test_tricklers_from_a_scrapers_own_address_never_close_its_kept_alive_connection() -> None:
    """16 slots; 40 connections from 127.0.0.1, half trickling a request head, half held open sending
    nothing, each opened again when closed (tests/spray.py, a process of its own); a client on the
    same address keeps one connection alive, its first request answered 200.  Its connection is
    never the one closed to make room (an unproven one always goes first, or the newcomer is
    refused): 52/52 requests on it answered.  (Before: its idle connection was the oldest idle one
    of its address, closed for the next trickler.)"""
    import subprocess
    import sys
    from pathlib import Path

    srv = HttpServer(("127.0.0.1", 0), lambda req: Response(200, b"ok\n", "text/plain"),
                     limits=Limits(max_connections=16), name="slots-proven").start()
    port = srv.server_address[1]
    spray = Path(__file__).resolve().parents[1] / "spray.py"
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    tricklers = None
    try:
        conn.request("GET", "/metrics")
        assert conn.getresponse().read() == b"ok\n"
        tricklers = subprocess.Popen([sys.executable, str(spray), "trickle", "--port", str(port), "--source",
                                      "127.0.0.1", "--conns", "40", "--gap", "0.2", "--seconds", "60"],
                                     stdout=subprocess.DEVNULL)
        time.sleep(1.5)
        got: list[int | str] = []
        for _ in range(52):
            try:
                conn.request("GET", "/metrics")
                r = conn.getresponse()
                r.read()
                got.append(r.status)
            except (OSError, http.client.HTTPException) as e:
                got.append(type(e).__name__)
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            time.sleep(0.05)
        assert got == [200] * 52, {x: got.count(x) for x in set(got)}
        assert srv.evicted_slow + srv.refused_source > 0     # the tricklers did press on the slots
        assert srv.connections <= 16
    finally:
        if tricklers is not None:
            tricklers.terminate()
            tricklers.wait(10)
        conn.close()
        srv.shutdown()
