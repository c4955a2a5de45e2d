"""What the OTLP receiver refuses or repairs so that its series stay sound: label names Prometheus
would reject (``__name__`` ...), metric names that would collide with the agent's own, cumulative
streams it cannot tell apart, points beyond the stream cap, inconsistent histograms, absurd span
durations.  The receiver on a real socket (agent/otlp.py), /metrics through the exporter's own
renderer, checked by the real ``promtool`` and prometheus_client's parser."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from triscope.agent.exporter import TickCollector, render_text
from triscope.agent.otlp import OtlpOptions, OtlpReceiver, StageSeries
from triscope.agent.otlp_decode import TEMPORALITY_CUMULATIVE, Decoded, Group, Point
from triscope.core.samples import Sample

T0 = 1_764_000_000_000_000_000


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    r = OtlpReceiver(OtlpOptions(listen=("127.0.0.1", 0), max_items=100_000, max_series=64)).start()
    try:
        yield r
    finally:
        r.shutdown()


def post_json(r: OtlpReceiver, doc: dict[str, Any], path: str = "/v1/metrics") -> dict[str, Any]:
    req = urllib.request.Request(f"http://127.0.0.1:{r.address[1]}{path}", data=json.dumps(doc).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(req, timeout=10) as resp:
        assert resp.status == 200
        out: dict[str, Any] = json.loads(resp.read())
        return out


def attr(key: str, value: str) -> dict[str, Any]:
    return {"key": key, "value": {"stringValue": value}}


def histogram(name: str, points: list[dict[str, Any]], service: str = "svc", temporality: int = 1,
              **resource: str) -> dict[str, Any]:
    res = [attr("service.name", service)] + [attr(k.replace("_", "."), v) for k, v in resource.items()]
    return {"resourceMetrics": [{"resource": {"attributes": res}, "scopeMetrics": [{"metrics": [
        {"name": name, "unit": "s", "histogram": {"aggregationTemporality": temporality, "dataPoints": points}}]}]}]}


def hpoint(count: int, total: float, bounds: list[float], buckets: list[int], start: int = T0,
           **attrs: str) -> dict[str, Any]:
    return {"attributes": [attr("stage", "h2d")] + [attr(k, v) for k, v in attrs.items()],
            "startTimeUnixNano": str(start), "timeUnixNano": str(T0 + 10**9), "count": str(count), "sum": total,
            "explicitBounds": bounds, "bucketCounts": [str(b) for b in buckets]}


def samples(r: OtlpReceiver | StageSeries) -> list[Sample]:
    state = r.state if isinstance(r, OtlpReceiver) else r
    return state.samples()


def value(got: list[Sample], name: str, **labels: str) -> float:
    hits = [s.value for s in got if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(hits) == 1, (name, labels, [s for s in got if s.name == name])
    return hits[0]


# -- 1. label names -----------------------------------------------------------------------------------

def test_reserved_and_double_underscore_attributes_never_become_labels(receiver: OtlpReceiver) -> None:
    bad = {"__name__": "up", "__scheme__": "https", "..hidden": "x", "job": "evil", "le": "1", "9lives": "y",
           "model.name": "resnet"}
    for metric in ("triscope_stage_seconds", "stage.latency"):
        post_json(receiver, histogram(metric, [hpoint(2, 0.3, [0.1], [1, 1], **bad)]))
    spans = {"resourceSpans": [{"resource": {"attributes": [attr("service.name", "svc")]}, "scopeSpans": [{"spans": [
        {"name": "h2d", "startTimeUnixNano": str(T0), "endTimeUnixNano": str(T0 + 10**6),
         "attributes": [attr("__name__", "up"), attr("triscope.stage", "h2d")]}]}]}]}
    post_json(receiver, spans, "/v1/traces")
    samples(receiver)
    got = samples(receiver)
    names = {n for s in got for n in s.labels}
    assert not [n for n in names if n.startswith("__")], names
    assert {"exported_job", "exported_le", "key_9lives", "model_name"} <= names
    assert value(got, "stage_latency_seconds_count", exported_job="evil", job="svc") == 2
    # a metric named like the agent's own is not the receiver's to feed: it would land on /metrics
    assert not [s for s in got if s.name.startswith("triscope_stage")]
    assert value(got, "triscope_otlp_dropped_total", signal="metrics", reason="reserved_name") == 1
    # three attributes (__name__, __scheme__, ..hidden -> __hidden) of each of the two points (attributes
    # are read before the metric's name is judged)
    assert value(got, "triscope_otlp_ignored_total", signal="metrics", reason="reserved_label") == 6

    # /metrics as the agent serves it: the tick's samples through the exporter's TickCollector (it keeps
    # the triscope_* ones: before, a point named triscope_* brought its __name__ label there)
    tick = TickCollector()
    tick.update(got)
    text = render_text(tick.samples()).decode()
    assert "triscope_otlp_series" in text
    assert not re.search(r"[{,]__\w*=", text), text
    promtool = shutil.which("promtool")
    assert promtool, "promtool missing: 'make test' installs Debian's prometheus package"
    res = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    from prometheus_client.parser import text_string_to_metric_families

    parsed = [s for f in text_string_to_metric_families(text) for s in f.samples]
    assert parsed and not [s for s in parsed if any(k.startswith("__") for k in s.labels)]


def test_every_label_name_a_point_can_produce_is_valid() -> None:
    from triscope.agent.otlp_decode import label_name

    ok = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
    for key in ("__name__", "_", "__", "a.b", "é", "", "9", "x" * 200, "_x", "le", "é__"):
        name = label_name(key)
        assert name is None or (ok.match(name) and not name.startswith("__")), (key, name)
    assert label_name("__name__") is None and label_name("..x") is None and label_name("_x") == "_x"


# -- 2. cumulative streams ------------------------------------------------------------------------------

def _two_senders(state: StageSeries, res_a: dict[str, str], res_b: dict[str, str], start_a: int, start_b: int,
                 ) -> tuple[float, list[tuple[int, str]]]:
    """Two processes, 750 requests each, reporting cumulative counts in turns; B lags A by 5."""
    answers = []
    for k in range(76):
        for res, start, n in ((res_a, start_a, 10 * k), (res_b, start_b, max(0, 10 * k - 5))):
            p = Point("x_seconds", "histogram", {"stage": "h2d"}, TEMPORALITY_CUMULATIVE, start, float(n),
                      n * 0.01, (0.1,), (float(n), 0.0))
            answers.append(state.add("metrics", Decoded([Group(res, points=[p])], received=1),
                                     lambda r: {"job": "s"}))
    got = state.samples()
    counts = [s.value for s in got if s.name == "x_seconds_count"]
    return (counts[0] if counts else 0.0), answers


def test_two_senders_that_cannot_be_told_apart_are_not_overcounted() -> None:
    truth = 750 + 745
    # told apart by service.instance.id, by process.pid, or by their start times: exact
    for res_b, start_b in (({"service.name": "s", "service.instance.id": "b"}, T0),
                           ({"service.name": "s", "process.pid": "4242"}, T0), ({"service.name": "s"}, T0 + 7)):
        res_a = {"service.name": "s", "service.instance.id": "a"} if "service.instance.id" in res_b else \
            {"service.name": "s", "process.pid": "4241"} if "process.pid" in res_b else {"service.name": "s"}
        count, answers = _two_senders(StageSeries(OtlpOptions()), res_a, res_b, T0, start_b)
        assert count == truth, (res_b, start_b)
        assert not any(n for n, _ in answers)
    # the same resource and the same start time: the series follows one of them, never more than the truth;
    # what could not be placed is dropped and said so
    state = StageSeries(OtlpOptions())
    count, answers = _two_senders(state, {"service.name": "s"}, {"service.name": "s"}, T0, T0)
    assert 745 <= count <= truth
    got = state.samples()
    conflicts = value(got, "triscope_otlp_dropped_total", signal="metrics", reason="stream_conflict")
    assert conflicts >= 70 and sum(n for n, _ in answers) == conflicts
    assert any("stream conflict" in why for _, why in answers)
    # no start time: a restart cannot be told from another sender, so such points are refused
    state = StageSeries(OtlpOptions())
    count, answers = _two_senders(state, {"service.name": "s"}, {"service.name": "s"}, 0, 0)
    assert count == 0 and sum(n for n, _ in answers) == 152
    got = state.samples()
    assert value(got, "triscope_otlp_dropped_total", signal="metrics", reason="no_start_time") == 152
    assert value(got, "triscope_otlp_accepted_total", signal="metrics") == 0


def test_a_restart_is_a_new_start_time_and_counts_from_zero() -> None:
    state = StageSeries(OtlpOptions(), clock=lambda: 1_000.0)     # the series is born at t=1000 s
    out = []
    for start, n in ((500 * 10**9, 5), (500 * 10**9, 9), (2_000 * 10**9, 2), (2_000 * 10**9, 3)):
        p = Point("x_seconds", "histogram", {"stage": "h2d"}, TEMPORALITY_CUMULATIVE, start, float(n), n * 1.0,
                  (0.1,), (float(n), 0.0))
        state.add("metrics", Decoded([Group({"service.name": "s"}, points=[p])], received=1), lambda r: {"job": "s"})
        out.append(value(state.samples(), "x_seconds_count"))
    # born at the first stream's totals; the restart (a later start time) adds all it counted since
    assert out == [5, 9, 11, 12]


# -- 3. the stream cap ----------------------------------------------------------------------------------

def test_points_beyond_the_stream_cap_are_dropped_and_reported_then_idle_streams_make_room() -> None:
    state = StageSeries(OtlpOptions(max_series=2), clock=lambda: 1.0)     # 8 streams; a series older than them

    def send(starts: list[int], n: float = 1.0) -> tuple[int, str]:
        pts = [Point("x_seconds", "histogram", {"stage": "h2d"}, TEMPORALITY_CUMULATIVE, st, n, 0.5, (0.1,),
                     (0.0, n)) for st in starts]
        return state.add("metrics", Decoded([Group({"service.name": "s"}, points=pts)], received=len(pts)),
                         lambda r: {"job": "s"})
    rejected, why = send([T0 + i for i in range(10)])
    assert rejected == 2 and "2 stream limit" in why
    got = state.samples()
    assert value(got, "triscope_otlp_dropped_total", signal="metrics", reason="stream_limit") == 2
    assert value(got, "triscope_otlp_accepted_total", signal="metrics") == 8
    # the next interval: streams not updated since the last tick make way (least recently updated first)
    assert value(got, "x_seconds_count") == 8
    rejected, why = send([T0 + 100, T0 + 101])
    assert rejected == 0, why
    got = state.samples()
    assert value(got, "triscope_otlp_accepted_total", signal="metrics") == 10
    assert value(got, "x_seconds_count") == 10
    # a forgotten stream that reports again is a baseline: its past is not counted twice
    assert send([T0], n=5.0) == (0, "")
    assert send([T0], n=7.0) == (0, "")
    assert value(state.samples(), "x_seconds_count") == 12


# -- 4. input validation --------------------------------------------------------------------------------

def test_inconsistent_histogram_points_are_refused(receiver: OtlpReceiver) -> None:
    ok = hpoint(2, 0.3, [0.1, 1.0], [1, 1, 0])
    post_json(receiver, histogram("lat", [ok]))
    answer = post_json(receiver, histogram("lat", [
        hpoint(3, 0.3, [0.1, 1.0], [5, -1, -1]),    # negative bucket counts
        hpoint(3, 0.3, [0.1, 1.0], [1, 1, 0]),      # buckets that do not add up to the count
        hpoint(4, 0.3, [0.2, 2.0], [1, 1, 2]),      # other boundaries than the series'
        ok]))
    assert answer["partialSuccess"]["rejectedDataPoints"] == "3"
    samples(receiver)
    got = samples(receiver)
    assert value(got, "lat_seconds_count") == 4 == value(got, "lat_seconds_bucket", le="+Inf")
    assert value(got, "lat_seconds_bucket", le="0.1") == 2
    assert value(got, "triscope_otlp_dropped_total", signal="metrics", reason="invalid") == 2
    assert value(got, "triscope_otlp_dropped_total", signal="metrics", reason="bounds_mismatch") == 1


def test_span_durations_are_bounded(receiver: OtlpReceiver) -> None:
    spans = [(0, 10**6), (0, 3601 * 10**9), (0, 400 * 86400 * 10**9), (10**6, 0)]
    doc = {"resourceSpans": [{"resource": {"attributes": [attr("service.name", "svc")]}, "scopeSpans": [{"spans": [
        {"name": "h2d", "startTimeUnixNano": str(T0 + a), "endTimeUnixNano": str(T0 + b)} for a, b in spans]}]}]}
    answer = post_json(receiver, doc, "/v1/traces")
    assert answer["partialSuccess"]["rejectedSpans"] == "3"
    samples(receiver)
    got = samples(receiver)
    assert value(got, "inference_stage_duration_seconds_count", stage="h2d") == 1
    assert value(got, "inference_stage_duration_seconds_sum", stage="h2d") == pytest.approx(0.001)
    assert value(got, "triscope_otlp_dropped_total", signal="traces", reason="too_long") == 2
    assert value(got, "triscope_otlp_dropped_total", signal="traces", reason="invalid") == 1


def test_self_metric_reasons_are_documented() -> None:
    from triscope.core.metrics import CATALOGUE

    text = CATALOGUE["triscope_otlp_dropped_total"].help + CATALOGUE["triscope_otlp_ignored_total"].help
    for reason in ("stream_limit", "stream_conflict", "no_start_time", "bounds_mismatch", "too_long",
                   "reserved_name", "reserved_label"):
        assert reason in text, reason
    _ = time


# -- 5. work under the lock -----------------------------------------------------------------------------

def test_a_large_request_is_applied_per_series_and_stream_under_the_lock() -> None:
    """50,000 points on 200 series (delta) and 200 streams (cumulative): the lock sees one update a
    series or stream, not one a point (measured: 40 ms / 100 ms held before, 0.3 / 0.7 ms after)."""
    from triscope.agent.otlp_decode import TEMPORALITY_DELTA

    for temporality in (TEMPORALITY_DELTA, TEMPORALITY_CUMULATIVE):
        state = StageSeries(OtlpOptions(max_items=100_000, max_series=256), clock=lambda: 1.0)
        calls = [0]
        inner = state._get

        def counted(*args: Any, _inner: Any = inner, calls: list[int] = calls) -> Any:
            calls[0] += 1
            return _inner(*args)

        state._get = counted   # type: ignore[method-assign]
        pts = [Point("x_seconds", "histogram", {"stage": f"s{i % 200}"}, temporality, T0,
                     float(1 + i // 200), 0.01, (0.1,), (float(1 + i // 200), 0.0)) for i in range(50_000)]
        assert state.add("metrics", Decoded([Group({"service.name": "s"}, points=pts)], received=50_000),
                         lambda r: {"job": "s"}) == (0, "")
        assert calls[0] == 200, temporality
        got = state.samples()
        if temporality == TEMPORALITY_DELTA:   # born at 0, then the totals
            got = state.samples()
        want = 250 * 251 / 2 if temporality == TEMPORALITY_DELTA else 250.0
        assert value(got, "x_seconds_count", stage="s7") == want


# -- bounded by construction ---------------------------------------------------------------------------

def test_a_histogram_point_with_too_many_buckets_is_refused_not_made_into_series(receiver: OtlpReceiver) -> None:
    """One point of 100,000 buckets was 100,000 series written every tick (the agent grew past 1.7 GB
    in two minutes).  Refused with its reason in the partial success; a normal point beside it is kept."""
    from triscope.agent.otlp_decode import MAX_BOUNDS

    n = 100_000
    huge = hpoint(n, 1.0, [i * 1e-6 for i in range(n)], [1] * n + [0], model="huge")
    ok = hpoint(2, 0.3, [0.1, 1.0], [1, 1, 0], model="ok")
    edge = hpoint(1, 0.1, [i * 1e-3 for i in range(MAX_BOUNDS)], [1] + [0] * MAX_BOUNDS, model="edge")
    out = post_json(receiver, histogram("stage.latency", [huge, ok, edge]))
    assert out["partialSuccess"]["rejectedDataPoints"] == "1" or out["partialSuccess"]["rejectedDataPoints"] == 1
    assert "too many buckets" in out["partialSuccess"]["errorMessage"]
    got = samples(receiver)
    assert not any(s.labels.get("model") == "huge" for s in got)
    assert any(s.labels.get("model") == "ok" for s in got) and any(s.labels.get("model") == "edge" for s in got)
    assert len(got) < 200
    assert value(got, "triscope_otlp_dropped_total", signal="metrics", reason="too_many_buckets") == 1


def test_a_nan_or_infinite_point_is_refused_and_the_series_goes_on(receiver: OtlpReceiver) -> None:
    """A NaN or infinite counter point used to poison its cumulative stream for good (accepted with
    200, every later valid point refused as older).  Refused per point, with its reason; the valid
    points around it are stored."""

    def counter(value: Any, t: int) -> dict[str, Any]:
        return {"resourceMetrics": [{"resource": {"attributes": [attr("service.name", "svc")]}, "scopeMetrics": [{
            "metrics": [{"name": "stage.items", "unit": "1", "sum": {
                "aggregationTemporality": 2, "isMonotonic": True, "dataPoints": [{
                    "attributes": [attr("stage", "h2d")], "startTimeUnixNano": str(T0),
                    "timeUnixNano": str(T0 + t * 10**9), "asDouble": value}]}}]}]}]}

    assert "rejectedDataPoints" not in post_json(receiver, counter(5.0, 1)).get("partialSuccess", {})
    for bad in ("NaN", "Infinity", "-Infinity"):
        out = post_json(receiver, counter(bad, 2))
        assert str(out["partialSuccess"]["rejectedDataPoints"]) == "1" and "not finite" in out["partialSuccess"]["errorMessage"]
    out = post_json(receiver, counter(9.0, 3))
    assert "rejectedDataPoints" not in out.get("partialSuccess", {}), out
    got = samples(receiver)
    assert value(got, "stage_items_total") == 9.0                       # the stream goes on
    assert value(got, "triscope_otlp_dropped_total", signal="metrics", reason="not_finite") == 3
