"""A state series read coarse is the time spent in each state, never the minute's "worst" state.

The agent publishes ``triscope_mismatch_state{state=...}`` as 1 for the state it reports and 0 for
the others.  Read through a rollup or a downsampled range, each state's bucket is its share of the
bucket: a minute with 10 s staging-bound and 50 s compute-bound reads 0.17 and 0.83 (min/max would
read 1 and 1, and "worst first" would then call the whole minute staging-bound).  Other series keep
their min and max per bucket (spikes survive).
"""

from __future__ import annotations

import math

import pytest

from tests.state_series import stored_state_samples
from triscope.analysis.reader import points_of
from triscope.core.samples import Sample, Tick
from triscope.store import Store

STATE = "triscope_mismatch_state"
HOUR = 3600.0


def _ticks(t0: float, minutes: int) -> list[Tick]:
    """Each minute: 10 s staging-bound, then 50 s compute-bound; a gauge spikes to 9 once a minute."""
    out = []
    for i in range(minutes * 60):
        io = i % 60 < 10
        out.append(Tick(t0 + i, [
            Sample(STATE, 1.0 if io else 0.0, {"state": "staging-bound", "gpu": "0"}),
            Sample(STATE, 0.0 if io else 1.0, {"state": "compute-bound", "gpu": "0"}),
            Sample("g", 9.0 if i % 60 == 30 else 1.0),
        ]))
    return out


@pytest.mark.parametrize("span_h,tier", [(3.0, "1m"), (3.0, "1h"), (1.0, "raw")])
def test_a_coarse_read_of_a_state_series_is_its_time_share(any_store: Store, span_h: float, tier: str) -> None:
    """Minute rollups with a raw tail, hourly rollups with minute and raw tails, raw points
    downsampled in SQL to 2-minute buckets: every bucket reads 10 s of 60 staging-bound."""
    t0 = math.floor(1_700_000_000.0 / HOUR) * HOUR
    minutes = int(span_h * 60)
    ticks = _ticks(t0, minutes)
    for i in range(0, len(ticks), 600):
        any_store.write_ticks("n", ticks[i:i + 600])
    end = t0 + minutes * 60 - 1
    max_points = minutes // 2                  # raw: 2-minute buckets, still 10 s of every 60
    got = {sd.info.labels["state"]: sd for sd in any_store.query(STATE, node="n", start=t0, end=end,
                                                                 max_points=max_points, tier=tier)}
    io, cb = got["staging-bound"], got["compute-bound"]
    assert io.tier == tier and len(io.values) >= 3
    inner = slice(1, -1)       # the edges may hold part of a bucket
    assert all(v == pytest.approx(10 / 60, abs=0.02) for v in io.values[inner]), io.values[:8]
    assert all(v == pytest.approx(50 / 60, abs=0.02) for v in cb.values[inner]), cb.values[:8]
    assert io.ts == cb.ts           # every state of one accelerator reads the same instants
    # the episodes read the minute as what it mostly was
    _src, samples, _step = stored_state_samples([points_of(io), points_of(cb)])
    states = {s.state for s in samples["gpu=0"][1:-1]}
    assert states == {"compute-bound"}
    # any other gauge keeps its spikes
    [g] = any_store.query("g", node="n", start=t0, end=end, max_points=max_points, tier=tier)
    assert max(g.values) == 9.0 and min(g.values) == 1.0
