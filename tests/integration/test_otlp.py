"""The OTLP/HTTP receiver (agent/otlp.py) on a real socket, fed by the real OpenTelemetry SDK
exporters (protobuf, gzip) and by hand-written OTLP JSON: what becomes a stage-duration series,
what is answered to bad, oversized and wrongly typed bodies, and how a flood is bounded.
The real agent process is exercised in tests/e2e/test_otlp_agent.py."""

from __future__ import annotations

import gzip
import json
import time
import urllib.error
import urllib.request
import zlib
from collections.abc import Iterator

import pytest
from google.rpc import status_pb2
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from opentelemetry.sdk.metrics import Histogram, MeterProvider
from opentelemetry.sdk.metrics.export import AggregationTemporality, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from triscope.agent.otlp import STAGE_BUCKETS, OtlpOptions, OtlpReceiver
from triscope.analysis.stages import stage_skew
from triscope.core.samples import Sample

STAGES = {"preprocess": 0.004, "h2d": 0.012, "compute": 0.040, "d2h": 0.006}


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    r = OtlpReceiver(OtlpOptions(listen=("127.0.0.1", 0), max_body=1 << 20, max_items=1000, max_series=64)).start()
    try:
        yield r
    finally:
        r.shutdown()


def url(r: OtlpReceiver, path: str = "/v1/traces") -> str:
    return f"http://127.0.0.1:{r.address[1]}{path}"


def post(r: OtlpReceiver, body: bytes, ctype: str = "application/json", path: str = "/v1/traces",
         encoding: str | None = None) -> tuple[int, dict[str, str], bytes]:
    headers = {"Content-Type": ctype}
    if encoding:
        headers["Content-Encoding"] = encoding
    req = urllib.request.Request(url(r, path), data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def tick(r: OtlpReceiver) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """One tick's samples by (name, labels)."""
    out = {}
    for s in r.collector.collect(time.time()):
        assert isinstance(s, Sample)
        out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(samples: dict, name: str, **labels: str) -> float:
    hits = [v for (n, lab), v in samples.items() if n == name and all(dict(lab).get(k) == x for k, x in labels.items())]
    assert len(hits) == 1, (name, labels, [k for k in samples if k[0] == name])
    return hits[0]


def json_spans(spans: list[tuple[str, float]], service: str = "json-svc", attr: bool = False, **resource: str) -> bytes:
    t0 = 1_764_000_000_000_000_000
    attrs = [{"key": "service.name", "value": {"stringValue": service}}]
    attrs += [{"key": k.replace("_", "."), "value": {"stringValue": v}} for k, v in resource.items()]
    out = []
    for i, (stage, d) in enumerate(spans):
        span = {"traceId": "5b8efff798038103d269b633813fc60c", "spanId": f"{i + 1:016x}", "kind": 1,
                "startTimeUnixNano": str(t0), "endTimeUnixNano": str(t0 + round(d * 1e9))}
        if attr:
            span["name"] = "work"
            span["attributes"] = [{"key": "triscope.stage", "value": {"stringValue": stage}}]
        else:
            span["name"] = stage
        out.append(span)
    return json.dumps({"resourceSpans": [{"resource": {"attributes": attrs},
                                          "scopeSpans": [{"scope": {"name": "t"}, "spans": out}]}]}).encode()


def test_sdk_spans_protobuf_gzip_become_the_stage_histogram(receiver: OtlpReceiver) -> None:
    tp = TracerProvider(resource=Resource.create({"service.name": "sdk-svc", "service.instance.id": "i-1",
                                                  "k8s.namespace.name": "ml", "k8s.pod.name": "infer-0"}))
    tp.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=url(receiver), compression=Compression.Gzip)))
    tracer = tp.get_tracer("test")
    t0 = time.time_ns()
    for n in range(3):
        for stage, d in STAGES.items():
            attrs = {"triscope.stage": stage} if stage == "preprocess" else {}
            name = "decode-and-resize" if stage == "preprocess" else stage.upper()   # names match case-blind
            s = tracer.start_span(name, start_time=t0 + n, attributes=attrs)
            s.end(end_time=t0 + n + round(d * (n + 1) * 1e9))
    s = tracer.start_span("http.request", start_time=t0)
    s.end(end_time=t0 + 1000)
    tp.shutdown()

    first = tick(receiver)
    # the series' first point is its baseline: 0, then the running totals from the next tick on
    assert value(first, "inference_stage_duration_seconds_count", stage="h2d") == 0
    got = tick(receiver)
    base = {"job": "sdk-svc", "instance": "i-1", "namespace": "ml", "pod": "infer-0", "container": "", "workload": ""}
    means = {}
    for stage, d in STAGES.items():
        assert value(got, "inference_stage_duration_seconds_count", stage=stage, **base) == 3
        total = value(got, "inference_stage_duration_seconds_sum", stage=stage, **base)
        assert total == pytest.approx(d * 6, abs=1e-9)           # d x (1 + 2 + 3)
        means[stage] = total / 3
        # cumulative buckets, as a Prometheus histogram: le="+Inf" is the count
        assert value(got, "inference_stage_duration_seconds_bucket", stage=stage, le="+Inf") == 3
        assert value(got, "inference_stage_duration_seconds_bucket", stage=stage, le="0.0001") == 0
    assert len([k for k in got if k[0] == "inference_stage_duration_seconds_bucket"]) == 4 * (len(STAGE_BUCKETS) + 1)
    assert value(got, "inference_stage_duration_seconds_bucket", stage="h2d", le="0.025") == 2   # 12 and 24 ms
    skew = stage_skew(means)
    assert skew is not None and skew.bottleneck == "compute"
    assert skew.bubble_fraction == pytest.approx(1 - sum(STAGES.values()) / (4 * STAGES["compute"]))
    assert value(got, "triscope_otlp_received_total", signal="traces") == 13
    assert value(got, "triscope_otlp_accepted_total", signal="traces") == 12
    assert value(got, "triscope_otlp_ignored_total", signal="traces", reason="no_stage") == 1
    assert value(got, "triscope_otlp_requests_total", signal="traces", code="200") == 13
    assert value(got, "triscope_otlp_series") == 4


