"""The fleet load generator (on the real PostgreSQL) and the one-table benchmark runner."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import text

from bench import run_all
from bench.common import Row
from bench.loadgen import node_series, run_load
from triscope.store import Store

REPO = Path(__file__).resolve().parents[2]


def test_a_node_sends_200_distinct_series_like_an_8_gpu_agent() -> None:
    series = node_series(200)
    assert len(series) == 200
    assert len({(m, tuple(sorted(lb.items()))) for m, lb, _ in series}) == 200
    assert sum(1 for m, _, _ in series if m == "triscope_gpu_sm_active_ratio") == 8
    assert {k for _, _, k in series} == {"gauge", "counter"}
    assert all(m.endswith("_total") == (k == "counter") for m, _, k in series)


@pytest.mark.postgres
@pytest.mark.slow
def test_loadgen_writes_every_tick_through_the_store_and_times_the_fleet_page(pg_url: str) -> None:
    res = run_load(pg_url, nodes=12, series=30, duration=6, workers=2, fleet_every=3, prefix="lg-")
    assert res.write_errors == 0
    assert res.samples_written == res.samples_expected == 12 * 30 * 6
    assert 0 <= res.lag_p50_s <= res.lag_p99_s <= res.lag_max_s < 30
    assert len(res.worst_lag_by_second) == 6
    assert res.fleet_page_s and all(t > 0 for t in res.fleet_page_s), res.fleet_page_error
    assert res.fleet_page_rows == 12
    assert res.server_cpu_s is not None and res.server_cpu_s > 0
    st = Store.open(pg_url)
    try:
        assert len(st.nodes()) == 12
        with st.engine.connect() as c:
            # warm-up tick + 6 timed ticks per node, each stored once, in the day partitions
            assert c.execute(text("SELECT count(*) FROM samples")).scalar() == 12 * 30 * 7
            assert c.execute(text("SELECT count(*) FROM sample_rows")).scalar() == 12 * 7   # a row per node tick
            assert c.execute(text("SELECT count(*) FROM sample_rows_default")).scalar() == 0
        states = st.latest("lg-0003", prefix="triscope_mismatch_state")
        assert sum(1 for lv in states if lv.value == 1.0) == 1      # one-hot state, as an agent exports it
    finally:
        st.close()


def test_runner_discovers_every_benchmark_module() -> None:
    names = run_all.discover()
    assert "bench_fleet" in names and "bench_store" in names
    assert run_all.select(names, ["fleet"]) == ["bench_fleet"]
    assert run_all.select(names, ["bench_store", "fleet"]) == ["bench_store", "bench_fleet"]
    with pytest.raises(SystemExit, match="no benchmark named 'nosuch'"):
        run_all.select(names, ["nosuch"])


def test_runner_prints_one_table_and_turns_a_crash_into_a_row(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pkg = tmp_path / "bench"
    pkg.mkdir()
    (pkg / "bench_ok.py").write_text(
        "from bench.common import Row\n"
        "def run(quick=False):\n"
        "    return [Row('ok', 'figure a', 1234.5, 'ms', '<= 2000', 'naive', 9876.0, True),\n"
        "            Row('ok', 'figure b', 0.004, 's', '< 2', '', None, False)]\n")
    (pkg / "bench_boom.py").write_text("def run(quick=False):\n    raise RuntimeError('no server')\n")
    monkeypatch.setattr(run_all, "BENCH_DIR", pkg)
    monkeypatch.syspath_prepend(str(tmp_path))
    for m in [m for m in sys.modules if m.startswith("bench")]:
        monkeypatch.delitem(sys.modules, m)
    import bench as fresh_bench  # the temp package, with bench.common from the repo on its path

    monkeypatch.setattr(fresh_bench, "__path__", [str(pkg), str(REPO / "bench")])
    names = run_all.discover()
    assert names == ["bench_boom", "bench_ok"]
    rows = run_all.run_modules(names, quick=True)
    assert [r.benchmark for r in rows] == ["boom", "ok", "ok"]
    assert rows[0].figure.startswith("FAILED: RuntimeError: no server") and rows[0].ok is False
    table = run_all.table_text(rows)
    lines = table.splitlines()
    assert lines[0].split() == ["benchmark", "figure", "value", "target", "met?", "baseline", "baseline", "value"]
    assert "1,234 ms" in table and "1234.5" not in table       # formatted, not raw floats
    assert "9,876 ms" in table and "yes" in table and "NO" in table
    md = run_all.results_markdown(rows, "make bench", "host x86_64", __import__("datetime").datetime(2026, 11, 29))
    assert md.count("\n| ") == 5 and "Machine: host x86_64" in md and "1 of 3 targets met" in md


def test_value_formatting() -> None:
    assert run_all.fmt_value(123456.7, "samples/s") == "123,457 samples/s"
    assert run_all.fmt_value(0.0042, "s") == "0.0042 s"
    assert run_all.fmt_value(1.234, "s") == "1.23 s"
    assert run_all.fmt_value(math.nan) == "n/a" and run_all.fmt_value(None) == "-"
    assert run_all.cells(Row("b", "f", 1.0, "s"))[4] == "-"


def test_bench_cli_lists_and_rejects_unknown_names() -> None:
    out = subprocess.run([sys.executable, "-m", "bench", "--list"], capture_output=True, text=True, cwd=REPO,
                         timeout=60)
    assert out.returncode == 0 and "fleet" in out.stdout.split()
    out = subprocess.run([sys.executable, "-m", "bench", "--only", "nosuch"], capture_output=True, text=True,
                         cwd=REPO, timeout=60)
    assert out.returncode != 0 and "no benchmark named 'nosuch'" in out.stderr
    assert "Traceback" not in out.stderr


def test_capacity_search_doubles_then_bisects() -> None:
    from bench.loadgen import find_capacity

    calls: list[int] = []

    def trial(n: int) -> bool:
        calls.append(n)
        return n <= 300

    best, tried = find_capacity(trial, start=50, limit=4000, refine=2)
    assert calls[:4] == [50, 100, 200, 400]            # doubling until the first failure
    assert calls[4:] == [300, 350]                     # then bisection between 200 and 400
    assert best == 300 and tried[-1] == (350, False)
    assert find_capacity(lambda n: True, start=50, limit=400)[0] == 400
    assert find_capacity(lambda n: False, start=50)[0] == 0
