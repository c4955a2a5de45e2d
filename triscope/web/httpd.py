"""One small HTTP/1.1 server for every listener the agent and the engine open (``/metrics``, the
Alertmanager webhook): no client can hold it.

Why not ``http.server``: it serves with a per-``recv`` timeout, so a client that sends one byte
every few seconds holds a thread (or, single-threaded, the whole server) forever; it starts a
thread per connection with no bound (1,200 slow connections made 1,203 threads); its listen
backlog is 5; ``Content-Length: -1`` made it read to EOF.

Here one thread runs an asyncio loop for all connections; requests are parsed by h11 (request
line, headers, Content-Length and chunked bodies, pipelined requests, ``Expect: 100-continue``), a
sans-I/O parser fed from that loop, so every wait and bound below stays this server's.  A response
head is written here (a status line and the handler's headers, each checked for control
characters: no header can be split into two); h11's own writer cost 20 µs a response more:

* **a whole-request deadline**: the request head must arrive within ``header_timeout`` of its
  first byte and the body within ``request_timeout``; a keep-alive connection may sit idle
  ``idle_timeout``; a response must be taken within ``write_timeout``;
* **bounded connections**: at ``max_connections`` the oldest *idle* connection (nothing received
  yet) is closed to make room, else the one whose request head has trickled in longest (past
  ``slow_head``), and when there is neither a new one gets ``503`` at once;
* **small limits**: ``max_header_bytes`` for the request line and headers together (``431``),
  ``max_headers`` header lines, ``max_body`` for the body (``413``); a body needs a valid,
  single ``Content-Length`` (negative, non-numeric or repeated → ``400``; missing → ``411``) or
  ``Transfer-Encoding: chunked`` (counted against ``max_body`` as it arrives); both at once → ``400``;
  h11 answers the rest of the grammar: a malformed request line or header, an HTTP/1.1 request
  without ``Host``, a control character in a header value → ``400``; a transfer coding other than
  ``chunked`` → ``501``; HTTP/2.0 and later → ``505``;
* a listen **backlog** sized for bursts (``backlog``, capped by the kernel's ``somaxconn``).

The handler is a plain function ``Request -> Response``: run on the loop itself when it is quick
and never blocks (``/metrics`` sends a body rendered at the tick), or on a bounded thread pool
(``workers``) when it writes to a database (the webhook); ``defer`` may answer a request later
instead, without holding the loop (a password check waiting for its turn at bcrypt: the agent's
``/metrics``, where a scrape whose credentials are already verified is answered on the loop at
once).  ``ssl_context`` serves TLS on the same
listener: a context, or a function giving the context for each new connection (a reloaded
``--web.config.file`` swaps in a new one: new connections take it, open ones keep theirs); the
handshake counts against ``max_connections`` and must finish within ``header_timeout``.
``every=(seconds, fn)`` runs ``fn`` that often on a thread of its own, never on the loop (a config
reload parses YAML and may hash with bcrypt), the next run ``seconds`` after the last one ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import socket
import ssl
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import h11

log = logging.getLogger(__name__)

REASONS = {100: "Continue", 200: "OK", 202: "Accepted", 400: "Bad Request", 401: "Unauthorized",
           404: "Not Found", 405: "Method Not Allowed", 408: "Request Timeout", 411: "Length Required",
           413: "Content Too Large", 415: "Unsupported Media Type", 429: "Too Many Requests", 431: "Request Header Fields Too Large",
           500: "Internal Server Error", 501: "Not Implemented", 503: "Service Unavailable",
           505: "HTTP Version Not Supported"}
BODY_METHODS = ("POST", "PUT", "PATCH")
READ_SIZE = 16384
_CONTENT_LENGTH = re.compile(rb"\ncontent-length[ \t]*:([^\r\n]*)", re.IGNORECASE)   # after \r\n or a bare \n (h11 takes both)
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")           # a header name (RFC 9110 token)
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")           # not in a header value (tab is)


@dataclass(frozen=True)
class Limits:
    max_connections: int = 256
    idle_timeout: float = 15.0      # a connection with nothing received may wait this long
    header_timeout: float = 5.0     # request line + headers, from their first byte
    request_timeout: float = 10.0   # the whole request, body included, from its first byte
    write_timeout: float = 10.0     # the client must take the response within this
    max_header_bytes: int = 8192
    max_headers: int = 64
    max_body: int = 0               # 0: requests with a body are refused (413)
    slow_head: float = 0.5          # at capacity, a request still arriving after this long gives up its slot
    per_source: int = 0             # once half the slots are taken, connections one source may hold (0: a quarter, >= 4)
    protected: int = 4              # an address's most recently used proven connections no unproven one can push out
    backlog: int = 1024


@dataclass
class Request:
    method: str
    target: str
    version: str
    headers: list[tuple[str, str]]     # (lower-case name, value) in arrival order
    body: bytes
    peer: tuple[str, int] | None
    verdict: bool | None = None     # set by ``defer``: the answer it found (cached or checked credentials)

    @property
    def path(self) -> str:
        return self.target.split("?", 1)[0]

    def header(self, name: str, default: str | None = None) -> str | None:
        name = name.lower()
        for k, v in self.headers:
            if k == name:
                return v
        return default

    def header_all(self, name: str) -> list[str]:
        name = name.lower()
        return [v for k, v in self.headers if k == name]


@dataclass
class Response:
    status: int
    body: bytes = b""
    content_type: str = "text/plain; charset=utf-8"
    headers: list[tuple[str, str]] = field(default_factory=list)
    close: bool = False
    head: bool = False    # the answer to a HEAD: headers only

    @staticmethod
    def text(status: int, message: str, **kw: object) -> Response:
        return Response(status, (message.rstrip("\n") + "\n").encode(), **kw)  # type: ignore[arg-type]


Handler = Callable[[Request], Response]


class _BadRequest(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


def source_key(addr: str) -> str:
    """What counts as one source: an IPv4 address; an IPv6 one's /64 (a host picks any address in it)."""
    if ":" not in addr:
        return addr
    import ipaddress

    try:
        ip = ipaddress.IPv6Address(addr.split("%", 1)[0])
    except ValueError:
        return addr
    if ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    return str(ipaddress.IPv6Network((int(ip) >> 64 << 64, 64)))


