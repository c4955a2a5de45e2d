"""What moved: one series over a window (an episode, or the ranked view's window) against its
reference or baseline.  Pure.

``score_series`` gives a moved series' magnitude:  ``effect = max(|mean_w - mean_b|, 0.5 * |peak_w -
mean_b|)`` (bursts count through the window's peak), ``z = effect / max(std_b, 5 % of |mean_b|, 1 %
of |mean_w|, eps)``, ``magnitude = log(1+z)/log(1+100)`` (0 below z = 3, 1 at z >= 100).
``series_score`` weighs it: ``magnitude * (0.6 + 0.4 * earliness) * role weight``, earliness 1 when
the series had already moved at the window's start and 0 at its end; a cause or load moving in its
benign direction (DMA maps falling, memory available rising) counts half.  A change also has to
clear its kind's noise floor (``triscope.analysis.rca.noise``), which the callers check with
``change_effect``.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from triscope.analysis.rca.categories import ROLE_WEIGHT, Category, bad_direction
from triscope.analysis.reader import SeriesPoints

Z_MIN = 3.0
Z_MAX = 100.0
BENIGN_FACTOR = 0.5
APPEARED_GRACE_STEPS = 3.0   # a series whose first point is this many steps from the data's start came with it
EARLY_SHARE = 0.4            # share of a series' score that earliness decides


@dataclass(slots=True)
class SeriesChange:
    metric: str
    labels: dict[str, str]
    category: str
    baseline: float | None
    window: float | None
    peak: float | None
    z: float
    onset: float | None
    direction: str               # up | down | appeared | vanished
    score: float
    series_id: int = 0           # the stored series (refining onsets reads it again)
    magnitude: float = 0.0       # 0..1, before earliness and role weight

    @property
    def series(self) -> str:
        lab = ",".join(f'{k}="{v}"' for k, v in sorted(self.labels.items()))
        return f"{self.metric}{{{lab}}}" if lab else self.metric

    def as_dict(self) -> dict[str, Any]:
        return {"type": "series", "series": self.series, "category": self.category, "baseline": rnd(self.baseline),
                "window": rnd(self.window), "peak": rnd(self.peak), "z": round(self.z, 2), "onset": self.onset,
                "direction": self.direction, "score": round(self.score, 4)}


def rnd(x: float | None) -> float | None:
    """Six significant digits (JSON output)."""
    if x is None:
        return None
    if x == 0 or not math.isfinite(x):
        return x
    return float(f"{x:.6g}")


def fmt(x: float | None) -> str:
    """A value for a line of text: 3 significant digits, k / M / G."""
    if x is None:
        return "-"
    ax = abs(x)
    if ax >= 1e9:
        return f"{x / 1e9:.3g}G"
    if ax >= 1e6:
        return f"{x / 1e6:.3g}M"
    if ax >= 1e3:
        return f"{x / 1e3:.3g}k"
    return f"{x:.3g}"


def score_series(bts: Any, bvals: Any, wts: Any, wvals: Any,
                 start: float, end: float, counter: bool) -> tuple[float, float, float | None, str,
                                                                   float | None, float | None, float | None]:
    """(magnitude 0..1, z, onset, direction, baseline mean, window mean, window peak) of one series."""
    b = np.asarray(bvals, dtype=float)
    w = np.asarray(wvals, dtype=float)
    b = b[np.isfinite(b)]
    wmask = np.isfinite(w)
    w_t = np.asarray(wts, dtype=float)[wmask]
    w = w[wmask]
    if len(w) == 0:
        if len(b) == 0:
            return 0.0, 0.0, None, "up", None, None, None
        mb = float(b.mean())
        if counter and abs(mb) < 1e-12:
            return 0.0, 0.0, None, "down", mb, None, None
        return 0.8, Z_MAX, start, "vanished", mb, None, None
    mw = float(w.mean())
    if len(b) == 0:
        if not counter:
            return 0.5, Z_MAX, float(w_t[0]), "appeared", None, mw, float(w.max())
        b = np.zeros(1)
    mb = float(b.mean())
    sb = float(b.std()) if len(b) > 1 else 0.0
    dev = np.abs(w - mb)
    ipk = int(dev.argmax())
    peak = float(w[ipk])
    effect = max(abs(mw - mb), 0.5 * float(dev[ipk]))
    scale = max(sb, 0.05 * abs(mb), 0.01 * abs(mw), 1e-12)
    z = effect / scale
    if z < Z_MIN or effect <= 1e-12:
        return 0.0, z, None, "up" if mw >= mb else "down", mb, mw, peak
    mag = min(1.0, math.log1p(z) / math.log1p(Z_MAX))
    thr = max(3 * scale, 0.5 * effect)
    over = dev > thr
    onset = None
    if over.any():
        idx = np.nonzero(over)[0]
        onset = float(w_t[idx[0]])
    # the direction of whatever made the effect: the mean shift, or the peak for a burst
    ref = mw if abs(mw - mb) >= 0.5 * float(dev[ipk]) else peak
    direction = "up" if ref >= mb else "down"
    return mag, z, onset, direction, mb, mw, peak


def refine_onset(ts: Sequence[float], vals: Sequence[float], mb: float, mw: float, peak: float | None) -> float | None:
    """First time the series left the baseline mean by half the window's effect and stayed out
    (median of that point and the next three)."""
    v = np.asarray(vals, dtype=float)
    if len(v) == 0:
        return None
    effect = abs(mw - mb)
    if peak is not None and 0.5 * abs(peak - mb) > effect:
        effect = 0.5 * abs(peak - mb)
    thr = 0.5 * effect
    if thr <= 0:
        return None
    dev = np.abs(v - mb)
    for i in np.nonzero(dev > thr)[0]:
        if float(np.median(dev[i:i + 4])) > thr:
            return float(ts[int(i)])
    return None


def earliness(onset: float | None, start: float, end: float) -> float:
    if onset is None or end <= start:
        return 0.0
    return max(0.0, min(1.0, 1.0 - (onset - start) / (end - start)))


def series_score(mag: float, onset: float | None, cat: Category, direction: str, metric: str,
                 start: float, end: float) -> float:
    """A moved series' score: magnitude x (0.6 + 0.4 x earliness) x its family's role weight
    (``ROLE_WEIGHT``; 0 for context), halved in a cause's benign direction."""
    score = mag * (1 - EARLY_SHARE + EARLY_SHARE * earliness(onset, start, end)) * ROLE_WEIGHT[cat.role]
    if cat.role in ("cause", "load") and direction != bad_direction(metric):
        score *= BENIGN_FACTOR
    return score


