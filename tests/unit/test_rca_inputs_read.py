"""The root-cause read (``analysis.rca.inputs.fetch_rca_inputs``) reads less and computes counter
rates itself, and what it returns is what the store's own reads give: the rates of a raw read the
same points as ``store.query``'s (resets, gaps, uneven steps), histogram buckets left out only where
their ``_count`` carries the histogram, kept where an SLO names them."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from pathlib import Path

import pytest

from triscope.analysis.rca.inputs import counter_rates, fetch_rca_inputs
from triscope.core.samples import Sample, Tick
from triscope.store import Store

NODE = "n1"
T0 = 1_800_000_000.0


def _store(tmp_path: Path, n: int = 1500) -> Store:
    st = Store.open(f"sqlite:///{tmp_path / 'r.db'}")
    st.upgrade()
    rnd = random.Random(5)
    c = big = 0.0
    ticks = []
    t = T0
    for i in range(n):
        t += rnd.choice((1.0, 1.0, 1.0, 0.5, 2.0, 7.25))          # uneven steps and gaps
        c = rnd.uniform(0, 50) if i % 211 == 17 else c + rnd.uniform(0, 1000)    # resets now and then
        big += 1e9 * rnd.random()
        smp = [Sample("app_requests_total", c, {"gpu": "0"}, "counter"),
               Sample("triscope_gpu_pcie_rx_bytes_total", big, {"gpu": "0"}, "counter"),
               Sample("triscope_gpu_sm_active_ratio", rnd.random(), {"gpu": "0"}),
               Sample("lat_seconds_count", float(i), {"stage": "x"}, "counter"),
               Sample("lat_seconds_sum", 0.1 * i, {"stage": "x"}, "counter"),
               Sample("orphan_bucket", float(i), {"le": "1"}, "counter")]
        smp += [Sample("lat_seconds_bucket", float(i) * k / 3, {"stage": "x", "le": le}, "counter")
                for k, le in enumerate(("0.1", "1", "+Inf"), 1)]
        ticks.append(Tick(t, smp))
    st.write_ticks(NODE, ticks)
    return st


def _same(a: Sequence[float], b: Sequence[float]) -> bool:
    return len(a) == len(b) and all(x == y or (math.isnan(x) and math.isnan(y)) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("span", [600.0, 1800.0, 3590.0])
def test_raw_counter_rates_are_the_stores(tmp_path: Path, span: float) -> None:
    st = _store(tmp_path)
    try:
        lo, hi = T0 + 37.5, T0 + 37.5 + span
        got = {sp.id: sp for sp in fetch_rca_inputs(st, NODE, lo + span / 2, hi, (lo, lo + span / 2), 1800).series}
        assert got
        for m in ("app_requests_total", "triscope_gpu_pcie_rx_bytes_total", "triscope_gpu_sm_active_ratio"):
            for sd in st.query(m, node=NODE, start=lo, end=hi, max_points=3600):
                sp = got[sd.info.id]
                assert sp.ts == sd.ts and _same(sp.values, sd.values), m
    finally:
        st.close()


def test_counter_rates_reset_and_nonfinite() -> None:
    assert counter_rates([1.0, 2.0, 4.0, 5.0], [10.0, 30.0, 5.0, 5.0]) == ([2.0, 4.0, 5.0], [20.0, 2.5, 0.0])
    assert counter_rates([1.0], [3.0]) == ([], [])
    assert counter_rates([1.0, 2.0], [1.0, math.inf]) is None


def test_buckets_left_out_where_the_count_carries_them(tmp_path: Path) -> None:
    st = _store(tmp_path, n=300)
    try:
        a, b = T0 + 100, T0 + 300
        metrics = {sp.metric for sp in fetch_rca_inputs(st, NODE, a, b).series}
        assert "lat_seconds_bucket" not in metrics                  # its _count is read
        assert {"lat_seconds_count", "lat_seconds_sum", "orphan_bucket"} <= metrics   # no _count: read
        kept = fetch_rca_inputs(st, NODE, a, b, keep={"lat_seconds_bucket"})
        assert sum(sp.metric == "lat_seconds_bucket" for sp in kept.series) == 3     # an SLO names it
        assert kept.series_examined == fetch_rca_inputs(st, NODE, a, b).series_examined
    finally:
        st.close()


def test_a_dense_counter_is_left_to_the_stores_downsampling(tmp_path: Path) -> None:
    """More raw points than the read may return (4 a second here): the store downsamples the rates
    itself, and the read returns what it does."""
    st = Store.open(f"sqlite:///{tmp_path / 'd.db'}")
    st.upgrade()
    try:
        rnd = random.Random(3)
        c, ticks = 0.0, []
        for i in range(2400):
            c = 0.0 if i % 500 == 499 else c + rnd.uniform(0, 10)
            ticks.append(Tick(T0 + i * 0.25, [Sample("app_requests_total", c, {}, "counter")]))
        st.write_ticks(NODE, ticks)
        lo, hi = T0, T0 + 600
        got = fetch_rca_inputs(st, NODE, T0 + 300, hi, (lo, T0 + 300), 400).series
        want = st.query("app_requests_total", node=NODE, start=lo, end=hi, max_points=800)
        assert len(got) == len(want) == 1 and len(want[0].ts) <= 800
        assert got[0].ts == want[0].ts and _same(got[0].values, want[0].values)
    finally:
        st.close()
