"""Application metrics: read a service's Prometheus text endpoint (an inference server's SLIs).

The body is parsed as prometheus-client's own parser parses it
(``prometheus_client.parser.text_string_to_metric_families``, imported at the first scrape), each
series' text once per target (``promtext``: a line seen before costs its value only); a body equal
to the last one is not parsed at all, and a target that sends an ``ETag`` is asked with
``If-None-Match`` (its ``304`` reuses what the last body gave).  Every sample keeps its own name
and labels, plus ``job`` and ``instance`` (``host:port``); a ``job``/``instance`` label the
service set itself is kept as ``exported_job``/``exported_instance`` (Prometheus'
``honor_labels: false``).  Kinds: counter samples, histogram/summary ``_bucket``/``_count``/``_sum``
are counters; gauges, summary quantiles, info and untyped samples are gauges (untyped names
ending in ``_total`` are counters); ``_created`` timestamps are dropped, and so are NaN/Inf values
(an empty summary's quantiles), which no store or JSON can carry.

Bounded: one GET with an overall deadline (``timeout``: connect, head and body together, not per
``recv``), a response head of at most 64 KiB, at most ``max_bytes`` of body and ``max_samples``
samples (a larger scrape fails as a whole, like Prometheus' ``sample_limit``); with the agent's
sample budget (``ledger``), the series the target held keep flowing and new ones beyond its budget
are left out (a histogram or summary with its buckets, count and sum counts as one: never half).  The HTTP/1.1
framing (status line, headers, Content-Length, chunked or read-to-close bodies) is h11's: it is
fed from this module's socket loop, so every wait stays bounded by the one deadline.  In the agent each target runs on its own worker
(``triscope.agent.collectors.background``), so even that deadline never delays a tick.
"""

from __future__ import annotations

import contextlib
import math
import select
import socket
import ssl
import time
from collections.abc import Iterable, Iterator
from typing import Literal, Protocol
from urllib.parse import SplitResult, quote, urlsplit

import h11

from triscope.agent.collectors import promtext
from triscope.agent.collectors.base import Availability, BaseCollector, CollectorUnavailable
from triscope.core.samples import Sample
from triscope.core.textsafe import label_text

ACCEPT = "text/plain;version=0.0.4;q=1.0,*/*;q=0.1"
URL_SAFE = "/?=&%:@!$'()*+,;-._~"   # what a request target keeps as it is (RFC 3986 reserved and unreserved)
TIMESTAMPED = promtext.TIMESTAMPED


class Ledger(Protocol):
    """What a target holds of the agent's sample budget (``triscope.agent.budget.ScrapeLedger``):
    given this scrape's series groups in order, the samples it may keep."""

    def admit(self, groups: Iterable[tuple[object, list[Sample]]]) -> list[Sample]: ...

    def close(self) -> None: ...


def _text_cache(job: str, instance: str) -> promtext.TextCache | Literal[False]:
    """A target's line cache, or False where this prometheus-client lacks the parts it walks with."""
    try:
        return promtext.TextCache(job, instance, label_text)
    except ImportError:
        return False


class ScrapeError(CollectorUnavailable):
    """The endpoint could not be read or parsed; ``reason`` says which and why."""


def parse_scrape_url(url: str) -> tuple[str, str]:
    """Return (normalised url, instance ``host:port``) or raise ValueError with a clear message."""

    if not isinstance(url, str) or not url.strip():
        raise ValueError("invalid scrape URL '': expected http://host:port/path")
    url = url.strip()
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as e:
        raise ValueError(f"invalid scrape URL {url!r}: {e}") from None
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"invalid scrape URL {url!r}: scheme must be http or https, e.g. http://127.0.0.1:8000/metrics")
    if not parts.hostname:
        raise ValueError(f"invalid scrape URL {url!r}: no host, e.g. http://127.0.0.1:8000/metrics")
    if any(c.isspace() for c in url):
        raise ValueError(f"invalid scrape URL {url!r}: contains whitespace")
    if port is None:
        port = 443 if parts.scheme == "https" else 80
    host = parts.hostname
    instance = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    if not parts.path:
        url = url + "/metrics"
    return url, instance


