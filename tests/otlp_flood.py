"""The largest metrics a single OTLP sender may send in the few requests that carry them (issue 43):
histogram points of ``MAX_BOUNDS`` bucket bounds, each with ``MAX_ATTRS`` attributes of
``MAX_VALUE`` characters, 64 points a request (~197 KB of protobuf).  Used by the e2e budget test
and by ``bench/bench_otlp.py``; ``python tests/otlp_flood.py PORT`` posts the issue's four requests."""

from __future__ import annotations

import sys
import time
import urllib.error
import urllib.request

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1.metrics_pb2 import (
    AGGREGATION_TEMPORALITY_CUMULATIVE,
    AGGREGATION_TEMPORALITY_DELTA,
    Histogram,
    HistogramDataPoint,
    Metric,
    ResourceMetrics,
    ScopeMetrics,
)

from triscope.agent.otlp_decode import MAX_ATTRS, MAX_BOUNDS, MAX_VALUE


def _kv(key: str, value: str) -> KeyValue:
    return KeyValue(key=key, value=AnyValue(string_value=value))


def histogram_request(service: str, first: int, n: int, bounds: int = MAX_BOUNDS, long_labels: bool = True,
                      cumulative: bool = False, start_ns: int | None = None, count: int = 1,
                      name: str = "flood.stage.latency") -> bytes:
    """One request of ``n`` histogram points (series ``first`` .. ``first + n - 1`` of ``service``),
    ``bounds`` bucket bounds each, one observation (``count``) in the first bucket."""
    now = time.time_ns()
    start = start_ns if start_ns is not None else now - 10**9
    edges = [0.001 * (i + 1) for i in range(bounds)]
    points = []
    for i in range(first, first + n):
        attrs = [_kv("stage", f"s{i:04d}")]
        if long_labels:   # MAX_ATTRS labels in all, each value MAX_VALUE characters long
            attrs += [_kv(f"attr_{j:02d}", (f"{i:04d}-{j:02d}-" * 20)[:MAX_VALUE]) for j in range(MAX_ATTRS - 1)]
        buckets = [0] * (bounds + 1)
        buckets[0] = count
        points.append(HistogramDataPoint(attributes=attrs, start_time_unix_nano=start, time_unix_nano=now,
                                         count=count, sum=0.0005 * count, explicit_bounds=edges,
                                         bucket_counts=buckets))
    temporality = AGGREGATION_TEMPORALITY_CUMULATIVE if cumulative else AGGREGATION_TEMPORALITY_DELTA
    metric = Metric(name=name, unit="s", histogram=Histogram(data_points=points, aggregation_temporality=temporality))
    req = ExportMetricsServiceRequest(resource_metrics=[ResourceMetrics(
        resource={"attributes": [_kv("service.name", service)]}, scope_metrics=[ScopeMetrics(metrics=[metric])])])
    return req.SerializeToString()


def issue_requests(service: str = "flood", series: int = 256, per_request: int = 64) -> list[bytes]:
    """The issue's case: 256 series x 64 bounds with long labels, in four ~197 KB requests."""
    return [histogram_request(service, first, per_request) for first in range(0, series, per_request)]


def post(port: int, body: bytes, path: str = "/v1/metrics") -> int:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=body, method="POST",
                                 headers={"Content-Type": "application/x-protobuf"})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            resp.read()
            return resp.status
    except urllib.error.HTTPError as e:
        return e.code


if __name__ == "__main__":
    port = int(sys.argv[1])
    for body in issue_requests():
        print(len(body), post(port, body))
