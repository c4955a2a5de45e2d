"""The mismatch detector: the pure classifier, thresholds config, the per-tick tracker, the
stored-series path (SQLite and PostgreSQL), and stage skew."""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import pytest

from triscope.analysis.config import ConfigError, MismatchThresholds, load_thresholds
from triscope.analysis.mismatch import (
    AcceleratorFeatures,
    WindowFeatures,
    classify_window,
    effective_ceiling,
    link_capacity_bytes_per_second,
    node_states,
    state_fractions,
)
from triscope.analysis.online import MismatchTracker
from triscope.analysis.stages import stage_skew, stage_skew_from_store
from triscope.analysis.synthetic import GB, H200_PHASES, PhaseShape, h200_phase_ticks, phase_intervals
from triscope.core.samples import EventRecord, Sample, Tick
from triscope.core.vocabulary import STATES
from triscope.store import Store

GEN5_X16 = link_capacity_bytes_per_second(32.0, 16)


def gpu(busy: float | None, link_gbps: float | None = None, name: str = "gpu=0") -> AcceleratorFeatures:
    return AcceleratorFeatures(name, busy, None if link_gbps is None else link_gbps * GB,
                               effective_ceiling(GEN5_X16, 60 * GB, MismatchThresholds()))


# ------------------------------------------------------------------------------------ pure classifier
def test_link_capacity_and_ceiling() -> None:
    assert pytest.approx(63.0e9, rel=0.001) == GEN5_X16
    assert link_capacity_bytes_per_second(8.0, 16) == pytest.approx(15.75e9, rel=0.001)
    assert link_capacity_bytes_per_second(2.5, 1) == pytest.approx(0.25e9)
    th = MismatchThresholds()
    # refined upwards by the highest observed rate, never below negotiated x efficiency
    assert effective_ceiling(GEN5_X16, 60e9, th) == 60e9
    assert effective_ceiling(GEN5_X16, 23e9, th) == pytest.approx(GEN5_X16 * th.link_efficiency)
    # unknown link: what was observed (floored)
    assert effective_ceiling(None, 40e9, th) == 40e9
    assert effective_ceiling(None, None, th) == th.min_ceiling_bytes_per_second


@pytest.mark.parametrize("features, state", [
    (WindowFeatures([gpu(0.0, 0.01)], cpu_busy=0.02), "idle"),
    (WindowFeatures([gpu(0.96, 0.05)], cpu_busy=0.07), "compute-bound"),
    (WindowFeatures([gpu(0.0, 58.5)], cpu_busy=0.07), "io-saturated"),
    (WindowFeatures([gpu(0.0, 23.5)], cpu_busy=0.08), "staging-bound"),
    (WindowFeatures([gpu(0.0, 6.0)], dma_map_rate=1100.0), "staging-bound"),
    # pin churn while the link is quiet: the host is not feeding this GPU (the flag still rises)
    (WindowFeatures([gpu(0.0, 0.0)], dma_map_rate=1100.0), "idle"),
    (WindowFeatures([gpu(0.02, 0.5)], retransmit_rate=40.0), "network-bound"),
    (WindowFeatures([gpu(0.5, 20.0)], cpu_busy=0.2), "balanced"),
    # a lightly loaded, healthy GPU (SM 4 %, 2.5 GB/s on Gen5 x16, CPU 5 %): nothing waits
    (WindowFeatures([gpu(0.04, 2.5)], cpu_busy=0.05), "demand-limited"),
    (WindowFeatures([gpu(0.5, 0.2)], cpu_busy=0.05), "demand-limited"),
    # compute and link both near their ceilings: balanced at any SM activity
    (WindowFeatures([gpu(0.92, 50.0)], cpu_busy=0.3), "balanced"),
    # an old recording's pageable copy: 5 GB/s (8 % of the link) with the SM idle
    (WindowFeatures([gpu(0.0, 5.0)], cpu_busy=0.15), "staging-bound"),
    # node CPU busy with the link moving data is staging evidence; with a quiet link it is not
    (WindowFeatures([gpu(0.04, 2.5)], cpu_busy=0.8), "staging-bound"),
    (WindowFeatures([gpu(0.04, 0.5)], cpu_busy=0.8, pressure=0.3), "idle"),
])
def test_classify_states(features: WindowFeatures, state: str) -> None:
    v = classify_window(features)
    assert v is not None
    assert v.state == state, v.evidence
    assert 0.0 <= v.score <= 1.0
    assert v.evidence["reasons"]


