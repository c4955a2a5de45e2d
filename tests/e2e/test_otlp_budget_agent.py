"""The sample budget end to end (issue 43): the real ``triscope agent`` process with its SQLite store,
an OTLP sender that keeps its series flowing and a real scrape target, then the largest shape OTLP
allows (256 histogram series x 64 bounds with long labels, four ~200 KB requests) from one sender,
and the same from three more: the agent's memory, what the store holds, the steady senders'
series at every tick, the refusals counted and logged.  And an OTLP counter that overflows
(1e308 + 1e308) restarts as a counter reset, in the store.  Figures print with -s."""

from __future__ import annotations

import json
import signal
import statistics
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from conftest import free_port
from test_otlp_agent import NODE, RunningAgent, json_body, rss_bytes, start

from tests.otlp_flood import issue_requests
from triscope.agent.budget import DEFAULT_SENDER_SAMPLES, DEFAULT_TOTAL_SAMPLES
from triscope.store import Store

pytestmark = [pytest.mark.slow]
METRIC = "inference_stage_duration_seconds"


class Target:
    """A scrape target: a counter and a histogram (8 samples); ``more`` adds new series later."""

    def __init__(self) -> None:
        self.more = 0
        target = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                body = target.body().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/metrics"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def body(self) -> str:
        lines = ["# TYPE app_requests_total counter", 'app_requests_total{code="200"} 7',
                 "# TYPE app_latency_seconds histogram"]
        lines += [f'app_latency_seconds_bucket{{le="{le}"}} 3' for le in ("0.1", "0.5", "1.0", "+Inf")]
        lines += ["app_latency_seconds_count 3", "app_latency_seconds_sum 0.6", "# TYPE app_extra gauge"]
        lines += [f'app_extra{{n="{i}"}} 1' for i in range(self.more)]
        return "\n".join(lines) + "\n"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def post_json(port: int, path: str, doc: dict) -> tuple[int, dict]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(doc).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return resp.status, json.loads(resp.read() or b"{}")


