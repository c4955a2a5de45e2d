"""The SLOs page in a real headless Chromium, served by the real ``triscope dashboard`` over a store
with only minutes of SLI data: no budget figure, no burn rate, no alert decided, each saying "not
enough data yet (N % of the W window covered)"; and, on a store whose windows are covered, the
figures themselves (the same page, the same code, so the first test cannot pass by showing nothing).
"""

from __future__ import annotations

import os
import re
import subprocess
import textwrap
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from browser_support import chromium, stop_checked
from conftest import REPO, free_port, wait_for_port
from test_dashboard_browser import TRISCOPE, Page

pytestmark = pytest.mark.browser

EXAMPLE = REPO / "deploy" / "slo.example.yaml"


def _inference_ticks(end: float, minutes: float, step: float = 10.0, late_share: float = 0.2) -> list[Any]:
    """The example SLOs' series (examples/workload/h200_phases.py names) over ``minutes`` ending at
    ``end``: 100 requests per tick, ``late_share`` of them past their deadline and slower than 250 ms."""
    from triscope.core.samples import Sample, Tick

    n = int(minutes * 60 / step)
    ok = late = 0.0
    out = []
    for i in range(n + 1):
        count = ok + late
        out.append(Tick(end - (n - i) * step, [
            Sample("inference_requests_total", ok, {"phase": "steady", "status": "ok"}, "counter"),
            Sample("inference_requests_total", late, {"phase": "steady", "status": "deadline_exceeded"}, "counter"),
            Sample("inference_request_errors_total", 0.0, {"phase": "steady", "reason": "none"}, "counter"),
            Sample("inference_request_duration_seconds_count", count, {"phase": "steady"}, "counter"),
            Sample("inference_request_duration_seconds_bucket", ok, {"phase": "steady", "le": "0.25"}, "counter"),
        ]))
        ok += 100 * (1 - late_share)
        late += 100 * late_share
    return out


@contextmanager
def _dashboard(tmp_path: Path, minutes: float, slo_file: Path) -> Iterator[str]:
    from triscope.store import Store

    url = f"sqlite:///{tmp_path / 'slo.db'}"
    st = Store.open(url)
    st.upgrade()
    st.write_ticks("gpu-node", _inference_ticks(time.time(), minutes))
    st.close()
    port = free_port()
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.pop("TRISCOPE_DASHBOARD_PASSWORD", None)
    proc = subprocess.Popen([TRISCOPE, "dashboard", "--db", url, "--port", str(port), "--slo", str(slo_file)],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        wait_for_port(port, timeout=60)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_checked(proc)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as b:
        yield b


def _slo_cards(browser: Any, base: str, shot: str) -> tuple[list[str], Page]:
    page = Page(browser, base)
    p = page.goto("/slos")
    p.wait_for_selector(".slo-card", timeout=30000)
    page.settle()
    page.shot(shot)
    return [c.inner_text() for c in p.query_selector_all(".slo-card")], page


def test_minutes_of_data_say_not_enough_data_yet(browser: Any, tmp_path: Path) -> None:
    with _dashboard(tmp_path, 5, EXAMPLE) as base:
        cards, page = _slo_cards(browser, base, "slos-not-enough-data")
        try:
            assert page.errors == []
            assert len(cards) == 2
            p = page.page
            # the budget KPI of each SLO: the period's coverage instead of a figure
            budgets = [b.inner_text() for b in p.query_selector_all(".slo-budget")]
            assert len(budgets) == 2
            for b in budgets:
                assert re.fullmatch(r"not enough data yet \(0\.\d\d % of the 30d window covered\)", b), b
            for text in cards:
                # 20 % of requests late is 20x / 40x the budget over every window measured: not shown as a verdict
                assert "%" in text and not re.search(r"budget left\s*-?\d", text), text
                assert re.search(r"ticket: 3d & 6h over 1x: not enough data yet \(0\.\d\d % of the 3d window covered\)",
                                 text), text
                assert re.search(r"page: 1h & 5m over 14.4x: not enough data yet \(\d\.\d % of the 1h window covered\)",
                                 text), text
                assert "FIRING" not in text
            assert [b.inner_text() for b in p.query_selector_all(".slo-card .badge")] == ["not enough data yet"] * 2
            # the burn-rate table: every window past 5 minutes says why it has no rate
            cells = [c.inner_text() for c in p.query_selector_all(".slo-card .small-table tbody tr td:nth-child(2)")]
            assert len(cells) == 12
            assert cells[0].endswith("x") and cells[6].endswith("x")      # the 5m window is covered
            assert [c for i, c in enumerate(cells) if i % 6] == ["not enough data yet"] * 10
            # the budget chart says the same instead of plotting nothing (or a -1900 % line)
            chart = p.query_selector(".slo-card .js-plotly-plot")
            assert chart is not None and "not enough data yet" in chart.inner_text()
        finally:
            page.close()


def test_covered_windows_show_figures(browser: Any, tmp_path: Path) -> None:
    """The control: 8 hours of the same 20 % late requests under a 3-day period cover the 1h and 6h
    windows and a tenth of the period: burn rates, a page, and a budget figure."""
    spec = tmp_path / "slo.yaml"
    spec.write_text(EXAMPLE.read_text().replace("period: 30d", "period: 3d"))
    with _dashboard(tmp_path, 8 * 60, spec) as base:
        cards, page = _slo_cards(browser, base, "slos-covered")
        try:
            assert page.errors == []
            budgets = [b.inner_text() for b in page.page.query_selector_all(".slo-budget")]
            # 20 % late against a 1 % budget: 20x over the period, 1 - 20 = -1900 %
            assert budgets[0] == "-1900.0%", budgets
            text = cards[0]
            # the factors of a 3-day period: 2 % of it in 1h is 1.44x, 5 % in 6h 0.6x, 10 % in 3d 0.1x
            assert "page: 1h & 5m over 1.44x (FIRING)" in text and "page: 6h & 30m over 0.6x (FIRING)" in text
            assert "ticket: 3d & 6h over 0.1x: not enough data yet (11 % of the 3d window covered)" in text, text
            assert [b.inner_text() for b in page.page.query_selector_all(".slo-card .badge")] == ["page"] * 2
        finally:
            page.close()


def test_example_spec_is_what_the_data_above_feeds() -> None:
    """The series written above are the ones the example SLOs read (a renamed metric would make
    the browser tests pass on 'no data')."""
    from triscope.analysis.slo import load_slo_file, query_metrics

    names = {s.name for t in _inference_ticks(0.0, 1) for s in t.samples}
    for slo in load_slo_file(EXAMPLE):
        assert set(query_metrics(slo)) <= names, textwrap.shorten(str(query_metrics(slo)), 200)
