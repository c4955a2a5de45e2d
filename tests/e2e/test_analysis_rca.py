"""Root-cause ranking: synthetic H200 phases, real loopback retransmits (procfs and eBPF),
events merged with their evidence, and the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from triscope.agent.collectors.cpu import CpuCollector
from triscope.agent.collectors.tcp import TcpCollector
from triscope.analysis.rca.categories import categorize
from triscope.analysis.rca.changes import score_series
from triscope.analysis.rca.ranked import rank_causes
from triscope.analysis.synthetic import h200_phase_ticks, phase_intervals
from triscope.core.samples import EventRecord, Sample, Tick
from triscope.store import Store
from triscope.web.loopback import syn_retransmits

REPO = Path(__file__).resolve().parents[2]
NETWORK = ("network", "network_traffic")


def _phases_store(url: str) -> Store:
    st = Store.open(url)
    st.upgrade()
    st.write_ticks("h200", [Tick(ts, s, ev) for ts, s, ev in h200_phase_ticks()])
    return st


def _phase(name: str) -> tuple[float, float]:
    for n, _exp, a, b in phase_intervals():
        if n == name:
            return a, b
    raise KeyError(name)


def test_categories() -> None:
    assert categorize("triscope_tcp_retransmits_total", {}).key == "network"
    assert categorize("triscope_dma_map_total", {"device": "x"}).key == "dma_mapping"
    assert categorize("triscope_pressure_ratio", {"resource": "cpu", "kind": "some"}).key == "host_staging"
    assert categorize("triscope_pressure_ratio", {"resource": "memory", "kind": "some"}).key == "host_memory"
    assert categorize("triscope_gpu_pcie_rx_bytes_total", {"gpu": "0"}).key == "pcie_load"
    assert categorize("triscope_gpu_sm_active_ratio", {"gpu": "0"}).key == "accelerator_activity"
    assert categorize("triscope_gpu_xid_errors_total", {"gpu": "0"}).key == "gpu_health"
    assert categorize("inference_requests_total", {}).key == "application"


def test_score_series_magnitude_onset_and_noise() -> None:
    base_t = [float(i) for i in range(60)]
    base_v = [1.0 + 0.01 * ((i * 7) % 5 - 2) for i in range(60)]
    win_t = [60.0 + i for i in range(60)]
    steady = [1.0 + 0.01 * ((i * 3) % 5 - 2) for i in range(60)]
    mag, z, onset, *_ = score_series(base_t, base_v, win_t, steady, 60, 120, False)
    assert mag == 0.0 and onset is None  # noise is not a change
    late = [1.0] * 40 + [5.0] * 20
    early = [5.0] * 60
    m_late, _, on_late, d, *_ = score_series(base_t, base_v, win_t, late, 60, 120, False)
    m_early, _, on_early, *_ = score_series(base_t, base_v, win_t, early, 60, 120, False)
    assert d == "up" and on_late == 100.0 and on_early == 60.0 and 0 < m_late <= m_early <= 1.0
    # a counter series without baseline points counts from 0; a gauge "appears"
    assert score_series([], [], win_t, early, 60, 120, True)[3] == "up"
    assert score_series([], [], win_t, early, 60, 120, False)[3] == "appeared"
    assert score_series(base_t, base_v, [], [], 60, 120, False)[3] == "vanished"


def test_pageable_window_ranks_host_staging_above_network(sqlite_url: str) -> None:
    st = _phases_store(sqlite_url)
    res = rank_causes(st, "h200", *_phase("pageable_h2d"))
    keys = [c.key for c in res.causes]
    assert keys[0] == "host_staging", [(c.key, round(c.score, 2)) for c in res.causes]
    for k in NETWORK:
        if k in keys:
            assert keys.index("host_staging") < keys.index(k)
    assert res.mismatch["window_states"] == {"staging-bound": 1.0}
    st.close()


def test_pin_churn_window_ranks_dma_mapping_first(db_url: str) -> None:
    st = _phases_store(db_url)
    res = rank_causes(st, "h200", *_phase("pin_churn"))
    top = res.causes[0]
    assert top.key == "dma_mapping", [(c.key, round(c.score, 2)) for c in res.causes]
    fig = top.evidence[0]   # how far past pin churn the window is, then what moved
    assert fig["type"] == "absolute" and fig["figure"] == "dma_maps_per_second" and fig["strength"] > 50
    ev = next(e for e in top.evidence if e["type"] == "series")
    assert ev["series"].startswith("triscope_dma_map_total") and ev["direction"] == "up"
    assert ev["window"] == pytest.approx(1100, rel=0.05)
    assert top.onset == pytest.approx(_phase("pin_churn")[0], abs=2)
    assert res.mismatch["pin_churn_share"] == 1.0
    st.close()


def test_events_are_merged_as_evidence(sqlite_url: str) -> None:
    st = _phases_store(sqlite_url)
    a, b = _phase("matmul")
    st.add_events("h200", [EventRecord("xid", "GPU 0 XID 79: fell off the bus", "critical",
                                       {"gpu": "0", "xid": 79})], ts=a + 30)
    st.add_events("h200", [EventRecord("remediation", "dry-run: restart deployment/infer", "info",
                                       {"action": "restart_deployment"})], ts=a + 40)
    res = rank_causes(st, "h200", a, b)
    by = {c.key: c for c in res.causes}
    assert "gpu_health" in by
    assert any(e.get("kind") == "xid" and e["details"]["xid"] == 79 for e in by["gpu_health"].evidence)
    assert by["gpu_health"].onset == pytest.approx(a + 30)
    # the engine's own action is context beside the causes, never one of them (issue 27)
    assert "remediation" not in by
    ctx = {c.kind: c for c in res.context}
    assert "restart deployment/infer" in ctx["remediation"].summary
    assert res.as_dict()["context"][0]["context"] in ("application", "remediation")
    kinds = {e["kind"] for e in res.events}
    assert {"xid", "remediation", "phase"} <= kinds
    st.close()


def _record(st: Store, node: str, collectors: list, seconds: float, extra=None) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    """Run real collectors at 1 Hz for ``seconds`` and store the ticks; returns (first, last) ts."""
    first = last = 0.0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        now = time.time()
        items = [x for c in collectors for x in c.collect(now)]
        samples = [x for x in items if isinstance(x, Sample)]
        events = [x for x in items if isinstance(x, EventRecord)]
        if extra is not None:
            events += extra(now, samples)
        st.write_ticks(node, [Tick(now, samples, events)])
        first = first or now
        last = now
        time.sleep(max(0.0, 1.0 - (time.time() - now)))
    return first, last


def _retransmit_rca(st: Store, node: str, collectors: list, extra_factory=None):  # type: ignore[no-untyped-def]
    b0, _ = _record(st, node, collectors, 6.0)
    with syn_retransmits(32) as (host, port):
        peer = f"{host}:{port}"
        extra = extra_factory(peer) if extra_factory else None
        w0, w1 = _record(st, node, collectors, 8.5, extra)
    return rank_causes(st, node, w0 - 0.5, w1 + 0.5, baseline=(b0 - 0.5, w0 - 0.5)), peer


@pytest.mark.slow
def test_loopback_retransmits_rank_first_and_name_the_peer(sqlite_url: str) -> None:
    """Real SYN retransmits on loopback, counted by the procfs collector; the burst events carry the
    peer as the eBPF collector writes them (its own test below uses the real probe)."""
    st = Store.open(sqlite_url)
    st.upgrade()
    tcp = TcpCollector()
    cpu = CpuCollector()
    prev: dict[str, float] = {}

    def extra_factory(peer: str):  # type: ignore[no-untyped-def]
        def extra(now: float, samples: list[Sample]) -> list[EventRecord]:
            total = next(s.value for s in samples if s.name == "triscope_tcp_retransmits_total")
            delta = total - prev.get("t", total)
            prev["t"] = total
            if delta >= 5:
                return [EventRecord("retransmit_burst", f"{delta:.0f} TCP retransmits in one tick", "warning",
                                    {"retransmits": delta, "threshold": 5,
                                     "top_peers": [{"peer": peer, "retransmits": delta}]})]
            return []
        return extra

    res, peer = _retransmit_rca(st, "loop", [tcp, cpu], extra_factory)
    top = res.causes[0]
    assert top.key == "network", [(c.key, round(c.score, 2), c.summary) for c in res.causes]
    assert top.peers and top.peers[0] == peer
    series = [e for e in top.evidence if e.get("type") == "series"]
    assert series[0]["series"] == "triscope_tcp_retransmits_total" and series[0]["direction"] == "up"
    assert peer in top.summary
    st.close()


@pytest.mark.ebpf
@pytest.mark.slow
def test_loopback_retransmits_with_the_ebpf_probe(sqlite_url: str) -> None:
    from triscope.agent.collectors.ebpf import EbpfCollector

    st = Store.open(sqlite_url)
    st.upgrade()
    bpf = EbpfCollector(probes=["tcp_retransmit"], burst_threshold=5, selftest_pid=os.getpid())
    try:
        assert bpf.attached["tcp_retransmit"], bpf.reasons["tcp_retransmit"]
        res, peer = _retransmit_rca(st, "loop-ebpf", [bpf, TcpCollector(emit_retransmits=False)])
    finally:
        bpf.close()
    top = res.causes[0]
    assert top.key == "network", [(c.key, round(c.score, 2), c.summary) for c in res.causes]
    assert peer in top.peers
    assert any(e.get("kind") == "retransmit_burst" for e in top.evidence)
    st.close()


def test_cli_rca_text_and_json(sqlite_url: str) -> None:
    _phases_store(sqlite_url).close()
    a, b = _phase("pin_churn")
    exe = str(REPO / ".venv/bin/triscope")
    # --ranked: the older single list, window against the preceding window
    r = subprocess.run([exe, "rca", "--db", sqlite_url, "--node", "h200", "--start", str(a), "--end", str(b),
                        "--ranked"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    first = next(line for line in lines if line.startswith("1. "))
    assert "DMA mapping" in first
    assert "pin churn in 100% of windows" in r.stdout
    j = subprocess.run([exe, "rca", "--db", sqlite_url, "--node", "h200", "--start", str(a), "--end", str(b),
                        "--json", "--ranked"], capture_output=True, text=True)
    data = json.loads(j.stdout)
    assert data["causes"][0]["cause"] == "dma_mapping" and data["baseline"]["end"] == a
    # the default: the timeline; this store has no stored states, the classifier cuts the episodes
    j = subprocess.run([exe, "rca", "--db", sqlite_url, "--node", "h200", "--start", str(a - 60), "--end", str(b),
                        "--json"], capture_output=True, text=True)
    data = json.loads(j.stdout)
    assert data["states_from"] == "classifier"
    eps = [e for e in data["episodes"] if e["kind"] == "state"]
    assert [e["state"] for e in eps] == ["compute-bound", "staging-bound"], eps
    assert eps[1]["reference"]["kind"] == "healthy-before" and eps[1]["causes"][0]["cause"] == "dma_mapping"
    bad = subprocess.run([exe, "rca", "--db", sqlite_url, "--node", "nope", "--start", "-2h"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "unknown node 'nope'" in bad.stderr and "Traceback" not in bad.stderr
    bad_t = subprocess.run([exe, "rca", "--db", sqlite_url, "--node", "h200", "--start", "yesterday"],
                           capture_output=True, text=True)
    assert bad_t.returncode == 2 and "cannot read time 'yesterday'" in bad_t.stderr


def test_rca_reports_stage_skew_where_the_app_exports_it(sqlite_url: str) -> None:
    st = Store.open(sqlite_url)
    st.upgrade()
    ticks = []
    sums = {"preprocess": 0.0, "h2d": 0.0, "compute": 0.0, "d2h": 0.0}
    count = 0.0
    for i in range(120):
        slow_copy = i >= 60  # the second minute: host-to-device copies take 10x longer
        per = {"preprocess": 0.001, "h2d": 0.02 if slow_copy else 0.002, "compute": 0.004, "d2h": 0.001}
        count += 10
        for k, d in per.items():
            sums[k] += 10 * d
        ticks.append(Tick(1000.0 + i, [
            *(Sample("inference_stage_duration_seconds_sum", v, {"stage": k}, "counter") for k, v in sums.items()),
            *(Sample("inference_stage_duration_seconds_count", count, {"stage": k}, "counter") for k in sums),
        ]))
    st.write_ticks("app", ticks)
    res = rank_causes(st, "app", 1060.0, 1120.0)
    sv = res.stages["inference_stage_duration_seconds"]
    assert sv["window"]["bottleneck"] == "h2d" and sv["baseline"]["bottleneck"] == "compute"
    assert sv["window"]["bubble_fraction"] > sv["baseline"]["bubble_fraction"]
    # the application's own stage timings are a symptom: context beside the causes, never one of them
    assert all(c.key != "application" for c in res.causes)
    app = next(c for c in res.context if c.kind == "application")
    assert "h2d" in app.summary
    st.close()
