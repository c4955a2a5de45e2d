"""Episodes, noise floors, throttle bits and SLO burn periods: the pure parts of the root-cause
timeline, on hand-built points (the store-backed tests are in test_analysis_rca_timeline.py)."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from tests.state_series import stored_state_samples
from triscope.analysis.episodes import (
    MIN_EPISODE_S,
    health_episodes,
    merge_flickers,
    min_episode_s,
    state_runs,
)
from triscope.analysis.rca.noise import (
    agent_trouble,
    is_agent_metric,
    never_a_cause,
    noise_floor,
    throttle_faults,
)
from triscope.analysis.rca.reference import pod_stem, workload_key
from triscope.analysis.rca.slo import slo_burn_episodes
from triscope.analysis.reader import SeriesPoints
from triscope.analysis.slo import parse_slo_text
from triscope.core.verdict import Verdict
from triscope.store.reader import EventRow


def below_floor(effect: float, metric: str, labels: Mapping[str, str], kind: str = "gauge") -> bool:
    """True when a change of ``effect`` (in the series' unit) is within its noise floor."""
    return effect < noise_floor(metric, labels, kind).floor


def _samples(*runs: tuple[str, int], t0: float = 1000.0) -> list[Verdict]:
    out, t = [], t0
    for state, n in runs:
        for _ in range(n):
            out.append(Verdict(t, state))
            t += 1.0
    return out


def _shape(eps):  # type: ignore[no-untyped-def]
    return [(e.state, round(e.start), round(e.end)) for e in eps]


def test_runs_and_flickers_merge_into_the_right_neighbour() -> None:
    s = _samples(("idle", 30), ("staging-bound", 5), ("io-saturated", 30), ("balanced", 3), ("compute-bound", 30))
    runs = state_runs({"gpu=0": s}, 1.0)
    assert _shape(runs) == [("idle", 1000, 1030), ("staging-bound", 1030, 1035), ("io-saturated", 1035, 1065),
                            ("balanced", 1065, 1068), ("compute-bound", 1068, 1098)]
    merged = merge_flickers(runs, min_episode_s(1.0))
    # a short I/O run joins the I/O neighbour, a short healthy run the healthy one
    assert _shape(merged) == [("idle", 1000, 1030), ("io-saturated", 1030, 1065), ("compute-bound", 1065, 1098)]
    assert merged[1].detail["merged_flickers"] == 1
    # a flicker between two runs of one state makes them one
    s = _samples(("compute-bound", 20), ("staging-bound", 4), ("compute-bound", 20))
    assert _shape(merge_flickers(state_runs({"gpu=0": s}, 1.0), MIN_EPISODE_S)) == [("compute-bound", 1000, 1044)]
    # rollups: two steps is the minimum
    assert min_episode_s(60.0) == 120.0 and min_episode_s(1.0) == MIN_EPISODE_S


def test_a_gap_in_the_data_ends_a_run_and_accelerators_are_separate() -> None:
    a = _samples(("staging-bound", 20)) + _samples(("staging-bound", 20), t0=1100.0)
    b = _samples(("compute-bound", 40))
    runs = state_runs({"gpu=0": a, "gpu=1": b}, 1.0)
    got = sorted((e.accelerator, e.state, round(e.start), round(e.end)) for e in runs)
    assert got == [("gpu=0", "staging-bound", 1000, 1020), ("gpu=0", "staging-bound", 1100, 1120),
                   ("gpu=1", "compute-bound", 1000, 1040)]


def _sp(metric: str, labels: dict[str, str], ts: list[float], vals: list[float], kind: str = "gauge") -> SeriesPoints:
    return SeriesPoints(metric, labels, ts, vals, kind, "n", 0)


def test_stored_states_prefer_per_accelerator_series_and_the_worst_of_a_mixed_bucket() -> None:
    wl = {"namespace": "ml", "pod": "p", "container": "c", "workload": "Deployment/x"}
    ts = [0.0, 60.0, 120.0]
    series = [
        _sp("triscope_mismatch_state", {"state": "idle"}, ts, [1, 1, 1]),   # node roll-up: ignored
        _sp("triscope_mismatch_state", {"state": "compute-bound", "gpu": "0", **wl}, ts, [1, 1, 0]),
        # a rollup bucket where the state changed reads 1 in both series: the I/O state wins
        _sp("triscope_mismatch_state", {"state": "staging-bound", "gpu": "0", **wl}, ts, [0, 1, 1]),
        _sp("triscope_mismatch_score", {"gpu": "0", **wl}, ts, [0.0, 0.5, 0.9]),
    ]
    source, samples, step = stored_state_samples(series)
    assert source == "per-accelerator state series" and step == 60.0
    assert [(s.state, s.score) for s in samples["gpu=0"]] == [("compute-bound", 0.0), ("staging-bound", 0.5),
                                                              ("staging-bound", 0.9)]
    assert samples["gpu=0"][0].workload == ("ml", "p", "c", "Deployment/x")
    source, samples, _ = stored_state_samples(series[:1])
    assert source == "node state series" and list(samples) == ["node"]
    assert stored_state_samples([])[0] == ""


def _ev(ts: float, kind: str, details: dict, severity: str = "warning", msg: str = "x") -> EventRow:  # type: ignore[type-arg]
    return EventRow(0, "n", ts, kind, severity, msg, details)


def test_health_events_become_episodes() -> None:
    evs = [
        _ev(100, "xid", {"gpu": "1", "xid": 79}, "critical"), _ev(110, "xid", {"gpu": "1", "xid": 79}, "critical"),
        _ev(400, "xid", {"gpu": "1", "xid": 48}, "error"),
        _ev(120, "aer", {"device": "0000:1b:00.0", "severity": "correctable"}),
        _ev(200, "collector", {"collector": "nvml", "up": False}), _ev(201, "collector", {"collector": "nvml", "up": False}),
        _ev(260, "collector", {"collector": "nvml", "up": True}, "info"),
        _ev(300, "collector", {"collector": "scrape:x", "up": False}),   # a workload's /metrics: no health incident
        _ev(310, "collector", {"collector": "ebpf", "up": False}),
        _ev(150, "mismatch_state", {"to": "io-saturated"}), _ev(160, "phase", {"phase": "x"}),
        _ev(170, "npu_health", {"npu": "1", "chip": "0"}, "info"),     # back to OK: not an incident
    ]
    eps = health_episodes(evs, {"0000:1b:00.0": "gpu=0"})
    got = [(e.state, e.accelerator, e.start, e.end, e.samples) for e in eps]
    assert got == [("xid", "gpu=1", 100, 110, 2), ("aer", "gpu=0", 120, 120, 1),
                   ("collector-down", "node", 200, 260, 3), ("collector-down", "node", 310, 310, 1),
                   ("xid", "gpu=1", 400, 400, 1)]
    assert all(e.bad for e in eps)
    assert eps[3].detail == {"collector": "ebpf", "still_down": True}
    assert "still_down" not in eps[2].detail


@pytest.mark.parametrize(("metric", "labels", "kind", "effect", "noise"), [
    ("triscope_cpu_seconds_total", {"mode": "softirq"}, "counter", 0.0015, True),   # the demo's "top cause"
    ("triscope_cpu_seconds_total", {"mode": "system"}, "counter", 3.4, False),
    ("triscope_dma_map_total", {"device": "x"}, "counter", 0.5, True),
    ("triscope_dma_map_total", {"device": "x"}, "counter", 55.0, False),
    ("triscope_tcp_retransmits_total", {}, "counter", 0.2, True),
    ("triscope_tcp_retransmits_total", {}, "counter", 8.0, False),
    ("triscope_gpu_pcie_rx_bytes_total", {"gpu": "0"}, "counter", 2e6, True),
    ("triscope_pcie_aer_errors_total", {"device": "x"}, "counter", 0.01, False),   # one error is news
    ("triscope_cpu_busy_ratio", {}, "gauge", 0.01, True),
    ("triscope_memory_available_bytes", {}, "gauge", 50e6, True),
    ("triscope_gpu_power_watts", {"gpu": "0"}, "gauge", 600.0, False),
])
def test_noise_floors(metric: str, labels: dict[str, str], kind: str, effect: float, noise: bool) -> None:
    assert below_floor(effect, metric, labels, kind) is noise, noise_floor(metric, labels, kind)


def test_series_that_are_never_causes_and_the_agent_metrics() -> None:
    for m, lab in (("triscope_gpu_info", {"gpu": "0"}), ("python_gc_collections_total", {}),
                   ("triscope_memory_total_bytes", {}), ("triscope_gpu_throttle_reasons", {"gpu": "0"}),
                   ("inference_request_duration_seconds_bucket", {"le": "0.1"}), ("triscope_mismatch_score", {}),
                   ("triscope_pcie_link_speed_gts", {"device": "x", "kind": "max"})):
        assert never_a_cause(m, lab), m
    assert not never_a_cause("triscope_pcie_link_speed_gts", {"device": "x", "kind": "current"})
    for m in ("triscope_ticks_total", "triscope_collector_duration_seconds", "triscope_tick_duration_seconds",
              "triscope_process_resident_memory_bytes", "triscope_spooled_samples_total",
              "triscope_store_write_errors_total"):
        assert is_agent_metric(m), m
    assert not is_agent_metric("triscope_cpu_seconds_total")


def test_agent_trouble() -> None:
    ts = [float(t) for t in range(100)]
    up = _sp("triscope_collector_up", {"collector": "nvml"}, ts, [1.0] * 50 + [0.0] * 50)
    never = _sp("triscope_collector_up", {"collector": "aer"}, ts, [0.0] * 100)   # cannot run here
    errs = _sp("triscope_store_write_errors_total", {}, ts, [0.0] * 80 + [2.0] * 20, "counter")
    assert agent_trouble([up, never, errs], [], 0, 40) == []
    assert agent_trouble([up, never, errs], [], 40, 70) == ["collector nvml not up"]
    assert agent_trouble([up, never, errs], [], 70, 100) == ["collector nvml not up", "store write errors"]
    down = _ev(20, "collector", {"collector": "ebpf", "up": False})
    assert agent_trouble([], [down], 0, 40) == ["collector ebpf down"]
    # a workload's own /metrics answering late (a service under a fault) is its symptom, not the agent's trouble
    late = _ev(20, "collector", {"collector": "scrape:127.0.0.1:9602", "up": False})
    scrape_up = _sp("triscope_collector_up", {"collector": "scrape:127.0.0.1:9602"}, ts, [1.0, 0.0] * 50)
    assert agent_trouble([scrape_up], [late], 0, 40) == []
    assert agent_trouble([scrape_up, up], [late, down], 40, 70) == ["collector nvml not up"]


def test_throttle_bits_power_cap_is_no_fault() -> None:
    assert throttle_faults([0x4, 0x4, 0x1 | 0x4, 0x2]) == (0.0, [])
    share, names = throttle_faults([0x4, 0x40 | 0x4, 0x20, 0x4])
    assert share == 0.5 and names == ["HW thermal slowdown", "SW thermal slowdown"]


def test_workload_keys() -> None:
    assert pod_stem("infer-7d9f8c6b5-x2x7q") == "infer" and pod_stem("db-0") == "db" and pod_stem("job-abcde") == "job"
    assert workload_key(("ml", "infer-7d9f8c6b5-x2x7q", "server", "Deployment/infer")) == ("workload", "ml",
                                                                                           "Deployment/infer")
    assert workload_key(("ml", "infer-7d9f8c6b5-x2x7q", "server", "")) == ("pod", "ml", "server", "infer")
    assert workload_key(("", "", "", "")) is None and workload_key(("", "", "", "shared")) is None


SLO = '''version: "prometheus/v1"
service: svc
slos:
  - name: on-time
    objective: 99
    sli:
      events:
        error_query: sum(rate(req_total{status="late"}[{{.window}}]))
        total_query: sum(rate(req_total[{{.window}}]))
'''


def test_slo_burn_periods_from_counter_rates() -> None:
    slo = parse_slo_text(SLO)[0]
    ts = [float(t) for t in range(300)]
    ok = [90.0 if not 100 <= t < 130 else 0.0 for t in ts]    # 30 s of every request late
    late = [0.5 if not 100 <= t < 130 else 9.0 for t in ts]
    series = [_sp("req_total", {"status": "ok"}, ts, ok, "counter"), _sp("req_total", {"status": "late"}, ts, late, "counter")]
    eps = slo_burn_episodes([slo], series, 0, 300)
    assert len(eps) == 1, [(e.start, e.end) for e in eps]
    e = eps[0]
    assert 98 <= e.start <= 103 and 126 <= e.end <= 133, (e.start, e.end)
    assert e.kind == "slo" and e.detail["slo"] == "svc-on-time" and e.detail["peak_burn_rate"] == pytest.approx(100)
    # 0.55 % late is a burn rate of 0.55: no period
    assert slo_burn_episodes([slo], series, 150, 300) == []