def test_scores_and_pin_churn_flag() -> None:
    io = classify_window(WindowFeatures([gpu(0.0, 58.5)]))
    assert io is not None and io.score == pytest.approx(1.0)
    half = classify_window(WindowFeatures([gpu(0.2, 58.5)]))
    assert half is not None and half.state == "io-saturated" and half.score == pytest.approx(0.8)
    comp = classify_window(WindowFeatures([gpu(0.96, 0.05)]))
    assert comp is not None and comp.score < 0.01
    idle = classify_window(WindowFeatures([gpu(0.0, 0.0)]))
    assert idle is not None and idle.score == 0.0 and not idle.pin_churn
    churn = classify_window(WindowFeatures([gpu(0.0, 6.0)], dma_map_rate=1100.0))
    assert churn is not None and churn.pin_churn and churn.evidence["pin_churn"]
    assert any("pin churn" in r for r in churn.evidence["reasons"])


def test_no_accelerator_or_low_coverage_gives_no_verdict() -> None:
    assert classify_window(WindowFeatures([], cpu_busy=1.0)) is None
    assert classify_window(WindowFeatures([gpu(None, 50)])) is None
    low = AcceleratorFeatures("gpu=0", 0.0, 58e9, 60e9, coverage=0.2)
    assert classify_window(WindowFeatures([low])) is None


def test_node_takes_the_accelerator_losing_most_time() -> None:
    v = classify_window(WindowFeatures([gpu(0.95, 0.1, "gpu=0"), gpu(0.0, 58.0, "gpu=1"),
                                        AcceleratorFeatures("chip=0,npu=1", 0.9)]))
    assert v is not None
    assert v.state == "io-saturated" and v.evidence["accelerator"] == "gpu=1"
    assert v.evidence["accelerators"]["gpu=0"]["state"] == "compute-bound"
    assert v.evidence["accelerators"]["chip=0,npu=1"]["state"] == "compute-bound"
    allbusy = classify_window(WindowFeatures([gpu(0.95, 0.1, "gpu=0"), AcceleratorFeatures("npu=0", 0.9)]))
    assert allbusy is not None and allbusy.state == "compute-bound"


def test_thresholds_from_yaml_and_env(tmp_path: Path) -> None:
    p = tmp_path / "th.yaml"
    p.write_text("mismatch:\n  io_saturated_link: 0.6\n  pin_churn_rate: 50\n")
    th = load_thresholds(p, environ={"TRISCOPE_MISMATCH_PIN_CHURN_RATE": "75"})
    assert th.io_saturated_link == 0.6 and th.pin_churn_rate == 75.0 and th.compute_busy == 0.70
    # the override changes a decision: 40 GB/s of 60 is io-saturated at 0.6, staging-bound at 0.75
    f = WindowFeatures([gpu(0.0, 40.0)])
    assert classify_window(f, th).state == "io-saturated"  # type: ignore[union-attr]
    assert classify_window(f).state == "staging-bound"  # type: ignore[union-attr]
    p.write_text("io_saturatd_link: 0.6\n")
    with pytest.raises(ConfigError, match="unknown mismatch threshold 'io_saturatd_link'"):
        load_thresholds(p, environ={})
    with pytest.raises(ConfigError, match="must be a number"):
        load_thresholds(None, environ={"TRISCOPE_MISMATCH_IDLE_BUSY": "low"})
    p.write_text("a: [\n")
    with pytest.raises(ConfigError, match=r"th.yaml:\d+: not valid YAML"):
        load_thresholds(p, environ={})


# ------------------------------------------------------------------------------------ per-tick tracker
def test_online_tracker_follows_the_phases() -> None:
    tr = MismatchTracker()
    by_phase: dict[str, list[str]] = {}
    churn_flags: dict[str, list[float]] = {}
    events: list[EventRecord] = []
    durations = []
    intervals = phase_intervals()
    for ts, samples, _ev in h200_phase_ticks():
        t0 = time.perf_counter()
        out = tr.process(ts, samples)
        durations.append(time.perf_counter() - t0)
        names = {o.name for o in out if isinstance(o, Sample)}
        assert names == {"triscope_mismatch_score", "triscope_mismatch_state", "triscope_mismatch_pin_churn"}
        # the node's roll-up: the series without accelerator labels
        one_hot = {o.labels["state"]: o.value for o in out if isinstance(o, Sample)
                   and o.name == "triscope_mismatch_state" and "gpu" not in o.labels}
        assert set(one_hot) == set(STATES) and sum(one_hot.values()) == 1.0
        events += [o for o in out if isinstance(o, EventRecord)]
        for name, _exp, a, b in intervals:
            if a + 10 <= ts < b:  # once the 10 s window lies inside the phase
                by_phase.setdefault(name, []).append(next(k for k, v in one_hot.items() if v == 1.0))
                churn_flags.setdefault(name, []).extend(
                    o.value for o in out if isinstance(o, Sample) and o.name == "triscope_mismatch_pin_churn")
    for name, exp, _a, _b in intervals:
        got = by_phase[name]
        share = got.count(exp) / len(got)
        assert share >= 0.9, (name, exp, state_fractions_list(got))
    assert all(churn_flags["pin_churn"]) and not any(churn_flags["matmul"])
    assert {e.kind for e in events} == {"mismatch_state", "accelerator_state"}
    node = [e for e in events if e.kind == "mismatch_state"]
    assert {e.details["to"] for e in node} >= {"idle", "io-saturated", "staging-bound", "compute-bound"}
    assert any(e.details["pin_churn"] for e in node)
    # each accelerator's own changes, with the verdict's reasons for an I/O state
    acc = [e for e in events if e.kind == "accelerator_state"]
    assert {e.details["to"] for e in acc} >= {"io-saturated", "staging-bound", "compute-bound"}
    assert all(e.details["reasons"] for e in acc if e.details["to"] in ("io-saturated", "staging-bound"))
    assert all(e.details["labels"].get("gpu") == "0" for e in acc)
    assert statistics.median(durations) < 1e-3


