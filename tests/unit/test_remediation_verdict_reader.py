"""The engine reads the verdict history once per evaluation (``conditions.VerdictReader``: every node's
newest runs in one ``current_verdicts`` statement), not once per node per rule, and with the same
answers as each rule reading for itself."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from kube_server import policy_text

from triscope.core.samples import Sample, Tick
from triscope.remediation import triggers
from triscope.remediation.conditions import VerdictReader, verdict_lookback
from triscope.remediation.policy import parse_policy
from triscope.store import Store

RULES = """  - name: staged
    trigger: {mismatch: staging-bound, for: 20s}
    action: command
    target: {node: {label: node}}
    params: {argv: ["true"], literal_targets: true}
  - name: long-staged
    trigger: {mismatch: staging-bound, for: 5m}
    action: command
    target: {node: {label: node}}
    params: {argv: ["true"], literal_targets: true}
  - name: low-sm
    trigger: {metric: triscope_gpu_sm_active_ratio, op: "<", threshold: 0.2, for: 10s}
    action: command
    target: {node: {label: node}}
    params: {argv: ["true"], literal_targets: true}
"""


class Counting:
    """A real store that counts its reads."""

    def __init__(self, store: Store) -> None:
        self.store, self.calls = store, Counter[str]()

    def __getattr__(self, name: str) -> Any:
        fn = getattr(self.store, name)

        def counted(*a: Any, **kw: Any) -> Any:
            self.calls[name] += 1
            return fn(*a, **kw)
        return counted


def _tick(ts: float, state: str) -> Tick:
    wl = {"namespace": "inference", "pod": "web-0", "container": "app", "workload": ""}
    return Tick(ts, [*(Sample("triscope_mismatch_state", 1.0 if s == state else 0.0, {"state": s, "gpu": "0", **wl})
                       for s in ("balanced", "staging-bound")),
                     Sample("triscope_gpu_sm_active_ratio", 0.1, {"gpu": "0"})])


def test_one_read_of_the_history_serves_every_rule_on_every_node(store: Store) -> None:
    now = time.time()
    for node in ("a", "b", "c"):
        store.write_ticks(node, [_tick(now - 40 + i, "staging-bound") for i in range(41)])
    rules = [parse_policy(policy_text(RULES), "p.yaml").rule(n) for n in ("staged", "long-staged", "low-sm")]
    alone = [sorted(e.key for e in triggers.stored_data_events(store, r, now + 0.5, 60.0, {})) for r in rules]
    assert [len(k) for k in alone] == [3, 0, 3]
    c = Counting(store)
    shared = VerdictReader(c, now + 0.5 - max(verdict_lookback(r.trigger.for_s, 60.0) for r in rules))  # type: ignore[arg-type]
    got = [sorted(e.key for e in triggers.stored_data_events(c, r, now + 0.5, 60.0, {}, shared))  # type: ignore[arg-type]
           for r in rules]
    assert got == alone
    assert c.calls["current_verdicts"] == 1 and c.calls["verdict_runs"] == 0
    # a reader that has read less far back reads again once, further back, and answers the same
    c.calls.clear()
    short = VerdictReader(c, now - 30)  # type: ignore[arg-type]
    assert sorted(e.key for e in triggers.stored_data_events(c, rules[0], now + 0.5, 60.0, {}, short)) == alone[0]  # type: ignore[arg-type]
    assert c.calls["current_verdicts"] == 2


def test_the_reader_answers_what_the_history_holds_for_any_range(store: Store) -> None:
    """Runs that end just after ``since`` are read (however far before the newest node's last tick), and
    none of another node's; the same runs ``verdict_runs`` gives for the range."""
    t = 1_800_000_000.0
    store.write_ticks("old", [_tick(t + i, "staging-bound") for i in range(10)])           # ends at t + 9
    store.write_ticks("new", [_tick(t + 500 + i, "balanced") for i in range(10)])
    store.write_ticks("new", [_tick(t + 560 + i, "staging-bound") for i in range(10)])
    for since, until in ((t + 8, t + 600), (t + 9, t + 600), (t + 10, t + 600), (t + 505, t + 565), (t - 100, t + 2)):
        reader = VerdictReader(store, since)
        for node in ("old", "new"):
            want = [r for r in store.verdict_runs(node, since, until) if r.start <= until]
            assert reader.runs(node, since, until) == want, (node, since - t, until - t)
    assert [r.state for r in VerdictReader(store).runs("old", t + 9, t + 600) if r.accelerator] == ["staging-bound"]
