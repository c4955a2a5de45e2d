"""Demand-aware, per-accelerator verdicts (issue 18, docs/workloads.md section 2).

* A lightly loaded, healthy GPU (SM 4 %, 2.5 GB/s on a Gen5 x16 link, host CPU 5 %, nothing
  pegged) reads ``demand-limited`` with score 0, stored (SQLite and PostgreSQL) and per tick.
* An I/O state needs evidence: with per-workload series a pegged feeder, CPU wait or cgroup CPU
  pressure with the link moving data; without them (older recordings) the link's utilisation
  above ``staging_link_floor``, node CPU, PSI, pin churn.
* One state per accelerator per window, labelled with its dominant workload; the node's roll-up
  is the worst accelerator (I/O states first, then the score).
* The tracker publishes ``triscope_mismatch_state{state, gpu|npu,chip, namespace, pod, container,
  workload}`` and ``triscope_mismatch_score{...}`` per accelerator plus the node's roll-up.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from triscope.analysis.config import MismatchThresholds, load_thresholds
from triscope.analysis.features import (
    INPUT_METRICS,
    AcceleratorWindow,
    WindowValues,
    WorkloadEvidence,
    WorkloadKey,
    WorkloadWindow,
    dominant_workload,
    window_features,
)
from triscope.analysis.mismatch import (
    AcceleratorFeatures,
    WindowFeatures,
    accelerator_states,
    classify_window,
    node_states,
    window_verdicts,
)
from triscope.analysis.mismatch_inputs import fetch_mismatch_inputs, mismatch_inputs_from_series
from triscope.analysis.online import MismatchTracker
from triscope.analysis.reader import points_of
from triscope.analysis.synthetic import (
    GB,
    LIGHT_SERVING,
    SERVING_PHASES,
    WORKLOAD,
    PhaseShape,
    h200_phase_ticks,
    phase_intervals,
)
from triscope.analysis.verdict import AcceleratorVerdict
from triscope.core.metrics import CATALOGUE
from triscope.core.samples import Sample, Tick
from triscope.core.vocabulary import IO_STATES, STATES
from triscope.store import Store

TH = MismatchThresholds()
ACC_KEYS = {"namespace", "pod", "container", "workload"}


# ------------------------------------------------------------------------------------ a synthetic node
@dataclass
class Wl:
    pod: str
    sm: float | None = None         # its SM share (None: the driver gives none)
    processes: float = 1.0
    feeder: float = 0.05
    wait: float = 0.01
    pressure: float | None = 0.0
    namespace: str = "inference"
    container: str = "server"
    workload: str = ""
    cores: float | None = None      # CPU seconds per second (None: no triscope_workload_cpu_seconds_total)


@dataclass
class Gpu:
    sm: float
    rx_gbps: float
    workloads: list[Wl] = field(default_factory=list)
    dma_maps: float = 0.0            # maps/s on its own PCI device


def node_ticks(shapes: dict[str, Gpu] | Callable[[int], dict[str, Gpu]], n: int = 30, t0: float = 1_900_000_000.0,
               cpu: float = 0.05, psi: float = 0.0, retransmits: float = 0.0, with_workloads: bool = True) -> list[Tick]:
    """``n`` 1 Hz ticks of a node with these GPUs (Gen5 x16 links; ``shapes(i)`` for tick i), their
    workloads' series."""
    rx: dict[str, float] = {}
    dma: dict[str, float] = {}
    cpu_s: dict[tuple[str, str, str], float] = {}
    rtx = 0.0
    out = []
    for i in range(n):
        gpus = shapes(i) if callable(shapes) else shapes
        ts = t0 + i
        rtx += retransmits
        s = [Sample("triscope_cpu_busy_ratio", cpu),
             Sample("triscope_pressure_ratio", psi, {"resource": "cpu", "kind": "some"}),
             Sample("triscope_tcp_retransmits_total", rtx, {}, "counter")]
        for g, shape in gpus.items():
            bus = f"0000:{int(g) + 0x10:02x}:00.0"
            rx[g] = rx.get(g, 0.0) + shape.rx_gbps * GB
            dma[g] = dma.get(g, 0.0) + shape.dma_maps
            lab = {"gpu": g}
            s += [Sample("triscope_gpu_sm_active_ratio", shape.sm, lab),
                  Sample("triscope_gpu_pcie_rx_bytes_total", rx[g], lab, "counter"),
                  Sample("triscope_gpu_pcie_tx_bytes_total", 0.0, lab, "counter"),
                  Sample("triscope_gpu_info", 1.0, {"gpu": g, "bus_id": bus, "name": "NVIDIA H200"}),
                  Sample("triscope_pcie_link_speed_gts", 32.0, {"device": bus, "kind": "current"}),
                  Sample("triscope_pcie_link_width", 16.0, {"device": bus, "kind": "current"}),
                  Sample("triscope_dma_map_total", dma[g], {"device": bus, "direction": "to_device"}, "counter")]
            if not with_workloads:
                continue
            for w in shape.workloads:
                wl = {"gpu": g, "namespace": w.namespace, "pod": w.pod, "container": w.container, "workload": w.workload}
                s += [Sample("triscope_accelerator_workload_info", 1.0, {**wl, "uuid": f"GPU-{g}"}),
                      Sample("triscope_workload_processes", w.processes, wl),
                      Sample("triscope_workload_feeder_busy_ratio", w.feeder, wl),
                      Sample("triscope_workload_cpu_wait_ratio", w.wait, wl)]
                if w.sm is not None:
                    s.append(Sample("triscope_workload_sm_ratio", w.sm, wl))
                if w.pressure is not None:
                    s.append(Sample("triscope_workload_cpu_pressure_ratio", w.pressure, wl))
                if w.cores is not None:     # a cumulative counter from an arbitrary start
                    c = cpu_s[(g, w.pod, w.workload)] = cpu_s.get((g, w.pod, w.workload), 5000.0) + w.cores
                    s.append(Sample("triscope_workload_cpu_seconds_total", c, wl, "counter"))
        out.append(Tick(ts, s))
    return out


