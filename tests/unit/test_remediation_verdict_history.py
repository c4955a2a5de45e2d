"""The engine's stored-data triggers read the verdict history (``verdict_runs``, the record root cause
and the pages read) where they ask which accelerator is in which state, naming which workload: a
mismatch trigger, a metric trigger's quiet-accelerator check, an XID's workload.  A store whose
history holds nothing for the node (written before the history existed) is read through the state
series instead, with the same answers.

Each case runs on a real store three ways: as it is, with the state series hidden (only the history
can answer) and with the history hidden (only the fallback can)."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from kube_server import policy_text

from triscope.core.samples import EventRecord, Sample, Tick
from triscope.remediation import conditions, triggers
from triscope.remediation.policy import parse_policy
from triscope.store import Store
from triscope.store.reader import LatestValue, SeriesData, VerdictRun

NODE = "gpu-node"
WEB = {"namespace": "inference", "pod": "web-0", "container": "app", "workload": ""}
LLM = {"namespace": "inference", "pod": "llm-0", "container": "app", "workload": ""}
RULES = """  - name: staged
    trigger: {mismatch: staging-bound, for: 20s}
    action: command
    target: {node: {label: node}}
    params: {argv: ["true"], literal_targets: true}
  - name: low-sm
    trigger: {metric: triscope_gpu_sm_active_ratio, op: "<", threshold: 0.2, for: 10s}
    action: command
    target: {node: {label: node}}
    params: {argv: ["true"], literal_targets: true}
