"""The scrape collector reads each series' text once (issue 46, item 2): the samples stored after a
cached parse are the ones prometheus-client's parser gives, a body equal to the last one is not
parsed again, a changed one is, a target's ETag is asked with If-None-Match, and a target can be read
every few ticks (``--scrape-interval``).  Real HTTP targets; the reference is prometheus-client's own
parser with the agent's rules as they were before the cache (``reference``)."""

from __future__ import annotations

import math
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from triscope.agent.budget import BudgetOptions, SampleBudget, ScrapeLedger
from triscope.agent.collectors.background import Background
from triscope.agent.collectors.base import BaseCollector
from triscope.agent.collectors.scrape import ScrapeCollector, ScrapeError
from triscope.core.textsafe import label_text

URL = "http://127.0.0.1:9/metrics"


def reference(body: str, job: str = "scrape", instance: str = "127.0.0.1:9") -> list[tuple] | tuple:
    """What the agent stored from ``body`` before the line cache: prometheus-client's families, the
    agent's kinds, ``job``/``instance``, no ``_created``, no NaN/Inf; or the error it raised."""
    ts_types = ("counter", "histogram", "summary", "gaugehistogram")
    suffixes = {"counter": ("_total", ""), "histogram": ("_bucket", "_count", "_sum"), "gaugehistogram": (),
                "summary": ("_count", "_sum")}
    try:
        families = list(text_string_to_metric_families(body))
    except Exception as e:  # noqa: BLE001
        return ("malformed", str(e))
    timestamped = {f.name for f in families if f.type in ts_types}
    out = []
    for fam in families:
        if fam.name.endswith("_created") and fam.name[:-8] in timestamped:
            continue
        counters = suffixes.get(fam.type)
        for s in fam.samples:
            if s.name.endswith("_created") and fam.type in ts_types:
                continue
            v = float(s.value)
            if not math.isfinite(v):
                continue
            if counters is not None:
                kind = "counter" if any(s.name == fam.name + x for x in counters) else "gauge"
            elif fam.type == "unknown":
                kind = "counter" if s.name.endswith("_total") else "gauge"
            else:
                kind = "gauge"
            labels = {k: x if x.isprintable() else label_text(x) for k, x in s.labels.items()}
            for key, val in (("job", job), ("instance", instance)):
                if key in labels:
                    labels[f"exported_{key}"] = labels.pop(key)
                labels[key] = val
            out.append((s.name, v, tuple(sorted(labels.items())), kind))
    return out


def stored(c: ScrapeCollector, body: str) -> list[tuple] | tuple:
    try:
        return [(s.name, s.value, tuple(sorted(s.labels.items())), s.kind) for s in c.parse(body)]
    except ScrapeError as e:
        return ("malformed", e.reason.split("malformed Prometheus text: ", 1)[1])


def exposition(buckets: tuple[float, ...], routes: list[str], requests: float, ttft: float) -> str:
    """A real prometheus_client exposition (counters, a histogram, a gauge, their _created lines)."""
    reg = CollectorRegistry()
    req = Counter("app_requests", "Requests", ["route", "code"], registry=reg)
    lat = Histogram("app_latency_seconds", "Latency", ["route"], registry=reg, buckets=buckets)
    q = Gauge("app_queue", "Queue", ["model"], registry=reg)
    for i, r in enumerate(routes):
        req.labels(r, "200").inc(requests + i)
        lat.labels(r).observe(ttft * (i + 1))
        q.labels(r).set(i)
    return generate_latest(reg).decode()


ROUTES = ["/v1/completions", '/v1/say "hi", again', "/v1/a,b=c"]   # escaped quotes, commas, '='


def test_a_cached_parse_stores_what_the_parser_gives() -> None:
    """One collector through a target's life -- values moving, a series appearing and one going, a
    label value with escaped quotes and commas, a counter reset, a histogram bucket added -- stores
    at every scrape what prometheus-client's parser gives, and reads only the new lines' text."""
    c = ScrapeCollector(URL)
    steps = [
        exposition((0.1, 1.0), ROUTES[:2], 5, 0.05),
        exposition((0.1, 1.0), ROUTES[:2], 9, 0.2),                 # values only
        exposition((0.1, 1.0), ROUTES, 12, 0.3),                    # a route appears (with '=' and ',' in it)
        exposition((0.1, 1.0), ROUTES[1:], 14, 0.4),                # one disappears
        exposition((0.1, 1.0), ROUTES[1:], 0, 0.4),                 # the process restarted: counters reset
        exposition((0.1, 0.5, 1.0), ROUTES[1:], 3, 0.6),            # a bucket bound added
    ]
    for i, body in enumerate(steps):
        before = c._text.parsed_lines if c._text else 0
        got = stored(c, body)
        assert got == reference(body), f"step {i}"
        assert c.last_path == "cached"
        new = c._text.parsed_lines - before
        if i == 1:
            assert new == 0                       # every line's text seen at the first scrape
        elif i == 2:   # the new route's counter, its _created, its 5 histogram lines + _created, its gauge
            assert new == 9, new
        elif i == 3:
            assert new == 0
    reset = {(n, lab): v for n, v, lab, _ in stored(c, steps[4]) if n == "app_requests_total"}
    assert sorted(reset.values()) == [0.0, 1.0]     # a counter's reset is stored as it is