def _store(url: str, node: str, ticks: list[Tick]) -> Store:
    st = Store.open(url)
    st.upgrade()
    st.write_ticks(node, ticks)
    return st


def _replay(ticks: list[Tick], th: MismatchThresholds = TH) -> tuple[MismatchTracker, list[Sample]]:
    tr = MismatchTracker(th)
    out: list = []
    for t in ticks:
        out = tr.process(t.ts, list(t.samples))
    return tr, [o for o in out if isinstance(o, Sample)]


# ------------------------------------------------------------------------------------ the lightly loaded GPU
def test_lightly_loaded_gpu_is_demand_limited_with_score_zero(db_url: str) -> None:
    """The SRE's case: it read staging-bound with score ~0.96 in every window before.  Alone in the
    store, so the ceiling is the Gen5 x16 link's (53.6 GB/s), not a higher rate seen earlier."""
    st = _store(db_url, "light", [Tick(ts, s, ev) for ts, s, ev in h200_phase_ticks(phases=(LIGHT_SERVING,), phase_s=60)])
    (_n, exp, a, b), = phase_intervals((LIGHT_SERVING,), phase_s=60)
    assert exp == "demand-limited"
    ws = node_states(st, "light", a, b, thresholds=TH)
    assert len(ws) == 6 and {w.state for w in ws} == {"demand-limited"}, [w.evidence["reasons"] for w in ws]
    assert all(w.score == 0.0 for w in ws)
    # the link really moves data (not idle), well below the staging floor
    assert all(TH.idle_link < w.evidence["link_util_median"] < TH.staging_link_floor for w in ws)
    per = accelerator_states(st, "light", a, b, thresholds=TH)
    assert [(p.accelerator, p.state, p.score) for p in per] == [("gpu=0", "demand-limited", 0.0)] * 6
    st.close()
    tr = MismatchTracker(TH)
    for ts, s, _ev in h200_phase_ticks(phases=(LIGHT_SERVING,), phase_s=60):
        out = tr.process(ts, s)
    assert tr.state == "demand-limited" and tr.last is not None and tr.last.score == 0.0
    score = [o for o in out if isinstance(o, Sample) and o.name == "triscope_mismatch_score"]
    assert score and all(o.value == 0.0 for o in score)


def test_serving_phases_keep_their_states_with_and_without_workload_series(sqlite_url: str) -> None:
    for i, wl in enumerate((None, WORKLOAD)):
        st = _store(f"{sqlite_url}{i}", "h200", [Tick(ts, s, ev) for ts, s, ev in
                                                 h200_phase_ticks(phases=SERVING_PHASES, workload=wl)])
        for name, exp, a, b in phase_intervals(SERVING_PHASES):
            per = accelerator_states(st, "h200", a, b, thresholds=TH)
            assert per and all(p.state == exp for p in per), (name, wl, [p.evidence["reasons"] for p in per])
            assert all(p.workload == (wl or dict.fromkeys(ACC_KEYS, "")) for p in per)
            if exp in ("idle", "demand-limited"):
                assert all(p.score == 0.0 for p in per)
            if wl is not None and exp == "staging-bound":   # the pegged feeder is named as evidence
                assert any("feeder pegged" in r and "inference/llm-0/server" in r for r in per[0].evidence["reasons"])
        st.close()


# ------------------------------------------------------------------------------------ evidence decides
PAGEABLE_LOOKING = 5.0   # GB/s: 9 % of a Gen5 x16 link with the SM idle, like the recorded pageable copy


@pytest.mark.parametrize("wl, with_workloads, state, reason", [
    # an older recording: the link's share alone is staging evidence
    (Wl("llm-0", sm=0.02), False, "staging-bound", "copies staged by the host"),
    # the same link with the workload's evidence: nothing waits, the workload asks for little
    (Wl("llm-0", sm=0.02), True, "demand-limited", "no pegged feeder"),
    (Wl("llm-0", sm=0.02, feeder=0.99), True, "staging-bound", "feeder pegged"),
    (Wl("llm-0", sm=0.02, wait=0.45), True, "staging-bound", "waits for a CPU 45%"),
    (Wl("llm-0", sm=0.02, pressure=0.3), True, "staging-bound", "CPU pressure of inference/llm-0/server's cgroup"),
    (Wl("llm-0", sm=0.02, pressure=None), True, "demand-limited", "no pegged feeder"),   # no cgroup v2: no PSI series
    # the pageable copy's host work: no thread pegged, but the workload keeps 1.3 cores busy
    (Wl("llm-0", sm=0.02, feeder=0.40, wait=0.0, cores=1.3), True, "staging-bound", "copies fed by the host"),
    (Wl("llm-0", sm=0.02, feeder=0.40, wait=0.0, cores=0.6), True, "demand-limited", "no pegged feeder"),
])
def test_the_workloads_evidence_decides_not_the_link(sqlite_url: str, wl: Wl, with_workloads: bool, state: str,
                                                      reason: str) -> None:
    ticks = node_ticks({"0": Gpu(0.02, PAGEABLE_LOOKING, [wl])}, with_workloads=with_workloads)
    st = _store(sqlite_url, "n", ticks)
    per = accelerator_states(st, "n", ticks[0].ts, ticks[-1].ts + 1, thresholds=TH)
    st.close()
    assert per and all(p.state == state for p in per), [p.evidence["reasons"] for p in per]
    assert any(reason in r for r in per[-1].evidence["reasons"]), per[-1].evidence["reasons"]
    assert all((p.score > 0.9) == (state in IO_STATES) for p in per)
    tr, out = _replay(ticks)
    assert tr.accelerator_states == {"gpu=0": state}