def change_effect(mb: float | None, mw: float | None, peak: float | None) -> float:
    """The size of a change in the series' own unit: the mean shift, or half the peak's distance
    for a burst (what ``score_series`` scores), from 0 for a series that appeared."""
    base = mb if mb is not None else 0.0
    eff = abs(mw - base) if mw is not None else abs(base)
    if peak is not None:
        eff = max(eff, 0.5 * abs(peak - base))
    return eff


def appeared_with_data(sp: SeriesPoints, data_start: float | None, step: float = 1.0) -> bool:
    """A series whose first point is at the start of the node's data: it did not *appear*."""
    return bool(sp.ts) and data_start is not None and sp.ts[0] <= data_start + max(APPEARED_GRACE_STEPS * step, 5.0)


def vanished_with_data(sp: SeriesPoints, data_end: float | None, step: float = 1.0) -> bool:
    """A series whose last point is at the end of the node's data: it did not *vanish*."""
    return bool(sp.ts) and data_end is not None and sp.ts[-1] >= data_end - max(APPEARED_GRACE_STEPS * step, 5.0)


def bisect_any(ts: Sequence[float], a: float, b: float) -> bool:
    """Whether sorted ``ts`` has a point in [a, b)."""
    i = bisect.bisect_left(ts, a)
    return i < len(ts) and ts[i] < b
