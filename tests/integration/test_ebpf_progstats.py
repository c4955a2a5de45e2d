"""BPF programs' own kernel time, read without bcc (``agent/ebpf/progstats.py``), on this machine's
real kernel: the wait-for programs attached by the agent's own loader, a burst of context switches
made here, and the kernel's run-time statistics switched on and off.

While another process holds the statistics on (``BPF_ENABLE_STATS``, or the sysctl written by
someone else), the "off" test cannot hold: it checks the sysctl first.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator

import pytest

from triscope.agent.collectors.ebpf import EbpfCollector
from triscope.agent.ebpf import layout as L
from triscope.agent.ebpf import progstats

pytestmark = pytest.mark.ebpf


@pytest.fixture(scope="module")
def probes() -> Iterator[EbpfCollector]:
    c = EbpfCollector(probes=["waitfor", "waitfor_irq"])
    assert c.attached["waitfor"], c.reasons["waitfor"]
    yield c
    c.close()


def _ours(c: EbpfCollector) -> dict[int, str]:
    """Program id -> function of this collector's attachments (not another agent's programs)."""
    assert c._load is not None
    fns = {tp: fn for name in ("waitfor", "waitfor_irq")
           for tp, fn in zip(L.PROBE_BY_NAME[name].tracepoints, L.PROBE_BY_NAME[name].fns, strict=True)}
    ids = progstats.attached_programs({a.fd: fns[a.tracepoint] for a in c._load.attachments if a.ok})
    assert set(ids.values()) == set(fns.values()), ids
    return ids


def _switches(n: int = 3000) -> None:
    """``n`` round trips between two threads over two pipes: each blocking read is a context switch."""
    r1, w1 = os.pipe()
    r2, w2 = os.pipe()

    def echo() -> None:
        for _ in range(n):
            os.read(r1, 1)
            os.write(w2, b"x")

    t = threading.Thread(target=echo)
    t.start()
    try:
        for _ in range(n):
            os.write(w1, b"x")
            os.read(r2, 1)
    finally:
        t.join(10)
        for fd in (r1, w1, r2, w2):
            os.close(fd)


def test_stats_on_a_burst_of_switches_moves_on_wf_switch(probes: EbpfCollector) -> None:
    ids = _ours(probes)
    with progstats.stats_enabled() as how:
        assert how in ("fd", "sysctl")
        a = progstats.snapshot(ids=ids)
        _switches()
        b = progstats.snapshot(ids=ids)
    d = progstats.delta(a, b)
    runs = d["on_wf_switch"][1]
    assert runs >= 3000, d                      # at least one switch per round trip, and the node's others
    assert d["on_wf_switch"][0] > 0
    per = progstats.per_run(d)["on_wf_switch"]
    assert 1 < per < 100_000, per               # ns per run: a sane figure, not a unit slip
    assert d["on_wf_waking"][1] > 0


def test_stats_off_run_cnt_stays(probes: EbpfCollector) -> None:
    if progstats.stats_sysctl():
        pytest.skip("kernel.bpf_stats_enabled is on (set by someone else)")
    ids = _ours(probes)
    a = progstats.snapshot(ids=ids)
    _switches(1000)
    b = progstats.snapshot(ids=ids)
    assert progstats.delta(a, b)["on_wf_switch"] == (0, 0)


def test_sysctl_way_switches_it_on_and_back(probes: EbpfCollector) -> None:
    before = progstats.stats_sysctl()
    if before is None:
        pytest.skip("no kernel.bpf_stats_enabled")
    if before:
        pytest.skip("kernel.bpf_stats_enabled is on (set by someone else)")
    ids = _ours(probes)
    with progstats.stats_enabled("sysctl") as how:
        assert how == "sysctl"
        assert progstats.stats_sysctl() == 1
        a = progstats.snapshot(ids=ids)
        _switches(1000)
        b = progstats.snapshot(ids=ids)
    assert progstats.stats_sysctl() == before
    assert progstats.delta(a, b)["on_wf_switch"][1] >= 1000


def test_by_name_without_ids_truncated_names_told_apart(probes: EbpfCollector) -> None:
    """Names past 15 characters (``on_wf_softirq_entry``/``_exit`` both load as ``on_wf_softirq_e``)
    come back under their full function names (the programs' BTF), the rest by prefix."""
    ids = _ours(probes)
    mine = progstats.programs(progstats.WAITFOR_FNS, ids=ids)
    assert {p.name for p in mine} >= {"on_wf_switch", "on_wf_waking", "on_wf_softirq_e", "on_wf_hrtimer_e"}
    assert all(len(p.name) <= progstats.NAME_LEN for p in mine)
    with progstats.stats_enabled():
        a = progstats.snapshot()
        _switches(500)
        b = progstats.snapshot()
    d = progstats.delta(a, b)
    assert {"on_wf_softirq_entry", "on_wf_softirq_exit", "on_wf_hrtimer_entry", "on_wf_hrtimer_exit"} <= set(d), d
    assert d["on_wf_switch"][1] >= 500
    t, n = progstats.total(d)
    assert n >= d["on_wf_switch"][1] and t >= d["on_wf_switch"][0]


def test_detached_programs_are_not_found(probes: EbpfCollector) -> None:
    """The id of an attachment whose fd is closed: nothing is attached through it any more."""
    r, w = os.pipe()
    try:
        with pytest.raises(progstats.BpfError):
            progstats.attached_program(r)      # a pipe carries no program
    finally:
        os.close(r)
        os.close(w)