def test_a_pegged_feeder_with_a_quiet_link_is_staging(sqlite_url: str) -> None:
    """A host that cannot produce data leaves the link quiet: a loader worker or feeder thread
    pegged while the accelerator starves is the host setting the pace, whatever the link does (the
    commonest starvation, a DataLoader with too few workers, looks exactly like this)."""
    ticks = node_ticks({"0": Gpu(0.10, 0.3, [Wl("llm-0", sm=0.1, feeder=1.0)])})
    st = _store(sqlite_url, "n", ticks)
    per = accelerator_states(st, "n", ticks[0].ts, ticks[-1].ts + 1, thresholds=TH)
    st.close()
    assert {p.state for p in per} == {"staging-bound"}
    assert any("feeder pegged" in r for r in per[-1].evidence["reasons"])


def test_threads_waiting_for_a_cpu_decide_with_a_quiet_link() -> None:
    """Preprocessing confined to a busy core: its threads wait for the CPU, the accelerator starves
    and the link carries almost nothing.  That is the host limiting the accelerator (a thread that
    spins on the GPU or busy-polls runs; it does not wait)."""
    ticks = node_ticks({"0": Gpu(0.05, 0.03, [Wl("svc", sm=0.05, feeder=0.55, wait=0.45)])})
    tr, _ = _replay(ticks)
    assert tr.accelerator_states == {"gpu=0": "staging-bound"}
    ticks = node_ticks({"0": Gpu(0.05, 0.03, [Wl("svc", sm=0.05, feeder=0.5, wait=0.02)])})
    tr, _ = _replay(ticks)
    assert tr.accelerator_states == {"gpu=0": "demand-limited"}      # half a core, no wait: its host side is quiet


def test_a_shared_cgroup_s_pressure_does_not_name_the_workload() -> None:
    """Two services in one cgroup share its CPU pressure; b's own pegged feeder names b even when the
    shared pressure is further above its threshold."""
    a = Wl("a", sm=0.10, feeder=0.10, pressure=0.40, workload="cmd:inference-a", namespace="", container="")
    b = Wl("b", sm=0.02, feeder=0.99, pressure=0.40, workload="cmd:inference-b", namespace="", container="")
    _, out = _replay(node_ticks({"0": Gpu(0.12, 9.0, [a, b])}))
    on = [o for o in out if o.name == "triscope_mismatch_state" and "gpu" in o.labels and o.value == 1.0]
    assert [(o.labels["state"], o.labels["workload"]) for o in on] == [("staging-bound", "cmd:inference-b")]


def test_the_victim_of_a_saturated_host_is_not_named_and_a_host_short_for_all_names_none() -> None:
    """Recorded on the H200 (two services on one GPU, 16 cores): b copies from pageable memory and
    uses 12 cores; a, lightly loaded, waits for a CPU behind it.  The verdict names b, the workload
    the host fails to feed, not a, the one that waits.  Both at full load, waiting alike: the host is
    short for both and the verdict names neither."""
    a = Wl("", sm=0.05, feeder=0.25, wait=0.45, pressure=0.25, workload="cmd:inference-a", namespace="", container="")
    b = Wl("", sm=0.15, feeder=0.75, wait=0.15, pressure=0.25, workload="cmd:inference-b", namespace="", container="")
    _, out = _replay(node_ticks({"0": Gpu(0.08, 5.5, [a, b])}))
    on = [o for o in out if o.name == "triscope_mismatch_state" and "gpu" in o.labels and o.value == 1.0]
    assert [(o.labels["state"], o.labels["workload"]) for o in on] == [("staging-bound", "cmd:inference-b")]
    a2 = Wl("", sm=0.07, feeder=0.55, wait=0.45, pressure=0.5, workload="cmd:inference-a", namespace="", container="")
    b2 = Wl("", sm=0.08, feeder=0.50, wait=0.47, pressure=0.5, workload="cmd:inference-b", namespace="", container="")
    tr, out = _replay(node_ticks({"0": Gpu(0.15, 0.1, [a2, b2])}))
    on = [o for o in out if o.name == "triscope_mismatch_state" and "gpu" in o.labels and o.value == 1.0]
    assert [(o.labels["state"], o.labels["workload"]) for o in on] == [("staging-bound", "")]
    assert tr.last is not None and tr.last.accelerators[0].evidence["workload_named_by"] == "host-wide"


def test_a_shared_link_names_the_workload_issuing_the_copies_or_none() -> None:
    """Recorded on the H200 (two services and a copy hog on one GPU): the link near its ceiling, the SMs
    starved.  The SM share says nothing about who fills the link (the hog has none): the verdict used
    to name a, the busiest computer.  Now it names the workload whose busiest thread works clearly
    hardest, else none; b uploading 2 GiB batches beside a light a is named."""
    def named(wls: list[Wl]) -> list[tuple[str, str]]:
        tr, out = _replay(node_ticks({"0": Gpu(0.06, 55.0, wls)}))
        return [(o.labels["state"], o.labels["workload"]) for o in out
                if o.name == "triscope_mismatch_state" and "gpu" in o.labels and o.value == 1.0]

    a = Wl("", sm=0.05, feeder=0.55, workload="cmd:inference-a", namespace="", container="")
    b = Wl("", sm=0.01, feeder=0.50, workload="cmd:inference-b", namespace="", container="")
    hog = Wl("", sm=0.0, feeder=0.76, workload="cmd:python3", namespace="", container="")
    assert named([a, b, hog]) == [("io-saturated", "")]
    a_light = Wl("", sm=0.03, feeder=0.17, workload="cmd:inference-a", namespace="", container="")
    b_up = Wl("", sm=0.02, feeder=0.65, workload="cmd:inference-b", namespace="", container="")
    assert named([a_light, b_up]) == [("io-saturated", "cmd:inference-b")]
    assert named([hog, a_light]) == [("io-saturated", "cmd:python3")]
    # a thread busy less than half the window is no evidence of who copies
    assert named([Wl("", sm=0.03, feeder=0.10, workload="cmd:inference-a", namespace="", container=""),
                  Wl("", sm=0.0, feeder=0.40, workload="cmd:inference-b", namespace="", container="")]) == [
        ("io-saturated", "")]