def test_json_spans_over_http(receiver: OtlpReceiver) -> None:
    body = json_spans([("h2d", 0.010), ("h2d", 0.030), ("compute", 0.050)], service="api", k8s_pod_name="p-1")
    status, headers, answer = post(receiver, body, "application/json; charset=utf-8")
    assert status == 200 and headers["Content-Type"] == "application/json" and json.loads(answer) == {}
    body = json_spans([("d2h", 0.002)], service="api", attr=True, k8s_pod_name="p-1")
    status, _, _ = post(receiver, gzip.compress(body), encoding="gzip")
    assert status == 200
    status, _, _ = post(receiver, zlib.compress(body), encoding="deflate")
    assert status == 200
    tick(receiver)
    got = tick(receiver)
    assert value(got, "inference_stage_duration_seconds_count", stage="h2d", job="api", pod="p-1") == 2
    assert value(got, "inference_stage_duration_seconds_sum", stage="h2d", job="api") == pytest.approx(0.040)
    assert value(got, "inference_stage_duration_seconds_sum", stage="compute", job="api") == pytest.approx(0.050)
    assert value(got, "inference_stage_duration_seconds_count", stage="d2h", job="api") == 2
    assert value(got, "inference_stage_duration_seconds_sum", stage="d2h", job="api") == pytest.approx(0.004)
    # numbers where strings are expected are read too (receivers SHOULD accept both)
    doc = json.loads(json_spans([("h2d", 0.001)], service="api", k8s_pod_name="p-1"))
    span = doc["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    span["startTimeUnixNano"], span["endTimeUnixNano"] = int(span["startTimeUnixNano"]), int(span["endTimeUnixNano"])
    assert post(receiver, json.dumps(doc).encode())[0] == 200
    assert value(tick(receiver), "inference_stage_duration_seconds_count", stage="h2d", job="api") == 3


def test_bad_requests_get_a_status_and_a_message(receiver: OtlpReceiver) -> None:
    # protobuf: a length that runs past the end -> 400 with a google.rpc.Status in protobuf
    status, headers, body = post(receiver, b"\x0a\xff\xff\xff\xff\x0f", "application/x-protobuf")
    assert status == 400 and headers["Content-Type"] == "application/x-protobuf"
    st = status_pb2.Status.FromString(body)
    assert st.code == 3 and "malformed protobuf" in st.message
    # JSON: not JSON, and JSON of the wrong shape -> 400 with {"code", "message"}
    for bad in (b"{not json", b'{"resourceSpans": 5}', b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"name": 1}]}]}]}',
                b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"name": "h2d", "startTimeUnixNano": "x"}]}]}]}'):
        status, headers, body = post(receiver, bad)
        assert status == 400, bad
        err = json.loads(body)
        assert err["code"] == 3 and err["message"], bad
    # a corrupt gzip stream -> 400
    status, _, body = post(receiver, gzip.compress(json_spans([("h2d", 0.1)]))[:-12], encoding="gzip")
    assert status == 400 and b"decompress" in body
    # wrong content type, unknown encoding -> 415; other paths -> 404; GET -> 405
    assert post(receiver, b"{}", "text/plain")[0] == 415
    assert post(receiver, b"{}", "application/json", encoding="br")[0] == 415
    assert post(receiver, b"{}", path="/v1/logs")[0] == 404
    try:
        urllib.request.urlopen(url(receiver), timeout=5)
        raise AssertionError("GET answered")
    except urllib.error.HTTPError as e:
        assert e.code == 405
    # nothing of it became a series
    got = tick(receiver)
    assert not [k for k in got if k[0].startswith("inference_")]
    assert value(got, "triscope_otlp_requests_total", signal="traces", code="400") == 6


