"""A hostile HTTP peer for the fault-injection tests: a scrape target that misbehaves on purpose
(trickles, hangs, floods, sends garbage, redirects to itself) and a slowloris client.

The target is a raw TCP server, one thread per connection, so it can do what no well-behaved
HTTP library would; ``mode`` can be changed while it runs (healthy, then slow).
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time

MODES = ("ok", "trickle", "trickle_head", "hang", "huge", "garbage", "redirect", "refuse_body")
OK_BODY = (b"# TYPE app_requests_total counter\napp_requests_total{code=\"200\"} 42\n"
           b"# TYPE app_queue_depth gauge\napp_queue_depth 3\n")


class HostileTarget:
    def __init__(self, mode: str = "ok") -> None:
        assert mode in MODES, mode
        self.mode = mode
        self.sock = socket.create_server(("127.0.0.1", 0), backlog=128)
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/metrics"
        self.connections = 0
        self._stop = threading.Event()
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True, name=f"hostile-{mode}").start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            with self._lock:
                self._open.add(conn)
            threading.Thread(target=self._serve, args=(conn, self.mode), daemon=True).start()

    def _serve(self, conn: socket.socket, mode: str) -> None:
        try:
            conn.settimeout(2.0)
            with contextlib.suppress(OSError):
                conn.recv(65536)   # the request; its content does not matter here
            if mode == "ok":
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: "
                             + str(len(OK_BODY)).encode() + b"\r\nConnection: close\r\n\r\n" + OK_BODY)
            elif mode == "trickle":   # a valid head, then the body one byte every half second
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\n")
                while not self._stop.is_set():
                    conn.sendall(b"#")
                    time.sleep(0.5)
            elif mode == "trickle_head":
                for ch in b"HTTP/1.1 200 OK\r\nX-Slow: " + b"y" * 10_000:
                    if self._stop.is_set():
                        break
                    conn.sendall(bytes([ch]))
                    time.sleep(0.5)
            elif mode == "hang":
                self._stop.wait()
            elif mode == "huge":   # a body that never ends, as fast as the agent takes it
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\n")
                block = b"".join(b"m_%d 1\n" % i for i in range(4000))
                while not self._stop.is_set():
                    conn.sendall(block)
            elif mode == "garbage":
                conn.sendall(b"\x1b[2J\x1b[31mNOT HTTP\x00\xff\xfe" + os.urandom(4096))
            elif mode == "redirect":
                conn.sendall(b"HTTP/1.1 302 Found\r\nLocation: /metrics\x1b[31m\r\nContent-Length: 0\r\n\r\n")
            elif mode == "refuse_body":   # an error status whose reason phrase carries escape sequences
                conn.sendall(b"HTTP/1.1 500 \x1b]0;owned\x07\x1b[2J\r\nContent-Length: 0\r\n\r\n")
        except OSError:
            pass
        finally:
            with self._lock:
                self._open.discard(conn)
            with contextlib.suppress(OSError):
                conn.close()

    def close(self) -> None:
        self._stop.set()
        with contextlib.suppress(OSError):
            self.sock.close()
        with self._lock:
            for c in list(self._open):
                with contextlib.suppress(OSError):
                    c.shutdown(socket.SHUT_RDWR)


class Slowloris:
    """A client that opens a connection and sends a request head one byte every ``gap`` seconds."""

    def __init__(self, host: str, port: int, gap: float = 2.0, head: bytes | None = None) -> None:
        self.sock = socket.create_connection((host, port), timeout=10)
        self.gap = gap
        self.head = head or (b"GET /metrics HTTP/1.1\r\nHost: x\r\n" + b"X-A: " + b"a" * 100_000)
        self.closed_by_server_after: float | None = None
        self._stop = threading.Event()
        self._started = time.monotonic()
        self.thread = threading.Thread(target=self._run, daemon=True, name="slowloris")
        self.thread.start()

    def _run(self) -> None:
        for ch in self.head:
            if self._stop.is_set():
                return
            try:
                self.sock.sendall(bytes([ch]))
            except OSError:
                self.closed_by_server_after = time.monotonic() - self._started
                return
            if self._stop.wait(self.gap):
                return
            # the server may have answered (408) and closed: a send then fails, or recv sees EOF
            self.sock.setblocking(False)
            try:
                data = self.sock.recv(4096)
                if not data or data.startswith(b"HTTP/"):
                    self.closed_by_server_after = time.monotonic() - self._started
                    return
            except BlockingIOError:
                pass
            except OSError:
                self.closed_by_server_after = time.monotonic() - self._started
                return
            finally:
                self.sock.setblocking(True)

    def close(self) -> None:
        self._stop.set()
        with contextlib.suppress(OSError):
            self.sock.close()
