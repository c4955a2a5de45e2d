"""The agent's /metrics output passes the real promtool."""

from __future__ import annotations

import shutil
import subprocess
import urllib.request

import pytest

from triscope.agent.exporter import ProcessMetrics, make_sources, render_text, serve
from triscope.core.metrics import CATALOGUE
from triscope.core.samples import Sample

pytestmark = pytest.mark.prometheus


def _render(samples: list[Sample]) -> str:
    process, tick = make_sources()
    tick.update(samples)
    return (render_text(tick.samples()) + process.render()).decode()


def test_catalogue_follows_conventions() -> None:
    for name, spec in CATALOGUE.items():
        assert name.startswith("triscope_"), name
        assert (spec.kind == "counter") == name.endswith("_total"), name
        assert spec.help, name


def test_promtool_accepts_exporter_output() -> None:
    promtool = shutil.which("promtool")
    assert promtool, "promtool missing: 'make test' installs Debian's prometheus package"
    samples = [Sample(name, 1.0, {k: "x" for k in spec.labels}, spec.kind) for name, spec in CATALOGUE.items()]
    samples.append(Sample("app_requests_total", 3.0, {}, "counter"))  # scraped app metric: not re-exported
    text = _render(samples)
    assert "app_requests_total" not in text
    assert "triscope_process_resident_memory_bytes" in text
    res = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


def test_served_over_http(unused_port: int) -> None:
    process, tick = make_sources()
    tick.update([Sample("triscope_tcp_retransmits_total", 7.0, kind="counter")])
    server, _thread = serve(process, "127.0.0.1", unused_port, tick)
    try:
        body = urllib.request.urlopen(f"http://127.0.0.1:{unused_port}/metrics", timeout=5).read().decode()
    finally:
        server.shutdown()
    assert "triscope_tcp_retransmits_total 7.0" in body


def test_rendering_matches_the_client_library() -> None:
    """Our fast renderer and prometheus_client agree on every value, label and type."""
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    process, tick = make_sources()
    samples = [Sample("triscope_tcp_sockets", 3.0, {"state": 'we"ird\\x\nline'}),
               Sample("triscope_tcp_retransmits_total", 12.0, kind="counter"),
               Sample("triscope_gpu_sm_active_ratio", 0.25, {"gpu": "0"}),
               Sample("triscope_gpu_sm_active_ratio", 0.75, {"gpu": "1"})]
    tick.update(samples)
    ours = {(s.name, tuple(sorted(s.labels.items())), s.value, f.type)
            for f in text_string_to_metric_families(render_text(tick.samples()).decode()) for s in f.samples}
    from prometheus_client import CollectorRegistry

    ref_reg = CollectorRegistry()
    ref_reg.register(_ClientLibraryReference(samples))
    ref = {(s.name, tuple(sorted(s.labels.items())), s.value, f.type)
           for f in text_string_to_metric_families(generate_latest(ref_reg).decode()) for s in f.samples
           if not s.name.endswith("_created")}
    assert ours == ref


def test_process_metrics_match_the_client_library() -> None:
    """The hand-written process block parses to the same families, types and (moving) values as
    prometheus_client's rendering of the same collector."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    pm = ProcessMetrics()
    reg = CollectorRegistry(auto_describe=False)
    reg.register(pm)

    def parsed(text: bytes) -> dict[str, tuple[str, str, float]]:
        return {s.name: (f.type, f.documentation, s.value)
                for f in text_string_to_metric_families(text.decode()) for s in f.samples}

    ours, ref = parsed(pm.render()), parsed(generate_latest(reg))
    assert set(ours) == set(ref) == {"triscope_process_cpu_seconds_total", "triscope_process_virtual_memory_bytes",
                                      "triscope_process_resident_memory_bytes", "triscope_process_start_time_seconds"}
    for name in ours:
        assert ours[name][:2] == ref[name][:2], name
        assert ours[name][2] == pytest.approx(ref[name][2], rel=0.05, abs=0.05), name   # read a moment apart
    assert ours["triscope_process_resident_memory_bytes"][2] > 1e6
    assert ours["triscope_process_start_time_seconds"][2] == ref["triscope_process_start_time_seconds"][2]


class _ClientLibraryReference:
    """The same samples rendered through prometheus_client's own metric families (the oracle)."""

    def __init__(self, samples: list[Sample]) -> None:
        self.samples = samples

    def collect(self):  # type: ignore[no-untyped-def]
        from collections import defaultdict

        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        by_name: dict[str, list[Sample]] = defaultdict(list)
        for smp in self.samples:
            by_name[smp.name].append(smp)
        for name, group in sorted(by_name.items()):
            spec = CATALOGUE[name]
            labels = sorted({k for smp in group for k in smp.labels})
            fam = (CounterMetricFamily(name[: -len("_total")], spec.help, labels=labels) if spec.kind == "counter"
                   else GaugeMetricFamily(name, spec.help, labels=labels))
            for smp in group:
                fam.add_metric([str(smp.labels.get(k, "")) for k in labels], float(smp.value))
            yield fam


