"""OTLP in (agent/otlp.py): what one request costs the receiver's worker, and what a tick pays.

One export of 5,000 stage spans (4 stages, 5 string attributes each, one resource) as OTLP
protobuf and as OTLP JSON: decode (``otlp_decode.decode``) and aggregate (``StageSeries.add``)
time, best of 5, in the process (the HTTP read is the shared server's and not measured here);
then a tick's read of the stage series at the series cap (256, 17 samples each: count, sum and
15 buckets) into samples, under the lock requests take too.  Target: at most 10 ms.
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
    r = OtlpReceiver(OtlpOptions(max_items=10**9, max_series=256))
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
    rows.append(Row(name, f"tick read at the 256-series cap ({n} samples), ms, median", reads[len(reads) // 2] * 1e3,
                    "ms", target="<= 10", ok=reads[len(reads) // 2] <= 0.010))
    return rows


if __name__ == "__main__":
    for row in run():
        print(row)