def test_oversized_bodies_and_gzip_bombs_get_413(receiver: OtlpReceiver) -> None:
    big = b"{" + b" " * (2 << 20) + b"}"
    status, _, body = post(receiver, big)
    assert status == 413 and b"too large" in body
    # 64 MiB of zeros in 64 KiB of gzip: decompression stops at the 1 MiB cap
    bomb = gzip.compress(b"0" * (64 << 20), compresslevel=9)
    assert len(bomb) < (1 << 20)
    t0 = time.monotonic()
    status, _, body = post(receiver, bomb, encoding="gzip")
    assert status == 413 and b"decompressed" in body
    assert time.monotonic() - t0 < 2.0
    # deflate too, and a body just under the cap is fine
    assert post(receiver, zlib.compress(b" " * (4 << 20)), encoding="deflate")[0] == 413
    ok = json_spans([("h2d", 0.001)])
    assert post(receiver, gzip.compress(ok + b" " * ((1 << 20) - len(ok) - 10)), encoding="gzip")[0] == 200


def test_a_flood_is_bounded_and_counted() -> None:
    opts = OtlpOptions(listen=("127.0.0.1", 0), max_items=100, max_series=4)
    with_r = OtlpReceiver(opts).start()
    try:
        body = json_spans([("h2d", 0.001)] * 60)
        assert json.loads(post(with_r, body)[2]) == {}
        status, _, answer = post(with_r, body)      # 40 of 60 taken
        partial = json.loads(answer)["partialSuccess"]
        assert status == 200 and partial["rejectedSpans"] == "20" and "buffer full" in partial["errorMessage"]
        status, headers, answer = post(with_r, body)    # nothing more until the next tick
        assert status == 429 and headers["Retry-After"] == "1" and json.loads(answer)["code"] == 8
        tick(with_r)
        got = tick(with_r)
        assert value(got, "inference_stage_duration_seconds_count", stage="h2d") == 100
        assert value(got, "triscope_otlp_dropped_total", signal="traces", reason="buffer_full") == 20
        assert value(got, "triscope_otlp_requests_total", signal="traces", code="429") == 1
        # the next tick opened a new interval: taken again; new series beyond max_series are dropped
        stages = json_spans([(f"s{i}", 0.001) for i in range(6)], attr=True)
        status, _, answer = post(with_r, stages)
        assert json.loads(answer)["partialSuccess"]["rejectedSpans"] == "3"   # h2d + 3 new, 3 refused
        got = tick(with_r)
        assert value(got, "triscope_otlp_series") == 4
        assert value(got, "triscope_otlp_dropped_total", signal="traces", reason="series_limit") == 3
        # protobuf answers carry partial_success too
        raw = urllib.request.Request(url(with_r), method="POST", headers={"Content-Type": "application/x-protobuf"},
                                     data=_pb_spans([f"s{i}" for i in range(6)]))
        with urllib.request.urlopen(raw, timeout=5) as resp:
            ps = ExportTraceServiceResponse.FromString(resp.read()).partial_success
        assert ps.rejected_spans == 3 and "series limit" in ps.error_message
    finally:
        with_r.shutdown()


