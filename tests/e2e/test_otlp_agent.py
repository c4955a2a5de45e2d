"""OTLP in, end to end: the real ``triscope agent`` process with ``--otlp-listen`` and a SQLite
store, spans sent by the real OpenTelemetry SDK (BatchSpanProcessor, OTLP/HTTP protobuf, gzip) and
as OTLP JSON over plain HTTP, and a histogram by the SDK's metrics exporter; the stored
stage-duration series, the bubble fraction and ``triscope rca --ranked --json``'s stage view read back.  Then a flood (far more spans than the agent
takes per tick) while the tick must stay 1/s and the agent's memory bounded.  And: no port
without the flag, no non-loopback bind without --otlp-allow-remote.  Figures print with -s."""

from __future__ import annotations

import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from conftest import free_port
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.metrics import Histogram, MeterProvider
from opentelemetry.sdk.metrics.export import AggregationTemporality, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from triscope.analysis.stages import stage_metrics, stage_skew_from_store
from triscope.store import Store

pytestmark = [pytest.mark.slow]

TRISCOPE = [sys.executable, "-m", "triscope"]
NODE = "otlp-node"
METRIC = "inference_stage_duration_seconds"
SDK_STAGES = {"preprocess": [0.003, 0.005], "h2d": [0.010, 0.014, 0.012], "compute": [0.041, 0.039], "d2h": [0.004]}
JSON_STAGES = {"h2d": [0.020], "compute": [0.030, 0.050], "d2h": [0.006, 0.008]}
MAX_ITEMS = 20_000


@dataclass
class RunningAgent:
    proc: subprocess.Popen[str]
    db: str
    port: int
    otlp: int
    log: Path
    figures: dict[str, object] = field(default_factory=dict)

    def metrics(self) -> str:
        return urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5).read().decode()

    def value(self, prefix: str) -> float:
        return sum(float(ln.split()[-1]) for ln in self.metrics().splitlines() if ln.startswith(prefix))

    def wait(self, what: str, ok, timeout: float = 60.0) -> None:   # type: ignore[no-untyped-def]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"agent exited ({self.proc.returncode}): {self.log.read_text()}")
            try:
                if ok():
                    return
            except OSError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"timed out waiting for {what}: {self.log.read_text()[-3000:]}")

    def ticks(self) -> float:
        return self.value("triscope_ticks_total ")


def start(tmp: Path, *extra: str) -> tuple[subprocess.Popen[str], int, Path]:
    port = free_port()
    log = tmp / f"agent-{port}.log"
    cmd = [*TRISCOPE, "agent", "--db", f"sqlite:///{tmp / 'otlp.db'}", "--interval", "1", "--write-every", "1",
           "--node", NODE, "--listen", f"127.0.0.1:{port}", "--spool", str(tmp / "spool"), "--no-nvml", "--no-npu",
           "--no-ebpf", *extra]
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, text=True, cwd=tmp,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
    return proc, port, log