class _Conn:
    __slots__ = ("active", "idle", "opened", "proven", "source", "started", "task", "writer")

    def __init__(self, writer: asyncio.StreamWriter, source: str | None = None) -> None:
        self.writer = writer
        self.source = source  # the peer's address: its share of the slots is bounded
        self.idle = True      # nothing of a request received yet: may be closed to make room
        self.started: float | None = None   # when the request being read began (None: not reading one)
        self.task: asyncio.Task[None] | None = None
        # a request on it was answered with success (2xx/3xx: authorized, where there is auth): a
        # client that sent whole requests and was let in, never closed for a newcomer while a
        # connection that never proved itself (held open, trickling) can be closed instead
        self.proven = False
        self.opened = self.active = time.monotonic()   # accepted; its last answer (least recently used goes first)


class HttpServer:
    """``HttpServer((host, port), handler, limits=Limits(...), workers=0).start()``; ``shutdown()``."""

    def __init__(self, addr: tuple[str, int], handler: Handler, *, limits: Limits | None = None,
                 workers: int = 0, name: str = "http",
                 ssl_context: ssl.SSLContext | Callable[[], ssl.SSLContext | None] | None = None,
                 methods: tuple[str, ...] | None = None,
                 error: Callable[[int, str], Response] | None = None,
                 every: tuple[float, Callable[[], object]] | None = None,
                 defer: Callable[[Request], Awaitable[Response] | None] | None = None,
                 screen: Callable[[str], bool] | None = None) -> None:
        self.handler = handler
        self.methods = methods     # others get 405 before any body is read
        self.error = error or (lambda status, message: Response.text(status, message))  # framing errors
        self.limits = limits or Limits()
        self.name = name
        self.ssl_context = ssl_context
        self.every = every      # (seconds, fn): fn runs on a thread that often (a config reload)
        # asked on the loop first: None, the request is answered as usual; an awaitable, its answer
        # is (the loop goes on meanwhile: a password check waiting for its turn at bcrypt)
        self.defer = defer
        # asked on the loop with a new connection's source before anything else (its TLS handshake
        # above all): False closes it at once (an address that keeps being refused password checks)
        self.screen = screen
        self.screened = 0                      # connections closed by ``screen``
        self.queued = 0                        # requests handed to the workers and not answered yet
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=f"{name}-worker") if workers else None
        self._conns: dict[_Conn, None] = {}    # insertion order = age
        self.refused = 0                       # connections answered 503 because every slot was busy
        self.timed_out = 0                     # requests or idle connections closed at a deadline
        self.evicted_slow = 0                  # trickling requests closed at capacity to make room
        self.refused_source = 0                # connections answered 503 because their source held its share
        # bind here, in the caller's thread, so an address in use is the caller's error at once
        self.sock = socket.create_server(addr, backlog=self.limits.backlog, reuse_port=False)
        self.sock.setblocking(False)
        self.server_address = self.sock.getsockname()
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.base_events.Server | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()

    # lifecycle ---------------------------------------------------------------------------------------
    def start(self) -> HttpServer:
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()
        self._ready.wait(10.0)
        return self

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        # TLS is started per connection (``_accept``), so each new one takes the current context
        self._server = self._loop.run_until_complete(asyncio.start_server(
            self._accept, sock=self.sock, backlog=self.limits.backlog, limit=self.limits.max_header_bytes + 2))
        self._ready.set()
        if self.every is not None:
            self._loop.call_later(self.every[0], self._tick)
        try:
            self._loop.run_forever()
        finally:
            with contextlib.suppress(Exception):
                self._loop.run_until_complete(self._loop.shutdown_asyncgens())
            self._loop.close()

    def _tick(self) -> None:
        assert self.every is not None
        seconds = self.every[0]
        fut = self._loop.run_in_executor(None, self._job)
        fut.add_done_callback(lambda _: self._loop.is_closed() or self._loop.call_later(seconds, self._tick))

    def _job(self) -> None:
        assert self.every is not None
        try:
            self.every[1]()
        except Exception:  # noqa: BLE001 - the periodic job never stops the server
            log.exception("%s: periodic job failed", self.name)

    def shutdown(self, timeout: float = 5.0) -> None:
        """Stop accepting, close every connection, stop the loop and its thread."""
        if self._thread is None or not self._thread.is_alive():
            with contextlib.suppress(OSError):
                self.sock.close()
            return

        async def _stop() -> None:
            if self._server is not None:
                self._server.close()
            for c in list(self._conns):
                if c.task is not None:
                    c.task.cancel()
                with contextlib.suppress(Exception):
                    c.writer.close()

        with contextlib.suppress(RuntimeError):
            asyncio.run_coroutine_threadsafe(_stop(), self._loop).result(timeout)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout)
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
        with contextlib.suppress(OSError):
            self.sock.close()

    @property
    def connections(self) -> int:
        return len(self._conns)

    # connections -------------------------------------------------------------------------------------
    @property
    def per_source(self) -> int:
        return self.limits.per_source or max(4, self.limits.max_connections // 4)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        source = source_key(str(peer[0])) if isinstance(peer, tuple) and peer else None
        if self.screen is not None and source is not None and not self.screen(source):
            self.screened += 1
            writer.transport.abort()
            return
        # once half the slots are taken, one source holds at most its share (its own idle or trickling
        # connection gives way first): a flood from one address leaves half to every other client.
        # So a lone source may hold up to half the slots, and past that its idle keep-alive
        # connections make way for its new ones (an IPv6 source is its /64: one host's addresses)
        if source is not None and len(self._conns) * 2 >= self.limits.max_connections \
                and sum(1 for c in self._conns if c.source == source) >= self.per_source \
                and not self._evict_idle(source):
            self.refused_source += 1
            await self._refuse(writer)
            return
        if len(self._conns) >= self.limits.max_connections and not self._evict_idle():
            self.refused += 1
            await self._refuse(writer)
            return
        conn = _Conn(writer, source)
        conn.task = asyncio.current_task()
        self._conns[conn] = None
        sockobj = writer.get_extra_info("socket")
        if sockobj is not None:
            with contextlib.suppress(OSError):
                sockobj.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            if self.ssl_context is not None:
                ctx = self.ssl_context() if callable(self.ssl_context) else self.ssl_context
                assert ctx is not None
                await writer.start_tls(ctx, ssl_handshake_timeout=self.limits.header_timeout)
            await self._serve(conn, reader, writer)
        except (asyncio.CancelledError, ConnectionError, asyncio.IncompleteReadError, ssl.SSLError, OSError):
            pass
        except Exception as e:  # noqa: BLE001 - one bad connection never stops the server
            log.warning("%s: connection failed: %s", self.name, e)
        finally:
            self._conns.pop(conn, None)
            with contextlib.suppress(Exception):
                writer.close()

    async def _linger(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """After an early answer (413, 400...) the client may still be sending its body: closing now
        would reset the connection and the client might never read the answer.  Half-close, then
        read and drop what still arrives for a moment (bounded in time and bytes), as web servers do."""
        with contextlib.suppress(Exception):
            if writer.can_write_eof():
                writer.write_eof()
            deadline = time.monotonic() + 1.0
            dropped = 0
            while dropped < (4 << 20):
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                chunk = await asyncio.wait_for(reader.read(65536), left)
                if not chunk:
                    break
                dropped += len(chunk)

    async def _refuse(self, writer: asyncio.StreamWriter) -> None:
        """503 and close (over TLS when the listener has it, as every answer is)."""
        with contextlib.suppress(Exception):
            if self.ssl_context is not None:
                ctx = self.ssl_context() if callable(self.ssl_context) else self.ssl_context
                assert ctx is not None
                await writer.start_tls(ctx, ssl_handshake_timeout=1.0)
            writer.write(_render(Response(503, headers=[("Retry-After", "1")], close=True)))
            await asyncio.wait_for(writer.drain(), 1.0)
        writer.close()

    def _evict_idle(self, source: str | None = None) -> bool:
        """Make room for a new connection (with ``source``: among that source's connections only).

        In this order: the oldest connection held open with nothing received for ``slow_head``
        seconds (a TLS handshake not finished counts) that never had a request answered with
        success; else the one whose request head has trickled in longest, past ``slow_head`` — a
        client that sends a whole request at once takes its head in milliseconds, so slots held by
        trickling clients are given to those that send whole requests (the request deadline alone
        would let 128 tricklers refuse everyone for 5 s at a time); else an idle *proven*
        connection (one of its requests was answered 2xx/3xx: a kept-alive client between two
        requests) past the ``protected`` most recently used of its address, least recently used
        first, with a FIN (an HTTP client retries on a new connection); else the oldest idle one
        that never proved itself, however young.  An address's ``protected`` most recently used
        proven connections (a scraper's kept-alive one) go only when every connection in reach is
        proven; while any unproven one is open and none can go, the newcomer is refused
        (``503``), so clients that hold or trickle, even from the scraper's own address, cannot
        reset its connection."""
        mine = [c for c in self._conns if c.task is not None and (source is None or c.source == source)]
        now = time.monotonic()
        slow = self.limits.slow_head
        for c in mine:
            if c.idle and not c.proven and now - c.opened >= slow:
                self._close(c)
                return True
        trickling = [c for c in mine if c.started is not None and now - c.started >= slow]
        if trickling:
            self._close(min(trickling, key=lambda c: (c.proven, c.started or now)))
            self.evicted_slow += 1
            return True
        protected = self._protected()
        spare = [c for c in mine if c.idle and c.proven and c not in protected]
        if spare:
            self._close(min(spare, key=lambda c: c.active), graceful=True)
            return True
        for c in mine:
            if c.idle and not c.proven:
                self._close(c)
                return True
        if any(not c.proven for c in mine):
            return False   # unproven ones that cannot go yet: the newcomer waits, the proven stay
        idle = [c for c in mine if c.idle]
        if idle:
            self._close(min(idle, key=lambda c: c.active), graceful=True)
            return True
        return False

    def _protected(self) -> set[_Conn]:
        """Each address's ``protected`` most recently used proven connections."""
        by_source: dict[str | None, list[_Conn]] = {}
        for c in self._conns:
            if c.proven:
                by_source.setdefault(c.source, []).append(c)
        keep: set[_Conn] = set()
        for conns in by_source.values():
            keep.update(sorted(conns, key=lambda c: c.active, reverse=True)[:self.limits.protected])
        return keep

    def _close(self, c: _Conn, graceful: bool = False) -> None:
        """Close a connection to make room.  The transport is closed as well as the task cancelled:
        a cancel that lands as the awaited read completes can be swallowed (``asyncio.wait_for`` on
        3.11), and the connection would then be served outside the count of slots.  Aborted (a
        reset) unless ``graceful`` (a FIN: an idle kept-alive connection, whose client retries)."""
        assert c.task is not None
        c.task.cancel()
        self._conns.pop(c, None)
        with contextlib.suppress(Exception):
            if graceful:
                c.writer.transport.close()
            else:
                c.writer.transport.abort()

    async def _serve(self, conn: _Conn, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        lim = self.limits
        peer = writer.get_extra_info("peername")
        peer = (str(peer[0]), int(peer[1])) if isinstance(peer, tuple) and len(peer) >= 2 else None
        first = b""     # what arrived of the next request with the last one (pipelined)
        while True:
            conn.idle = True
            if not first:
                try:
                    first = await asyncio.wait_for(reader.read(READ_SIZE), lim.idle_timeout)
                except TimeoutError:
                    self.timed_out += 1
                    return
                if not first:
                    return
            conn.idle = False
            started = conn.started = time.monotonic()
            # one h11 connection per request: its state ends with the request; what it holds beyond
            # (a pipelined request) starts the next one
            http = h11.Connection(h11.SERVER, max_incomplete_event_size=lim.max_header_bytes)
            try:
                req = await asyncio.wait_for(self._read_request(http, first, reader, writer, peer),
                                             max(0.0, lim.request_timeout))
                conn.started = None
            except TimeoutError:
                self.timed_out += 1
                await self._write(writer, self._error(408, "request not received in time"))
                return
            except _BadRequest as e:
                if await self._write(writer, self._error(e.status, e.message)):
                    await self._linger(reader, writer)
                return
            if time.monotonic() - started > lim.request_timeout:   # pragma: no cover - wait_for covers it
                return
            resp = await self._respond(req)
            keep = (req.version == "HTTP/1.1" and not resp.close
                    and (req.header("connection") or "").lower() != "close")
            resp.close = not keep
            if not await self._write(writer, resp, head=req.method == "HEAD") or not keep:
                return
            conn.active = time.monotonic()
            if resp.status < 400:
                conn.proven = True
            first = http.trailing_data[0]

    async def _respond(self, req: Request) -> Response:
        """The handler's answer: ``defer``'s, on the loop, or on the workers; a handler bug is a 500."""
        try:
            if self.defer is not None and (later := self.defer(req)) is not None:
                return await later
            if self._pool is None:
                return self.handler(req)
            self.queued += 1
            try:
                return await asyncio.get_running_loop().run_in_executor(self._pool, self.handler, req)
            finally:
                self.queued -= 1
        except Exception as e:  # noqa: BLE001 - a handler bug is a 500 and one log line
            log.exception("%s: %s %s failed", self.name, req.method, req.path)
            return Response.text(500, f"internal error: {type(e).__name__}", close=True)

    def _error(self, status: int, message: str) -> Response:
        resp = self.error(status, message)
        resp.close = True
        if status == 405 and self.methods:
            resp.headers.append(("Allow", ", ".join(self.methods)))
        return resp

    def _next(self, http: h11.Connection) -> object:
        """h11's next event; a framing error it finds is the answer (its status hint: 400; 431 past
        ``max_header_bytes`` of a head, chunk header or trailer still incomplete; 501)."""
        try:
            return http.next_event()
        except h11.RemoteProtocolError as e:
            if e.error_status_hint == 431:
                raise _BadRequest(431, f"request head larger than {self.limits.max_header_bytes} bytes") from None
            raise _BadRequest(e.error_status_hint, f"malformed request: {e}") from None

    async def _read_head(self, http: h11.Connection, first: bytes, reader: asyncio.StreamReader) -> tuple[h11.Request, bytes]:
        """The request line and headers (h11's ``Request``) and the raw bytes they took, within
        ``header_timeout`` of the first byte and ``max_header_bytes`` (h11 stops buffering past it)."""
        lim = self.limits
        deadline = time.monotonic() + lim.header_timeout
        raw = bytearray(first)
        http.receive_data(first)
        while (event := self._next(http)) is h11.NEED_DATA:
            data = await asyncio.wait_for(reader.read(READ_SIZE), deadline - time.monotonic())
            if not data:
                raise ConnectionResetError
            raw += data
            http.receive_data(data)
        if not isinstance(event, h11.Request):   # ConnectionClosed
            raise ConnectionResetError
        size = len(raw) - len(http.trailing_data[0])
        if size > lim.max_header_bytes:   # a head that arrived whole in one read
            raise _BadRequest(431, f"request head larger than {lim.max_header_bytes} bytes")
        return event, bytes(raw[:size])

    async def _read_request(self, http: h11.Connection, first: bytes, reader: asyncio.StreamReader,
                            writer: asyncio.StreamWriter, peer: tuple[str, int] | None) -> Request:
        lim = self.limits
        event, head = await self._read_head(http, first, reader)
        try:
            method, target = event.method.decode("ascii"), event.target.decode("ascii")
        except UnicodeDecodeError:
            raise _BadRequest(400, "malformed request line") from None
        version = "HTTP/" + event.http_version.decode("ascii")
        if version not in ("HTTP/1.1", "HTTP/1.0"):
            raise _BadRequest(505, "only HTTP/1.0 and HTTP/1.1 are served")
        if not target.startswith("/") or not method.isalpha():
            raise _BadRequest(400, "malformed request line")
        if len(event.headers) > lim.max_headers:
            raise _BadRequest(431, f"more than {lim.max_headers} header lines")
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in event.headers]
        req = Request(method, target, version, headers, b"", peer)
        if self.methods is not None and method not in self.methods:
            raise _BadRequest(405, f"method {method} is not served here (only {', '.join(self.methods)})")
        self._check_framing(req, head)
        if http.they_are_waiting_for_100_continue and not _no_body(req):
            writer.write(http.send(h11.InformationalResponse(status_code=100, headers=[])))
            await writer.drain()
        req.body = await self._read_body(http, reader)
        return req

    def _check_framing(self, req: Request, head: bytes) -> None:
        """What h11 lets through and this server refuses: a body with both framings, none on a POST,
        one larger than ``max_body``; a repeated ``Content-Length`` (h11 folds equal ones into one,
        RFC 9110 allows either; refused here, as a smuggling defence: so the raw head is looked at)."""
        lim = self.limits
        chunked = bool(req.header_all("transfer-encoding"))   # h11 passes only ``chunked``, once (else 501)
        lengths = _CONTENT_LENGTH.findall(head)
        if chunked and lengths:
            raise _BadRequest(400, "both Content-Length and Transfer-Encoding: refused")
        if len(lengths) > 1 or (lengths and b"," in lengths[0]):
            raise _BadRequest(400, "more than one Content-Length")
        if chunked:
            if lim.max_body <= 0:
                raise _BadRequest(413, "this endpoint takes no request body")
            return
        if not lengths:
            if req.method in BODY_METHODS:
                raise _BadRequest(411, "Content-Length (or Transfer-Encoding: chunked) is required")
            return
        length = int(req.header("content-length") or 0)   # digits only: h11 checked
        if length > lim.max_body:
            raise _BadRequest(413, f"body too large ({length} bytes > {lim.max_body})"
                              if lim.max_body > 0 else "this endpoint takes no request body")

    async def _read_body(self, http: h11.Connection, reader: asyncio.StreamReader) -> bytes:
        """The body as h11 deframes it (Content-Length or chunked, trailers dropped), counted against
        ``max_body`` as it arrives; bounded in time by the request deadline around it."""
        lim = self.limits
        body = bytearray()
        while not isinstance(event := self._next(http), h11.EndOfMessage):
            if event is h11.NEED_DATA:
                data = await reader.read(READ_SIZE)
                if not data:
                    raise ConnectionResetError
                http.receive_data(data)
            elif isinstance(event, h11.Data):
                body += event.data
                if len(body) > lim.max_body:
                    raise _BadRequest(413, f"body too large (more than {lim.max_body} bytes)")
        return bytes(body)

    async def _write(self, writer: asyncio.StreamWriter, resp: Response, head: bool = False) -> bool:
        """Send ``resp`` (its head only with ``head``, the answer to a HEAD) within ``write_timeout``."""
        try:
            writer.write(_render(resp, head=head or resp.head))
            await asyncio.wait_for(writer.drain(), self.limits.write_timeout)
            return True
        except (TimeoutError, ConnectionError, OSError):
            self.timed_out += 1
            return False
        except ValueError as e:   # a handler's header that would split the head (a newline in a value)
            log.error("%s: answer %d not sent: %s", self.name, resp.status, e)
            return False


def _no_body(req: Request) -> bool:
    return not req.header_all("transfer-encoding") and (req.header("content-length") or "0") == "0"


def _render(resp: Response, *, head: bool = False) -> bytes:
    """A response's bytes: status line, headers, body (none with ``head``).  ``ValueError`` for a
    header name that is not a token or a value with a control character (CR, LF, NUL...): a
    handler's header never becomes two."""
    headers = [("Content-Type", resp.content_type), ("Content-Length", str(len(resp.body))), *resp.headers]
    for name, value in headers:
        if not _TOKEN.fullmatch(name) or _CONTROL.search(value):
            raise ValueError(f"header {name[:40]!r}: {value[:80]!r} cannot be sent")
    lines = [f"HTTP/1.1 {resp.status} {REASONS.get(resp.status, 'Unknown')}",
             *(f"{name}: {value}" for name, value in headers)]
    if resp.close:
        lines.append("Connection: close")
    out = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return out if head else out + resp.body
