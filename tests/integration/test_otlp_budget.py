"""The sample budget (agent/budget.py) on real sockets: the OTLP receiver fed over HTTP, scrape
targets served by prometheus_client's own exporter, the budget file and flags through the real
command line parser; and OTLP counters that overflow (issue 43, items 1 and 6).  The real agent
process with its store: tests/e2e/test_otlp_budget_agent.py."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import free_port
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceResponse
from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server

from tests.otlp_flood import histogram_request
from triscope.agent.budget import BudgetOptions, SampleBudget, ScrapeLedger, histogram_samples
from triscope.agent.collectors.scrape import ScrapeCollector
from triscope.agent.otlp import OtlpOptions, OtlpReceiver
from triscope.core.samples import Sample

T0 = 1_764_000_000_000_000_000


def receiver(budget: SampleBudget, **opts: object) -> OtlpReceiver:
    return OtlpReceiver(OtlpOptions(listen=("127.0.0.1", 0), max_items=100_000, **opts), budget=budget).start()


def post(r: OtlpReceiver, body: bytes, ctype: str = "application/x-protobuf") -> tuple[int, bytes]:
    req = urllib.request.Request(f"http://127.0.0.1:{r.address[1]}/v1/metrics", data=body, method="POST",
                                 headers={"Content-Type": ctype})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return resp.status, resp.read()


def rejected(answer: bytes) -> tuple[int, str]:
    ps = ExportMetricsServiceResponse.FromString(answer).partial_success
    return ps.rejected_data_points, ps.error_message


def tick(r: OtlpReceiver) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for s in r.collector.collect(time.time()):
        assert isinstance(s, Sample)
        out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def of(samples: dict, name: str, **labels: str) -> list[float]:
    return [v for (n, lab), v in samples.items() if n == name and all(dict(lab).get(k) == x for k, x in labels.items())]


def budget_figures(budget: SampleBudget) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for s in budget.samples()}


# -- OTLP: per sender and in total --------------------------------------------------------------------

def test_each_sender_has_its_share_in_samples_and_existing_series_keep_flowing() -> None:
    per = histogram_samples(64)                       # 67 samples a tick for 64 bounds
    budget = SampleBudget(BudgetOptions(total_samples=10 * per, sender_samples=4 * per))
    r = receiver(budget)
    try:
        # a steady sender's two series first
        assert post(r, histogram_request("steady", 0, 2, long_labels=False)) == (200, b"")
        # one sender sends 16 series of 64 bounds: 4 fit its share, 12 are refused
        status, answer = post(r, histogram_request("flood", 0, 16))
        assert status == 200 and rejected(answer) == (12, "rejected: 12 sender budget")
        # the same name from another address would be another sender; the same address with another
        # service.name is one too: 4 more, then the total (10 x 67) leaves 0 for a third
        assert rejected(post(r, histogram_request("flood-2", 0, 16))[1]) == (12, "rejected: 12 sender budget")
        assert rejected(post(r, histogram_request("flood-3", 0, 16))[1]) == (16, "rejected: 16 total budget")
        got = tick(r)
        assert len(of(got, "flood_stage_latency_seconds_count")) == 10
        assert budget.used == 10 * per
        # the steady sender's series keep flowing; a new one of its own is refused (the total is full)
        assert post(r, histogram_request("steady", 0, 2, long_labels=False, count=3))[0] == 200
        assert rejected(post(r, histogram_request("steady", 2, 1, long_labels=False))[1])[0] == 1
        tick(r)
        got = tick(r)
        assert sorted(of(got, "flood_stage_latency_seconds_count", job="steady")) == [4.0, 4.0]
        assert of(got, "triscope_otlp_dropped_total", reason="sender_budget") == [24.0]
        assert of(got, "triscope_otlp_dropped_total", reason="total_budget") == [17.0]
        assert of(got, "triscope_otlp_series_samples") == [10.0 * per]
        fig = budget_figures(budget)
        assert fig[("triscope_budget_refused_series_total", (("reason", "sender_budget"), ("source", "otlp")))] == 24
        assert fig[("triscope_budget_refused_series_total", (("reason", "total_budget"), ("source", "otlp")))] == 17
        assert fig[("triscope_budget_used_samples", (("source", "otlp"),))] == 10 * per
        assert fig[("triscope_budget_senders", (("source", "otlp"),))] == 3
    finally:
        r.shutdown()


def test_a_forgotten_series_gives_its_samples_back() -> None:
    budget = SampleBudget(BudgetOptions(total_samples=1000, sender_samples=histogram_samples(64)))
    r = receiver(budget, series_ttl=0.3)
    try:
        assert rejected(post(r, histogram_request("a", 0, 2))[1])[0] == 1     # one series of 67 fits
        tick(r)
        time.sleep(0.5)
        tick(r)                                                                  # idle past its TTL: forgotten
        assert budget.used == 0 and budget.held("otlp", "a@127.0.0.1") == 0
        assert rejected(post(r, histogram_request("a", 1, 1))[1])[0] == 0
    finally:
        r.shutdown()


def test_a_sender_named_in_the_budget_file_has_its_own_share(tmp_path: Path) -> None:
    from triscope.agent.budget_file import load

    f = tmp_path / "budget.yaml"
    f.write_text("total_samples: 1000\nsender_samples: 20\nsenders:\n  big: 200\n  small@127.0.0.1: 0\n")
    budget = SampleBudget(load(str(f)))
    r = receiver(budget)
    try:
        assert rejected(post(r, histogram_request("big", 0, 5, bounds=30))[1])[0] == 0       # 5 x 33 <= 200
        assert rejected(post(r, histogram_request("other", 0, 2, bounds=30))[1])[0] == 2     # 33 > 20
        assert rejected(post(r, histogram_request("small", 0, 1, bounds=1))[1])[0] == 1      # 0 for it
    finally:
        r.shutdown()


# -- scrapes share the total -------------------------------------------------------------------------

@pytest.fixture
def app() -> Iterator[tuple[str, dict]]:
    reg = CollectorRegistry()
    m = {"requests": Counter("app_requests", "Requests", ["code"], registry=reg),
         "latency": Histogram("app_latency_seconds", "Latency", ["route"], buckets=(0.1, 0.5, 1.0), registry=reg)}
    port = free_port()
    server, _ = start_http_server(port, addr="127.0.0.1", registry=reg)
    try:
        yield f"http://127.0.0.1:{port}/metrics", m
    finally:
        server.shutdown()
        server.server_close()


def test_a_scrape_target_keeps_what_it_had_and_new_series_beyond_its_share_are_left_out(app) -> None:
    url, m = app
    now = [0.0]
    budget = SampleBudget(BudgetOptions(total_samples=1000, sender_samples=20, idle_s=60), clock=lambda: now[0])
    c = ScrapeCollector(url, ledger=ScrapeLedger(budget, url))
    m["requests"].labels("200").inc()
    m["latency"].labels("/a").observe(0.2)       # one histogram: 3 bounds + Inf + count + sum = 6 samples
    first = {(s.name, tuple(sorted(s.labels.items()))) for s in c.collect(time.time())}
    held = budget.held("scrape", url)
    assert held == len(first) and held <= 20
    # new series: two histograms (12 samples) do not both fit; the one that does is whole, never half
    for route in ("/b", "/c", "/d"):
        m["latency"].labels(route).observe(0.2)
    m["requests"].labels("500").inc()
    got = list(c.collect(time.time()))
    keys = {(s.name, tuple(sorted(s.labels.items()))) for s in got}
    assert first <= keys and budget.held("scrape", url) <= 20
    routes = {}
    for s in got:
        if s.name.startswith("app_latency_seconds"):
            routes[s.labels["route"]] = routes.get(s.labels["route"], 0) + 1
    assert set(routes.values()) == {6}, routes
    assert budget.refused[("scrape", "sender_budget")] >= 1
    # the OTLP total is shared: a second target finds only what is left
    budget2 = SampleBudget(BudgetOptions(total_samples=10, sender_samples=100), clock=lambda: now[0])
    budget2.take("otlp", "x@local", 8)
    c2 = ScrapeCollector(url, ledger=ScrapeLedger(budget2, url))
    assert sum(1 for _ in c2.collect(time.time())) <= 2 and budget2.refused[("scrape", "total_budget")] > 0
    # a series gone from the target for idle_s gives its samples back
    ledger = ScrapeLedger(budget, "gone")
    ledger.admit([("g", [Sample("x", 1.0)])])
    assert budget.held("scrape", "gone") == 1
    now[0] += 61
    ledger.admit([])
    assert budget.held("scrape", "gone") == 0


# -- counters that overflow -----------------------------------------------------------------------------

def counter_body(values: list[float], temporality: int = 1, start: int = T0, service: str = "big") -> bytes:
    points = [{"attributes": [{"key": "stage", "value": {"stringValue": "h2d"}}], "startTimeUnixNano": str(start),
               "timeUnixNano": str(start + 10**9), "asDouble": v} for v in values]
    return json.dumps({"resourceMetrics": [{
        "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": service}}]},
        "scopeMetrics": [{"metrics": [{"name": "big.bytes", "sum": {
            "aggregationTemporality": temporality, "isMonotonic": True, "dataPoints": points}}]}]}]}).encode()


def test_an_overflowing_counter_restarts_as_a_counter_reset() -> None:
    """1e308 + 1e308 is past the largest float: the series reads 0 at the next tick (a reset, which
    increase() counts across) and then what came since; it never reads +Inf or goes blank."""
    r = receiver(SampleBudget())
    try:
        def series() -> list[float]:
            return of(tick(r), "big_bytes_total", job="big")

        post(r, counter_body([1e308]), "application/json")
        assert series() == [0.0]             # born at 0, as every series of delta points
        assert series() == [1e308]
        post(r, counter_body([1e308]), "application/json")
        assert series() == [0.0]             # the overflow: a reset
        assert series() == [1e308]
        post(r, counter_body([5.0]), "application/json")
        assert series() == [1e308 + 5.0]
        # two in one request: the second restarts the first
        post(r, counter_body([1e308, 1e308]), "application/json")
        assert series() == [0.0] and series() == [1e308]
        # a cumulative stream whose restart overflows the series
        start = time.time_ns() - 10**9
        post(r, counter_body([1.5e308], temporality=2, start=start, service="cum"), "application/json")
        assert of(tick(r), "big_bytes_total", job="cum") == [1.5e308]
        restart = time.time_ns() + 10**9     # a restart of the sender: a stream that starts after its series
        post(r, counter_body([1.5e308], temporality=2, start=restart, service="cum"), "application/json")
        assert of(tick(r), "big_bytes_total", job="cum") == [0.0]
        post(r, counter_body([1.6e308], temporality=2, start=restart, service="cum"), "application/json")
        got = of(tick(r), "big_bytes_total", job="cum")[0]
        assert got == pytest.approx(1.6e308)
        # a histogram's sum that overflows resets its count and buckets with it
        h = histogram_request("hist", 0, 1, bounds=2, long_labels=False)
        from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
        req = ExportMetricsServiceRequest.FromString(h)
        req.resource_metrics[0].scope_metrics[0].metrics[0].histogram.data_points[0].sum = 1e308
        post(r, req.SerializeToString())
        tick(r)
        post(r, req.SerializeToString())
        got = tick(r)
        assert of(got, "flood_stage_latency_seconds_sum", job="hist") == [0.0]
        got = tick(r)
        assert of(got, "flood_stage_latency_seconds_sum", job="hist") == [1e308]
        assert of(got, "flood_stage_latency_seconds_count", job="hist") == [1.0]
        assert sorted(of(got, "flood_stage_latency_seconds_bucket", job="hist")) == [1.0, 1.0, 1.0]
    finally:
        r.shutdown()


# -- configuration: file and flags -----------------------------------------------------------------------

def test_budget_flags_and_file_through_the_command_line(tmp_path: Path) -> None:
    from triscope.cli import build_parser
    from triscope.commands.agent import budget_options
    from triscope.core.errors import UserError

    parse = build_parser().parse_args
    assert budget_options(parse(["agent"])) == BudgetOptions()
    f = tmp_path / "budget.yaml"
    f.write_text("total_samples: 9000\nsender_samples: 300\nidle: 5m\nsenders:\n  http://127.0.0.1:8000/metrics: 5000\n")
    opts = budget_options(parse(["agent", "--budget-file", str(f), "--budget-sender-samples", "400"]))
    assert (opts.total_samples, opts.sender_samples, opts.idle_s) == (9000, 400, 300.0)
    assert opts.limit_for("http://127.0.0.1:8000/metrics") == 5000 and opts.limit_for("x@1.2.3.4", "x") == 400
    f.write_text("total_samples: 9000\nsender_samples: -3\n")
    with pytest.raises(UserError, match=r"budget.yaml:2: sender_samples: must be >= 0"):
        budget_options(parse(["agent", "--budget-file", str(f)]))
    f.write_text("total_sample: 9000\n")
    with pytest.raises(UserError, match=r"budget.yaml:1: .*unknown key 'total_sample'"):
        budget_options(parse(["agent", "--budget-file", str(f)]))
    with pytest.raises(UserError, match="--budget-total-samples"):
        budget_options(parse(["agent", "--budget-total-samples", "-1"]))
    out = subprocess.run([sys.executable, "-m", "triscope", "agent", "--help"], capture_output=True, text=True,
                         timeout=60).stdout
    for flag in ("--budget-total-samples", "--budget-sender-samples", "--budget-file"):
        assert flag in out
    assert "bounds + 3" in out and "service.name and peer address" in out
