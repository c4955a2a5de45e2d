"""The verdict on the classes of real bottlenecks the issue measured on an H200 with stock serving code,
built from per-workload series as the agent publishes them (window values -> ``window_features`` ->
``classify_window``): a host-starved accelerator is ``staging-bound`` whatever its link does, a
workload's own lossy connections make it ``network-bound``, another process's retransmits never do,
and the workload named is the one with the evidence, not the one with the larger SM share.

The figures are the classes' shapes, not one recording's values: each case is checked across a
range (loss rates, throttling shares, busy levels) on both sides of its threshold.
"""

from __future__ import annotations

import pytest

from triscope.analysis.config import MismatchThresholds
from triscope.analysis.features import (
    AcceleratorWindow,
    WindowValues,
    WorkloadKey,
    WorkloadWindow,
    window_features,
)
from triscope.analysis.verdict import AcceleratorVerdict, classify_window

TH = MismatchThresholds()
CEIL = 53.6e9
A: WorkloadKey = ("inference", "vision-7f9c", "server", "")
B: WorkloadKey = ("inference", "text-1b2d", "server", "")
N = 10


def wl(key: WorkloadKey, sm: float = 0.0, feeder: float = 0.1, wait: float = 0.0, pressure: float | None = 0.0,
       cores: float = 0.3, throttled: float | None = None, rtx: float | None = 0.0, segs: float | None = 200.0
       ) -> WorkloadWindow:
    """One workload's series over a 10-tick window (counters already as per-second rates)."""
    w = WorkloadWindow(key, 9.0, sm=[sm] * N, processes=[17.0] * N, feeder=[feeder] * N, cpu_wait=[wait] * N,
                       cores=[cores] * N)
    if pressure is not None:
        w.cpu_pressure = [pressure] * N
    if throttled is not None:
        w.periods, w.throttled = [10.0] * N, [10.0 * throttled] * N
    if rtx is not None and segs is not None:
        w.retransmits, w.segments = [rtx] * N, [segs] * N
    return w


def verdict(busy: float, *workloads: WorkloadWindow, link: float = 0.001, node_rtx: float = 0.0) -> AcceleratorVerdict:
    v = classify_window(window_features(WindowValues(
        [AcceleratorWindow("gpu=0", [busy] * N, [link * CEIL] * N, CEIL, N, None, list(workloads))],
        cpu_busy=[0.3] * N, retransmit_rates=[[node_rtx] * N])), TH)
    assert v is not None
    return v.accelerators[0]


def named(v: AcceleratorVerdict) -> WorkloadKey:
    w = v.workload
    return (w["namespace"], w["pod"], w["container"], w["workload"])


# ------------------------------------------------------------------------------------ host-starved
@pytest.mark.parametrize("busy", [0.02, 0.08, 0.14, 0.25])
@pytest.mark.parametrize("link", [0.0, 0.01, 0.05])
def test_a_loader_with_too_few_workers_is_staging_bound_with_the_link_quiet(busy: float, link: float) -> None:
    """Loader workers pegged (each a full core), the GPU waiting on data 75-98 % of the time, the
    link carrying little: the host cannot produce data fast enough."""
    v = verdict(busy, wl(A, sm=busy, feeder=0.99, cores=7.6), link=link)
    assert v.state == "staging-bound" and named(v) == A, v.evidence["reasons"]


@pytest.mark.parametrize("throttled", [0.3, 0.6, 0.99])
def test_a_throttled_pod_is_staging_bound_and_named_not_the_busier_one(throttled: float) -> None:
    """The serving pod under a CPU limit (0.05 CPU: throttled nearly every period) on a GPU it shares
    with a busier healthy pod: named, though its SM share is the smaller."""
    v = verdict(0.06, wl(A, sm=0.05, feeder=0.3, cores=0.6), wl(B, sm=0.01, feeder=0.05, cores=0.05,
                                                                throttled=throttled, pressure=0.7))
    assert v.state == "staging-bound" and named(v) == B, v.evidence["reasons"]
    assert any("throttled in" in r for r in v.evidence["reasons"])


def test_throttling_below_the_bar_is_no_evidence() -> None:
    v = verdict(0.03, wl(A, sm=0.03, feeder=0.2, throttled=0.1))
    assert v.state in ("idle", "demand-limited"), v.evidence["reasons"]


@pytest.mark.parametrize("pressure", [0.12, 0.4, 0.79])
def test_a_loaders_cgroup_under_pressure_is_staging_bound(pressure: float) -> None:
    v = verdict(0.02, wl(A, sm=0.02, feeder=0.5, pressure=pressure, cores=1.0))
    assert v.state == "staging-bound" and named(v) == A