class ScrapeCollector(BaseCollector):
    """``ScrapeCollector("http://127.0.0.1:8000/metrics", job="vllm")``; ``name`` is ``scrape:<instance>``."""

    def __init__(self, url: str, timeout: float = 2.0, job: str | None = None, max_bytes: int = 16 << 20,
                 max_samples: int = 50_000, ledger: Ledger | None = None) -> None:
        self.url, self.instance = parse_scrape_url(url)
        if not timeout or timeout <= 0:
            raise ValueError(f"scrape timeout must be > 0 seconds, got {timeout!r}")
        self.timeout = float(timeout)
        self.job = job or "scrape"
        self.max_bytes = max_bytes
        self.max_samples = max_samples
        self.ledger = ledger      # the agent's budget: new series beyond it are left out (existing ones kept)
        self.name = f"scrape:{self.instance}"
        self.last_duration = 0.0
        self.last_bytes = 0
        self.last_path = ""       # how the last body was read: "unchanged", "cached" (lines seen before) or "parsed"
        self._text: promtext.TextCache | Literal[False] | None = None   # this target's lines (False: not available)
        self._last: tuple[str, list[Sample], dict | None] | None = None   # the last body and what it gave
        self._etag: str | None = None       # the target's ETag for that body: asked with If-None-Match
        self._spans_of: list | None = None   # the keys whose groups ``_spans`` holds
        self._spans: list[tuple[promtext.GroupKey, int, int]] | None = None

    # -- fetching ------------------------------------------------------------------------------

    def fetch(self) -> str:
        """GET the body or raise ``ScrapeError`` saying why.

        ``timeout`` bounds the whole fetch — connect, TLS, head and body — not each ``recv``: a
        target that sends one byte every half second fails at the deadline like one that never
        answers.  Redirects are not followed (the error names where it points)."""

        deadline = time.monotonic() + self.timeout
        parts = urlsplit(self.url)
        sock = self._connect(parts, deadline)
        try:
            status, reason, headers, body = self._exchange(sock, parts, deadline)
        finally:
            with contextlib.suppress(OSError):
                sock.close()
        if status == 304 and self._last is not None and self._etag is not None:
            self.last_bytes = 0       # "304 Not Modified" to our If-None-Match: the body we have is current
            return self._last[0]
        if 300 <= status < 400:
            where = headers.get("location", "")
            raise ScrapeError(f"scrape {self.url}: HTTP {status} redirect to {where[:200]!r}, not followed",
                              "point --scrape at the final URL")
        if status != 200:
            raise ScrapeError(f"scrape {self.url}: HTTP {status} {reason[:100]}", "check the URL's path")
        encoding = headers.get("content-encoding", "identity").lower()
        if encoding not in ("identity", ""):
            raise ScrapeError(f"scrape {self.url}: body sent with Content-Encoding {encoding[:40]!r}, "
                              "identity was asked for", "")
        self.last_bytes = len(body)
        self._etag = headers.get("etag") or None
        return _decode(body, headers.get("content-type", ""))

    def _connect(self, parts: SplitResult, deadline: float) -> socket.socket:
        host = parts.hostname or ""
        port = parts.port or (443 if parts.scheme == "https" else 80)
        try:
            return _connect(host, port, deadline)
        except TimeoutError:
            raise ScrapeError(f"scrape {self.url}: timed out after {self.timeout:g} s connecting",
                              "the endpoint is too slow or unreachable") from None
        except ConnectionRefusedError:
            raise ScrapeError(f"scrape {self.url}: connection refused (is the service running?)",
                              "start the service or fix --scrape URL") from None
        except socket.gaierror as e:
            raise ScrapeError(f"scrape {self.url}: cannot resolve host ({e.strerror})",
                              "start the service or fix --scrape URL") from None
        except OSError as e:
            raise ScrapeError(f"scrape {self.url}: {e.strerror or e}", "start the service or fix --scrape URL") from None

    def _exchange(self, sock: socket.socket, parts: SplitResult,
                  deadline: float) -> tuple[int, str, dict[str, str], bytes]:
        """TLS where asked, the request out, the response in: every wait bounded by ``deadline``."""
        host = parts.hostname or ""
        # a non-ASCII path or query goes out percent-encoded (as UTF-8), a non-ASCII host as IDNA
        target = quote((parts.path or "/metrics") + (f"?{parts.query}" if parts.query else ""), safe=URL_SAFE)
        try:
            host_header = self.instance if parts.port else (f"[{host}]" if ":" in host else host)
            host_header = host_header if host_header.isascii() else host_header.encode("idna").decode("ascii")
            request = h11.Request(method="GET", target=target,
                                  headers=[("Host", host_header), ("Accept", ACCEPT), ("Accept-Encoding", "identity"),
                                           ("User-Agent", "triscope-agent"),
                                           ("X-Prometheus-Scrape-Timeout-Seconds", f"{self.timeout:g}"),
                                           *self._conditional(),
                                           ("Connection", "close")])
        except (UnicodeError, h11.LocalProtocolError) as e:
            raise ScrapeError(f"scrape {self.url}: cannot send a request to this URL ({e})",
                              "fix --scrape URL") from None
        try:
            if parts.scheme == "https":
                sock = _tls(sock, host, deadline)
            return _get(sock, request, deadline, self.max_bytes)
        except _Deadline as e:
            raise ScrapeError(f"scrape {self.url}: timed out after {self.timeout:g} s {e}",
                              "the endpoint is too slow; raise the timeout") from None
        except _TooLarge:
            raise ScrapeError(f"scrape {self.url}: body larger than {self.max_bytes} bytes",
                              "raise max_bytes or reduce the endpoint's cardinality") from None
        except _Malformed as e:
            raise ScrapeError(f"scrape {self.url}: malformed HTTP response: {e}",
                              "the endpoint must speak HTTP/1.x") from None
        except (OSError, ssl.SSLError) as e:  # reset mid-body, TLS failure, ...
            raise ScrapeError(f"scrape {self.url}: {getattr(e, 'strerror', None) or e}", "") from None

    def _conditional(self) -> list[tuple[str, str]]:
        """``If-None-Match`` with the ETag of the body we hold (a target that sends ETags answers
        ``304`` when its exposition did not change: nothing to send, nothing to read)."""
        etag = self._etag
        if etag is None or self._last is None or not etag.isascii() or not etag.isprintable():
            return []
        return [("If-None-Match", etag)]

    def parse(self, body: str) -> list[Sample]:
        """Prometheus text -> samples with ``job``/``instance``; raises ``ScrapeError`` on a malformed body.

        A body equal to the last one gives the same samples without being read again; otherwise each
        line seen at an earlier scrape costs only its value (``promtext.TextCache``), and whatever
        that cannot answer -- an error above all -- is parsed whole by prometheus-client (``_slow``):
        the samples and the errors are the parser's either way."""

        if self._last is not None and body == self._last[0]:
            self.last_path = "unchanged"
            out, groups = self._last[1], self._last[2]
        else:
            self._last = None
            got = None
            if self._text is None:
                self._text = _text_cache(self.job, self.instance)
            if self._text:
                try:
                    got = self._text.walk(body)
                    self.last_path = "cached"
                except Exception:  # noqa: BLE001 - anything the walk cannot answer: the parser answers it
                    got = None
            if got is None:
                got = self._slow(body)
                self.last_path = "parsed"
            out, keys, n = got
            if n > self.max_samples:
                raise ScrapeError(f"scrape {self.url}: more than {self.max_samples} samples",
                                  "raise max_samples or reduce the endpoint's cardinality")
            groups = None
            if self.ledger is not None:    # with a budget: a histogram/summary with its parts is one group
                groups = self._groups(out, keys)
            self._last = (body, out, groups)
        if self.ledger is None:
            return list(out)
        if groups is None:    # the ledger came after the last parse
            self._last = None
            return self.parse(body)
        return self.ledger.admit(groups.items())

    def _groups(self, out: list[Sample], keys: list[promtext.GroupKey]) -> dict[promtext.GroupKey, list[Sample]]:
        """The budget's groups of ``out``: each key's samples, in order.  Where every group's samples
        stand together (an exposition as clients write it) and the keys are the last scrape's (the
        same list: the body had the last one's skeleton), each group is a slice of ``out`` at the
        places found then."""
        if keys is not self._spans_of:
            self._spans_of, self._spans = keys, _spans(keys)
        spans = self._spans
        if spans is not None:
            return {k: out[a:b] for k, a, b in spans}
        groups: dict[promtext.GroupKey, list[Sample]] = {}
        for sample, gkey in zip(out, keys, strict=True):
            group = groups.get(gkey)
            if group is None:
                groups[gkey] = [sample]
            else:
                group.append(sample)
        return groups

    def _slow(self, body: str) -> tuple[list[Sample], list[promtext.GroupKey], int]:
        """The whole body through prometheus-client's parser: ``TextCache.walk``'s answer, or its error."""
        # imported at the first scrape, not with the agent: prometheus_client is 3.3 MB of resident
        # memory, which an agent with no --scrape target never needs
        from prometheus_client.parser import text_string_to_metric_families

        try:
            families = list(text_string_to_metric_families(body))
        except Exception as e:  # noqa: BLE001 - the parser raises ValueError, IndexError, KeyError, ... on bad input
            raise ScrapeError(f"scrape {self.url}: malformed Prometheus text: {e}",
                              "the endpoint must serve the Prometheus text format (0.0.4)") from None
        timestamped = {f.name for f in families if f.type in TIMESTAMPED}
        out: list[Sample] = []
        keys: list[promtext.GroupKey] = []
        n = 0
        for fam in families:
            if fam.name.endswith("_created") and fam.name[: -len("_created")] in timestamped:
                continue
            for s in fam.samples:
                n += 1
                if n > self.max_samples:
                    raise ScrapeError(f"scrape {self.url}: more than {self.max_samples} samples",
                                      "raise max_samples or reduce the endpoint's cardinality")
                name, labels, kind, gkey, skip = promtext.entry(fam.name, fam.type, s.name, s.labels, self.job,
                                                                self.instance, label_text)
                if skip:        # a _created timestamp is no series
                    continue
                try:
                    value = float(s.value)
                except OverflowError:   # an integer past a float's range (the parser keeps it an int)
                    raise ScrapeError(f"scrape {self.url}: malformed Prometheus text: the value of {s.name} is out "
                                      "of a float's range", "the endpoint must serve the Prometheus text format "
                                      "(0.0.4)") from None
                if not math.isfinite(value):    # NaN/Inf (an empty summary's quantiles): no store can carry them
                    continue
                out.append(Sample(name, value, labels, kind))  # type: ignore[arg-type]
                keys.append(gkey)
        return out, keys, n

    # -- protocol ------------------------------------------------------------------------------

    # the agent does not read the target before its first tick (that read would hold up the start
    # by up to ``timeout`` per target); ``triscope doctor`` still calls check()
    check_at_start = False

    def check(self) -> Availability:
        try:
            self.parse(self.fetch())
        except ScrapeError as e:
            return Availability(False, e.reason, e.hint, transient=True)
        return Availability(True)

    def close(self) -> None:
        if self.ledger is not None:
            self.ledger.close()

    def collect(self, now: float) -> Iterator[Sample]:
        t0 = time.monotonic()
        samples = self.parse(self.fetch())
        self.last_duration = time.monotonic() - t0
        yield from samples