def test_pin_churn_counts_on_the_accelerators_own_device() -> None:
    """GPU 1 pins host memory (its own PCI device maps 80/s) while copying; GPU 0 on the same node
    copies as much without pinning: only GPU 1 is staging-bound (per-workload evidence path)."""
    ticks = node_ticks({"0": Gpu(0.02, 3.0, [Wl("a")]), "1": Gpu(0.02, 3.0, [Wl("b")], dma_maps=80.0)})
    tr, out = _replay(ticks)
    assert tr.accelerator_states == {"gpu=0": "demand-limited", "gpu=1": "staging-bound"}
    assert tr.last is not None and tr.last.pin_churn            # the node's flag
    by = {a.accelerator: a for a in tr.last.accelerators}
    assert by["gpu=1"].pin_churn and not by["gpu=0"].pin_churn
    assert by["gpu=1"].evidence["device_dma_map_rate"] == pytest.approx(80.0)
    assert tr.state == "staging-bound" and tr.last.evidence["accelerator"] == "gpu=1"


# ------------------------------------------------------------------------------------ host copies: a workload's cores
INF_A: WorkloadKey = ("", "", "", "cmd:inference-a")
INF_B: WorkloadKey = ("", "", "", "cmd:inference-b")
H200_CEILING = 58.6e9


def _shared_gpu(link: float, cores: dict[WorkloadKey, float], busy: float = 0.06,
                feeders: dict[WorkloadKey, float] | None = None, th: MismatchThresholds = TH) -> AcceleratorVerdict:
    """One H200 shared by inference-a and inference-b (the recorded pageable fault: SM 0.056-0.063,
    b's busiest thread 0.35-0.42, no CPU wait, no cgroup pressure), its link at ``link`` of the
    ceiling, each workload keeping ``cores`` busy: the accelerator's verdict."""
    feeders = feeders or {INF_A: 0.12, INF_B: 0.40}
    per = [WorkloadEvidence(k, feeders[k], 0.0, 0.0, cores.get(k)) for k in (INF_A, INF_B)]
    top = max(feeders, key=lambda k: feeders[k])
    acc = AcceleratorFeatures("gpu=0", busy, link * H200_CEILING, H200_CEILING, 1.0, busy, link * H200_CEILING,
                              dma_map_rate=0.0, feeder_busy=feeders[top], cpu_wait=0.0, cpu_pressure=0.0,
                              feeder_of=top, cpu_wait_of=INF_A, cpu_pressure_of=INF_A, workload=INF_A,
                              workloads=2, per_workload=per, workload_cores=cores)
    v = classify_window(WindowFeatures([acc], cpu_busy=0.1, pressure=0.0, dma_map_rate=0.0, retransmit_rate=0.0), th)
    assert v is not None
    return v.accelerators[0]


def test_a_workload_feeding_pageable_copies_is_staging_bound_and_named() -> None:
    """Measured on the H200: the pageable fault keeps inference-b at 1.24-1.43 cores with the link at
    12-14 % and no thread pegged; inference-a, healthy, at 0.09-0.13 cores."""
    for link, b_cores in ((0.12, 1.24), (0.14, 1.43)):
        a = _shared_gpu(link, {INF_A: 0.11, INF_B: b_cores})
        assert a.state == "staging-bound", a.evidence["reasons"]
        assert a.workload["workload"] == "cmd:inference-b"
        assert a.evidence["workload_named_by"] == "host evidence: its threads feed the copies"
        assert any(r.startswith("copies fed by the host") and "cmd:inference-b" in r for r in a.evidence["reasons"])
        assert a.score == pytest.approx(0.94)
        assert a.evidence["workload_cores_max"] == pytest.approx(b_cores)


@pytest.mark.parametrize("link, b_cores, th, state", [
    (0.001, 1.33, TH, "demand-limited"),                                  # the link quiet: no copies to feed
    (TH.staging_link_floor - 0.001, 1.33, TH, "demand-limited"),          # just below the floor
    (TH.io_saturated_link, 1.33, TH, "io-saturated"),                     # the link's own ceiling decides
    (0.13, 1.33, MismatchThresholds(host_copy_cores=0), "demand-limited"),     # the rule switched off
    (0.13, 1.33, TH.with_overrides({"host_copy_cores": 1.5}), "demand-limited"),  # 1.33 < 1.5
    (0.13, 0.6, TH, "demand-limited"),     # the healthy service at full load: 0.5-0.7 cores
    (0.13, TH.host_copy_cores, TH, "staging-bound"),                      # at the threshold
])
def test_host_copy_cores_needs_the_link_band_and_the_cores(link: float, b_cores: float, th: MismatchThresholds,
                                                           state: str) -> None:
    a = _shared_gpu(link, {INF_A: 0.11, INF_B: b_cores}, th=th)
    assert a.state == state, a.evidence["reasons"]
    assert any(r.startswith("copies fed by the host") for r in a.evidence["reasons"]) == (state == "staging-bound")


def test_the_healthy_service_at_full_load_is_demand_limited() -> None:
    """inference-a at full load, measured: 0.5-0.7 cores, link 0.1 %, SM 0.09-0.10; even with the
    link at 12 % its 0.6 cores are no host copy evidence."""
    for link in (0.001, 0.12):
        a = _shared_gpu(link, {INF_A: 0.6, INF_B: 0.11}, busy=0.095, feeders={INF_A: 0.35, INF_B: 0.05})
        assert a.state == "demand-limited", (link, a.evidence["reasons"])
        assert not any("copies fed by the host" in r for r in a.evidence["reasons"])


def test_two_workloads_feeding_copies_alike_name_none() -> None:
    a = _shared_gpu(0.13, {INF_A: 1.2, INF_B: 1.3})
    assert a.state == "staging-bound"
    assert a.workload == dict.fromkeys(ACC_KEYS, "") and a.evidence["workload_named_by"] == "host-wide"
    # one clearly the busier (>= 1.5 x): named
    a = _shared_gpu(0.13, {INF_A: 1.2, INF_B: 1.8})
    assert a.workload["workload"] == "cmd:inference-b"
    assert a.evidence["workload_named_by"] == "host evidence: its threads feed the copies"


