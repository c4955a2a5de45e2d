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
window, a ratio of sums.  ``stage_skew_from_counters`` computes it from counters fetched first;
``stage_skew_from_store`` reads them and calls it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from triscope.analysis.counters import fetch_counters, increase, tier_for
from triscope.analysis.reader import SeriesPoints, StoreReader

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


def stage_metrics(store: StoreReader, node: str | None = None, stage_label: str = "stage") -> list[str]:
    """Histogram/summary base names with a ``stage`` label that the node stores (an inventory read)."""
    out = set()
    for name in store.metric_names(node):
        if name.endswith("_sum"):
            base = name[:-4]
            if any(stage_label in s.labels for s in store.series(node=node, metric=name)):
                out.add(base)
    return sorted(out)


def stage_counter_metrics(metric: str = DEFAULT_STAGE_METRIC) -> tuple[str, str]:
    """The two counters per-stage mean durations are computed from."""
    return metric + "_sum", metric + "_count"


def stage_skew_from_counters(series: Iterable[SeriesPoints], span: float, metric: str = DEFAULT_STAGE_METRIC,
                             stage_label: str = "stage") -> StageSkew | None:
    """Mean duration per stage over a range of ``span`` seconds from the cumulative values of
    ``METRIC_sum`` / ``METRIC_count`` in it (``fetch_counters``), then ``stage_skew``.  Pure."""
    tier = tier_for(span)
    s_name, c_name = stage_counter_metrics(metric)
    sums: dict[str, float] = {}
    counts: dict[str, float] = {}
    for sp in series:
        acc = sums if sp.metric == s_name else counts if sp.metric == c_name else None
        st = sp.labels.get(stage_label)
        if acc is None or st is None:
            continue
        inc, _ = increase(sp.ts, sp.values, span, tier)
        acc[st] = acc.get(st, 0.0) + inc
    means = {k: sums[k] / counts[k] for k in sums if counts.get(k, 0) > 0}
    res = stage_skew(means)
    if res is not None:
        res.requests = counts.get(res.bottleneck)
    return res


def stage_skew_from_store(store: StoreReader, node: str | None, start: float, end: float,
                          metric: str = DEFAULT_STAGE_METRIC, stage_label: str = "stage") -> StageSkew | None:
    """Mean duration per stage over [start, end] from ``METRIC_sum`` / ``METRIC_count``: one read
    per counter (``fetch_counters``), then ``stage_skew_from_counters``."""
    reads = fetch_counters(store, stage_counter_metrics(metric), [(start, end)], node)
    return stage_skew_from_counters(reads[(start, end)], end - start, metric, stage_label)