def _spans(keys: list[promtext.GroupKey]) -> list[tuple[promtext.GroupKey, int, int]] | None:
    """(key, start, end) of each group when each key's samples stand together in ``keys``; else None."""
    spans: list[tuple[promtext.GroupKey, int, int]] = []
    seen: set[promtext.GroupKey] = set()
    start = 0
    for i in range(1, len(keys) + 1):
        if i == len(keys) or keys[i] != keys[start]:
            if keys[start] in seen:
                return None
            seen.add(keys[start])
            spans.append((keys[start], start, i))
            start = i
    return spans


# an HTTP/1.1 client (h11 for the protocol) whose every wait is bounded by one deadline ----------------
MAX_HEAD = 64 << 10


class _Deadline(Exception):
    pass


class _TooLarge(Exception):
    pass


class _Malformed(Exception):
    pass


def _left(deadline: float, what: str) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise _Deadline(what)
    return left


def _connect(host: str, port: int, deadline: float) -> socket.socket:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError
    sock = socket.create_connection((host, port), timeout=left)
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _tls(sock: socket.socket, host: str, deadline: float) -> ssl.SSLSocket:
    ctx = ssl.create_default_context()
    tls = ctx.wrap_socket(sock, server_hostname=host, do_handshake_on_connect=False)
    tls.setblocking(False)
    try:
        while True:
            try:
                tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                select.select([tls], [], [], _left(deadline, "in the TLS handshake"))
            except ssl.SSLWantWriteError:
                select.select([], [tls], [], _left(deadline, "in the TLS handshake"))
    finally:
        tls.setblocking(True)
    return tls