def test_a_pegged_feeder_and_another_workloads_copies_name_none() -> None:
    """a's thread pegged while b's threads feed the copies: two workloads with evidence of two kinds,
    and acting on either would be a guess (host-wide); a pegged and feeding the copies: a."""
    a = _shared_gpu(0.13, {INF_A: 0.3, INF_B: 1.4}, feeders={INF_A: 0.99, INF_B: 0.40})
    assert a.state == "staging-bound"
    assert a.workload == dict.fromkeys(ACC_KEYS, "") and a.evidence["workload_named_by"] == "host-wide"
    a = _shared_gpu(0.13, {INF_A: 1.4, INF_B: 0.3}, feeders={INF_A: 0.99, INF_B: 0.40})
    assert a.workload["workload"] == "cmd:inference-a" and a.evidence["workload_named_by"] == "host evidence"


def test_the_agents_other_sum_never_feeds_the_copies() -> None:
    """``other`` sums the workloads past the agent's per-accelerator limit: many small services add up
    past a core, and naming it would page no one in particular."""
    other: WorkloadKey = ("", "", "", "other")
    a = _shared_gpu(0.08, {INF_A: 0.3, other: 1.4})
    assert a.state == "demand-limited", a.evidence["reasons"]
    a = _shared_gpu(0.08, {INF_B: 1.3, other: 1.4})
    assert a.state == "staging-bound" and a.workload["workload"] == "cmd:inference-b"


def test_a_cpu_heavy_workload_does_not_outweigh_retransmits() -> None:
    """The host-copy strength is capped: 4 cores beside 10 retransmits/s (twice their threshold) is
    network-bound, as it is with 1.3 cores."""
    for cores in (1.3, 4.0):
        acc = AcceleratorFeatures("gpu=0", 0.06, 0.08 * H200_CEILING, H200_CEILING, 1.0, 0.06, 0.08 * H200_CEILING,
                                  dma_map_rate=0.0, feeder_busy=0.4, cpu_wait=0.0, cpu_pressure=0.0, feeder_of=INF_B,
                                  cpu_wait_of=INF_B, cpu_pressure_of=INF_B, workload=INF_B, workloads=1,
                                  per_workload=[WorkloadEvidence(INF_B, 0.4, 0.0, 0.0, cores)],
                                  workload_cores={INF_B: cores})
        v = classify_window(WindowFeatures([acc], cpu_busy=0.1, pressure=0.0, dma_map_rate=0.0, retransmit_rate=10.0))
        assert v is not None and v.state == "network-bound", (cores, v.evidence["reasons"])


def test_a_process_on_several_accelerators_shares_its_cores_among_them() -> None:
    """The agent lists a process under every accelerator it holds, each time with all its CPU: one
    process at 1.6 cores on two GPUs is 0.8 on each, under ``host_copy_cores``; alone on one, 1.6."""
    def acc(name: str) -> AcceleratorWindow:
        return AcceleratorWindow(name, [0.06] * 10, [0.12 * H200_CEILING] * 10, H200_CEILING, 10.0,
                                 workloads=[WorkloadWindow(INF_B, 10.0, feeder=[0.4] * 10, cpu_wait=[0.0] * 10,
                                                           cores=[1.6] * 10)])
    two = window_features(WindowValues([acc("gpu=0"), acc("gpu=1")]))
    assert [a.workload_cores[INF_B] for a in two.accelerators] == [pytest.approx(0.8)] * 2
    v = classify_window(two)
    assert v is not None and {a.state for a in v.accelerators} == {"demand-limited"}
    one = window_features(WindowValues([acc("gpu=0")]))
    assert one.accelerators[0].workload_cores[INF_B] == pytest.approx(1.6)
    v = classify_window(one)
    assert v is not None and v.state == "staging-bound"


def test_tracker_reads_the_cpu_counter_as_cores() -> None:
    """The recorded pageable fault fed tick by tick: b's counter grows 1.3 s per 1 s tick, its busiest
    thread at 0.40; the tracker's state names b from its cores."""
    a = Wl("", sm=0.05, feeder=0.12, wait=0.0, workload="cmd:inference-a", namespace="", container="", cores=0.11)
    b = Wl("", sm=0.01, feeder=0.40, wait=0.0, workload="cmd:inference-b", namespace="", container="", cores=1.3)
    link = 0.13 * 53.6                      # GB/s: 13 % of the Gen5 x16 link
    tr, out = _replay(node_ticks({"0": Gpu(0.06, link, [a, b])}))
    assert tr.accelerator_states == {"gpu=0": "staging-bound"}
    on = [o for o in out if o.name == "triscope_mismatch_state" and "gpu" in o.labels and o.value == 1.0]
    assert [(o.labels["state"], o.labels["workload"]) for o in on] == [("staging-bound", "cmd:inference-b")]
    assert tr.last is not None
    ev = tr.last.accelerators[0].evidence
    assert ev["workload_cores_max"] == pytest.approx(1.3)
    assert ev["workload_named_by"] == "host evidence: its threads feed the copies"
    # the same without the counter: nothing says the host copies
    a.cores = b.cores = None
    tr, _ = _replay(node_ticks({"0": Gpu(0.06, link, [a, b])}))
    assert tr.accelerator_states == {"gpu=0": "demand-limited"}


def test_a_workloads_first_counter_point_gives_no_rate() -> None:
    """A counter that started long ago (12345 CPU seconds) gives no rate on its first point, then
    the per-second increase; a reset counts from zero."""
    tr = MismatchTracker(TH)
    wl = {"gpu": "0", "namespace": "", "pod": "", "container": "", "workload": "cmd:inference-b"}

    def tick(ts: float, cpu: float) -> dict[str, Any]:
        tr.process(ts, [Sample("triscope_gpu_sm_active_ratio", 0.06, {"gpu": "0"}),
                        Sample("triscope_accelerator_workload_info", 1.0, {**wl, "uuid": "GPU-0"}),
                        Sample("triscope_workload_feeder_busy_ratio", 0.4, wl),
                        Sample("triscope_workload_cpu_seconds_total", cpu, wl, "counter")])
        assert tr.last is not None
        return tr.last.accelerators[0].evidence

    assert "workload_cores_max" not in tick(1000.0, 12345.0)
    assert tick(1001.0, 12346.3)["workload_cores_max"] == pytest.approx(1.3)
    assert tick(1003.0, 12347.3)["workload_cores_max"] == pytest.approx((1.3 + 0.5) / 2)
    assert tick(1004.0, 0.9)["workload_cores_max"] == pytest.approx((1.3 + 0.5 + 0.9) / 3)  # restarted


