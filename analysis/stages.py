"""Stage skew and pipeline bubbles from an application's per-stage durations.

An inference request runs pre-process -> host-to-device -> compute -> device-to-host.  When the
stages are pipelined (request k+1 copies in while request k computes), throughput is set by the
slowest stage and every other stage idles for part of each cycle: those idle slots are the
pipeline's bubbles.  With mean stage durations d_1..d_n:

* bottleneck  = the stage with max d;
* skew        = max d / mean d (1.0 = perfectly even stages, n = one stage does all the work);
* bubble      = 1 - sum d / (n x max d): the share of stage-time slots left empty in a perfectly
  overlapped pipeline (0 = no bubbles);
* per-stage idle share = 1 - d_i / max d.

Durations come from a histogram with a stage label (the H200 workload exports
``inference_stage_duration_seconds{stage}``): mean = increase(_sum) / increase(_count) over the
window, a ratio of sums.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

DEFAULT_STAGE_METRIC = "inference_stage_duration_seconds"
STAGE_ORDER = ("preprocess", "h2d", "compute", "d2h")


@dataclass(slots=True)
class StageSkew:
    durations: dict[str, float]      # mean seconds per stage
    bottleneck: str
    skew: float
    bubble_fraction: float
    idle_share: dict[str, float]     # 1 - d_i / max d
    requests: float | None = None    # observations in the window (histogram count of the bottleneck)

    def as_dict(self) -> dict[str, Any]:
        return {"durations": self.durations, "bottleneck": self.bottleneck, "skew": round(self.skew, 4),
                "bubble_fraction": round(self.bubble_fraction, 4),
                "idle_share": {k: round(v, 4) for k, v in self.idle_share.items()}, "requests": self.requests}


def stage_skew(durations: Mapping[str, float]) -> StageSkew | None:
    """Skew and bubble fraction of mean stage durations (seconds); None without 2+ positive stages."""
    d = {k: float(v) for k, v in durations.items() if v is not None and v == v and v >= 0}
    if len(d) < 2 or max(d.values()) <= 0:
        return None
    order = sorted(d, key=lambda k: (STAGE_ORDER.index(k) if k in STAGE_ORDER else len(STAGE_ORDER), k))
    d = {k: d[k] for k in order}
    mx = max(d.values())
    mean = sum(d.values()) / len(d)
    bottleneck = max(d, key=lambda k: d[k])
    return StageSkew(
        durations=d, bottleneck=bottleneck, skew=mx / mean,
        bubble_fraction=1.0 - sum(d.values()) / (len(d) * mx),
        idle_share={k: 1.0 - v / mx for k, v in d.items()},
    )


def stage_metrics(store: Any, node: str | None = None, stage_label: str = "stage") -> list[str]:
    """Histogram/summary base names with a ``stage`` label that the node stores."""
    out = set()
    for name in store.metric_names(node):
        if name.endswith("_sum"):
            base = name[:-4]
            if any(stage_label in s.labels for s in store.series(node=node, metric=name)):
                out.add(base)
    return sorted(out)


def stage_skew_from_store(store: Any, node: str | None, start: float, end: float,
                          metric: str = DEFAULT_STAGE_METRIC, stage_label: str = "stage") -> StageSkew | None:
    """Mean duration per stage over [start, end] from ``METRIC_sum`` / ``METRIC_count``."""
    from triscope.analysis.slo import counter_increase

    sums: dict[str, float] = {}
    counts: dict[str, float] = {}
    for suffix, acc in (("_sum", sums), ("_count", counts)):
        for info in store.series(node=node, metric=metric + suffix):
            st = info.labels.get(stage_label)
            if st is None:
                continue
            inc, _ = counter_increase(store, info, start, end)
            acc[st] = acc.get(st, 0.0) + inc
    means = {k: sums[k] / counts[k] for k in sums if counts.get(k, 0) > 0}
    res = stage_skew(means)
    if res is not None:
        res.requests = counts.get(res.bottleneck)
    return res