def state_fractions_list(states: list[str]) -> dict[str, int]:
    return {s: states.count(s) for s in set(states)}


def test_online_tracker_silent_without_accelerator_and_handles_counter_reset() -> None:
    tr = MismatchTracker()
    assert tr.process(1.0, [Sample("triscope_cpu_busy_ratio", 0.9)]) == []
    lab = {"gpu": "0"}
    rx = 0.0
    for i in range(12):
        rx += 58e9
        tr.process(100.0 + i, [Sample("triscope_gpu_sm_active_ratio", 0.0, lab),
                               Sample("triscope_gpu_pcie_rx_bytes_total", rx, lab, "counter")])
    assert tr.state == "io-saturated"
    # agent restart: the counter starts again from a small value; no negative rate, still io-saturated
    out = tr.process(112.0, [Sample("triscope_gpu_sm_active_ratio", 0.0, lab),
                             Sample("triscope_gpu_pcie_rx_bytes_total", 58e9, lab, "counter")])
    assert tr.state == "io-saturated" and not any(isinstance(o, EventRecord) for o in out)


# ------------------------------------------------------------------------------------ stored series
def _store_with_phases(url: str, **kw) -> Store:  # type: ignore[no-untyped-def]
    st = Store.open(url)
    st.upgrade()
    st.write_ticks("h200", [Tick(ts, s, ev) for ts, s, ev in h200_phase_ticks(**kw)])
    return st


def test_node_states_on_stored_phases(db_url: str) -> None:
    st = _store_with_phases(db_url)
    for name, exp, a, b in phase_intervals():
        ws = node_states(st, "h200", a, b)
        assert len(ws) == 6
        frac = state_fractions(ws)
        assert frac.get(exp, 0) >= 0.9, (name, exp, frac)
        churn = sum(w.pin_churn for w in ws) / len(ws)
        assert churn >= 0.9 if name == "pin_churn" else churn == 0, name
    # evidence names the inputs, the ceiling comes from gen5 x16 and the observed maximum
    w = node_states(st, "h200", *phase_intervals()[1][2:])[2]
    assert w.evidence["accelerator"] == "gpu=0"
    assert 58e9 < w.evidence["link_ceiling_bytes_per_second"] < 61e9
    assert w.end - w.start == 10
    st.close()


def test_node_states_uses_gpm_not_nvml_utilization(sqlite_url: str) -> None:
    # NVML utilization reads 100 % during copies; without GPM SM activity there is no verdict
    st = Store.open(sqlite_url)
    st.upgrade()
    ticks = []
    for ts, s, ev in h200_phase_ticks(phases=(H200_PHASES[1],), phase_s=30):
        ticks.append(Tick(ts, [x for x in s if x.name != "triscope_gpu_sm_active_ratio"], ev))
    st.write_ticks("h200", ticks)
    a, b = phase_intervals((H200_PHASES[1],), phase_s=30)[0][2:]
    assert node_states(st, "h200", a, b) == []
    st.close()


def test_node_states_without_link_facts_uses_observed_ceiling(sqlite_url: str) -> None:
    st = _store_with_phases(sqlite_url, with_link_info=False)
    for name, exp, a, b in phase_intervals():
        assert state_fractions(node_states(st, "h200", a, b)).get(exp, 0) >= 0.9, name
    st.close()


def test_network_bound_window(sqlite_url: str) -> None:
    ph = (PhaseShape("net", "network-bound", 0.0, 0.2 * GB, 0.01 * GB, 0.05, 0.0, retransmits=60.0),)
    st = _store_with_phases(sqlite_url, phases=ph, phase_s=30)
    a, b = phase_intervals(ph, phase_s=30)[0][2:]
    ws = node_states(st, "h200", a, b)
    assert ws and all(w.state == "network-bound" for w in ws)
    assert ws[0].evidence["retransmit_rate"] == pytest.approx(60.0, rel=0.1)
    st.close()