def listening_ports(pid: int) -> set[int]:
    """TCP ports a process listens on: its socket inodes matched with /proc/net/tcp{,6} LISTEN rows."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ports = set()
    for table in ("tcp", "tcp6"):
        with open(f"/proc/{pid}/net/{table}") as f:
            for line in list(f)[1:]:
                cols = line.split()
                if cols[3] == "0A" and cols[9] in inodes:
                    ports.add(int(cols[1].rsplit(":", 1)[1], 16))
    return ports


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def json_body(service: str, stages: dict[str, list[float]]) -> bytes:
    t0 = time.time_ns()
    spans = []
    for stage, durations in stages.items():
        for d in durations:
            spans.append({"traceId": "0af7651916cd43dd8448eb211c80319c", "spanId": f"{len(spans) + 1:016x}",
                          "name": stage, "kind": 1, "startTimeUnixNano": str(t0),
                          "endTimeUnixNano": str(t0 + round(d * 1e9))})
    return json.dumps({"resourceSpans": [{"resource": {"attributes": [
        {"key": "service.name", "value": {"stringValue": service}},
        {"key": "process.pid", "value": {"intValue": str(os.getpid())}}]},
        "scopeSpans": [{"scope": {"name": "test"}, "spans": spans}]}]}).encode()


def post(port: int, body: bytes) -> int:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/traces", data=body, method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            resp.read()
            return resp.status
    except urllib.error.HTTPError as e:
        return e.code


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningAgent]:
    tmp = tmp_path_factory.mktemp("otlp-agent")
    otlp = free_port()
    proc, port, log = start(tmp, "--otlp-listen", f"127.0.0.1:{otlp}", "--otlp-max-items", str(MAX_ITEMS))
    handle = RunningAgent(proc, f"sqlite:///{tmp / 'otlp.db'}", port, otlp, log)
    try:
        handle.wait("the first tick", lambda: handle.ticks() >= 1, timeout=90)
        yield handle
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        print("\notlp agent figures:", handle.figures)


def test_spans_from_the_sdk_and_json_become_stored_stage_series_that_analysis_reads(agent: RunningAgent) -> None:
    assert "OTLP/HTTP on http://127.0.0.1:" in agent.log.read_text()
    assert listening_ports(agent.proc.pid) == {agent.port, agent.otlp}
    t_start = time.time() - 1
    tp = TracerProvider(resource=Resource.create({"service.name": "sdk-svc", "service.instance.id": "sdk-1"}))
    tp.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=f"http://127.0.0.1:{agent.otlp}/v1/traces",
                                                              compression=Compression.Gzip)))
    tracer = tp.get_tracer("test")
    t0 = time.time_ns()
    for stage, durations in SDK_STAGES.items():
        for d in durations:
            span = tracer.start_span(stage, start_time=t0)
            span.end(end_time=t0 + round(d * 1e9))
    tracer.start_span("GET /infer", start_time=t0).end(end_time=t0 + 5_000_000)   # no stage: not counted
    tp.shutdown()   # the batch goes out now
    assert post(agent.otlp, json_body("json-svc", JSON_STAGES)) == 200
    n = sum(map(len, SDK_STAGES.values())) + sum(map(len, JSON_STAGES.values()))
    agent.wait("the spans to be taken", lambda: agent.value('triscope_otlp_accepted_total{signal="traces"}') >= n)
    seen = agent.ticks()
    agent.wait("two ticks written", lambda: agent.ticks() >= seen + 3)
    t_end = time.time()

    st = Store.open(agent.db)
    try:
        assert METRIC in stage_metrics(st, NODE)
        for job, stages in (("sdk-svc", SDK_STAGES), ("json-svc", JSON_STAGES)):
            for stage, durations in stages.items():
                [sums] = st.query(METRIC + "_sum", node=NODE, labels={"job": job, "stage": stage}, start=t_start,
                                  end=t_end, max_points=None, rate=False)
                [counts] = st.query(METRIC + "_count", node=NODE, labels={"job": job, "stage": stage}, start=t_start,
                                    end=t_end, max_points=None, rate=False)
                assert sums.values[0] == 0 and counts.values[0] == 0, (job, stage)   # born at 0 ...
                assert counts.values[-1] == len(durations), (job, stage, counts.values)
                assert sums.values[-1] == pytest.approx(sum(durations), abs=1e-6), (job, stage)
        # the JSON sender is this process: its pid named the workload through the agent's attribution
        [info] = [s.info for s in st.query(METRIC + "_count", node=NODE, labels={"job": "json-svc", "stage": "h2d"},
                                           start=t_start, end=t_end)]
        assert info.labels["workload"].startswith(("cmd:", "unit:")) or info.labels["pod"], info.labels
        # analysis over the window: per-stage means of both senders together, and the bubble fraction
        skew = stage_skew_from_store(st, NODE, t_start, t_end)
    finally:
        st.close()
    both = {k: SDK_STAGES.get(k, []) + JSON_STAGES.get(k, []) for k in SDK_STAGES}
    means = {k: sum(v) / len(v) for k, v in both.items()}
    assert skew is not None
    for stage, mean in means.items():
        assert skew.durations[stage] == pytest.approx(mean, rel=1e-6), stage
    bubble = 1 - sum(means.values()) / (len(means) * max(means.values()))
    assert skew.bottleneck == "compute" and skew.bubble_fraction == pytest.approx(bubble, rel=1e-6)
    agent.figures["bubble_fraction"] = round(skew.bubble_fraction, 4)

    # the root-cause command (its ranked view, which carries the stage section) shows the same
    out = subprocess.run([*TRISCOPE, "rca", "--db", agent.db, "--node", NODE, "--start", f"{t_start:.3f}",
                          "--end", f"{t_end:.3f}", "--ranked", "--json"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    view = json.loads(out.stdout)["stages"][METRIC]["window"]
    assert view["bottleneck"] == "compute" and view["bubble_fraction"] == pytest.approx(bubble, abs=1e-4)


def test_sdk_histograms_become_a_stage_metric_analysis_finds(agent: RunningAgent) -> None:
    t_start = time.time() - 1
    exporter = OTLPMetricExporter(endpoint=f"http://127.0.0.1:{agent.otlp}/v1/metrics", compression=Compression.Gzip,
                                  preferred_temporality={Histogram: AggregationTemporality.DELTA})
    reader = PeriodicExportingMetricReader(exporter, export_interval_millis=3_600_000)
    mp = MeterProvider(metric_readers=[reader], resource=Resource.create({"service.name": "meter-svc"}))
    h = mp.get_meter("test").create_histogram("pipeline.stage.latency", unit="ms")
    recorded = {"h2d": [8.0, 12.0], "compute": [30.0, 34.0, 32.0], "d2h": [2.0]}
    for stage, values in recorded.items():
        for v in values:
            h.record(v, {"stage": stage})
    assert mp.force_flush()
    mp.shutdown()
    agent.wait("the points to be taken", lambda: agent.value('triscope_otlp_accepted_total{signal="metrics"}') >= 3)
    seen = agent.ticks()
    agent.wait("two ticks written", lambda: agent.ticks() >= seen + 3)
    st = Store.open(agent.db)
    try:
        metric = "pipeline_stage_latency_seconds"
        assert metric in stage_metrics(st, NODE)
        skew = stage_skew_from_store(st, NODE, t_start, time.time(), metric=metric)
    finally:
        st.close()
    assert skew is not None and skew.bottleneck == "compute"
    for stage, values in recorded.items():
        assert skew.durations[stage] == pytest.approx(sum(values) / len(values) / 1000, rel=1e-6), stage


def test_reserved_label_names_reach_neither_metrics_nor_the_store(agent: RunningAgent) -> None:
    """A point with ``__name__`` among its attributes, one named like the agent's own metrics: the
    agent's /metrics stays readable by promtool and prometheus_client, the store holds no ``__`` label."""
    import shutil

    from prometheus_client.parser import text_string_to_metric_families

    t_start = time.time() - 1
    t0 = time.time_ns() - 10**9
    attrs = [{"key": k, "value": {"stringValue": v}} for k, v in
             (("stage", "h2d"), ("__name__", "up"), ("__address__", "x"), ("job", "evil"))]
    point = {"attributes": attrs, "startTimeUnixNano": str(t0), "timeUnixNano": str(t0 + 10**9), "count": "2",
             "sum": 0.3, "explicitBounds": [0.1], "bucketCounts": ["1", "1"]}
    metrics = [{"name": name, "unit": "s", "histogram": {"aggregationTemporality": 1, "dataPoints": [point]}}
               for name in ("triscope_stage", "reserved.check")]
    body = json.dumps({"resourceMetrics": [{"resource": {"attributes": [
        {"key": "service.name", "value": {"stringValue": "reserved-svc"}}]},
        "scopeMetrics": [{"metrics": metrics}]}]}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{agent.otlp}/v1/metrics", data=body, method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        assert json.loads(resp.read())["partialSuccess"]["rejectedDataPoints"] == "1"   # triscope_stage
    agent.wait("the reserved name counted",
               lambda: agent.value('triscope_otlp_dropped_total{reason="reserved_name",signal="metrics"}') >= 1)
    seen = agent.ticks()
    agent.wait("two ticks written", lambda: agent.ticks() >= seen + 3)
    text = agent.metrics()
    assert "triscope_stage" not in text
    assert not [ln for ln in text.splitlines() if "__name__=" in ln or "__address__=" in ln]
    promtool = shutil.which("promtool")
    assert promtool, "promtool missing: 'make test' installs Debian's prometheus package"
    res = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    assert [f for f in text_string_to_metric_families(text) if f.name == "triscope_otlp_ignored"]
    st = Store.open(agent.db)
    try:
        [series] = st.query("reserved_check_seconds_count", node=NODE, labels={"job": "reserved-svc"},
                            start=t_start, end=time.time(), max_points=None, rate=False)
        assert series.values[-1] == 2
    finally:
        st.close()
    assert series.info.labels["exported_job"] == "evil"
    assert not [k for k in series.info.labels if k.startswith("__")], series.info.labels


def test_a_flood_keeps_the_tick_and_memory_bounded_then_sigterm_writes_it_all(agent: RunningAgent) -> None:
    stages = {"preprocess": [0.001] * 1100, "h2d": [0.002] * 1100, "compute": [0.003] * 1100, "d2h": [0.001] * 1100}
    body = json_body("flood-svc", stages)    # 4,400 stage spans (~1 MB): the 5th request of a tick is taken in part
    pid = agent.proc.pid
    rss_before = rss_bytes(pid)
    codes: dict[int, int] = {}
    stop = threading.Event()

    def flood() -> None:
        while not stop.is_set():
            c = post(agent.otlp, body)
            codes[c] = codes.get(c, 0) + 1

    senders = [threading.Thread(target=flood, daemon=True) for _ in range(2)]
    f0 = time.time()
    for t in senders:
        t.start()
    rss_max = rss_before
    while time.time() - f0 < 15:
        rss_max = max(rss_max, rss_bytes(pid))
        time.sleep(0.2)
    stop.set()
    for t in senders:
        t.join(15)
    f1 = time.time()
    time.sleep(1.5)
    dropped = agent.value('triscope_otlp_dropped_total{reason="buffer_full",signal="traces"}')
    throttled = agent.value('triscope_otlp_requests_total{code="429",signal="traces"}')
    accepted = agent.value('triscope_otlp_accepted_total{signal="traces"}')
    rss_after = rss_bytes(pid)
    agent.figures.update(flood_s=round(f1 - f0, 1), flood_requests=codes, spans_accepted=accepted,
                         spans_dropped_buffer_full=dropped, rss_before_mib=round(rss_before / 2**20, 1),
                         rss_max_mib=round(rss_max / 2**20, 1), rss_after_mib=round(rss_after / 2**20, 1))
    assert codes.get(200, 0) > 0 and codes.get(429, 0) > 0 and set(codes) <= {200, 429}, codes
    assert dropped > 0 and throttled > 0
    assert rss_max - rss_before < 48 << 20, agent.figures   # bodies in flight + one decode, not the flood

    agent.proc.send_signal(signal.SIGTERM)
    assert agent.proc.wait(timeout=15) == 0
    text = agent.log.read_text()
    assert "Traceback" not in text, text
    st = Store.open(agent.db)
    try:
        [ticks] = st.query("triscope_ticks_total", node=NODE, start=f0 - 1, end=f1 + 1, max_points=None, rate=False)
        [tick_s] = st.query("triscope_tick_duration_seconds", node=NODE, start=f0, end=f1, max_points=None)
        [h2d] = st.query(METRIC + "_count", node=NODE, labels={"job": "flood-svc", "stage": "h2d"}, start=0,
                         end=time.time() + 10, max_points=None, rate=False)
    finally:
        st.close()
    gaps = [b - a for a, b in zip(ticks.ts, ticks.ts[1:], strict=False)]
    rate = (len(ticks.ts) - 1) / (ticks.ts[-1] - ticks.ts[0])
    agent.figures.update(ticks_per_s=round(rate, 4), tick_gap_max_s=round(max(gaps), 3),
                         tick_gap_median_s=round(statistics.median(gaps), 4),
                         tick_duration_max_ms=round(1000 * max(tick_s.values), 1),
                         tick_duration_median_ms=round(1000 * statistics.median(tick_s.values), 1))
    print("\notlp flood figures:", agent.figures)
    assert 0.95 <= rate <= 1.05, (rate, gaps)
    assert max(gaps) < 2.5 and sum(g > 1.5 for g in gaps) <= 1, gaps
    # no more than the cap was taken per tick, and what was taken is stored
    per_tick = [b - a for a, b in zip(h2d.values, h2d.values[1:], strict=False)]
    assert max(per_tick) <= MAX_ITEMS and h2d.values[-1] > 0


def test_off_by_default_loopback_only_and_a_busy_port_is_an_error(tmp_path: Path) -> None:
    help_text = subprocess.run([*TRISCOPE, "agent", "--help"], capture_output=True, text=True, timeout=60).stdout
    assert "--otlp-listen" in help_text and "--otlp-allow-remote" in help_text
    db = f"sqlite:///{tmp_path / 'refused.db'}"
    r = subprocess.run([*TRISCOPE, "agent", "--db", db, "--duration", "1", "--otlp-listen", "0.0.0.0:4318"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "--otlp-allow-remote" in r.stderr and "Traceback" not in r.stderr, r.stderr
    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        r = subprocess.run([*TRISCOPE, "agent", "--db", db, "--duration", "1", "--listen", "off", "--no-nvml",
                            "--no-npu", "--no-ebpf", "--spool", str(tmp_path / "spool"),
                            "--otlp-listen", f"127.0.0.1:{port}"], capture_output=True, text=True, timeout=60,
                           cwd=tmp_path)
    assert r.returncode != 0 and "for OTLP" in r.stderr and "Traceback" not in r.stderr, r.stderr
    # without the flag the agent listens on /metrics only
    proc, mport, log = start(tmp_path, "--duration", "20")
    try:
        handle = RunningAgent(proc, db, mport, 0, log)
        handle.wait("the first tick", lambda: handle.ticks() >= 1, timeout=90)
        assert listening_ports(proc.pid) == {mport}
        assert "OTLP" not in log.read_text()
    finally:
        proc.kill()
        proc.wait(10)
