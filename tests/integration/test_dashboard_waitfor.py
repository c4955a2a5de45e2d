"""The Node page's wait-for data (``dashboard/waitfor_data.py``) on a real SQLite store: series
written through ``Store.write_ticks`` (the agent's path) and read back through the store's query
functions; and the host lab's cpu-lab-7 recording imported as the demo imports it (shifted to end
now), read per scenario of its timeline."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO

from triscope.core.samples import Sample, Tick
from triscope.core.vocabulary import AcceleratorId
from triscope.dashboard import rca_view, waitfor_data
from triscope.dashboard.waitfor_data import NO_EVIDENCE

NODE = "wf-node"
LAB_B = {"gpu": "0", "namespace": "lab", "pod": "lab-b", "container": "lab-b", "workload": ""}
LAB_A = {"gpu": "0", "namespace": "lab", "pod": "lab-a", "container": "lab-a", "workload": ""}
PREP = {"culprit": "lab-b-prep", "culprit_namespace": "lab", "culprit_pod": "lab-b", "culprit_container": "lab-b-prep",
        "culprit_workload": ""}
SELF = {"culprit": "lab-b", "culprit_namespace": "lab", "culprit_pod": "lab-b", "culprit_container": "lab-b",
        "culprit_workload": ""}
RECORDING = REPO / "examples" / "hostlab" / "traces" / "cpu-lab-7.jsonl.gz"
TIMELINE = REPO / "examples" / "hostlab" / "traces" / "cpu-lab-7.timeline.jsonl"


def _seed(st: Any, end: float, span: int = 120, traced: bool = True) -> tuple[float, float]:
    """GPU 0 at 10 % SM with two workloads: lab-b's driving thread (traced: 80 % in IPC, 20 % on a
    CPU; its chain ending 60 % on its sidecar held at its CPU limit, 20 % on the sidecar's CPU work,
    20 % sleeping) and lab-a (host symptoms only: no wait-for series)."""
    start = end - span
    c: dict[str, float] = {}

    def counter(name: str, rate: float, labels: dict[str, str]) -> Sample:
        key = name + json.dumps(labels, sort_keys=True)
        c[key] = c.get(key, 0.0) + rate
        return Sample(name, c[key], labels, "counter")

    ticks = []
    for i in range(span):
        smp = [Sample("triscope_gpu_sm_active_ratio", 0.1, {"gpu": "0"}),
               Sample("triscope_accelerator_workload_info", 1.0, {**LAB_A, "uuid": "GPU-x"}),
               Sample("triscope_workload_cpu_wait_ratio", 0.3, LAB_A),
               Sample("triscope_accelerator_workload_info", 1.0, {**LAB_B, "uuid": "GPU-x"})]
        if traced:
            smp += [counter("triscope_workload_driver_seconds_total", 0.8, {**LAB_B, "state": "ipc"}),
                    counter("triscope_workload_driver_seconds_total", 0.2, {**LAB_B, "state": "cpu"}),
                    Sample("triscope_workload_driver_threads", 1.0, {**LAB_B, "found_by": "driver_calls"}),
                    counter("triscope_workload_wait_chain_seconds_total", 0.6,
                            {**LAB_B, "cause": "cpu_throttled", "relation": "pod", **PREP}),
                    counter("triscope_workload_wait_chain_seconds_total", 0.2,
                            {**LAB_B, "cause": "cpu", "relation": "pod", **PREP}),
                    counter("triscope_workload_wait_chain_seconds_total", 0.2,
                            {**LAB_B, "cause": "timer", "relation": "self", **SELF}),
                    counter("triscope_workload_requests_wait_seconds_total", 0.0, LAB_B),
                    counter("triscope_workload_driver_waited_on_seconds_total", 0.0, LAB_B)]
        ticks.append(Tick(start + i, smp))
    st.write_ticks(NODE, ticks)
    return start, end


def test_first_hop_ends_and_the_verdicts_reading(store: Any) -> None:
    start, end = _seed(store, 1_800_000_000.0)
    (gpu,) = waitfor_data.node_waitfor(store, NODE, start, end)
    assert gpu.accel == AcceleratorId("gpu", "0")
    (b,) = gpu.traced
    assert (b.ref.pod, b.ref.container) == ("lab-b", "lab-b")
    assert [r.pod for r in gpu.untraced] == ["lab-a"]             # said as "no wait-for evidence"
    # the first hop over the range and per bucket (the first tick has no rate: 119 s of 1 thread)
    assert b.first_hop == pytest.approx({"ipc": 0.8, "cpu": 0.2})
    assert b.seconds == pytest.approx(119.0, abs=0.5)
    assert b.width == 2.0 and len(b.bucket_start) == 60
    assert all(v == pytest.approx(0.8) for v in b.states["ipc"][1:])
    assert all(t == pytest.approx(1.0) for t in b.threads[1:])
    # the chain's ends, read by the verdict: the sidecar held at its CPU limit decides, staging-bound
    got = [(e.cause, e.relation, e.culprit, round(e.share, 3), e.group) for e in b.ends]
    assert got == [("cpu_throttled", "pod", "lab-b-prep", 0.6, "staging"), ("cpu", "pod", "lab-b-prep", 0.2, "staging"),
                   ("timer", "self", "lab-b", 0.2, "demand")]
    assert (b.state, b.deciding, b.named) == ("staging-bound", "staging", ("lab", "lab-b", "lab-b-prep", ""))
    assert b.found_by == "driver_calls" and "lab-b-prep" in b.reasons[0]
    # one accelerator only, and one with nothing on it
    assert waitfor_data.node_waitfor(store, NODE, start, end, AcceleratorId("gpu", "0"))[0].traced[0].state == "staging-bound"
    assert waitfor_data.node_waitfor(store, NODE, start, end, AcceleratorId("gpu", "1")) == []


def test_a_store_without_wait_for_series_says_so(store: Any) -> None:
    start, end = _seed(store, 1_800_000_000.0, traced=False)
    (gpu,) = waitfor_data.node_waitfor(store, NODE, start, end)
    assert gpu.traced == [] and sorted(r.pod for r in gpu.untraced) == ["lab-a", "lab-b"]
    assert NO_EVIDENCE == "no wait-for evidence: the verdict decided on host symptoms"


def test_too_little_evidence_shows_the_shares_unread(store: Any) -> None:
    start, end = _seed(store, 1_800_000_000.0)
    (b,) = waitfor_data.node_waitfor(store, NODE, end - 3, end)[0].traced     # 2 s of driving time < 4 s
    assert b.state == "" and "too little wait-for evidence" in b.note
    assert [e.culprit for e in b.ends][:2] == ["lab-b-prep", "lab-b-prep"] and {e.group for e in b.ends} == {""}


# ---------------------------------------------------------------------------------------------- the recording
@pytest.fixture(scope="module")
def recording(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, float]]:
    """cpu-lab-7 imported as the demo imports it (``import_for_demo``: shifted to end now, marked a
    recording); (store, the shift)."""
    from triscope.commands.run import import_for_demo
    from triscope.core.trace import read_trace
    from triscope.store import Store

    url = f"sqlite:///{tmp_path_factory.mktemp('wf-recording') / 'triscope.db'}"
    node = import_for_demo(url, RECORDING, now=time.time())
    st = Store.open(url)
    try:
        bounds = st.time_bounds(node)
        assert bounds is not None
        yield st, bounds[1] - read_trace(RECORDING).ticks[-1][0]
    finally:
        st.close()


def phases(offset: float) -> dict[str, tuple[float, float]]:
    """scenario -> its span in the imported store (the timeline file, moved as the ticks were)."""
    out: dict[str, tuple[float, float]] = {}
    for line in Path(TIMELINE).read_text().splitlines():
        p = json.loads(line)
        out.setdefault(p["scenario"], (p["start"] + offset, p["end"] + offset))
    return out


def _deciding(d: Any) -> list[tuple[str, str, str]]:
    return [(e.cause, e.relation, e.culprit) for e in d.ends if d.deciding and e.group == d.deciding]


def test_the_recordings_chains_name_the_culprits_of_its_timeline(recording: tuple[Any, float]) -> None:
    st, offset = recording
    span = phases(offset)
    for scenario in ("sidecar_shm", "sidecar_tcp"):     # b's GPU container fed by its throttled sidecar
        (gpu,) = waitfor_data.node_waitfor(st, "cpu-lab-7", *span[scenario])
        b = next(d for d in gpu.traced if d.ref.pod == "lab-b")
        assert b.state == "staging-bound" and b.named == ("lab", "lab-b", "lab-b-prep", ""), scenario
        assert _deciding(b)[0] == ("cpu_throttled", "pod", "lab-b-prep"), scenario
        a = next(d for d in gpu.traced if d.ref.pod == "lab-a")
        assert a.state == "", scenario                    # the healthy instance: nothing holds it back
    # contention by cpu.weight: a's own threads wait for CPUs; the chain names lab-a itself
    (gpu,) = waitfor_data.node_waitfor(st, "cpu-lab-7", *span["contention_weight"])
    a = next(d for d in gpu.traced if d.ref.pod == "lab-a")
    assert a.state == "staging-bound" and a.named == ("lab", "lab-a", "lab-a", "")
    assert _deciding(a)[0] == ("cpu_wait", "self", "lab-a")
    # the first hop over the sidecar phases: IPC over the Unix socket, then the loopback TCP socket
    (gpu,) = waitfor_data.node_waitfor(st, "cpu-lab-7", span["sidecar_shm"][0], span["sidecar_tcp"][1])
    b = next(d for d in gpu.traced if d.ref.pod == "lab-b")
    assert max(v or 0 for v in b.states["ipc"]) > 0.8 and max(v or 0 for v in b.states["network"]) > 0.8


def test_root_causes_episodes_carry_the_chain(recording: tuple[Any, float]) -> None:
    st, _ = recording
    a, b = st.time_bounds("cpu-lab-7") or (0.0, 0.0)
    tv = rca_view.timeline(st, "cpu-lab-7", a, b + 1)
    chains = [e.causes[0].chain for e in tv.bad if e.causes and e.causes[0].chain]
    named = {tuple(c["named"]) for c in chains}
    assert ("lab", "lab-b", "lab-b-prep", "") in named and ("lab", "lab-a", "lab-a", "") in named
    prep = next(c for c in chains if tuple(c["named"]) == ("lab", "lab-b", "lab-b-prep", ""))
    top = prep["ends"][0]
    assert (top["culprit"], top["relation"], top["group"]) == ("lab-b-prep", "pod", "staging")
    assert prep["detail"] and prep["state"] == "staging-bound"
