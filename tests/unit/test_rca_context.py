"""Root cause's pure parts on hand-built points (issue 27): context is never ranked, a scrape target's
late /metrics is an event on its workload's lane with its blips merged, an SLO burn links to the
episode it overlaps or follows within its burn window, an episode whose cause changes is cut into
phases, and a link busy past half its ceiling is the limit while the host side is load."""

from __future__ import annotations

from typing import Any

from tests.state_series import _healthy_hours
from triscope.analysis.config import default_thresholds
from triscope.analysis.episodes import Episode
from triscope.analysis.rca.context import context_lines, metrics_late_events
from triscope.analysis.rca.evidence import LIMIT_FLOOR, evidence_context, figures
from triscope.analysis.rca.phases import split_phases
from triscope.analysis.rca.score import score_cause
from triscope.analysis.rca.slo import link_burn
from triscope.analysis.reader import SeriesPoints
from triscope.store.reader import EventRow

BUS = "0000:1b:00.0"
TH = default_thresholds()


def _ev(ts: float, kind: str, details: dict[str, Any], msg: str = "x") -> EventRow:
    return EventRow(0, "n", ts, kind, "warning", msg, details)


def _sp(metric: str, labels: dict[str, str], fn: Any, n: int = 200, kind: str = "gauge") -> SeriesPoints:
    ts = [float(t) for t in range(n)]
    return SeriesPoints(metric, labels, ts, [float(fn(t)) for t in ts], kind)


def test_context_families_are_never_ranked() -> None:
    ev = _ev(10, "remediation", {"action": "restart_deployment"}, "dry-run: restart deployment/infer")
    assert score_cause("remediation", events=[ev]) is None
    assert score_cause("application") is None and score_cause("agent") is None
    xid = EventRow(0, "n", 10, "xid", "critical", "XID 79", {"gpu": "0"})
    c = score_cause("gpu_health", events=[xid])
    assert c is not None and c.score > 0.5 and c.onset == 10
    lines = context_lines([], [ev, _ev(11, "collector", {"collector": "scrape:h:1", "up": False})], {})
    assert {x.kind for x in lines} == {"remediation", "application"}
    assert "restart deployment/infer" in next(x for x in lines if x.kind == "remediation").summary


def test_late_metrics_are_an_event_on_the_workloads_lane_with_blips_merged() -> None:
    target = "scrape:127.0.0.1:9602"
    evs = [_ev(200, "collector", {"collector": target, "up": False}), _ev(201, "collector", {"collector": target, "up": True}),
           _ev(230, "collector", {"collector": target, "up": False}), _ev(231, "collector", {"collector": target, "up": True}),
           _ev(400, "collector", {"collector": target, "up": False}),
           _ev(205, "collector", {"collector": "nvml", "up": False})]        # the agent's own: not here
    series = [SeriesPoints("inference_backend_info", {"instance": "127.0.0.1:9602", "workload": "inference-b"},
                           [0.0], [1.0])]
    lane = Episode(0, 500, "staging-bound", "gpu=0", ("", "", "", "cmd:inference-b"))
    other = Episode(0, 500, "idle", "gpu=1", ("", "", "", "cmd:inference-a"))
    got = metrics_late_events(evs, series, [lane, other])
    assert [(e.start, e.end, e.accelerator, e.workload[3], e.kind, e.bad) for e in got] == [
        (200, 231, "gpu=0", "cmd:inference-b", "event", False), (400, 400, "gpu=0", "cmd:inference-b", "event", False)]
    assert got[0].detail["blips"] == 2 and got[1].detail["still_down"] is True
    # a target whose workload is not known goes on the node's lane
    assert [e.accelerator for e in metrics_late_events(evs, [], [lane])] == ["node", "node"]