def _pb_spans(stages: list[str]) -> bytes:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    kv = rs.resource.attributes.add()
    kv.key, kv.value.string_value = "service.name", "json-svc"   # the series the JSON spans made
    ss = rs.scope_spans.add()
    for st in stages:
        sp = ss.spans.add()
        sp.name, sp.start_time_unix_nano, sp.end_time_unix_nano = st, 1_000_000_000, 1_002_000_000
        a = sp.attributes.add()
        a.key, a.value.string_value = "triscope.stage", st
    return req.SerializeToString()


@pytest.mark.parametrize("temporality", ["delta", "cumulative"])
def test_sdk_histograms_with_a_stage_become_the_same_series(receiver: OtlpReceiver, temporality: str) -> None:
    pref = {Histogram: AggregationTemporality.DELTA if temporality == "delta" else AggregationTemporality.CUMULATIVE}
    exporter = OTLPMetricExporter(endpoint=url(receiver, "/v1/metrics"), compression=Compression.Gzip,
                                  preferred_temporality=pref)
    reader = PeriodicExportingMetricReader(exporter, export_interval_millis=3_600_000)
    mp = MeterProvider(metric_readers=[reader], resource=Resource.create({"service.name": "m-svc"}))
    meter = mp.get_meter("test")
    h = meter.create_histogram("inference.stage.duration", unit="ms")
    plain = meter.create_histogram("http.server.duration", unit="ms")
    gauge = meter.create_up_down_counter("queue.depth")
    for ms in (10, 20):
        h.record(ms, {"stage": "h2d", "model": "resnet"})
    h.record(50, {"stage": "compute", "model": "resnet"})
    plain.record(5)
    gauge.add(3)
    assert mp.force_flush()
    got0 = tick(receiver)
    h.record(30, {"stage": "h2d", "model": "resnet"})
    assert mp.force_flush()
    assert mp.force_flush()      # cumulative: the same totals again add nothing; delta: an empty report
    got = tick(receiver)
    mp.shutdown()
    labels = {"job": "m-svc", "model": "resnet"}
    if temporality == "delta":   # born at 0, then the totals
        assert value(got0, "inference_stage_duration_seconds_count", stage="h2d", **labels) == 0
    else:                        # born at the stream's totals (a first scrape's baseline)
        assert value(got0, "inference_stage_duration_seconds_count", stage="h2d", **labels) == 2
    assert value(got, "inference_stage_duration_seconds_count", stage="h2d", **labels) == 3
    assert value(got, "inference_stage_duration_seconds_sum", stage="h2d", **labels) == pytest.approx(0.060)
    assert value(got, "inference_stage_duration_seconds_sum", stage="compute", **labels) == pytest.approx(0.050)
    # the SDK's default boundaries (in ms) are scaled to seconds like the sums
    les = {dict(k[1])["le"] for k in got if k[0] == "inference_stage_duration_seconds_bucket"}
    assert {"0.025", "0.05", "+Inf"} <= les
    assert value(got, "inference_stage_duration_seconds_bucket", stage="h2d", le="0.025", **labels) == 2
    assert value(got, "triscope_otlp_ignored_total", signal="metrics", reason="no_stage") >= 1
    assert value(got, "triscope_otlp_ignored_total", signal="metrics", reason="unsupported_type") >= 1
    assert not [k for k in got if k[0].startswith("http_server")]


