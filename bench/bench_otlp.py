"""OTLP in (agent/otlp.py): what one request costs the receiver's worker, and what a tick pays.

One export of 5,000 stage spans (4 stages, 5 string attributes each, one resource) as OTLP
protobuf and as OTLP JSON: decode (``otlp_decode.decode``) and aggregate (``StageSeries.add``)
time, best of 5, in the process (the HTTP read is the shared server's and not measured here);
then a tick's read of the stage series at the default total budget (4,096 samples a tick: 240
series of 17, count, sum and 15 buckets) into samples, under the lock requests take too.  Target:
at most 10 ms.  And issue 43's flood (256 histogram series x 64 bounds, 16 labels of 128
characters, in four ~200 KB protobuf requests from one sender) at the default budget: what one
request costs (decode + add), the samples a tick kept (target: at most the sender budget) and the
tick's read of them.  The agent's memory under that flood is measured on the real process by
``tests/e2e/test_otlp_budget_agent.py -s`` (docs/otlp.md, "Budget").
"""

from __future__ import annotations

import json
import time

from bench.common import Row

N = 5000
STAGES = ("h2d", "compute", "d2h", "preprocess")


def _bodies() -> tuple[bytes, bytes]:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    t0 = 1_700_000_000_000_000_000
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    kv = rs.resource.attributes.add()
    kv.key, kv.value.string_value = "service.name", "bench"
    ss = rs.scope_spans.add()
    spans = []
    for i in range(N):
        sp = ss.spans.add()
        sp.name, sp.trace_id, sp.span_id = STAGES[i % 4], b"\x01" * 16, i.to_bytes(8, "big")
        sp.start_time_unix_nano, sp.end_time_unix_nano = t0, t0 + 1000 * i
        for k in range(5):
            a = sp.attributes.add()
            a.key, a.value.string_value = f"attr.{k}", "value"
        spans.append({"traceId": "01" * 16, "spanId": f"{i:016x}", "name": STAGES[i % 4],
                      "startTimeUnixNano": str(t0), "endTimeUnixNano": str(t0 + 1000 * i),
                      "attributes": [{"key": f"attr.{k}", "value": {"stringValue": "value"}} for k in range(5)]})
    js = json.dumps({"resourceSpans": [{"resource": {"attributes": [
        {"key": "service.name", "value": {"stringValue": "bench"}}]}, "scopeSpans": [{"spans": spans}]}]})
    return req.SerializeToString(), js.encode()


def run(quick: bool = False) -> list[Row]:
    from triscope.agent.otlp import OtlpOptions, OtlpReceiver
    from triscope.agent.otlp_decode import decode

    pb, js = _bodies()
    rows: list[Row] = []
    name = f"otlp receiver ({N} stage spans per request)"
    for fmt, body in (("protobuf", pb), ("JSON", js)):
        r = OtlpReceiver(OtlpOptions(max_items=10**9))
        dec_s, add_s = [], []
        for _ in range(2 if quick else 5):
            t0 = time.perf_counter()
            d = decode("traces", body, "proto" if fmt == "protobuf" else "json")
            t1 = time.perf_counter()
            r.state.add("traces", d, r.labels_of)
            dec_s.append(t1 - t0)
            add_s.append(time.perf_counter() - t1)
        rows.append(Row(name, f"{fmt} ({len(body) / 1e6:.2f} MB): decode, us per span", min(dec_s) / N * 1e6, "us"))
        rows.append(Row(name, f"{fmt}: aggregate into the series, ms per request", min(add_s) * 1e3, "ms"))
    from triscope.agent.budget import DEFAULT_TOTAL_SAMPLES, BudgetOptions, SampleBudget

    one_sender_fills_it = SampleBudget(BudgetOptions(sender_samples=DEFAULT_TOTAL_SAMPLES))
    r = OtlpReceiver(OtlpOptions(max_items=10**9), budget=one_sender_fills_it)
    d = decode("traces", json.dumps({"resourceSpans": [{"resource": {"attributes": [
        {"key": "service.name", "value": {"stringValue": "bench"}}]}, "scopeSpans": [{"spans": [
            {"name": "w", "startTimeUnixNano": "1", "endTimeUnixNano": "2",
             "attributes": [{"key": "triscope.stage", "value": {"stringValue": f"s{i}"}}]}
            for i in range(256)]}]}]}).encode(), "json")
    r.state.add("traces", d, r.labels_of)
    reads = []
    n = 0
    for _ in range(5 if quick else 20):
        t0 = time.perf_counter()
        n = len(r.state.samples())
        reads.append(time.perf_counter() - t0)
    reads.sort()
    rows.append(Row(name, f"tick read at the default total budget ({n} samples), ms, median",
                    reads[len(reads) // 2] * 1e3, "ms", target="<= 10", ok=reads[len(reads) // 2] <= 0.010))
    rows += _issue_43(quick)
    return rows


def _issue_43(quick: bool) -> list[Row]:
    from tests.otlp_flood import issue_requests
    from triscope.agent.budget import DEFAULT_SENDER_SAMPLES, SampleBudget
    from triscope.agent.otlp import OtlpOptions, OtlpReceiver
    from triscope.agent.otlp_decode import decode

    name = "otlp budget (issue 43: 256 series x 64 bounds, long labels, 4 requests, one sender)"
    bodies = issue_requests("flood")
    per_request, kept, reads = [], 0.0, []
    for _ in range(2 if quick else 5):
        r = OtlpReceiver(OtlpOptions(max_items=10**9), budget=SampleBudget())
        for body in bodies:
            t0 = time.perf_counter()
            r.state.add("metrics", decode("metrics", body, "proto"), r.labels_of, "127.0.0.1")
            per_request.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        got = r.state.samples()
        reads.append(time.perf_counter() - t0)
        kept = next(s.value for s in got if s.name == "triscope_otlp_series_samples")
    per_request.sort()
    reads.sort()
    size = sum(map(len, bodies)) / len(bodies) / 1e3
    return [Row(name, f"decode + add, ms per request ({size:.0f} KB), median", per_request[len(per_request) // 2] * 1e3,
                "ms"),
            Row(name, "samples a tick kept at the default budget", kept, "samples", target=f"<= {DEFAULT_SENDER_SAMPLES}",
                baseline="before the budget (17,152 stored)", baseline_value=256 * 67.0, ok=kept <= DEFAULT_SENDER_SAMPLES),
            Row(name, "tick read of what was kept, ms, median", reads[len(reads) // 2] * 1e3, "ms")]


if __name__ == "__main__":
    for row in run():
        print(row)