def test_workers_confined_to_one_core_wait_for_it() -> None:
    v = verdict(0.02, wl(A, sm=0.02, feeder=0.55, wait=0.5, cores=1.0))
    assert v.state == "staging-bound" and named(v) == A


@pytest.mark.parametrize("busy", [0.35, 0.5, 0.65])
def test_partly_busy_with_a_saturated_host_is_staging_not_demand(busy: float) -> None:
    """``demand-limited`` means the whole host side is quiet: a GPU at half its activity whose feeder
    is pegged is waiting on the host."""
    assert verdict(busy, wl(A, sm=busy, feeder=0.98)).state == "staging-bound"
    assert verdict(busy, wl(A, sm=busy, feeder=0.4)).state == "demand-limited"


@pytest.mark.parametrize("busy", [0.0, 0.02, 0.04, 0.15])
def test_a_healthy_service_at_low_load_is_never_an_io_state(busy: float) -> None:
    """2 % load: threads mostly asleep, no throttling, no pressure, its own connections clean."""
    v = verdict(busy, wl(A, sm=busy, feeder=0.05, cores=0.05, throttled=0.02, rtx=0.0, segs=40.0))
    assert v.state in ("idle", "demand-limited"), v.evidence["reasons"]


# ------------------------------------------------------------------------------------ network
@pytest.mark.parametrize("loss, segs", [(0.02, 20.0), (0.05, 40.0), (0.10, 20.0), (0.20, 60.0)])
def test_a_low_rate_services_own_lossy_connections_are_network_bound(loss: float, segs: float) -> None:
    """10 % of a low-rate service's packets lost: 2 retransmits/s, far under any node-wide rate bar,
    and its GPU idles while requests wait on retransmission timeouts."""
    v = verdict(0.01, wl(A, sm=0.01, rtx=loss * segs, segs=segs))
    assert v.state == "network-bound" and named(v) == A, v.evidence["reasons"]


@pytest.mark.parametrize("node_rtx", [5.0, 12.7, 40.0])
def test_another_process_s_retransmits_never_make_a_gpu_network_bound(node_rtx: float) -> None:
    """A non-GPU process's stream loses 20 % (12.7 retransmits/s on the node): the GPU services' own
    sockets are clean, so neither is network-bound, and neither is named."""
    v = verdict(0.04, wl(A, sm=0.04, rtx=0.0), wl(B, sm=0.01, rtx=0.0), node_rtx=node_rtx)
    assert v.state not in ("network-bound",), v.evidence["reasons"]
    v = verdict(0.9, wl(A, sm=0.9, rtx=0.0), node_rtx=node_rtx)
    assert v.state == "compute-bound"


def test_a_few_retransmits_of_a_quiet_connection_are_no_loss_rate() -> None:
    v = verdict(0.01, wl(A, sm=0.01, rtx=0.1, segs=2.0))       # 5 %, but one retransmit in 10 s
    assert v.state != "network-bound"


def test_the_lossy_workload_is_named_not_the_busier_one() -> None:
    v = verdict(0.12, wl(A, sm=0.11, rtx=0.0, segs=300.0), wl(B, sm=0.01, rtx=3.0, segs=30.0))
    assert v.state == "network-bound" and named(v) == B


def test_recordings_without_per_workload_tcp_read_the_node_and_name_none() -> None:
    v = verdict(0.04, wl(A, sm=0.04, rtx=None), node_rtx=12.0)
    assert v.state == "network-bound" and named(v) == ("", "", "", "")
    assert v.evidence["workload_named_by"] == "node-wide retransmits: whose is not known"


@pytest.mark.parametrize("loss_in, segs_in", [(0.02, 60.0), (0.05, 200.0), (0.12, 30.0)])
def test_loss_on_the_way_in_is_the_workloads_own_network(loss_in: float, segs_in: float) -> None:
    """A service fetching its inputs over a lossy path: the sender retransmits, so its own sockets send
    few retransmits (0.6 % of a handful of request segments), but they receive data out of order."""
    b = wl(B, sm=0.0, rtx=0.3, segs=50.0)
    b.ooo_in, b.segments_in = [loss_in * segs_in] * N, [segs_in] * N
    a = wl(A, sm=0.05, rtx=0.0, segs=1300.0)
    a.ooo_in, a.segments_in = [0.0] * N, [900.0] * N
    v = verdict(0.04, a, b)
    assert v.state == "network-bound" and named(v) == B, v.evidence["reasons"]
    assert any("out of order" in r for r in v.evidence["reasons"])
    # clean on the way in, and a quiet connection's one gap, are no loss rate
    b.ooo_in = [0.0] * N
    assert verdict(0.04, a, b).state != "network-bound"
    b.ooo_in, b.segments_in = [0.1] * N, [2.0] * N
    assert verdict(0.04, a, b).state != "network-bound"
