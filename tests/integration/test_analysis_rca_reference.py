"""References that exist (or none), and what is not a cause: synthetic H200-shaped nodes whose
stored states come from the real per-tick tracker (``MismatchTracker``, as the agent runs it), on
real SQLite and PostgreSQL stores.

* the healthy period before, the workload's history on another node, fleet peers running the same
  workload at the same time, none (ranked on absolute evidence), a baseline given;
* a network-bound episode (retransmits) explained as network, from the classifier's states;
* the agent's own metrics are a cause only while the agent is unhealthy; a GPU at its power cap is
  not a health fault, a thermal slowdown is.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import pytest

from triscope.analysis.online import MismatchTracker
from triscope.analysis.rca.timeline import rca_timeline
from triscope.analysis.synthetic import H200_PHASES, PhaseShape, h200_phase_ticks
from triscope.core.samples import EventRecord, Sample, Tick
from triscope.store import Store

P = {p.name: p for p in H200_PHASES}
NET = PhaseShape("net", "network-bound", 0.03, 0.4e9, 0.2e9, 0.05, 0.0, retransmits=40.0)
T0 = 1_800_000_000.0
W = {"namespace": "ml", "container": "server", "workload": "Deployment/infer"}


def record(st: Store, node: str, phases: Sequence[PhaseShape], start: float, phase_s: int = 60,
           pod: str | None = None, tracker: bool = True,
           extra: Callable[[float, str], list[Sample]] | None = None) -> None:
    """Ticks through ``phases`` as the agent stores them: the collectors' samples (with the
    workload's series when ``pod`` is given), and the tracker's states and events."""
    tr = MismatchTracker()
    ticks = []
    phase_at = [(start + i * phase_s, p.name) for i, p in enumerate(phases)]
    workload = {**W, "pod": pod} if pod else None
    for ts, s, ev in h200_phase_ticks(start=start, phase_s=phase_s, phases=phases, workload=workload):
        if extra is not None:
            s = s + extra(ts, next(n for t, n in reversed(phase_at) if t <= ts))
        out = tr.process(ts, s) if tracker else []
        ticks.append(Tick(ts, s + [x for x in out if isinstance(x, Sample)],
                          list(ev) + [x for x in out if isinstance(x, EventRecord)]))
    st.write_ticks(node, ticks)


@pytest.fixture
def st(db_url: str):  # type: ignore[no-untyped-def]
    s = Store.open(db_url)
    s.upgrade()
    yield s
    s.close()


def _bad(tl: Any) -> list[Any]:
    return [e for e in tl.episodes if e.kind == "state" and e.bad]


def test_workload_history_on_another_node(st: Store) -> None:
    record(st, "a", [P["matmul"], P["matmul"]], T0, pod="infer-7d9f8c6b5-aaaaa")
    record(st, "b", [P["pageable_h2d"], P["matmul"]], T0 + 7200, pod="infer-7d9f8c6b5-bbbbb")
    tl = rca_timeline(st, "b", T0 + 7200, T0 + 7320)
    assert tl.source == "verdict history"
    e = _bad(tl)[0]
    assert e.state == "staging-bound" and e.workload == ("ml", "infer-7d9f8c6b5-bbbbb", "server", "Deployment/infer")
    ref = e.reference
    assert ref is not None and ref["kind"] == "workload-history" and ref["node"] == "a", ref
    assert ref["state"] == "compute-bound" and ref["end"] <= T0 + 120
    top = e.causes[0]
    assert top.key == "host_staging", [(c.key, round(c.score, 2)) for c in e.causes]
    assert any(x["type"] == "absolute" and x["figure"] == "feeder_busy" and x["value"] > 0.9 for x in top.evidence)
    # compared with node a's series of the same workload (another pod): the feeder went from ~0.3 to pegged
    moved = {x["series"].split("{")[0]: x for x in top.evidence if x["type"] == "series"}
    assert "triscope_workload_feeder_busy_ratio" in moved, top.evidence
    assert moved["triscope_workload_feeder_busy_ratio"]["baseline"] == pytest.approx(0.3, abs=0.05)


def test_fleet_peers_at_the_same_time(st: Store) -> None:
    record(st, "b", [P["pageable_h2d"], P["matmul"]], T0, pod="infer-7d9f8c6b5-bbbbb")
    record(st, "c", [P["matmul"], P["matmul"]], T0, pod="infer-7d9f8c6b5-ccccc")
    record(st, "d", [P["pageable_h2d"], P["matmul"]], T0, pod="other-0")   # another workload: no peer
    tl = rca_timeline(st, "b", T0, T0 + 120)
    e = _bad(tl)[0]
    assert e.reference is not None and e.reference["kind"] == "fleet-peers", e.reference
    assert e.reference["peers"] == ["c/gpu=0"]
    assert e.causes[0].key == "host_staging"


def test_no_reference_ranks_on_absolute_evidence(sqlite_url: str) -> None:
    st = Store.open(sqlite_url)
    st.upgrade()
    record(st, "n", [P["pinned_h2d"], P["matmul"]], T0)   # bad from its first tick, no workload labels
    tl = rca_timeline(st, "n", T0, T0 + 120)
    e = _bad(tl)[0]
    assert e.state == "io-saturated" and e.reference == {"kind": "none", "why": e.reference["why"]}
    assert "no workload labels" in e.reference["why"] and "absolute evidence" in e.reference["why"]
    top = e.causes[0]
    assert top.key == "pcie_load" and {x["type"] for x in top.evidence} == {"absolute"}
    assert not any(x["type"] == "series" for c in e.causes for x in c.evidence)   # nothing "rose from 0"
    # a baseline given is the reference of every bad episode
    record(st, "n", [P["matmul"]], T0 - 120)
    tl = rca_timeline(st, "n", T0, T0 + 120, baseline=(T0 - 110, T0 - 70))
    e = _bad(tl)[0]
    assert e.reference is not None and e.reference["kind"] == "given" and e.causes[0].key == "pcie_load"
    assert any(x["type"] == "series" for x in e.causes[0].evidence)
    st.close()


def test_network_bound_from_the_classifier(st: Store) -> None:
    record(st, "net", [P["matmul"], NET, P["matmul"]], T0, tracker=False)   # an older store: no states
    tl = rca_timeline(st, "net", T0, T0 + 180)
    assert tl.source == "classifier"
    bad = _bad(tl)
    assert [e.state for e in bad] == ["network-bound"], [(e.state, e.start - T0, e.end - T0) for e in tl.episodes]
    e = bad[0]
    assert abs(e.start - (T0 + 60)) <= 10 and abs(e.end - (T0 + 120)) <= 10
    assert e.reference is not None and e.reference["kind"] == "healthy-before"
    top = e.causes[0]
    assert top.key == "network", [(c.key, round(c.score, 2)) for c in e.causes]
    fig = next(x for x in top.evidence if x["type"] == "absolute")
    assert fig["figure"] == "retransmits_per_second" and fig["value"] == pytest.approx(40, rel=0.1)


def _agent_samples(errors: bool) -> Callable[[float, str], list[Sample]]:
    def extra(ts: float, phase: str) -> list[Sample]:
        slow = phase == "pageable_h2d"
        return [Sample("triscope_ticks_total", ts - T0, {}, "counter"),
                Sample("triscope_tick_duration_seconds", 0.2 if slow else 0.01, {}),
                Sample("triscope_process_resident_memory_bytes", 9e8 if slow else 5e7, {}),
                Sample("triscope_store_write_errors_total", (ts - T0 - 60 if errors and slow else 0.0), {}, "counter")]
    return extra


def test_the_agent_is_context_only_while_unhealthy(sqlite_url: str) -> None:
    st = Store.open(sqlite_url)
    st.upgrade()
    record(st, "ok", [P["matmul"], P["pageable_h2d"], P["matmul"]], T0, extra=_agent_samples(errors=False))
    record(st, "sick", [P["matmul"], P["pageable_h2d"], P["matmul"]], T0, extra=_agent_samples(errors=True))
    e = _bad(rca_timeline(st, "ok", T0, T0 + 180))[0]
    assert e.causes[0].key == "host_staging"
    assert "agent" not in {c.key for c in e.causes} and "agent" not in {c.kind for c in e.context}
    e = _bad(rca_timeline(st, "sick", T0, T0 + 180))[0]
    # the agent's trouble is a gap in the evidence shown beside the causes, never ranked among them
    assert e.causes[0].key == "host_staging" and "agent" not in {c.key for c in e.causes}
    agent = next(c for c in e.context if c.kind == "agent")
    assert any(x["type"] == "absolute" and "store write errors" in x["detail"] for x in agent.evidence)
    assert any(x["type"] == "series" and x["series"].startswith("triscope_tick_duration_seconds")
               for x in agent.evidence)
    st.close()


def test_power_cap_is_no_health_fault_thermal_slowdown_is(sqlite_url: str) -> None:
    def gpu(thermal: bool) -> Callable[[float, str], list[Sample]]:
        def extra(ts: float, phase: str) -> list[Sample]:
            hot = phase == "pageable_h2d"
            bits = 0x4 | (0x40 if thermal and hot else 0)     # SW power cap all along
            return [Sample("triscope_gpu_throttle_reasons", float(bits), {"gpu": "0"}),
                    Sample("triscope_gpu_temperature_celsius", 72.0 if hot else 45.0, {"gpu": "0"})]
        return extra

    st = Store.open(sqlite_url)
    st.upgrade()
    record(st, "cap", [P["matmul"], P["pageable_h2d"], P["matmul"]], T0, extra=gpu(thermal=False))
    record(st, "hot", [P["matmul"], P["pageable_h2d"], P["matmul"]], T0, extra=gpu(thermal=True))
    tl = rca_timeline(st, "cap", T0, T0 + 180)
    assert not [e for e in tl.episodes if e.kind == "health"]
    e = _bad(tl)[0]
    health = next((c for c in e.causes if c.key == "gpu_health"), None)
    # the temperature rose 27 C against the matmul before: a change, not a fault (a quarter of its score)
    assert health is None or (health.score < 0.3 and not any(x["type"] == "absolute" for x in health.evidence))
    assert e.causes[0].key == "host_staging"
    e = _bad(rca_timeline(st, "hot", T0, T0 + 180))[0]
    health = next(c for c in e.causes if c.key == "gpu_health")
    assert any(x["type"] == "absolute" and "HW thermal slowdown" in x["detail"] for x in health.evidence)
    assert health.score > 1.0
    st.close()


def test_health_events_in_an_episode_are_its_evidence(sqlite_url: str) -> None:
    st = Store.open(sqlite_url)
    st.upgrade()
    record(st, "x", [P["matmul"], replace(P["pinned_h2d"], name="pinned"), P["matmul"]], T0)
    st.add_events("x", [EventRecord("aer", "PCIe AER: 3 correctable error(s) on 0000:1b:00.0", "warning",
                                    {"device": "0000:1b:00.0", "severity": "correctable"})], ts=T0 + 90)
    tl = rca_timeline(st, "x", T0, T0 + 180)
    e = _bad(tl)[0]
    errs = next(c for c in e.causes if c.key == "pcie_errors")
    assert any(x["type"] == "event" and x["kind"] == "aer" for x in errs.evidence)
    health = [h for h in tl.episodes if h.kind == "health"]
    assert [(h.state, h.accelerator) for h in health] == [("aer", "gpu=0")]   # the device is the GPU's
    st.close()