def _send_all(sock: socket.socket, data: bytes, deadline: float) -> None:
    view = memoryview(data)
    while view:
        sock.settimeout(_left(deadline, "sending the request"))
        try:
            n = sock.send(view)
        except TimeoutError:
            raise _Deadline("sending the request") from None
        view = view[n:]


def _recv(sock: socket.socket, deadline: float, what: str) -> bytes:
    sock.settimeout(_left(deadline, what))
    try:
        return sock.recv(65536)
    except TimeoutError:
        raise _Deadline(what) from None


def _get(sock: socket.socket, request: h11.Request, deadline: float,
         max_bytes: int) -> tuple[int, str, dict[str, str], bytes]:
    """Send ``request`` and read the response through h11: (status, reason, headers with lower-case
    names, repeated ones joined with ``,``, body).  Every recv waits at most until ``deadline``; the
    head is bounded by ``MAX_HEAD``, the body by ``max_bytes`` (a larger Content-Length fails at once)."""
    http = h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_HEAD)
    _send_all(sock, (http.send(request) or b"") + (http.send(h11.EndOfMessage()) or b""), deadline)
    response: h11.Response | None = None
    body = bytearray()
    received = 0     # bytes in before the head was complete
    while True:
        event = _next_event(http)
        if event is h11.NEED_DATA:
            chunk = _recv(sock, deadline, "reading the body" if response else "waiting for the response head")
            if response is None:
                if not chunk:
                    raise _Malformed("connection closed before the response head")
                received += len(chunk)
            http.receive_data(chunk)    # b"": the end, which ends a body framed by the connection's close
        elif isinstance(event, h11.Response):
            response = event
            _check_head(event, received - len(http.trailing_data[0]), max_bytes)
        elif isinstance(event, h11.Data):
            body += event.data
            if len(body) > max_bytes:
                raise _TooLarge
        elif isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
            break
        # an InformationalResponse (1xx) is skipped: the final answer follows
    assert response is not None
    headers: dict[str, str] = {}
    for k, v in response.headers:
        key, value = k.decode("latin-1"), v.decode("latin-1")
        headers[key] = f"{headers[key]},{value}" if key in headers else value
    return response.status_code, response.reason.decode("latin-1").strip(), headers, bytes(body)


