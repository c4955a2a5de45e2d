"""Application metrics: read a service's Prometheus text endpoint (an inference server's SLIs).

The body is parsed with prometheus-client's own parser
(``prometheus_client.parser.text_string_to_metric_families``).  Every sample keeps its own name
and labels, plus ``job`` and ``instance`` (``host:port``); a ``job``/``instance`` label the
service set itself is kept as ``exported_job``/``exported_instance`` (Prometheus'
``honor_labels: false``).  Kinds: counter samples, histogram/summary ``_bucket``/``_count``/``_sum``
are counters; gauges, summary quantiles, info and untyped samples are gauges (untyped names
ending in ``_total`` are counters); ``_created`` timestamps are dropped, and so are NaN/Inf values
(an empty summary's quantiles), which no store or JSON can carry.

Bounded: one GET with an overall deadline (``timeout``), at most ``max_bytes`` of body and
``max_samples`` samples (a larger scrape fails as a whole, like Prometheus' ``sample_limit``).
"""

from __future__ import annotations

import math
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from urllib.parse import urlsplit

from prometheus_client.parser import text_string_to_metric_families

from agent.collectors.base import Availability, BaseCollector, CollectorUnavailable
from triscope.samples import Sample

ACCEPT = "text/plain;version=0.0.4;q=1.0,*/*;q=0.1"
COUNTER_SUFFIXES = {
    "counter": ("_total", ""),
    "histogram": ("_bucket", "_count", "_sum"),
    "gaugehistogram": (),
    "summary": ("_count", "_sum"),
}
TIMESTAMPED = ("counter", "histogram", "summary", "gaugehistogram")


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
                 max_samples: int = 50_000) -> None:
        self.url, self.instance = parse_scrape_url(url)
        if not timeout or timeout <= 0:
            raise ValueError(f"scrape timeout must be > 0 seconds, got {timeout!r}")
        self.timeout = float(timeout)
        self.job = job or "scrape"
        self.max_bytes = max_bytes
        self.max_samples = max_samples
        self.name = f"scrape:{self.instance}"
        self.last_duration = 0.0
        self.last_bytes = 0

    # -- fetching ------------------------------------------------------------------------------

    def fetch(self) -> str:
        """GET the body (bounded in time and size) or raise ``ScrapeError`` saying why."""

        deadline = time.monotonic() + self.timeout
        req = urllib.request.Request(self.url, headers={"Accept": ACCEPT, "Accept-Encoding": "identity",
                                                        "User-Agent": "triscope-agent"})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                chunks: list[bytes] = []
                size = 0
                while True:
                    if time.monotonic() > deadline:
                        raise ScrapeError(f"scrape {self.url}: timed out after {self.timeout:g} s reading the body")
                    chunk = resp.read(65536)
                    if not chunk:
                        break
                    size += len(chunk)
                    if size > self.max_bytes:
                        raise ScrapeError(f"scrape {self.url}: body larger than {self.max_bytes} bytes",
                                          "raise max_bytes or reduce the endpoint's cardinality")
                    chunks.append(chunk)
                charset = resp.headers.get_content_charset() or "utf-8"
        except ScrapeError:
            raise
        except urllib.error.HTTPError as e:
            raise ScrapeError(f"scrape {self.url}: HTTP {e.code} {e.reason}", "check the URL's path") from None
        except urllib.error.URLError as e:
            reason = e.reason
            if isinstance(reason, ConnectionRefusedError):
                why = "connection refused (is the service running?)"
            elif isinstance(reason, TimeoutError):
                why = f"timed out after {self.timeout:g} s"
            elif isinstance(reason, socket.gaierror):
                why = f"cannot resolve host ({reason.strerror})"
            else:
                why = str(getattr(reason, "strerror", None) or reason)
            raise ScrapeError(f"scrape {self.url}: {why}", "start the service or fix --scrape URL") from None
        except TimeoutError:
            raise ScrapeError(f"scrape {self.url}: timed out after {self.timeout:g} s",
                              "the endpoint is too slow; raise the timeout") from None
        except (OSError, ValueError) as e:  # connection reset mid-body, bad status line...
            raise ScrapeError(f"scrape {self.url}: {e}", "") from None
        self.last_bytes = size
        try:
            return b"".join(chunks).decode(charset, errors="replace")
        except LookupError:
            return b"".join(chunks).decode("utf-8", errors="replace")

    def parse(self, body: str) -> list[Sample]:
        """Prometheus text -> samples with ``job``/``instance``; raises ``ScrapeError`` on a malformed body."""

        try:
            families = list(text_string_to_metric_families(body))
        except Exception as e:  # the parser raises ValueError, IndexError, ... on bad input
            raise ScrapeError(f"scrape {self.url}: malformed Prometheus text: {e}",
                              "the endpoint must serve the Prometheus text format (0.0.4)") from None
        timestamped = {f.name for f in families if f.type in TIMESTAMPED}
        out: list[Sample] = []
        n = 0
        for fam in families:
            if fam.name.endswith("_created") and fam.name[: -len("_created")] in timestamped:
                continue
            counters = COUNTER_SUFFIXES.get(fam.type)
            for s in fam.samples:
                n += 1
                if n > self.max_samples:
                    raise ScrapeError(f"scrape {self.url}: more than {self.max_samples} samples",
                                      "raise max_samples or reduce the endpoint's cardinality")
                if s.name.endswith("_created") and fam.type in TIMESTAMPED:
                    continue
                value = float(s.value)
                if not math.isfinite(value):
                    continue
                if counters is not None:
                    kind = "counter" if any(s.name == fam.name + suf for suf in counters) else "gauge"
                elif fam.type == "unknown":
                    kind = "counter" if s.name.endswith("_total") else "gauge"
                else:
                    kind = "gauge"
                labels = dict(s.labels)
                for key, value_ in (("job", self.job), ("instance", self.instance)):
                    if key in labels:
                        labels[f"exported_{key}"] = labels.pop(key)
                    labels[key] = value_
                out.append(Sample(s.name, value, labels, kind))  # type: ignore[arg-type]
        return out

    # -- protocol ------------------------------------------------------------------------------

    def check(self) -> Availability:
        try:
            self.parse(self.fetch())
        except ScrapeError as e:
            return Availability(False, e.reason, e.hint, transient=True)
        return Availability(True)

    def collect(self, now: float) -> Iterator[Sample]:
        t0 = time.monotonic()
        samples = self.parse(self.fetch())
        self.last_duration = time.monotonic() - t0
        yield from samples