def test_self_metrics_are_in_the_catalogue(receiver: OtlpReceiver) -> None:
    from triscope.core.metrics import CATALOGUE

    post(receiver, json_spans([("h2d", 0.001), ("other", 0.001)]))
    post(receiver, b"{", "application/json")
    post(receiver, b"{}", path="/nowhere")
    seen = set()
    for s in receiver.collector.collect(time.time()):
        assert isinstance(s, Sample)
        if s.name.startswith("triscope_"):
            spec = CATALOGUE[s.name]
            assert spec.kind == s.kind and set(spec.labels) == set(s.labels), s
            seen.add(s.name)
    assert seen == {n for n in CATALOGUE if n.startswith("triscope_otlp_")} - {"triscope_otlp_dropped_total"}


def test_cumulative_streams_add_what_is_new() -> None:
    """Cumulative points: one stream per (series, start time); each adds its increase since its last
    report; a stream that started after the series existed adds its whole count; one older than the
    series is a baseline; a count that went down without a new start time is a conflict (another
    sender with the same identity and start time): dropped, never added."""
    from triscope.agent.otlp import StageSeries
    from triscope.agent.otlp_decode import TEMPORALITY_CUMULATIVE, Decoded, Group, Point

    now = [1_000.0]
    state = StageSeries(OtlpOptions(), clock=lambda: now[0])

    def send(start_ns: int, count: float, total: float) -> float:
        p = Point("x_seconds", "histogram", {"stage": "h2d"}, TEMPORALITY_CUMULATIVE, start_ns, count, total,
                  (0.1,), (count, 0.0))
        state.add("metrics", Decoded([Group({"service.name": "s"}, points=[p])], received=1), lambda r: {"job": "s"})
        now[0] += 1
        [c] = [s.value for s in state.samples() if s.name == "x_seconds_count"]
        return c

    born = int(1_000.0 * 1e9)
    assert send(100, 5, 0.5) == 5            # a new series starts at the stream's totals
    assert send(100, 8, 0.8) == 8            # +3
    assert send(born + 1, 2, 0.2) == 10      # a stream started after the series: all of it is new
    assert send(50, 100, 10.0) == 10         # an older stream joining: a baseline
    assert send(50, 104, 10.4) == 14         # +4
    assert send(100, 1, 0.1) == 14           # went down without a new start: dropped (stream_conflict)
    assert send(100, 9, 0.9) == 15           # +1 from the stream's last report (8)
    [b] = [s.value for s in state.samples() if s.name == "x_seconds_bucket" and s.labels["le"] == "0.1"]
    assert b == 15


def test_gzip_members_are_inflated_in_linear_time_and_capped(receiver: OtlpReceiver) -> None:
    """A body of ~200,000 empty gzip members (4 MiB) took 14-18 s to inflate, each member copying the
    rest of the body; now each member is read from an offset, and past MAX_GZIP_MEMBERS it is refused."""
    from triscope.agent.otlp import MAX_GZIP_MEMBERS, inflate

    empty = gzip.compress(b"")
    flood = empty * ((4 << 20) // len(empty))
    t0 = time.monotonic()
    with pytest.raises(zlib.error, match=f"more than {MAX_GZIP_MEMBERS} gzip members"):
        inflate(flood, "gzip", 1 << 20)
    assert time.monotonic() - t0 < 0.5
    status, _, body = post(receiver, flood[: (1 << 20) - 100], encoding="gzip")
    assert status == 400 and b"gzip members" in body
    # a few concatenated members are legal and decoded whole, in order
    spans = json_spans([("h2d", 0.001)])
    cut = len(spans) // 3
    parts = gzip.compress(spans[:cut]) + gzip.compress(spans[cut:2 * cut]) + gzip.compress(spans[2 * cut:])
    assert inflate(parts, "gzip", 1 << 20) == spans
    assert post(receiver, parts, encoding="gzip")[0] == 200
    # linear: 64 members of 64 KiB of data each (4 MiB out) inflate fast
    big = b"".join(gzip.compress(bytes([i]) * 65536, compresslevel=1) for i in range(MAX_GZIP_MEMBERS))
    t0 = time.monotonic()
    assert len(inflate(big, "gzip", 8 << 20)) == MAX_GZIP_MEMBERS * 65536
    assert time.monotonic() - t0 < 0.5
    with pytest.raises(zlib.error, match="truncated"):
        inflate(parts[:-5], "gzip", 1 << 20)