def _next_event(http: h11.Connection) -> object:
    try:
        return http.next_event()
    except h11.RemoteProtocolError as e:
        if e.error_status_hint == 431:   # h11 buffered MAX_HEAD bytes of an unfinished head or chunk header
            raise _Malformed(f"response head larger than {MAX_HEAD} bytes") from None
        # h11 words its early check of the first line for either side as a "request line"
        raise _Malformed(str(e).replace("request line", "status line")[:200]) from None


def _check_head(response: h11.Response, size: int, max_bytes: int) -> None:
    """A head over ``MAX_HEAD`` (h11 bounds what it buffers of an unfinished one; this, one that came
    whole in a read) or a Content-Length over ``max_bytes`` fails before the body is read."""
    if size > MAX_HEAD:
        raise _Malformed(f"response head larger than {MAX_HEAD} bytes")
    for k, v in response.headers:
        if k == b"content-length" and int(v) > max_bytes:    # digits, one value: h11 checked
            raise _TooLarge


def _decode(body: bytes, content_type: str) -> str:
    """The body as text, in the charset its Content-Type names (UTF-8 when none or unknown)."""
    charset = "utf-8"
    for param in content_type.split(";")[1:]:
        k, _, v = param.strip().partition("=")
        if k.lower() == "charset" and v:
            charset = v.strip('"')
    try:
        return body.decode(charset, errors="replace")
    except LookupError:
        return body.decode("utf-8", errors="replace")