@pytest.mark.parametrize("body", [
    'a{x="1"} 1_0\n', 'a{x="1"} 0x10\n', 'a{x="1" 1\n', "# TYPE a\n", "# TYPE a bogus\na 1\n",
    "<html><body>Welcome to nginx!</body></html>\n", 'a{x="1"} \n', 'a{x="1"}} 2\n', 'a{x="1\\"} 1\n',
])
def test_bad_text_after_a_cached_parse_gives_the_parsers_error(body: str) -> None:
    c = ScrapeCollector(URL)
    good = 'a{x="1"} 1\n# TYPE a gauge\na{x="2"} 5\n'
    assert stored(c, good) == reference(good)
    want = reference(body)
    assert want[0] == "malformed"
    assert stored(c, body) == want == stored(ScrapeCollector(URL), body)
    with pytest.raises(ScrapeError, match="malformed Prometheus text"):
        c.parse(body)
    assert stored(c, good) == reference(good)      # and the next good body is read again


@pytest.mark.parametrize("body", [
    "x 1\ny_total 2\nz NaN\nw +Inf\nv -Inf\n",
    "x 1 1700000000000\n",                                  # a timestamp: the last token is no value
    'x 1 # {t="x"} 2\n',
    '# TYPE s summary\ns{quantile="0.5"} NaN\ns_count 0\ns_sum 0\n',
    "# TYPE foo counter\nfoo 1\n# TYPE foo gauge\nfoo 2\n",     # a family's type changed under it
    "# HELP foo doc\nfoo 1\nfoo_bar 2\nfoo 3\n",                 # untyped families of one sample
    '{__name__="n",l="v"} 4\n', 'a{job="j",instance="i"} 1\n', 'a{l="\u202e"} 1\n', 'a{l="}"} 5\n',
    "a\t2\n", "a  3\n", "a 1\r\nb 2\r\n", "a 1\na 2\n", "a 1e999\n",
    "# TYPE c_total counter\nc_total 1\nc_created 5\n# TYPE c_created gauge\nc_created 6\n",
    '# TYPE g gaugehistogram\ng_bucket{le="1"} 1\ng_gcount 1\n', '# TYPE i info\ni_info{v="1"} 1\n',
])
def test_odd_text_is_stored_as_the_parser_reads_it(body: str) -> None:
    """The corners of the format, at the first scrape and with their values changed."""
    c = ScrapeCollector(URL)
    for new in ("", "7", "8"):
        text = body if not new else "\n".join(
            f"{line.rpartition(' ')[0]} {new}" if line[:1].isalpha() and line.rpartition(" ")[2][:1].isdigit()
            else line for line in body.split("\n"))
        assert stored(c, text) == reference(text), text


class _Target(BaseHTTPRequestHandler):
    """Serves ``server.body`` (with ``server.etag`` when set: 304 to a matching If-None-Match)."""

    def do_GET(self) -> None:  # noqa: N802
        srv = self.server
        srv.requests.append(dict(self.headers))   # type: ignore[attr-defined]
        etag = srv.etag    # type: ignore[attr-defined]
        if etag and self.headers.get("If-None-Match") == etag:
            self.send_response(304)
            self.send_header("ETag", etag)
            self.end_headers()
            return
        body = srv.body.encode()   # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        if etag:
            self.send_header("ETag", etag)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def target():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Target)
    srv.daemon_threads = True
    srv.body, srv.etag, srv.requests = "", None, []   # type: ignore[attr-defined]
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield srv, f"http://127.0.0.1:{srv.server_address[1]}/metrics"
    finally:
        srv.shutdown()
        srv.server_close()


def test_an_unchanged_exposition_is_not_parsed_again_and_a_changed_one_is(target) -> None:
    srv, url = target
    budget = SampleBudget(BudgetOptions(total_samples=100, sender_samples=100))
    c = ScrapeCollector(url, ledger=ScrapeLedger(budget, url))
    srv.body = exposition((0.1, 1.0), ROUTES[:1], 5, 0.05)
    first = stored(c, c.fetch())
    assert c.last_path == "cached" and first == reference(srv.body, instance=c.instance)
    held = budget.held("scrape", url)
    again = [(s.name, s.value, tuple(sorted(s.labels.items())), s.kind) for s in c.collect(1.0)]
    assert c.last_path == "unchanged" and again == first and budget.held("scrape", url) == held
    srv.body = exposition((0.1, 1.0), ROUTES[:1], 6, 0.05)     # one counter moved
    changed = [(s.name, s.value, tuple(sorted(s.labels.items())), s.kind) for s in c.collect(2.0)]
    assert c.last_path == "cached" and changed == reference(srv.body, instance=c.instance) != first
    assert budget.held("scrape", url) == held


