"""Root-cause results for the dashboard, through ``triscope.analysis.rca.rank_causes``.

``explain(store, node, start, end)`` returns ranked ``Cause`` rows, each with the series that
moved most in its category (for the evidence chart), the baseline window and the detector's
comparison; an explained empty result when ``triscope.analysis.rca`` is not in this build.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from triscope.store.reader import StoreReader


@dataclass
class Evidence:
    metric: str
    labels: dict[str, str]
    baseline: float | None
    window: float | None
    direction: str
    onset: float | None


@dataclass
class Cause:
    key: str
    title: str
    summary: str
    score: float | None = None
    onset: float | None = None
    series: list[Evidence] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    peers: list[str] = field(default_factory=list)


@dataclass
class RcaResult:
    causes: list[Cause]
    baseline: tuple[float, float] | None
    note: str
    series_examined: int = 0
    mismatch: dict[str, Any] = field(default_factory=dict)


# the detector input to chart for a cause that has no moved series of its own (its evidence is the
# mismatch detector's verdict, which reads these)
CATEGORY_SERIES = {
    "host_staging": ("triscope_cpu_busy_ratio", "triscope_pressure_ratio"),
    "dma_mapping": ("triscope_dma_map_total",),
    "network": ("triscope_tcp_retransmits_total",),
    "pcie_load": ("triscope_gpu_pcie_rx_bytes_total", "triscope_gpu_pcie_tx_bytes_total"),
    "accelerator_activity": ("triscope_gpu_sm_active_ratio", "triscope_npu_aicore_utilization_ratio"),
}


def explain(store: StoreReader, node: str, start: float, end: float, top: int = 8) -> RcaResult:
    from triscope.analysis.rca import rank_causes

    res = rank_causes(store, node, start, end)
    by_cat: dict[str, list[Any]] = {}
    for ch in sorted(res.changes, key=lambda c: -c.score):
        by_cat.setdefault(ch.category, []).append(ch)
    causes = []
    for c in res.causes[:top]:
        ev = [Evidence(ch.metric, dict(ch.labels), ch.baseline, ch.window, ch.direction, ch.onset)
              for ch in by_cat.get(c.key, [])[:3]]
        if not ev:
            for metric in CATEGORY_SERIES.get(c.key, ()):
                infos = store.series(node=node, metric=metric)
                if infos:
                    ev.append(Evidence(metric, dict(infos[0].labels), None, None, "detector input", c.onset))
                    break
        causes.append(Cause(c.key, c.title, c.summary, c.score, c.onset, ev,
                            [e for e in c.evidence if e.get("type") == "event"], list(c.peers)))
    note = "" if causes else (f"nothing moved against the baseline in this window "
                              f"({res.series_examined} series examined)")
    return RcaResult(causes, (res.baseline_start, res.baseline_end), note, res.series_examined, dict(res.mismatch))