def post_pb(port: int, body: bytes) -> tuple[int, bytes]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/metrics", data=body, method="POST",
                                 headers={"Content-Type": "application/x-protobuf"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return resp.status, resp.read()


def delta_counter(service: str, value: float) -> dict:
    t = time.time_ns()
    point = {"attributes": [{"key": "stage", "value": {"stringValue": "h2d"}}], "startTimeUnixNano": str(t - 10**9),
             "timeUnixNano": str(t), "asDouble": value}
    return {"resourceMetrics": [{"resource": {"attributes": [{"key": "service.name",
                                                               "value": {"stringValue": service}}]},
                                 "scopeMetrics": [{"metrics": [{"name": "big.bytes", "sum": {
                                     "aggregationTemporality": 1, "isMonotonic": True, "dataPoints": [point]}}]}]}]}


def rss_mib(pid: int) -> float:
    return rss_bytes(pid) / 2**20


def test_no_sender_fills_the_store_and_the_others_keep_flowing(tmp_path: Path) -> None:
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceResponse

    target = Target()
    otlp = free_port()
    proc, port, log = start(tmp_path, "--otlp-listen", f"127.0.0.1:{otlp}", "--scrape", target.url)
    agent = RunningAgent(proc, f"sqlite:///{tmp_path / 'otlp.db'}", port, otlp, log)
    stop = threading.Event()
    steady_codes: list[int] = []

    def steady() -> None:   # a second sender: its one stage series (17 samples) gets spans all along
        while not stop.is_set():
            req = urllib.request.Request(f"http://127.0.0.1:{otlp}/v1/traces", data=json_body("steady", {"h2d": [0.01]}),
                                         method="POST", headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=10) as resp:
                steady_codes.append(resp.status)
            stop.wait(0.3)

    sender = threading.Thread(target=steady, daemon=True)
    figures: dict[str, object] = {}
    try:
        agent.wait("the first tick", lambda: agent.ticks() >= 1, timeout=90)
        sender.start()
        agent.wait("the steady series and the scrape", lambda: agent.value(
            'triscope_budget_used_samples{source="otlp"}') == 17 and agent.value(
            'triscope_budget_used_samples{source="scrape"}') == 7)

        # an OTLP counter that overflows: 1e308 + 1e308 is past the largest float
        for _ in range(2):
            assert post_json(otlp, "/v1/metrics", delta_counter("big", 1e308))[0] == 200
        seen = agent.ticks()
        agent.wait("two ticks", lambda: agent.ticks() >= seen + 2)
        assert post_json(otlp, "/v1/metrics", delta_counter("big", 1.0))[0] == 200
        t_overflow = time.time()

        seen = agent.ticks()
        agent.wait("ten ticks", lambda: agent.ticks() >= seen + 10)
        before = statistics.median(rss_mib(proc.pid) for _ in range(5) if not time.sleep(0.2))
        f0 = time.time()
        rejected = []
        for service in ("flood", "flood-b", "flood-c", "flood-d"):
            for body in issue_requests(service):
                status, answer = post_pb(otlp, body)
                assert status == 200
                rejected.append(ExportMetricsServiceResponse.FromString(answer).partial_success.rejected_data_points)
        target.more = 100         # the scrape target's new series come once the total is (nearly) full
        rss_max = before
        while time.time() - f0 < 12:
            rss_max = max(rss_max, rss_mib(proc.pid))
            time.sleep(0.2)
        f1 = time.time()
        refused = {f"{s}/{r}": agent.value(f'triscope_budget_refused_series_total{{reason="{r}",source="{s}"}}')
                   for r, s in (("sender_budget", "otlp"), ("total_budget", "otlp"), ("total_budget", "scrape"))}
        used = agent.value("triscope_budget_used_samples")
        rss_after = rss_mib(proc.pid)
    finally:
        stop.set()
        sender.join(10)
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        proc.wait(20)
        target.close()
    text = log.read_text()
    assert "Traceback" not in text, text[-3000:]
    per_series = 64 + 3
    figures.update(rss_before_mib=round(before, 1), rss_max_mib=round(rss_max, 1), rss_after_mib=round(rss_after, 1),
                   rejected_per_request=rejected, refused=refused, used_samples=used)

    st = Store.open(agent.db)
    try:
        senders_series = [s for s in st.series(node=NODE) if not s.metric.startswith("triscope_")]
        ticks = st.query("triscope_ticks_total", node=NODE, start=f0, end=f1, max_points=None, rate=False)[0]
        [steady_count] = st.query(METRIC + "_count", node=NODE, labels={"job": "steady", "stage": "h2d"},
                                  start=f0, end=f1, max_points=None, rate=False)
        [scraped] = st.query("app_requests_total", node=NODE, start=f0, end=f1, max_points=None, rate=False)
        extra = st.query("app_extra", node=NODE, start=0, end=time.time() + 10, max_points=None)
        [big] = st.query("big_bytes_total", node=NODE, labels={"job": "big"}, start=0, end=time.time() + 10,
                         max_points=None, rate=False)
    finally:
        st.close()
    flood_series = {s.labels.get("job") for s in senders_series if s.metric.startswith("flood_stage_latency")}
    figures.update(stored_sender_series=len(senders_series), flood_jobs=sorted(flood_series), scrape_extra=len(extra),
                   ticks_in_flood=len(ticks.ts), steady_points=len(steady_count.ts))
    print("\notlp budget figures:", figures)

    # one sender got its share and no more; four of them no more than the total
    assert rejected[0] == 64 - DEFAULT_SENDER_SAMPLES // per_series and all(r > 0 for r in rejected), rejected
    assert len(senders_series) <= DEFAULT_TOTAL_SAMPLES, figures
    assert len(flood_series) >= 2, figures
    # the senders already in keep flowing: a stored point at every tick of the flood
    assert set(steady_count.ts) >= set(ticks.ts) and len(ticks.ts) >= 10, figures
    assert set(scraped.ts) >= set(ticks.ts)
    assert steady_count.values[-1] > steady_count.values[0] and set(steady_codes) == {200}
    assert len(extra) <= DEFAULT_TOTAL_SAMPLES - 2 * 30 * per_series - 17 - 7 - 1 < 100, len(extra)
    # counted, and logged at most once a minute per source and reason
    assert all(n > 0 for n in refused.values()), refused
    assert 0 < text.count("WARNING triscope.agent.budget") <= 4, text
    assert 'scrape target' in text
    # the target: the agent from ~60 MB to at most 120 MB
    assert rss_max <= 120 and rss_max - before <= 60, figures

    # the overflowed counter: a reset to 0, then on; never +Inf, never blank
    vals = big.values
    assert all(v == v and abs(v) != float("inf") for v in vals), vals
    assert vals[-1] == 1e308 and max(big.ts) > t_overflow + 1, (vals, big.ts, t_overflow)