def test_a_target_with_an_etag_is_asked_if_it_changed(target) -> None:
    srv, url = target
    c = ScrapeCollector(url)
    srv.body, srv.etag = 'a_total{x="1"} 1\nb 2\n', '"v1"'
    first = list(c.collect(1.0))
    assert "If-None-Match" not in srv.requests[-1]
    second = list(c.collect(2.0))
    assert srv.requests[-1].get("If-None-Match") == '"v1"' and c.last_bytes == 0 and c.last_path == "unchanged"
    assert [(s.name, s.value, s.labels) for s in second] == [(s.name, s.value, s.labels) for s in first]
    srv.body, srv.etag = 'a_total{x="1"} 3\nb 2\n', '"v2"'
    third = {s.name: s.value for s in c.collect(3.0)}
    assert third == {"a_total": 3.0, "b": 2.0} and c.last_bytes > 0
    srv.etag = None                                        # a target that stops sending ETags
    list(c.collect(4.0))
    list(c.collect(5.0))
    assert "If-None-Match" not in srv.requests[-1]


class _Counting(BaseCollector):
    name = "counting"

    def __init__(self, delay: float = 0.0) -> None:
        self.reads = 0
        self.delay = delay

    def collect(self, now: float):
        self.reads += 1
        time.sleep(self.delay)
        from triscope.core.samples import Sample

        return [Sample("x", float(self.reads))]


def _tick(b: Background, now: float) -> list:
    b.begin(now)
    return list(b.collect(now))


def test_a_target_read_every_few_ticks() -> None:
    inner = _Counting()
    b = Background(inner, budget=1.0, every=3)
    try:
        got = [_tick(b, float(t)) for t in range(7)]
        assert [len(g) for g in got] == [1, 0, 0, 1, 0, 0, 1] and inner.reads == 3
        assert b.source_status().up and b.source_status().staleness == 0.0   # between reads: its last read's
    finally:
        b.close()
    # a read that comes in after its tick's wait lands in the next tick, not lost
    slow = _Counting(delay=0.3)
    b = Background(slow, budget=0.05, every=3)
    try:
        first = _tick(b, 0.0)
        time.sleep(0.5)
        second = _tick(b, 1.0)
        assert first == [] and [s.value for s in second] == [1.0] and b.source_status().up
        assert _tick(b, 2.0) == [] and slow.reads == 1
    finally:
        b.close()
    with pytest.raises(ValueError):
        Background(_Counting(), every=0)


def test_scrape_interval_flag() -> None:
    from triscope.commands.agent import scrape_intervals
    from triscope.core.errors import UserError

    a, b = "http://127.0.0.1:8000/metrics", "http://127.0.0.1:8001/m?x=1"
    assert scrape_intervals([], [a, b], 1.0) == {}
    assert scrape_intervals(["15"], [a, b], 1.0) == {a: 15, b: 15}
    assert scrape_intervals(["15", f"{b}=5"], [a, b], 1.0) == {a: 15, b: 5}
    assert scrape_intervals([f"{b}=1"], [a, b], 1.0) == {}
    assert scrape_intervals(["10"], [a], 2.0) == {a: 5}
    from triscope.agent.registry import AgentOptions, build_collectors

    built = build_collectors(AgentOptions(ebpf=False, nvml=False, npu=False, workloads=False, scrape=[a, b],
                                          scrape_every={a: 15}))
    try:
        every = {c.name: getattr(c, "every", None) for c in built if c.name.startswith("scrape:")}
        assert every == {"scrape:127.0.0.1:8000": 15, "scrape:127.0.0.1:8001": 1}
    finally:
        for c in built:
            c.close()
    for bad, msg in ((["0.5"], "shorter than --interval"), (["x"], "expected SECONDS"),
                     (["http://other/metrics=5"], "no --scrape target"), (["-3"], "expected SECONDS")):
        with pytest.raises(UserError, match=msg):
            scrape_intervals(bad, [a, b], 1.0)


def test_a_series_that_did_not_move_keeps_its_sample() -> None:
    """A line whose value did not change gives the very sample the last scrape stored (no new object)."""
    c = ScrapeCollector(URL)
    first = c.parse('a{x="1"} 1\nb 2\n')
    second = c.parse('a{x="1"} 1\nb 3\n')
    assert second[0] is first[0] and second[1] is not first[1] and second[1].value == 3.0
    assert stored(c, 'a{x="1"} 1\nb 3\n') == reference('a{x="1"} 1\nb 3\n')