def test_an_slo_burn_links_to_the_episode_it_overlaps_or_follows() -> None:
    bad = Episode(100, 130, "staging-bound", "gpu=0")
    bad.causes = [score_cause("host_staging", events=[_ev(110, "mismatch_state", {})])]
    healthy = Episode(130, 300, "compute-bound", "gpu=0")

    def burn(a: float, b: float) -> Episode:
        s = Episode(a, b, "slo-burn", "node", kind="slo")
        s.detail["burn_window_s"] = 10.0
        link_burn(s, [bad, healthy])
        return s

    over, after, late = burn(120, 140), burn(135, 150), burn(150, 160)
    assert over.reference is not None and over.reference["link"] == "overlaps" and over.causes == bad.causes
    assert after.reference is not None and after.reference["link"] == "follows" and after.reference["start"] == 100
    assert late.reference is not None and late.reference["kind"] == "none" and not late.causes


def _node(cpu: Any, dma: Any, link: Any) -> list[SeriesPoints]:
    return [_sp("triscope_gpu_info", {"gpu": "0", "bus_id": BUS}, lambda t: 1),
            _sp("triscope_gpu_sm_active_ratio", {"gpu": "0"}, lambda t: 0.02),
            _sp("triscope_gpu_pcie_rx_bytes_total", {"gpu": "0"}, lambda t: 50e9 if t < 20 else link(t), kind="counter"),
            _sp("triscope_cpu_busy_ratio", {}, cpu),
            _sp("triscope_dma_map_total", {"device": BUS, "direction": "to_device"}, dma, kind="counter")]


def test_an_episode_whose_cause_changes_is_cut_into_phases() -> None:
    # the host pegged, then (from t = 100) pin churn on a quiet host: one staging-bound run, two incidents
    series = _node(lambda t: 0.9 if t < 100 else 0.2, lambda t: 50.0 if t >= 100 else 0.0, lambda t: 3e9)
    ctx = evidence_context(series, [], TH)
    e = Episode(40, 160, "staging-bound", "gpu=0", samples=120)
    phases = split_phases(e, ctx, TH.window_s)
    assert [(p.start, p.end, p.detail["phase"], p.detail["phases"]) for p in phases] == [
        (40, 100, 1, 2), (100, 160, 2, 2)]
    assert all(p.state == "staging-bound" and p.detail["episode"] == {"start": 40, "end": 160} for p in phases)
    # two strong causes trading places by less than the lead margin are one incident
    flap = _node(lambda t: 0.9, lambda t: 22.0 if (t // 10) % 2 else 18.0, lambda t: 3e9)
    assert len(split_phases(e, evidence_context(flap, [], TH), TH.window_s)) == 1


def test_a_busy_link_is_the_limit_and_the_host_side_load() -> None:
    # the link at 60 % of its ceiling (above what staged pageable copies reach) with the host pegged
    series = _node(lambda t: 0.95, lambda t: 30.0, lambda t: 30e9)
    figs = figures(evidence_context(series, [], TH), "gpu=0", 40, 160)
    busy = next(f for f in figs["pcie_load"] if f.name == "link_busy")
    assert busy.value == 0.6 and busy.strength >= 1.0
    assert max(f.strength for f in figs["host_staging"]) == LIMIT_FLOOR
    assert max(f.strength for f in figs["dma_mapping"]) == LIMIT_FLOOR
    assert not any(f.name == "pageable_signature" for fs in figs.values() for f in fs)
    # at 6 %: the pageable signature, the host the limit
    quiet = figures(evidence_context(_node(lambda t: 0.95, lambda t: 0.0, lambda t: 3e9), [], TH), "gpu=0", 40, 160)
    assert any(f.name == "pageable_signature" for f in quiet["host_staging"])
    assert max(f.strength for f in quiet["host_staging"]) > 1.5


def test_an_hour_partly_healthy_is_a_reference_hour() -> None:
    """Hourly reads of a state series are time shares: an hour with 20 minutes balanced (0.33) saw
    a healthy state and may serve as the reference; an hour with no share in it did not."""
    sp = SeriesPoints("triscope_mismatch_state", {"state": "balanced", "gpu": "0"}, [7200.0 + 1800, 10800.0 + 1800],
                      [0.33, 0.0], node="n")
    assert _healthy_hours([sp]) == [(7200.0, "n")]
