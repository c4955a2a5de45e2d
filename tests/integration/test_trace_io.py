"""Recorded traces: the committed H200 trace loads and still shows each phase's signature; export
and import round-trip on SQLite and PostgreSQL; bad files give one clear error."""

from __future__ import annotations

import gzip
import importlib.util
import json
import time

import pytest
from conftest import REPO

from triscope.cli import main
from triscope.core.samples import EventRecord, Sample, Tick
from triscope.core.trace import TraceError, export_trace, import_trace, phase_spans, read_trace
from triscope.store import Store

TRACE = REPO / "examples" / "traces" / "h200-phases.jsonl.gz"
PHASES = ["idle", "pinned_h2d", "pinned_d2h", "pageable_h2d", "compute_bf16", "pin_churn", "idle_end"]


def _check_phases():
    spec = importlib.util.spec_from_file_location("check_phases", REPO / "examples" / "workload" / "check_phases.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_committed_trace_is_compact_and_well_formed():
    assert TRACE.stat().st_size < 3 * 1024 * 1024
    tr = read_trace(TRACE)
    assert tr.header["node"] == "h200"
    assert len(tr.ticks) > 150
    assert [e["details"]["phase"] for e in tr.events if e["kind"] == "phase" and e["details"]["edge"] == "start"] == PHASES
    metrics = {s[1] for s in tr.header["series"]}
    for m in ("triscope_gpu_pcie_rx_bytes_total", "triscope_gpu_sm_active_ratio", "triscope_dma_map_total",
              "inference_request_duration_seconds_bucket", "inference_requests_total"):
        assert m in metrics, m


def test_committed_trace_imports_and_each_phase_checks_out(store):
    info = import_trace(store, TRACE, node="h200-demo")
    assert info.node == "h200-demo" and info.events >= 14
    spans = phase_spans(store.events(node="h200-demo", kinds=["phase"]))
    assert list(spans) == PHASES
    cp = _check_phases()
    m = cp.measure(store, "h200-demo")
    results = cp.checks(m)
    assert len(results) >= 10
    failed = [(n, d) for n, ok, d in results if not ok]
    assert not failed, failed
    # the figures the docs quote
    assert m["pinned_h2d"]["pcie_rx_Bps"] > 40e9
    assert m["compute_bf16"]["sm_active"] > 0.8
    assert m["pin_churn"]["dma_map_per_s"] > 20


def test_shift_to_now_and_reimport_is_idempotent(store):
    now = 2_000_000_000.0
    info = import_trace(store, TRACE, shift_to_now=True, now=now)
    lo, hi = store.time_bounds("h200")
    assert hi == pytest.approx(now, abs=1.0) and info.end == pytest.approx(now)
    spans = phase_spans(store.events(node="h200", kinds=["phase"]))
    assert all(lo - 60 <= s <= e <= now + 1 for s, e in spans.values()), spans
    n_events = len(store.events(node="h200"))
    n_points = sum(len(sd.ts) for sd in store.query("triscope_gpu_sm_active_ratio", node="h200", start=0, end=now + 10,
                                                     max_points=None))
    again = import_trace(store, TRACE, shift_to_now=True, now=now)
    assert again.events == 0
    assert len(store.events(node="h200")) == n_events
    assert sum(len(sd.ts) for sd in store.query("triscope_gpu_sm_active_ratio", node="h200", start=0, end=now + 10,
                                                 max_points=None)) == n_points


def test_export_import_round_trip(db_url, tmp_path):
    st = Store.open(db_url)
    st.upgrade()
    try:
        t0 = 1_800_000_000.0
        ticks = [Tick(t0 + i, [Sample("triscope_gpu_sm_active_ratio", i / 10, {"gpu": "0"}),
                                Sample("triscope_gpu_pcie_rx_bytes_total", 1e9 * i + 0.5, {"gpu": "0"}, "counter"),
                                Sample("app_latency_seconds", 0.001 * i, {"route": "/infer", "le": "0.1"})],
                     [EventRecord("phase", f"phase p{i} start", details={"phase": f"p{i}", "edge": "start"})] if i % 3 == 0 else [])
                 for i in range(10)]
        st.write_ticks("src", ticks)
        out = tmp_path / "t.jsonl.gz"
        info = export_trace(st, "src", out)
        assert (info.ticks, info.series, info.samples, info.events) == (10, 3, 30, 4)
        back = import_trace(st, out, node="dst")
        assert back.events == 4
        for metric in ("triscope_gpu_sm_active_ratio", "triscope_gpu_pcie_rx_bytes_total", "app_latency_seconds"):
            a = st.query(metric, node="src", start=t0 - 1, end=t0 + 20, max_points=None, rate=False)
            b = st.query(metric, node="dst", start=t0 - 1, end=t0 + 20, max_points=None, rate=False)
            assert [(s.info.labels, s.info.kind, s.ts, s.values) for s in a] == \
                   [(s.info.labels, s.info.kind, s.ts, s.values) for s in b]
        assert [e.message for e in st.events(node="dst")] == [e.message for e in st.events(node="src")]
    finally:
        st.close()


def test_bad_trace_files(tmp_path):
    with pytest.raises(TraceError, match="does not exist"):
        read_trace(tmp_path / "missing.jsonl.gz")
    p = tmp_path / "x.jsonl"
    p.write_text("hello\n")
    with pytest.raises(TraceError, match="not a triscope trace"):
        read_trace(p)
    p.write_text(json.dumps({"format": "something-else"}) + "\n")
    with pytest.raises(TraceError, match="no 'triscope-trace' header"):
        read_trace(p)
    hdr = {"format": "triscope-trace", "version": 1, "node": "n", "series": [[0, "m", {}, "gauge"]]}
    p.write_text(json.dumps(hdr) + "\n" + json.dumps({"t": 1.0, "v": [[0, 1.0]]}) + "\n" + json.dumps({"t": 2.0, "v": [[7, 1.0]]}) + "\n")
    with pytest.raises(TraceError, match=r"x.jsonl:3: bad trace line \(unknown series id 7\)"):
        read_trace(p)
    g = tmp_path / "cut.jsonl.gz"
    g.write_bytes(gzip.compress((json.dumps(hdr) + "\n").encode() * 50)[:40])
    with pytest.raises(TraceError):
        read_trace(g)


def test_cli_import_trace(tmp_path, capsys, sqlite_url):
    rc = main(["import-trace", str(TRACE), "--db", sqlite_url, "--node", "demo-gpu", "--shift-to-now"])
    out = capsys.readouterr().out
    assert rc == 0 and "as node 'demo-gpu'" in out
    st = Store.open(sqlite_url)
    try:
        hi = st.time_bounds("demo-gpu")[1]
        assert abs(hi - time.time()) < 120
    finally:
        st.close()
    rc = main(["import-trace", str(tmp_path / "nope.jsonl.gz"), "--db", sqlite_url])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "does not exist" in err
    out_file = tmp_path / "again.jsonl.gz"
    rc = main(["export-trace", "--db", sqlite_url, "--node", "demo-gpu", "-o", str(out_file)])
    assert rc == 0 and read_trace(out_file).header["node"] == "demo-gpu"
    rc = main(["export-trace", "--db", sqlite_url, "--node", "nobody", "-o", str(out_file)])
    assert rc == 2 and "has no samples" in capsys.readouterr().err


def test_import_for_demo_loads_once_per_trace_length(sqlite_url):
    from triscope.commands.run import import_for_demo

    now = 1_900_000_000.0
    assert import_for_demo(sqlite_url, TRACE, now=now) == "h200"
    st = Store.open(sqlite_url)
    try:
        assert st.time_bounds("h200")[1] == pytest.approx(now, abs=1)
        n = len(st.events(node="h200"))
        assert import_for_demo(sqlite_url, TRACE, now=now + 30) == "h200"   # still fresh: nothing added
        assert len(st.events(node="h200")) == n
        import_for_demo(sqlite_url, TRACE, now=now + 3600)                  # an hour later: a new copy
        assert st.time_bounds("h200")[1] == pytest.approx(now + 3600, abs=1)
    finally:
        st.close()


def test_phase_checks_fail_when_the_signature_is_missing():
    cp = _check_phases()
    good = {"link_capacity_Bps": 63e9, "pcie_rx_Bps": 0.0, "pcie_tx_Bps": 0.0, "sm_active": 0.0,
            "tensor_active": 0.0, "utilization": 0.0, "dma_map_per_s": 0.0}
    m = {
        "idle": dict(good),
        "pinned_h2d": {**good, "pcie_rx_Bps": 20e9, "utilization": 0.9},       # far below the link
        "compute_bf16": {**good, "sm_active": 0.9, "tensor_active": 0.8},
        "pin_churn": {**good, "dma_map_per_s": None},                           # eBPF probes absent
    }
    res = {n: ok for n, ok, _ in cp.checks(m)}
    assert res["idle: PCIe quiet"] and res["compute_bf16: SMs busy"]
    assert not res["pinned_h2d: PCIe RX >= 70% of the link"]
    assert not res["pin_churn: DMA mappings seen (eBPF dma:dma_map_*)"]
    m["idle"]["sm_active"] = None                                               # NVML missing: not a pass
    assert not {n: ok for n, ok, _ in cp.checks(m)}["idle: SMs quiet"]


def test_the_engine_s_decisions_travel_with_the_trace(tmp_path, capsys):
    """export-trace carries the node's remediation decisions; import-trace (and make run's import)
    puts them in the audit table moved with the ticks, once."""
    from triscope.store import audit

    src, dst = f"sqlite:///{tmp_path / 'src.db'}", f"sqlite:///{tmp_path / 'dst.db'}"
    t0 = 1_900_000_000.0
    st = Store.open(src)
    st.upgrade()
    st.write_ticks("gpu-a", [Tick(t0 + i, [Sample("triscope_gpu_sm_active_ratio", 0.1, {"gpu": "0"})])
                             for i in range(60)])
    st.write_ticks("gpu-b", [Tick(t0 + i, [Sample("triscope_gpu_sm_active_ratio", 0.2, {"gpu": "0"})])
                             for i in range(60)])
    audit.record_decision(st, audit.AuditRow(
        ts=t0 + 30, rule="pinned-buffers", trigger_kind="mismatch", action="dependency_fallback",
        target="file:/k/inference-b.yaml", target_key="file:/k/inference-b.yaml", node="gpu-a",
        outcome="acted", reason="wrote it", issued_ts=t0 + 31, params={"knobs": {"pinned": True}}))
    audit.record_decision(st, audit.AuditRow(ts=t0 + 40, rule="other-node", trigger_kind="mismatch",
                                             action="rolling_restart", node="gpu-b", outcome="dry_run"))
    st.close()
    out = tmp_path / "a.jsonl.gz"
    assert main(["export-trace", "--db", src, "--node", "gpu-a", "-o", str(out)]) == 0
    assert "1 remediation decisions" in capsys.readouterr().out
    tr = read_trace(out)
    assert [d["rule"] for d in tr.decisions] == ["pinned-buffers"]
    for _ in range(2):
        assert main(["import-trace", str(out), "--db", dst, "--node", "again"]) == 0
    assert main(["import-trace", str(out), "--db", dst, "--node", "demo-a", "--shift-to-now"]) == 0
    st = Store.open(dst)
    try:
        rows = audit.audit_log(st, since=0, limit=100)
        assert [(r.node, r.ts) for r in rows if r.node == "again"] == [("again", t0 + 30)], "twice adds nothing"
        (r,) = [r for r in rows if r.node == "demo-a"]
        assert r.node == "demo-a" and r.outcome == "acted" and r.params == {"knobs": {"pinned": True}}
        end = st.time_bounds("demo-a")[1]
        assert abs((r.ts - end) - (30 - 59)) < 1e-3 and abs(r.issued_ts - r.ts - 1) < 1e-6
    finally:
        st.close()
    # a decision line that is not an audit row is one clear error
    bad = tmp_path / "bad.jsonl"
    with gzip.open(out, "rt") as f:
        lines = f.read().splitlines()
    bad.write_text("\n".join([*lines, json.dumps({"d": {"ts": "soon", "rule": "r", "action": "a", "outcome": "x"}})]))
    with pytest.raises(TraceError, match=r"bad trace line \(ts must be epoch seconds"):
        read_trace(bad)