# ------------------------------------------------------------------------------------ per accelerator, roll-up
def test_eight_gpus_one_state_each_and_the_node_takes_the_worst(db_url: str) -> None:
    gpus = {str(g): Gpu(0.04, 2.5, [Wl(f"llm-{g}", sm=0.04)]) for g in range(8)}
    gpus["2"] = Gpu(0.93, 1.0, [Wl("train-2", sm=0.9, workload="Job/train")])
    gpus["5"] = Gpu(0.05, 6.0, [Wl("etl-5", sm=0.03, feeder=0.98), Wl("side-5", sm=0.01)])
    gpus["7"] = Gpu(0.0, 0.0, [])                                        # nobody on it
    ticks = node_ticks(gpus, n=40)
    st = _store(db_url, "n8", ticks)
    a, b = ticks[0].ts, ticks[-1].ts + 1
    per = accelerator_states(st, "n8", a, b, thresholds=TH)
    roll = node_states(st, "n8", a, b, thresholds=TH)
    st.close()
    assert len(per) == 8 * len(roll) and len(roll) == 4
    last = {p.accelerator: p for p in per if p.start == roll[-1].start}
    assert {k: p.state for k, p in last.items()} == {
        **{f"gpu={g}": "demand-limited" for g in (0, 1, 3, 4, 6)},
        "gpu=2": "compute-bound", "gpu=5": "staging-bound", "gpu=7": "idle"}
    assert last["gpu=5"].workload == {"namespace": "inference", "pod": "etl-5", "container": "server", "workload": ""}
    assert last["gpu=2"].workload["workload"] == "Job/train" and last["gpu=2"].labels == {"gpu": "2"}
    assert last["gpu=7"].workload == dict.fromkeys(ACC_KEYS, "")
    assert [w.state for w in roll] == ["staging-bound"] * 4
    ev = roll[-1].evidence
    assert ev["accelerator"] == "gpu=5" and ev["workload"]["pod"] == "etl-5" and ev["feeder_busy"] > 0.9
    assert ev["accelerators"]["gpu=2"] == {"state": "compute-bound", "score": last["gpu=2"].score,
                                           "workload": "inference/train-2/server (Job/train)"}


def test_rollup_puts_io_states_first_then_the_score() -> None:
    # GPU 0: balanced by its typical tick (busy 30 %, link saturated) but idle half the window, so
    # its score (0.82) beats GPU 1's staging-bound 0.75: the node is still staging-bound
    bal = AcceleratorFeatures("gpu=0", 0.18, 50e9, 60e9, 1.0, 0.30, 50e9)
    stg = AcceleratorFeatures("gpu=1", 0.25, 10e9, 60e9, 1.0, 0.25, 10e9, feeder_busy=0.99,
                              feeder_of=("ns", "p", "c", ""))
    v = classify_window(WindowFeatures([bal, stg]), TH)
    assert v is not None
    by = {a.accelerator: a for a in v.accelerators}
    assert by["gpu=0"].state == "balanced" and by["gpu=0"].score == pytest.approx(0.82)
    assert by["gpu=1"].state == "staging-bound" and by["gpu=1"].score == pytest.approx(0.75)
    assert v.state == "staging-bound" and v.score == pytest.approx(0.75) and v.evidence["accelerator"] == "gpu=1"
    # among states that are not I/O states, the score; demand-limited and idle score 0
    v = classify_window(WindowFeatures([AcceleratorFeatures("gpu=0", 0.04, 2.5e9, 60e9),
                                        AcceleratorFeatures("gpu=1", 0.0, 0.0, 60e9),
                                        AcceleratorFeatures("gpu=2", 0.95, 1e9, 60e9)]), TH)
    assert v is not None and [a.state for a in v.accelerators] == ["demand-limited", "idle", "compute-bound"]
    assert v.state == "compute-bound"


def test_balanced_at_any_sm_activity_when_both_are_near_their_ceilings() -> None:
    for busy in (0.70, 0.85, 0.99):
        v = classify_window(WindowFeatures([AcceleratorFeatures("gpu=0", busy, 55e9, 60e9)]), TH)
        assert v is not None and v.state == "balanced", busy
    v = classify_window(WindowFeatures([AcceleratorFeatures("gpu=0", 0.99, 40e9, 60e9)]), TH)
    assert v is not None and v.state == "compute-bound"


def test_dominant_workload() -> None:
    def w(pod: str, last: float = 10.0, sm: list[float] | None = None, procs: list[float] | None = None,
          workload: str = "") -> WorkloadWindow:
        return WorkloadWindow(("ns", pod, "c", workload), last, sm=sm or [], processes=procs or [])

    assert dominant_workload([w("a", sm=[0.1, 0.2]), w("b", sm=[0.5, 0.1])])[1] == "b"      # SM share first
    assert dominant_workload([w("a", procs=[3]), w("b", procs=[1])])[1] == "a"              # else processes
    assert dominant_workload([w("a", sm=[0.0]), w("b", procs=[5])])[1] == "a"               # any SM share wins
    assert dominant_workload([w("", sm=[0.9], workload="other"), w("b", sm=[0.1])])[1] == "b"
    assert dominant_workload([w("a", last=9.0, sm=[0.9]), w("b", sm=[0.1])])[1] == "b"      # a left before the end
    assert dominant_workload([]) == ("", "", "", "")