# ------------------------------------------------------------------------------------ stage skew
def test_stage_skew_pure() -> None:
    s = stage_skew({"compute": 0.004, "preprocess": 0.001, "h2d": 0.009, "d2h": 0.002})
    assert s is not None
    assert list(s.durations) == ["preprocess", "h2d", "compute", "d2h"]
    assert s.bottleneck == "h2d"
    assert s.skew == pytest.approx(0.009 / 0.004)
    assert s.bubble_fraction == pytest.approx(1 - 0.016 / (4 * 0.009))
    assert s.idle_share["h2d"] == 0.0 and s.idle_share["preprocess"] == pytest.approx(1 - 1 / 9)
    even = stage_skew({"a": 1.0, "b": 1.0})
    assert even is not None and even.bubble_fraction == 0.0 and even.skew == 1.0
    assert stage_skew({"a": 1.0}) is None


def test_stage_skew_from_stored_histogram(sqlite_url: str) -> None:
    st = Store.open(sqlite_url)
    st.upgrade()
    per = {"preprocess": 0.001, "h2d": 0.020, "compute": 0.002, "d2h": 0.001}
    ticks = []
    for i in range(61):
        samples = []
        for stage, d in per.items():
            samples.append(Sample("inference_stage_duration_seconds_sum", i * 10 * d, {"stage": stage}, "counter"))
            samples.append(Sample("inference_stage_duration_seconds_count", i * 10.0, {"stage": stage}, "counter"))
        ticks.append(Tick(1000.0 + i, samples))
    st.write_ticks("h200", ticks)
    s = stage_skew_from_store(st, "h200", 1000.0, 1060.0)
    assert s is not None and s.bottleneck == "h2d"
    assert s.durations["h2d"] == pytest.approx(0.020)
    assert s.bubble_fraction == pytest.approx(1 - 0.024 / 0.080)
    assert s.requests == pytest.approx(600)
    st.close()


def test_tracker_and_node_states_pick_up_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = tmp_path / "mismatch.yaml"
    f.write_text("io_saturated_link: 0.3\n")
    monkeypatch.setenv("TRISCOPE_MISMATCH_FILE", str(f))
    monkeypatch.setenv("TRISCOPE_MISMATCH_WINDOW_S", "5")
    tr = MismatchTracker()
    assert tr.th.io_saturated_link == 0.3 and tr.th.window_s == 5.0
    monkeypatch.setenv("TRISCOPE_MISMATCH_WINDOW_S", "soon")
    with pytest.raises(ConfigError):
        MismatchTracker()


def test_tracker_goes_straight_from_idle_to_io_saturated() -> None:
    """A GPM tick that straddles the start of a copy phase (half idle, half copying) and a window
    half idle / half copying must not show up as staging-bound (the trace's shape)."""
    tr = MismatchTracker()
    lab = {"gpu": "0"}
    rx = 0.0
    rates = [0.0] * 12 + [31e9] + [50e9] * 12
    seen = []
    events = []
    for i, r in enumerate(rates):
        rx += r
        out = tr.process(1000.0 + i, [Sample("triscope_gpu_sm_active_ratio", 0.0, lab),
                                      Sample("triscope_gpu_pcie_rx_bytes_total", rx, lab, "counter"),
                                      Sample("triscope_gpu_info", 1.0, {"gpu": "0", "bus_id": "0000:00:06.0"}),
                                      Sample("triscope_pcie_link_speed_gts", 32.0, {"device": "0000:00:06.0", "kind": "current"}),
                                      Sample("triscope_pcie_link_width", 16.0, {"device": "0000:00:06.0", "kind": "current"})])
        seen.append(tr.state)
        events += [o for o in out if isinstance(o, EventRecord) and o.kind == "mismatch_state"]
    assert "staging-bound" not in seen and seen[-1] == "io-saturated"
    assert [e.details["to"] for e in events] == ["idle", "io-saturated"]
    # the state follows the window's median tick: idle here, although the mean link load is 30 %
    v = classify_window(WindowFeatures([AcceleratorFeatures("gpu=0", 0.0, 15e9, 50e9, 1.0, 0.0, 0.0)]))
    assert v is not None and v.state == "idle"


def test_dwell_zero_reports_at_once() -> None:
    tr = MismatchTracker(MismatchThresholds(state_dwell_s=0))
    lab = {"gpu": "0"}
    tr.process(1.0, [Sample("triscope_gpu_sm_active_ratio", 0.0, lab)])
    assert tr.state == "idle"
    tr.process(2.0, [Sample("triscope_gpu_sm_active_ratio", 0.95, lab)])
    tr.process(3.0, [Sample("triscope_gpu_sm_active_ratio", 0.95, lab)])
    assert tr.state == "compute-bound"
