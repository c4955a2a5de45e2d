"""The Prometheus exporter: the last tick's samples, rendered with catalogue HELP/TYPE lines.

Only ``triscope_*`` metrics are exported (scraped application metrics stay with the
application).  The process's own CPU and memory are ``triscope_process_*`` (the names of
prometheus_client's ProcessCollector, read from one ``/proc/self/stat``).

The HTTP side is the shared server (``triscope.web.httpd``): one thread with an event loop for every
connection, so no client can hold it (a whole-request deadline, bounded connections, small
header limits); it sleeps in ``epoll`` between scrapes.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import defaultdict
from collections.abc import Awaitable, Iterator, Sequence
from typing import TYPE_CHECKING

from triscope.agent.collectors.base import OpenFiles
from triscope.core.labels import escape_value
from triscope.core.metrics import CATALOGUE, kind_of
from triscope.core.samples import Sample
from triscope.web.auth import RELOAD_EVERY, UNAUTHORIZED_HEADERS, CheckQueue, WebConfig
from triscope.web.httpd import HttpServer, Limits, Request, Response, source_key

if TYPE_CHECKING:
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

log = logging.getLogger(__name__)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
"""What ``render_text`` writes: the text exposition format 0.0.4, said as such (prometheus_client's
``CONTENT_TYPE_LATEST`` names whichever version the installed library writes; this body is ours)."""


class TickCollector:
    """The last tick's ``triscope_*`` samples; ``version`` moves every tick (the render cache key)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._samples: list[Sample] = []
        self.version = 0

    def update(self, samples: Sequence[Sample]) -> None:
        keep = [s for s in samples if s.name.startswith("triscope_")]
        with self._lock:
            self._samples = keep
            self.version += 1

    def samples(self) -> list[Sample]:
        with self._lock:
            return list(self._samples)


def _fmt(v: float) -> str:
    if v != v:
        return "NaN"
    if v in (float("inf"), float("-inf")):
        return "+Inf" if v > 0 else "-Inf"
    return repr(float(v))


def render_text(samples: Sequence[Sample]) -> bytes:
    """The text exposition format (0.0.4) for a tick's samples, without building metric objects.

    About ten times cheaper than going through prometheus_client's registry per scrape, which
    matters for an agent that must stay under half a percent of a core.
    """
    by_name: dict[str, list[Sample]] = defaultdict(list)
    for s in samples:
        by_name[s.name].append(s)
    out: list[str] = []
    for name in sorted(by_name):
        spec = CATALOGUE.get(name)
        kind = spec.kind if spec else kind_of(name)
        if kind == "counter" and not name.endswith("_total"):
            kind = "gauge"
        help_text = (spec.help if spec else f"{name} (triscope)").replace("\\", "\\\\").replace("\n", "\\n")
        out.append(f"# HELP {name} {help_text}\n# TYPE {name} {kind}\n")
        seen: set[tuple[tuple[str, str], ...]] = set()
        for smp in by_name[name]:
            key = tuple(sorted((str(k), str(v)) for k, v in smp.labels.items()))
            if key in seen:
                continue
            seen.add(key)
            if key:
                lab = ",".join(f'{k}="{escape_value(v)}"' for k, v in key)
                out.append(f"{name}{{{lab}}} {_fmt(smp.value)}\n")
            else:
                out.append(f"{name} {_fmt(smp.value)}\n")
    return "".join(out).encode()