# ------------------------------------------------------------------------------------ the tracker's series
def test_tracker_publishes_per_accelerator_series_with_workload_labels() -> None:
    ticks = node_ticks({"0": Gpu(0.04, 2.5, [Wl("llm-0", sm=0.03, processes=2), Wl("side", sm=0.01)]),
                        "1": Gpu(0.01, 9.0, [Wl("etl-1", sm=0.01, feeder=0.99, workload="Deployment/etl")]),
                        "2": Gpu(0.0, 0.0, [])})
    tr, out = _replay(ticks)
    states = [o for o in out if o.name == "triscope_mismatch_state"]
    scores = [o for o in out if o.name == "triscope_mismatch_score"]
    per_acc = [o for o in states if "gpu" in o.labels]
    node = [o for o in states if "gpu" not in o.labels]
    # the node's roll-up keeps its label set: {state} only
    assert {tuple(sorted(o.labels)) for o in node} == {("state",)}
    assert {o.labels["state"] for o in node} == set(STATES) and sum(o.value for o in node) == 1
    assert {o.labels["state"]: o.value for o in node}["staging-bound"] == 1.0
    # per accelerator: a stable label set, one-hot over the seven states
    assert {frozenset(o.labels) for o in per_acc} == {frozenset({"state", "gpu", *ACC_KEYS})}
    on = {o.labels["gpu"]: o.labels for o in per_acc if o.value == 1.0}
    assert len(per_acc) == 3 * len(STATES) and len(on) == 3
    assert on["0"] == {"state": "demand-limited", "gpu": "0", "namespace": "inference", "pod": "llm-0",
                       "container": "server", "workload": ""}
    assert on["1"]["state"] == "staging-bound" and on["1"]["workload"] == "Deployment/etl"
    assert on["2"] == {"state": "idle", "gpu": "2", **dict.fromkeys(ACC_KEYS, "")}
    acc_scores = {o.labels.get("gpu"): o for o in scores}
    assert set(acc_scores) == {"0", "1", "2", None}
    assert acc_scores["0"].value == 0.0 and acc_scores["1"].value > 0.95 and acc_scores[None].labels == {}
    assert acc_scores["1"].labels == {k: v for k, v in on["1"].items() if k != "state"}


def test_a_shared_gpu_names_the_starved_workload_not_the_busiest(tmp_path: Path) -> None:
    """Two services on one GPU: inference-a has the larger SM share, inference-b's feeder is pegged
    (pageable copies).  The staging verdict names inference-b, per tick and from the store; with
    nothing pegged it names the dominant workload again."""
    a = Wl("inference-a", sm=0.12, feeder=0.10, workload="cmd:inference-a", namespace="", container="")
    b = Wl("inference-b", sm=0.04, feeder=0.99, workload="cmd:inference-b", namespace="", container="")
    ticks = node_ticks({"0": Gpu(0.16, 9.0, [a, b])})
    _, out = _replay(ticks)
    on = [o for o in out if o.name == "triscope_mismatch_state" and "gpu" in o.labels and o.value == 1.0]
    assert [(o.labels["state"], o.labels["workload"]) for o in on] == [("staging-bound", "cmd:inference-b")]
    st = _store(f"sqlite:///{tmp_path / 'shared.db'}", "n", ticks)
    per = accelerator_states(st, "n", ticks[0].ts, ticks[-1].ts + 1)
    assert per and {(p.state, p.workload["workload"]) for p in per} == {("staging-bound", "cmd:inference-b")}
    assert all(p.evidence["workload_named_by"] == "host evidence" for p in per)
    # the feeder back to normal: demand-limited, named by SM share
    b.feeder = 0.2
    _, out = _replay(node_ticks({"0": Gpu(0.16, 2.0, [a, b])}))
    on = [o for o in out if o.name == "triscope_mismatch_state" and "gpu" in o.labels and o.value == 1.0]
    assert [(o.labels["state"], o.labels["workload"]) for o in on] == [("demand-limited", "cmd:inference-a")]


def test_tracker_labels_npus_with_npu_and_chip() -> None:
    tr = MismatchTracker(TH)
    for i in range(12):
        wl = {"npu": "1", "chip": "0", "namespace": "ns", "pod": "p", "container": "c", "workload": ""}
        out = tr.process(1000.0 + i, [Sample("triscope_npu_aicore_utilization_ratio", 0.92, {"npu": "1", "chip": "0"}),
                                      Sample("triscope_accelerator_workload_info", 1.0, wl),
                                      Sample("triscope_workload_processes", 1.0, wl),
                                      Sample("triscope_workload_feeder_busy_ratio", 0.2, wl)])
    on = [o for o in out if isinstance(o, Sample) and o.name == "triscope_mismatch_state" and o.value == 1.0]
    assert {frozenset(o.labels.items()) for o in on} == {
        frozenset({"state": "compute-bound", "npu": "1", "chip": "0", "namespace": "ns", "pod": "p", "container": "c",
                   "workload": ""}.items()),
        frozenset({"state": "compute-bound"}.items())}


def test_each_accelerator_has_its_own_dwell() -> None:
    """GPU 1's workload changes at tick 15 (pod b, nothing waits -> pod c, a pegged feeder): its
    reported state follows its verdict after the dwell, GPU 0's never moves, and the labels follow
    the workload that is there now."""
    def shapes(i: int) -> dict[str, Gpu]:
        g1 = Gpu(0.04, 2.5, [Wl("b", sm=0.04)]) if i < 15 else Gpu(0.02, 9.0, [Wl("c", sm=0.02, feeder=1.0)])
        return {"0": Gpu(0.95, 1.0, [Wl("a", sm=0.9)]), "1": g1}

    ticks = node_ticks(shapes, n=30)
    tr = MismatchTracker(TH)
    seen = []
    for t in ticks:
        tr.process(t.ts, list(t.samples))
        assert tr.last is not None
        verdict = {a.accelerator: a.state for a in tr.last.accelerators}["gpu=1"]
        seen.append((t.ts - ticks[0].ts, dict(tr.accelerator_states), verdict))
    assert all(s["gpu=0"] == "compute-bound" for _, s, _v in seen)
    changed = next(dt for dt, _s, v in seen if v == "staging-bound")
    reported = next(dt for dt, s, _v in seen if s["gpu=1"] == "staging-bound")
    assert 15 <= changed <= 15 + TH.window_s / 2 and reported - changed == TH.state_dwell_s
    # (the first tick has no link rate yet: idle until the dwell passes)
    assert all(s["gpu=1"] == "demand-limited" for dt, s, _v in seen if 5 <= dt < reported)
    assert {a.accelerator: a.workload["pod"] for a in tr.last.accelerators} == {"gpu=0": "a", "gpu=1": "c"}