"""


class Hiding:
    """A real store with one of its reads hidden: ``history`` (``verdict_runs`` answers nothing, as a store
    written before the history existed) or ``series`` (the ``triscope_mismatch_state`` series answer nothing)."""

    def __init__(self, store: Store, hide: str) -> None:
        self.store, self.hide = store, hide

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    def verdict_runs(self, node: str, start: float, end: float) -> list[VerdictRun]:
        return [] if self.hide == "history" else self.store.verdict_runs(node, start, end)

    def query(self, metric: str, *a: Any, **kw: Any) -> list[SeriesData]:
        return [] if self.hide == "series" and metric == conditions.MISMATCH_METRIC else self.store.query(metric, *a, **kw)

    def latest(self, node: str, metric: str | None = None, *a: Any, **kw: Any) -> Sequence[LatestValue]:
        if self.hide == "series" and metric == conditions.MISMATCH_METRIC:
            return []
        return self.store.latest(node, metric, *a, **kw)


def _tick(ts: float, states: Mapping[str, tuple[str, dict[str, str]]], sm: Mapping[str, float],
          events: list[EventRecord] | None = None) -> Tick:
    """One tick of the agent's tracker: every GPU's state (1 for its state, 0 for two others) and SM activity."""
    samples = []
    for gpu, (state, wl) in states.items():
        for s in ("balanced", "staging-bound", "demand-limited"):
            samples.append(Sample("triscope_mismatch_state", 1.0 if s == state else 0.0, {"state": s, "gpu": gpu, **wl}))
        samples.append(Sample("triscope_gpu_sm_active_ratio", sm[gpu], {"gpu": gpu}))
    return Tick(ts, samples, events or [])


@pytest.fixture
def recorded(store: Store) -> tuple[Store, float]:
    """GPU 0 staging-bound for 40 s (web-0's), GPU 1 demand-limited (llm-0's), both at low SM activity; an
    XID 79 on GPU 0 at the end."""
    now = time.time()
    ticks = [_tick(now - 40 + i, {"0": ("staging-bound", WEB), "1": ("demand-limited", LLM)}, {"0": 0.1, "1": 0.05})
             for i in range(40)]
    ticks.append(_tick(now, {"0": ("staging-bound", WEB), "1": ("demand-limited", LLM)}, {"0": 0.1, "1": 0.05},
                       [EventRecord("xid", "GPU has fallen off the bus", "critical", {"xid": 79, "gpu": "0"}, now)]))
    store.write_ticks(NODE, ticks)
    return store, now


@pytest.mark.parametrize("hide", ["nothing", "series", "history"])
def test_a_mismatch_trigger_reads_the_verdict_history_else_the_series(recorded: tuple[Store, float],
                                                                     hide: str) -> None:
    store, now = recorded
    st = Hiding(store, hide)
    rule = parse_policy(policy_text(RULES), "p.yaml").rule("staged")
    if hide != "history":
        assert conditions.stretches(st, NODE, now - 60, now)["gpu=0"].state == "staging-bound"  # type: ignore[index]
    events = triggers.stored_data_events(st, rule, now + 0.5, 60.0, {})
    assert [(e.labels["gpu"], e.labels["pod"], e.series["state"]) for e in events] == [("0", "web-0", "staging-bound")]
    assert events[0].started_at == pytest.approx(now - 40, abs=0.01)   # the stretch's start, not the window's
    assert events[0].key.endswith(f":{now - 40:.0f}")
    # the recheck right before acting reads the same record
    assert triggers.recheck(st, events[0], now + 1, 60.0)[0]
    # quiet for 61 s: no longer published, it no longer holds
    assert not triggers.recheck(st, events[0], now + 61, 60.0)[0]


@pytest.mark.parametrize("hide", ["nothing", "series", "history"])
def test_the_quiet_check_and_an_xids_workload_read_the_verdict(recorded: tuple[Store, float], hide: str) -> None:
    store, now = recorded
    st = Hiding(store, hide)
    rule = parse_policy(policy_text(RULES), "p.yaml").rule("low-sm")
    conds = {c.series["gpu"]: c for c in conditions.accelerator_conditions(st, rule.trigger, NODE, now + 0.5, 60.0)}
    assert conds["0"].holds and conds["0"].workload["pod"] == "web-0"     # the verdict's workload
    assert not conds["1"].holds and "demand-limited" in conds["1"].detail  # a quiet accelerator never triggers
    assert conditions.xid_workload(st, NODE, "0", now, 60.0)["pod"] == "web-0"
    assert conditions.xid_workload(st, NODE, "1", now, 60.0)["pod"] == "llm-0"


def test_a_stretch_spans_one_state_not_a_silence_or_another_state(store: Store) -> None:
    """Ticks of one state and workload are one stretch across short gaps; a silence longer than the
    history's gap (the agent down) is no time in the state, so a ``for:`` cannot be met across it; a
    state between two runs splits them too."""
    now = time.time()
    calm = {"0": ("staging-bound", WEB)}
    store.write_ticks(NODE, [_tick(now - 160 + i, calm, {"0": 0.1}) for i in range(10)])      # 10 s
    store.write_ticks(NODE, [_tick(now - 130 + i, calm, {"0": 0.1}) for i in range(10)])      # after 20 s: one run
    got = conditions.stretches(store, NODE, now - 200, now - 115)
    assert got is not None and got["gpu=0"].start == pytest.approx(now - 160, abs=0.01)
    store.write_ticks(NODE, [_tick(now - 40 + i, calm, {"0": 0.1}) for i in range(41)])       # after a 80 s silence
    got = conditions.stretches(store, NODE, now - 200, now)
    assert got is not None and got["gpu=0"].start == pytest.approx(now - 40, abs=0.01)
    assert got["gpu=0"].end == pytest.approx(now, abs=0.01)
    store.write_ticks(NODE, [_tick(now + 1, {"0": ("balanced", WEB)}, {"0": 0.1})])
    store.write_ticks(NODE, [_tick(now + 2 + i, calm, {"0": 0.1}) for i in range(3)])
    got = conditions.stretches(store, NODE, now - 200, now + 5)
    assert got is not None and got["gpu=0"].start == pytest.approx(now + 2, abs=0.01)


def test_a_metric_condition_held_across_a_silence_starts_again_after_it() -> None:
    """A metric trigger's ``for:`` counts time with data: points before a silence longer than the
    history's gap do not extend the run that follows it."""
    ts = [0.0, 1.0, 2.0, 3.0, 100.0, 101.0, 102.0]
    vals = [0.1] * len(ts)
    assert conditions._run_start(ts, vals, "<", 0.2) == (100.0, 0.1)
    assert conditions._run_start([0.0, 10.0, 20.0], [0.1] * 3, "<", 0.2) == (0.0, 0.1)   # 10 s steps hold