def test_http_answers_bad_requests_and_stops(unused_port: int) -> None:
    """Wrong path 404, wrong method 405, garbage 400, HEAD has headers only; shutdown ends the thread."""
    import socket
    import urllib.error

    process, tick = make_sources()
    tick.update([Sample("triscope_ticks_total", 3.0, kind="counter")])
    server, thread = serve(process, "127.0.0.1", unused_port, tick)
    base = f"http://127.0.0.1:{unused_port}"
    try:
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(f"{base}/nope", timeout=5)
        assert e.value.code == 404
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(urllib.request.Request(f"{base}/metrics", data=b"x", method="POST"), timeout=5)
        assert e.value.code == 405
        with socket.create_connection(("127.0.0.1", unused_port), timeout=5) as s:
            s.sendall(b"hello\r\n\r\n")
            assert s.recv(100).startswith(b"HTTP/1.1 400")
        head = urllib.request.urlopen(urllib.request.Request(f"{base}/metrics", method="HEAD"), timeout=5)
        assert int(head.headers["Content-Length"]) > 0 and head.read() == b""
        body = urllib.request.urlopen(f"{base}/metrics?x=1", timeout=5).read().decode()
        assert "triscope_ticks_total 3.0" in body and "triscope_process_cpu_seconds_total" in body
    finally:
        server.shutdown()
    thread.join(5)
    assert not thread.is_alive()


def test_rendered_at_the_tick_only_when_scraped_about_as_often(unused_port: int) -> None:
    """Scraped once per tick, the body is rendered at the tick (the scrape sends it as is); scraped
    less often, nothing is rendered until a scrape asks."""
    process, tick = make_sources()
    server, _thread = serve(process, "127.0.0.1", unused_port, tick, max_age=10.0)
    url = f"http://127.0.0.1:{unused_port}/metrics"
    try:
        tick.update([Sample("triscope_ticks_total", 1.0, kind="counter")])
        assert not server.prerender(1.0)          # never scraped: no render ahead of a scrape
        urllib.request.urlopen(url, timeout=5).read()
        urllib.request.urlopen(url, timeout=5).read()
        assert server.scrape_gap is not None and server.scrape_gap < 1.0
        tick.update([Sample("triscope_ticks_total", 2.0, kind="counter")])
        assert server.prerender(1.0)
        rendered = server._cache
        body = urllib.request.urlopen(url, timeout=5).read().decode()
        assert server._cache is rendered          # the scrape sent the body rendered at the tick
        assert "triscope_ticks_total 2.0" in body
        server._last_scrape = (server._last_scrape or 0.0) - 10.0   # the fast scraper went away
        assert not server.prerender(1.0)
        server.scrape_gap = 15.0                  # Prometheus every 15 s against 1 s ticks
        tick.update([Sample("triscope_ticks_total", 3.0, kind="counter")])
        assert not server.prerender(1.0)
        assert "triscope_ticks_total 3.0" in urllib.request.urlopen(url, timeout=5).read().decode()
    finally:
        server.shutdown()