# ------------------------------------------------------------------------------------ fetch paths, config, catalogue
def test_fetched_and_in_memory_inputs_give_the_same_verdicts(sqlite_url: str) -> None:
    """``fetch_mismatch_inputs`` (node_states) and ``mismatch_inputs_from_series`` (the root-cause
    query's path) read the per-workload series alike."""
    ticks = node_ticks({"0": Gpu(0.02, 6.0, [Wl("etl", sm=0.02, feeder=0.99)]), "1": Gpu(0.04, 2.5, [Wl("x")])})
    st = _store(sqlite_url, "n", ticks)
    a, b = ticks[0].ts, ticks[-1].ts + 1
    fetched = fetch_mismatch_inputs(st, "n", a, b, TH.window_s)
    series = [points_of(sd) for m in INPUT_METRICS for sd in st.query(m, node="n", start=a - TH.window_s, end=b,
                                                                      max_points=None)]
    series += [points_of(sd) for sd in st.query("triscope_gpu_info", node="n", start=a, end=b, max_points=None)]
    st.close()
    mem = mismatch_inputs_from_series(series, a, b)
    # info, processes, feeder, wait, cgroup pressure for both; SM share only for etl
    assert len(fetched.workloads) == len(mem.workloads) == 11
    got_f = [(w.verdict.state, [(x.accelerator, x.state, x.workload["pod"]) for x in w.verdict.accelerators])
             for w in window_verdicts(fetched, a, b, TH.window_s, TH)]
    got_m = [(w.verdict.state, [(x.accelerator, x.state, x.workload["pod"]) for x in w.verdict.accelerators])
             for w in window_verdicts(mem, a, b, TH.window_s, TH)]
    assert got_f == got_m and got_f[-1] == ("staging-bound", [("gpu=0", "staging-bound", "etl"),
                                                              ("gpu=1", "demand-limited", "x")])


def test_new_thresholds_come_from_the_file_and_the_environment(tmp_path: Path) -> None:
    p = tmp_path / "m.yaml"
    p.write_text("mismatch:\n  staging_link_floor: 0.03\n  feeder_busy: 0.8\n")
    th = load_thresholds(p, environ={"TRISCOPE_MISMATCH_CPU_WAIT": "0.5", "TRISCOPE_MISMATCH_WORKLOAD_CPU_PRESSURE": "0.2"})
    assert (th.staging_link_floor, th.feeder_busy, th.cpu_wait, th.workload_cpu_pressure) == (0.03, 0.8, 0.5, 0.2)
    assert th.host_copy_cores == TH.host_copy_cores == 1.0
    # the floor moves the lightly loaded GPU of an old recording across the line
    f = WindowFeatures([AcceleratorFeatures("gpu=0", 0.04, 2.5e9, 53.6e9)], cpu_busy=0.05)
    assert classify_window(f, TH).state == "demand-limited"  # type: ignore[union-attr]
    assert classify_window(f, th).state == "staging-bound"  # type: ignore[union-attr]


def test_host_copy_cores_comes_from_the_file_and_the_environment(tmp_path: Path) -> None:
    p = tmp_path / "m.yaml"
    p.write_text("mismatch:\n  host_copy_cores: 1.5\n")
    th = load_thresholds(p, environ={})
    assert th.host_copy_cores == 1.5
    assert load_thresholds(None, environ={"TRISCOPE_MISMATCH_HOST_COPY_CORES": "0"}).host_copy_cores == 0.0
    # 1.33 cores: the pageable fault at the default, not at 1.5 nor switched off
    assert _shared_gpu(0.13, {INF_A: 0.11, INF_B: 1.33}).state == "staging-bound"
    assert _shared_gpu(0.13, {INF_A: 0.11, INF_B: 1.33}, th=th).state == "demand-limited"
    p.write_text("mismatch:\n  host_copy_cores: 0\n")
    assert _shared_gpu(0.13, {INF_A: 0.11, INF_B: 1.33}, th=load_thresholds(p, environ={})).state == "demand-limited"


def test_catalogue_lists_the_states_and_the_labels() -> None:
    state, score = CATALOGUE["triscope_mismatch_state"], CATALOGUE["triscope_mismatch_score"]
    assert set(state.labels) == {"state", "gpu", "npu", "chip", *ACC_KEYS}
    assert set(score.labels) == {"gpu", "npu", "chip", *ACC_KEYS}
    assert all(s in state.help for s in STATES) and "demand-limited" in STATES
    assert STATES == ("idle", "demand-limited", "compute-bound", "balanced", "io-saturated", "staging-bound",
                      "network-bound")


def test_network_bound_needs_no_link_and_beats_weak_host_evidence(sqlite_url: str) -> None:
    ph = (PhaseShape("net", "network-bound", 0.0, 0.2 * GB, 0.01 * GB, 0.05, 0.0, retransmits=60.0),)
    st = _store(sqlite_url, "net", [Tick(ts, s, ev) for ts, s, ev in h200_phase_ticks(phases=ph, phase_s=30,
                                                                                       workload=WORKLOAD)])
    (_n, _e, a, b), = phase_intervals(ph, phase_s=30)
    per = accelerator_states(st, "net", a, b, thresholds=TH)
    st.close()
    # the node's retransmits alone (no per-workload TCP series): network-bound, naming no workload
    assert per and {p.state for p in per} == {"network-bound"} and per[0].workload["pod"] == ""
    assert per[0].evidence["workload_named_by"] == "node-wide retransmits: whose is not known"