class ProcessMetrics:
    """CPU seconds, resident and virtual memory and start time of this process, from one read of
    ``/proc/self/stat`` (prometheus_client's ProcessCollector also reads limits and lists every
    open file descriptor on each scrape)."""

    def __init__(self, proc: str = "/proc") -> None:
        self.path = os.path.join(proc, "self", "stat")
        self._files = OpenFiles(limit=1)
        self.ticks = os.sysconf("SC_CLK_TCK")
        self.page = os.sysconf("SC_PAGE_SIZE")
        with open(os.path.join(proc, "stat"), "rb") as f:
            btime = next(float(line.split()[1]) for line in f if line.startswith(b"btime"))
        with open(self.path, "rb") as f:
            self.start = btime + float(f.read().rsplit(b")", 1)[1].split()[19]) / self.ticks

    def read(self) -> tuple[float, float, float]:
        """(CPU seconds, virtual bytes, resident bytes) now."""
        fields = self._files.read_bytes(self.path).rsplit(b")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / self.ticks, float(fields[20]), float(int(fields[21]) * self.page)

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        """For a prometheus_client registry (the reference ``render()`` is tested against).  The
        library is imported here only: the agent itself never loads it for /metrics (3.3 MB of
        resident memory, measured in the agent's process)."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        cpu, vms, rss = self.read()
        yield CounterMetricFamily("triscope_process_cpu_seconds", _PROCESS_HELP["cpu"], value=cpu)
        yield GaugeMetricFamily("triscope_process_virtual_memory_bytes", _PROCESS_HELP["vms"], value=vms)
        yield GaugeMetricFamily("triscope_process_resident_memory_bytes", _PROCESS_HELP["rss"], value=rss)
        yield GaugeMetricFamily("triscope_process_start_time_seconds", _PROCESS_HELP["start"], value=self.start)

    def render(self) -> bytes:
        """What prometheus_client's ``generate_latest`` renders for ``collect()`` (the same families,
        types, help and values; large values in Python's float notation), without building metric
        families: this runs once per tick in the agent."""
        cpu, vms, rss = self.read()
        return (f"# HELP triscope_process_cpu_seconds_total {_PROCESS_HELP['cpu']}\n"
                f"# TYPE triscope_process_cpu_seconds_total counter\n"
                f"triscope_process_cpu_seconds_total {_fmt(cpu)}\n"
                f"# HELP triscope_process_virtual_memory_bytes {_PROCESS_HELP['vms']}\n"
                f"# TYPE triscope_process_virtual_memory_bytes gauge\n"
                f"triscope_process_virtual_memory_bytes {_fmt(vms)}\n"
                f"# HELP triscope_process_resident_memory_bytes {_PROCESS_HELP['rss']}\n"
                f"# TYPE triscope_process_resident_memory_bytes gauge\n"
                f"triscope_process_resident_memory_bytes {_fmt(rss)}\n"
                f"# HELP triscope_process_start_time_seconds {_PROCESS_HELP['start']}\n"
                f"# TYPE triscope_process_start_time_seconds gauge\n"
                f"triscope_process_start_time_seconds {_fmt(self.start)}\n").encode()


_PROCESS_HELP = {"cpu": "Total user and system CPU time spent in seconds.", "vms": "Virtual memory size in bytes.",
                 "rss": "Resident memory size in bytes.",
                 "start": "Start time of the process since unix epoch in seconds."}


def make_sources() -> tuple[ProcessMetrics, TickCollector]:
    """The process's own metrics and the holder of the last tick's samples: what /metrics renders."""
    return ProcessMetrics(), TickCollector()


class MetricsServer:
    """/metrics over HTTP/1.1 on the shared server (``triscope.web.httpd``): concurrent connections,
    each request under a whole-request deadline, connections bounded, small header limits, no body.

    The body is rendered once per tick at most and kept for ``max_age`` seconds.  Scraped about
    as often as the agent ticks, the agent renders it right after the tick, in the sampler's own
    wake-up (``prerender``), and a scrape only sends bytes; scraped less often (Prometheus every
    15 s), the first scrape after a tick renders it: one render per scrape, not one per tick.

    ``web`` (``--web.config.file``, ``triscope.web.config``): TLS on the same listener (a plain HTTP
    request to it fails the handshake and gets nothing) and basic auth on every path (``401`` with
    ``WWW-Authenticate: Basic``).  Credentials already verified (cached) are answered on the loop
    from one cache lookup (``WebConfig.lookup``, whose answer the handler then uses); only a bcrypt
    check (the first scrape with a password, a new wrong one) waits its turn in ``checks``
    (``triscope.web.auth.CheckQueue``: ranked by source, bounded, under a CPU budget, run on a
    thread of its own), so it never stalls the loop nor a scrape whose password is known, and a
    spray of wrong passwords from many addresses cannot keep a scraper's first check out.  A
    check refused there is answered ``429`` with ``Retry-After: 1`` and its connection closed.
    The queue exists whenever a web config is given, so users added by a reload are checked off the
    loop too.
    """

    def __init__(self, addr: tuple[str, int], process: ProcessMetrics | None, tick: TickCollector | None,
                 max_age: float = 1.0, limits: Limits | None = None, web: WebConfig | None = None) -> None:
        self.process = process
        self.tick = tick
        self.max_age = max_age
        self._cache: tuple[int, float, bytes] | None = None
        self._lock = threading.Lock()
        self._last_scrape: float | None = None
        self.scrape_gap: float | None = None   # seconds between the last two scrapes
        self.web = web
        self.checks = CheckQueue(web.authorized) if web is not None else None
        self.turned_away = 0     # requests answered 429: no room for their password check
        self.http = HttpServer(addr, self._handle, limits=limits or EXPORTER_LIMITS, name="metrics-http",
                               methods=("GET", "HEAD"),
                               ssl_context=web.ssl_context if web is not None else None,
                               every=(RELOAD_EVERY, web.refresh) if web is not None else None,
                               defer=self._defer if web is not None else None,
                               screen=self.checks.screen if self.checks is not None else None)
        self.server_address = self.http.server_address

    def render(self) -> bytes:
        """Rendered once per tick (and at most once per ``max_age`` without ticks): scrapes are cheap."""
        version = self.tick.version if self.tick is not None else 0
        now = time.monotonic()
        with self._lock:
            if self._cache is not None and self._cache[0] == version and now - self._cache[1] < self.max_age:
                return self._cache[2]
            samples = self.tick.samples() if self.tick is not None else []
            body = render_text(samples) + (self.process.render() if self.process is not None else b"")
            self._cache = (version, now, body)
            return body

    def prerender(self, interval: float) -> bool:
        """Render now if scrapes come about once per ``interval`` or more often (and still do)."""
        if self.scrape_gap is None or self.scrape_gap > 1.5 * interval or self._last_scrape is None:
            return False
        if time.monotonic() - self._last_scrape > 1.5 * interval:
            return False
        self.render()
        return True

    def _handle(self, req: Request) -> Response:
        resp = self._answer(req)
        resp.head = req.method == "HEAD"   # a HEAD gets the head of any answer (401, 404) and no body
        if self.web is not None:
            resp.headers.extend(self.web.headers)
        return resp

    def _defer(self, req: Request) -> Awaitable[Response] | None:
        """On the loop: the credentials' answer if cached (kept on the request; answered at once),
        else the password check's turn in the queue, awaited."""
        assert self.web is not None
        req.verdict = self.web.lookup(req.header("authorization"))
        return None if req.verdict is not None else self._checked(req)

    async def _checked(self, req: Request) -> Response:
        assert self.checks is not None
        source = source_key(req.peer[0]) if req.peer else "?"
        answer = await self.checks.submit(source, req.header("authorization"))
        if isinstance(answer, str):
            self.turned_away += 1
            return Response.text(429, f"too many password checks: {answer}; retry in a second",
                                 headers=[("Retry-After", "1"), *(self.web.headers if self.web else [])], close=True)
        req.verdict = answer
        return self._handle(req)

    def _answer(self, req: Request) -> Response:
        ok = req.verdict
        if ok is None and self.web is not None:
            ok = self.web.authorized(req.header("authorization"))
        if ok is False:
            return Response.text(401, "Unauthorized", headers=list(UNAUTHORIZED_HEADERS))
        if req.method not in ("GET", "HEAD"):
            return Response.text(405, "only GET /metrics is served here", headers=[("Allow", "GET, HEAD")])
        if req.path not in ("/metrics", "/"):
            return Response.text(404, "only /metrics is served here")
        if req.method == "GET":   # a HEAD or a health check does not count as a scraper
            now = time.monotonic()
            if self._last_scrape is not None:
                self.scrape_gap = now - self._last_scrape
            self._last_scrape = now
        return Response(200, self.render(), CONTENT_TYPE, head=req.method == "HEAD")

    def serve_forever(self) -> None:
        """Serve until ``shutdown()`` (the server runs on its own thread; this waits for it)."""
        self.http.start()
        thread = self.http._thread
        if thread is not None:
            thread.join()

    def shutdown(self) -> None:
        """Stop serving and close the socket."""
        if self.checks is not None:
            self.checks.close()
        self.http.shutdown()


# Prometheus scrapes with keep-alive every 15-60 s: an idle connection is closed after 20 s; a
# request (no body) must arrive whole within 5 s of its first byte.
EXPORTER_LIMITS = Limits(max_connections=128, idle_timeout=20.0, header_timeout=5.0, request_timeout=5.0,
                         write_timeout=10.0, max_header_bytes=8192, max_headers=64, max_body=0)


def serve(process: ProcessMetrics | None, host: str, port: int, tick: TickCollector | None = None,
          max_age: float = 1.0, web: WebConfig | None = None) -> tuple[MetricsServer, threading.Thread]:
    """Start the /metrics HTTP server on its own thread; returns (server, thread)."""
    server = MetricsServer((host, port), process, tick, max_age, web=web)
    server.http.start()
    thread = server.http._thread
    assert thread is not None
    return server, thread
