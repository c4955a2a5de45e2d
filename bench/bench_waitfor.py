"""What the wait-for probes cost (docs/waitfor.md, section 7), under load: context-switch generators
keep both CPUs of the machine busy.

A BPF program's run time is charged to the task that switches, not to the agent, so the programs'
own kernel time is read from the kernel's run-time statistics (``agent/ebpf/progstats.py``:
``run_time_ns / run_cnt`` per program, switched on for the measurement and back after).  Those
figures include the statistics' own clock reads: an empty program on the same tracepoint, measured
in the same run, shows that floor.  They leave out what a classic tracepoint does before it calls
the program (it builds the event's record): the hand-off rows time a pipe hand-off as the
application sees it, programs attached against detached (loaded once, attached and detached
without bcc: ``bench/wfload.py``).

* **untracked switches** — pairs of processes handing a byte back and forth over pipes, with a
  little work between hand-offs, at about 100,000 switches/s (the rate reached is a row; the
  machine's other work adds its own), none followed by the agent (its reader follows an idle
  ``sleep``): ns per run of ``on_wf_switch``, ``on_wf_waking`` and the interrupt-context markers,
  and all of them per context switch, beside an empty program on the same tracepoint; the
  raw-tracepoint prototype of the two programs beside an empty raw program.
* **hand-off** — CPU time of a hand-off (a switch and its wakeup) of a pipe pair pinned to one CPU
  at real-time priority, detached against: the wait-for programs (pair not followed, and
  followed), empty programs on the classic and on the raw tracepoints, the raw prototype.
* **interrupt markers** — the softirq/IRQ/hrtimer markers on raw tracepoints (as they are) against
  classic ones (as they were): loopback UDP sends, each running the receive softirq in the sender's
  context, markers detached / classic / raw alternated; added CPU time per send and kernel time per run.
* **raw_syscalls** — not attached (the blocked syscall is read at ``sched_switch``); what its
  untracked filter would cost if it were: a ``getpid`` loop with the filter attached, classic and
  raw tracepoint.
* **tracked switches** — one process of 100 threads (50 pipe pairs, paced to about 20,000
  switches/s, each hand-off after 50 us of CPU work) followed by the agent's real wait-for side
  (``WorkloadWaits`` ticking once a second: ``WaitFor.read()``, the chain, the series) in a process
  of its own: its whole-process CPU time and RSS, the programs' kernel time, the load's own CPU;
  against the same load with the wait-for probes off (baseline), and with the probes attached but
  the load not followed.
* **cost centres** — the tracked path with parts of ``waitfor.bpf.c`` left out or changed, in a
  scratch copy (``wfload.EDITS``): reading the blocked syscall, the path without the scheduler's BTF
  (the fallback), the last wait kept in the thread's entry; each beside the program as it is,
  alternated with it.
* **slots and clock** — the tracked path as it is (a thread's entry in an array slot, the run
  queue's clock) against each part as it was before (``wfload.PROTOTYPES``: the hash, the
  bpf_ktime_get_ns clock, both), alternated with it under the tracked load.

``agent/ebpf/waitfor.bpf.c`` is never changed here.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from bench import wfload as W
from bench.common import Row

TARGET_UNTRACKED = 100_000      # context switches/s on the node, none of them followed
TARGET_TRACKED = 20_000         # switches/s of the followed threads
SWITCH_NS = 150                 # per untracked switch, the programs' own kernel time
TRACKED_PCT = 0.2               # % of a core the followed threads' switches may add (agent + programs)
RSS_MB = 5.0
B = "waitfor"


def _med(xs: Iterable[float]) -> float:
    xs = [x for x in xs if x == x]
    return statistics.median(xs) if xs else float("nan")


def _span(xs: list[float], fmt: str = "{:.0f}") -> str:
    xs = [x for x in xs if x == x]
    return f"min {fmt.format(min(xs))}, max {fmt.format(max(xs))}, n={len(xs)}" if xs else "n=0"


class Window:
    """Program statistics (by id), node switches and wall time between ``start()`` and ``stop()``."""

    def __init__(self, ids: dict[int, str]) -> None:
        from triscope.agent.ebpf import progstats

        self.ps, self.ids = progstats, ids

    def start(self) -> None:
        self.s0, self.c0, self.t0 = self.ps.snapshot(ids=self.ids), W.node_switches(), time.monotonic()

    def stop(self) -> tuple[dict[str, tuple[int, int]], float, float]:
        d = self.ps.delta(self.s0, self.ps.snapshot(ids=self.ids))
        dt = time.monotonic() - self.t0
        return d, (W.node_switches() - self.c0) / dt, dt


def _kernel_time(progs: W.Programs, variant: str, load: Callable[[], object]) -> dict[str, tuple[int, int]]:
    """The programs' kernel time (run ns, runs) by name while ``load`` runs with ``variant`` attached."""
    progs.attach(variant)
    w = Window(progs.ids(variant))
    w.start()
    load()
    d, _sw, _dt = w.stop()
    progs.detach()
    return d


# ------------------------------------------------------------------------------------ untracked
def _next_work(work: int, rate: float) -> int:
    """The work per hand-off for ~100,000 switches/s, from the rate ``work`` gave (each CPU's
    hand-off period is about work + the switch itself)."""
    if rate > TARGET_UNTRACKED:
        return max(500, int((work + 2000) * rate / TARGET_UNTRACKED) - 2000)
    return max(0, int((work + 2000) * rate / TARGET_UNTRACKED) - 2000)


def _switch_rate(secs: float) -> float:
    c0, t0 = W.node_switches(), time.monotonic()
    time.sleep(secs)
    return (W.node_switches() - c0) / (time.monotonic() - t0)


def _calibrated_load(exe: Path, quick: bool, work: int = 4000) -> tuple[W.Gen, int]:
    """4 pairs of processes, work per hand-off adjusted until the node switches ~100,000 times/s
    (the machine's other work counts too: it is part of the load)."""
    for _ in range(4):
        gen = W.Gen(exe, "procs", 4, work)
        time.sleep(0.3)
        rate = _switch_rate(1.0 if quick else 1.5)
        if 0.85 * TARGET_UNTRACKED <= rate <= 1.25 * TARGET_UNTRACKED or (work == 0 and rate < TARGET_UNTRACKED):
            return gen, work
        gen.close()
        work = _next_work(work, rate)
    return W.Gen(exe, "procs", 4, work), work


def untracked(exe: Path, progs: W.Programs, quick: bool) -> list[Row]:
    from triscope.agent.ebpf import progstats

    rounds, secs = (3, 2.0) if quick else (5, 2.5)
    idle = subprocess.Popen(["sleep", "100000"])
    gen = None
    rows: list[Row] = []
    try:
        progs.waitfor.track([idle.pid])         # type: ignore[attr-defined]
        gen, work = _calibrated_load(exe, quick)
        works = []
        variants = ("waitfor", "empty", "proto_raw", "empty_raw")
        per: dict[tuple[str, str], list[float]] = {}        # (variant, fn) -> ns per run, each round
        rate: dict[tuple[str, str], list[float]] = {}       # runs/s
        node: list[float] = []
        per_switch: dict[str, list[float]] = {v: [] for v in variants}
        # all variants attached together: each program's statistics are its own, taken in the same
        # windows under the same load (detaching a classic tracepoint waits for RCU: slow under load)
        ids = {k: v for x in variants for k, v in progs.ids(x).items()}
        fns = {v: [fn for _tp, _k, fn in W.VARIANTS[v]] for v in variants}
        progs.attach(*variants)
        with progstats.stats_enabled() as how:
            for _ in range(rounds):
                works.append(work)
                got = []
                for _ in range(len(variants)):
                    time.sleep(0.3)
                    w = Window(ids)
                    w.start()
                    time.sleep(secs)
                    d, sw, dt = w.stop()
                    node.append(sw)
                    got.append(sw)
                    for v in variants:
                        for fn in fns[v]:
                            t, n = d.get(fn, (0, 0))
                            per.setdefault((v, fn), []).append(t / n if n else float("nan"))
                            rate.setdefault((v, fn), []).append(n / dt)
                        per_switch[v].append(sum(d.get(fn, (0, 0))[0] for fn in fns[v]) / max(1.0, sw * dt))
                r = _med(got)
                if not 0.9 * TARGET_UNTRACKED <= r <= 1.2 * TARGET_UNTRACKED and not (work == 0 and r < TARGET_UNTRACKED):
                    gen.close()                  # the machine's other work changed: back to ~100,000/s
                    gen, work = _calibrated_load(exe, quick, _next_work(work, r))
        progs.detach()
        others = W.other_waitfor_programs(progs.prog_ids.values())
    finally:
        progs.detach()
        if gen is not None:
            gen.close()
        idle.kill()
        idle.wait()
    bm = "waitfor untracked"
    other = f"; {others} wait-for programs of another agent loaded too" if others else ""
    rows.append(Row(bm, f"context switches/s on the node: 4 pipe pairs (8 processes, {min(works) / 1000:.1f}-"
                    f"{max(works) / 1000:.1f} us work per hand-off, set each round) "
                    f"+ the machine's other work, none followed; median over {len(node)} windows ({_span(node, '{:,.0f}')}); "
                    f"run-time stats via {how}{other}", round(_med(node)), "switches/s", f"~{TARGET_UNTRACKED:,} (the load)"))
    floor = "empty program, same tracepoint, same load (the statistics' own clock reads)"
    for fn, empty in (("on_wf_switch", "bench_empty_switch"), ("on_wf_waking", "bench_empty_waking")):
        xs, r = per[("waitfor", fn)], _med(rate[("waitfor", fn)])
        rows.append(Row(bm, f"{fn}: kernel time per run, bpf_stats ({r:,.0f} runs/s; {_span(xs)})", round(_med(xs), 1),
                        "ns/run", f"<= {SWITCH_NS}", floor, round(_med(per[("empty", empty)]), 1), _med(xs) <= SWITCH_NS))
    ws = per_switch["waitfor"]
    net = _med(ws) - _med(per_switch["empty"])
    rows.append(Row(bm, f"all 8 wait-for programs per context switch (switch + wakeups + interrupt markers; {_span(ws)}; "
                    f"{net:.0f} over the empty programs' floor)",
                    round(_med(ws), 1), "ns/switch", f"<= {SWITCH_NS}", "empty programs on sched_switch + sched_waking",
                    round(_med(per_switch["empty"]), 1), _med(ws) <= SWITCH_NS))
    for _tp, _k, fn in W.IRQ_MARKERS:
        xs = per[("waitfor", fn)]
        rows.append(Row(bm, f"{fn}: kernel time per run ({_med(rate[('waitfor', fn)]):,.0f} runs/s)", round(_med(xs), 1),
                        "ns/run", "", floor, round(_med(per[("empty", "bench_empty_switch")]), 1)))
    for fn, empty in (("proto_wf_switch_raw", "bench_empty_switch_raw"), ("proto_wf_waking_raw", "bench_empty_waking_raw")):
        xs = per[("proto_raw", fn)]
        rows.append(Row(bm, f"prototype {fn} (raw tracepoint, pid read with bpf_probe_read_kernel): kernel time per run",
                        round(_med(xs), 1), "ns/run", "", "empty program on the raw tracepoint",
                        round(_med(per[("empty_raw", empty)]), 1)))
    return rows


# ------------------------------------------------------------------------------------ end to end
E2E = {   # variant -> (programs attached, the pair followed?, what)
    "waitfor": ("waitfor", False, "wait-for programs attached, the pair NOT followed (the untracked path)"),
    "followed": ("waitfor", True, "wait-for programs attached, the pair followed (the tracked path, no agent draining)"),
    "empty": ("empty", False, "empty programs on the classic sched_switch + sched_waking tracepoints (their record "
              "building and call)"),
    "empty_raw": ("empty_raw", False, "empty programs on raw sched_switch + sched_waking tracepoints"),
    "proto_raw": ("proto_raw", False, "prototype: the two wait-for programs on raw tracepoints, pair not followed"),
}


def hand_off(exe: Path, progs: W.Programs, quick: bool) -> list[Row]:
    """CPU time of a pipe hand-off (a switch and its wakeup) as the application sees it: a pair of
    processes pinned to CPU 1 at real-time priority, round trips timed in reps of 3,000.  For each
    variant, reps alternate detached / attached (``reps`` of each), and each side counts its least
    (noise on a shared VM only ever adds time); a figure is the median over blocks of the two
    least."""
    blocks, reps = (3, 4) if quick else (5, 8)
    idle = subprocess.Popen(["sleep", "100000"])
    rtt = W.Rtt(exe, 3_000, 1)
    pair = [rtt.proc.pid, *rtt.child_pids()]
    got: dict[str, list[float]] = {}
    others = W.other_waitfor_programs(progs.prog_ids.values())
    try:
        for _ in range(blocks):
            for v, (variant, followed, _what) in E2E.items():
                progs.waitfor.track(pair if followed else [idle.pid])     # type: ignore[attr-defined]
                off_, on_ = [], []
                for _ in range(reps):
                    progs.detach()
                    off_.append(rtt.rep()[1] / 2)
                    progs.attach(variant)
                    on_.append(rtt.rep()[1] / 2)
                progs.detach()
                got.setdefault("none", []).append(min(off_))
                got.setdefault(v, []).append(min(on_) - min(off_))
    finally:
        progs.detach()
        progs.waitfor.track([idle.pid])                                    # type: ignore[attr-defined]
        rtt.close()
        idle.kill()
        idle.wait()
    others = max(others, W.other_waitfor_programs(progs.prog_ids.values()))
    off = (f"programs detached: CPU ns per hand-off ({blocks} blocks x {reps} alternations, reps of 3,000 round trips"
           f"{', SCHED_FIFO' if rtt.fifo else ''}"
           + (f"; {others} wait-for programs of ANOTHER agent attached meanwhile: the classic tracepoints' record "
              "building was then in this baseline too" if others else "; no other wait-for programs loaded") + ")")
    base = round(_med(got["none"]), 1)
    return [Row("waitfor hand-off", f"{what}: added per hand-off, CPU time ({_span(got[v])})", round(_med(got[v]), 1),
                "ns", "", off, base) for v, (_variant, _f, what) in E2E.items()]


# ------------------------------------------------------------------------------------ raw_syscalls
def syscalls(exe: Path, progs: W.Programs, quick: bool) -> list[Row]:
    from triscope.agent.ebpf import progstats

    n, rounds = (500_000, 3) if quick else (2_000_000, 5)

    def loop() -> tuple[float, float]:
        out = subprocess.run(["taskset", "-c", "1", str(exe), "getpid", str(n)], capture_output=True, text=True,
                             check=True).stdout.split()
        return float(out[0]), float(out[1])

    stats: dict[str, list[float]] = {}
    added: dict[str, list[float]] = {}
    walls: list[float] = []
    with progstats.stats_enabled():
        for v in ("sys_filter", "sys_filter_raw"):
            for _ in range(2):
                t, c = next(iter(_kernel_time(progs, v, loop).values()))
                stats.setdefault(v, []).append(t / c if c else float("nan"))
    for _ in range(rounds):
        progs.detach()
        wall, base = loop()
        walls.append(wall)
        for v in ("sys_filter", "sys_filter_raw"):
            progs.attach(v)
            added.setdefault(v, []).append(loop()[1] - base)
            progs.detach()
    rate = 1e9 / _med(walls)
    bm = "waitfor raw_syscalls"
    return [
        Row(bm, "raw_syscalls:sys_enter/exit: NOT attached (the blocked syscall is read from the task's saved registers "
            "at sched_switch): cost per untracked syscall", 0.0, "ns/syscall", f"<= {SWITCH_NS}", ok=True),
        Row(bm, f"if it were: the untracked filter (process bit) on classic raw_syscalls:sys_enter, getpid loop at "
            f"{rate:,.0f} calls/s: kernel time per run ({_span(stats['sys_filter'])})", round(_med(stats["sys_filter"]), 1),
            "ns/run", f"<= {SWITCH_NS}", "same filter on the raw tracepoint", round(_med(stats["sys_filter_raw"]), 1),
            _med(stats["sys_filter"]) <= SWITCH_NS),
        Row(bm, f"if it were, classic tracepoint: added per getpid call, CPU time ({_span(added['sys_filter'])})",
            round(_med(added["sys_filter"]), 1), "ns", "", "raw tracepoint, same filter", round(_med(added["sys_filter_raw"]), 1)),
    ]


# ------------------------------------------------------------------------------------ interrupt markers
def irq_markers(exe: Path, progs: W.Programs, quick: bool) -> list[Row]:
    """The interrupt-context markers on raw tracepoints (as they are) against classic ones (as they
    were: the same bodies): a loop of loopback UDP sends pinned to CPU 1, each running the network
    receive softirq in the sender's context (softirq_entry/exit: one pair a send; this kernel has no
    IRQ time accounting, so the softirq's time is the sender's CPU time), alternating none / classic /
    raw; added CPU time per send (each side's least of its reps in a block: noise only adds), and
    the markers' kernel time per run (bpf_stats) in the same loops."""
    from triscope.agent.ebpf import progstats

    n, blocks, reps = (50_000, 3, 4) if quick else (50_000, 6, 8)

    def loop() -> float:
        out = subprocess.run(["taskset", "-c", "1", str(exe), "udp", str(n)], capture_output=True, text=True,
                             check=True).stdout.split()
        return float(out[1])

    variants = ("irq_classic", "irq_raw")
    added: dict[str, list[float]] = {v: [] for v in variants}
    base: list[float] = []
    for _ in range(blocks):
        got: dict[str, list[float]] = {v: [] for v in ("none", *variants)}
        for _ in range(reps):
            for v in ("none", *variants):
                if v == "none":
                    progs.detach()
                else:
                    progs.attach(v)
                got[v].append(loop())
        progs.detach()
        base.append(min(got["none"]))
        for v in variants:
            added[v].append(min(got[v]) - min(got["none"]))
    per: dict[tuple[str, str], list[float]] = {}
    with progstats.stats_enabled():
        for _ in range(2):
            for v in variants:
                for fn, (t, c) in _kernel_time(progs, v, loop).items():
                    if c:
                        per.setdefault((v, fn.replace("bench_tp_", "on_wf_")), []).append(t / c)
    bm = "waitfor interrupt markers"
    rows = [Row(bm, f"softirq markers on raw tracepoints (as it is): added per loopback UDP send, CPU time "
                f"({_span(added['irq_raw'])}; {blocks} blocks x {reps} alternations of {n:,} sends)",
                round(_med(added["irq_raw"]), 1), "ns", "", "the same markers on classic tracepoints (as before)",
                round(_med(added["irq_classic"]), 1)),
            Row(bm, f"a loopback UDP send, markers detached (CPU time; {_span(base)})", round(_med(base), 1), "ns", "")]
    for fn in ("on_wf_softirq_entry", "on_wf_softirq_exit"):
        rows.append(Row(bm, f"{fn} on the raw tracepoint: kernel time per run, bpf_stats "
                        f"({_span(per.get(('irq_raw', fn), []))})", round(_med(per.get(("irq_raw", fn), [])), 1),
                        "ns/run", "", "classic tracepoint, same body", round(_med(per.get(("irq_classic", fn), [])), 1)))
    return rows


# ------------------------------------------------------------------------------------ tracked
class Tracked:
    """The followed load: one process of 100 threads (50 paced pipe pairs) at ~20,000 switches/s."""

    def __init__(self, exe: Path) -> None:
        self.exe = exe
        self.period = 9_000_000
        self.gen = W.Gen(exe, "threads", 50, 50_000, self.period)
        time.sleep(1.0)
        rate = self.rate(1.5)
        if not 0.85 * TARGET_TRACKED <= rate <= 1.2 * TARGET_TRACKED and rate > 0:
            self.gen.close()
            self.period = int(self.period * rate / TARGET_TRACKED)
            self.gen = W.Gen(exe, "threads", 50, 50_000, self.period)
            time.sleep(1.0)

    def rate(self, secs: float) -> float:
        s0, t0 = W.process_switches(self.gen.pids), time.monotonic()
        time.sleep(secs)
        return (W.process_switches(self.gen.pids) - s0) / (time.monotonic() - t0)

    def close(self) -> None:
        self.gen.close()


def _agent_round(mode: str, pids: list[int], load: Tracked, warm: float, secs: float) -> dict[str, float]:
    """One run of the agent's wait-for side: ``warm`` seconds, then ``secs`` measured."""
    a = W.AgentSide(mode, pids)
    try:
        time.sleep(warm)
        w = Window(a.ids)
        w.start()
        a0, g0, s0 = a.cpu_ns(), W.process_cpu_ns(load.gen.pids), W.process_switches(load.gen.pids)
        rss = []
        end = time.monotonic() + secs
        while time.monotonic() < end:
            time.sleep(min(1.0, max(0.0, end - time.monotonic())))
            rss.append(a.rss())
        d, _sw, dt = w.stop()
        out = {"agent": (a.cpu_ns() - a0) / dt / 1e7, "gen": (W.process_cpu_ns(load.gen.pids) - g0) / dt / 1e7,
               "switches": (W.process_switches(load.gen.pids) - s0) / dt, "rss": max(rss),
               "progs": sum(t for t, _n in d.values()) / dt / 1e7}
        for fn, (t, n) in d.items():
            out[fn] = t / n if n else float("nan")
    finally:
        seen = a.close()
    out["waits_per_tick"] = seen.get("waits", 0) / max(1, seen.get("ticks", 1))
    out["threads"] = seen.get("threads", 0)
    return out


def tracked(exe: Path, quick: bool) -> list[Row]:
    from triscope.agent.ebpf import progstats

    rounds, warm, secs = (2, 2.5, 5.0) if quick else (3, 4.0, 10.0)
    load = Tracked(exe)
    idle = subprocess.Popen(["sleep", "100000"])
    got: dict[str, list[dict[str, float]]] = {}
    modes: list[tuple[str, str, Callable[[], list[int]]]] = [
        ("off", "off", lambda: load.gen.pids), ("on", "on", lambda: load.gen.pids),
        ("on_idle", "on", lambda: [idle.pid])]
    try:
        with progstats.stats_enabled():
            for _ in range(rounds):
                for key, mode, pids in modes:
                    got.setdefault(key, []).append(_agent_round(mode, pids(), load, warm, secs))
    finally:
        load.close()
        idle.kill()
        idle.wait()

    def m(key: str, field: str) -> float:
        return _med(r.get(field, float("nan")) for r in got[key])

    def span(key: str, field: str, fmt: str = "{:.2f}") -> str:
        return _span([r.get(field, float("nan")) for r in got[key]], fmt)

    bm = "waitfor tracked"

    def add(key: str) -> list[float]:
        """Per round: agent CPU over the probes-off run + programs over the load-not-followed run."""
        return [r["agent"] - off["agent"] + r["progs"] - idle_["progs"]
                for r, off, idle_ in zip(got[key], got["off"], got["on_idle"], strict=True)]

    added = add("on")
    threads = int(m("on", "threads"))
    rows = [
        Row(bm, f"switches/s of the followed threads (1 process, 100 threads: 50 pipe pairs paced at "
            f"{load.period / 1e6:.1f} ms, 50 us CPU work per hand-off; {span('on', 'switches', '{:,.0f}')})",
            round(m("on", "switches")), "switches/s", f">= {int(0.85 * TARGET_TRACKED):,}", "same load, probes off",
            round(m("off", "switches")), m("on", "switches") >= 0.85 * TARGET_TRACKED),
        Row(bm, f"added by following them: agent side's whole-process CPU (with - probes off) + the programs' kernel "
            f"time (bpf_stats, load followed - not followed); {_span(added, '{:.2f}')}", round(_med(added), 2),
            "% of a core", f"<= {TRACKED_PCT}", "probes off: the agent side's CPU", round(m("off", "agent"), 3),
            _med(added) <= TRACKED_PCT),
        Row(bm, f"the programs' kernel time, load followed ({span('on', 'progs')})", round(m("on", "progs"), 2),
            "% of a core", "", "programs attached, load not followed (agent following an idle process)",
            round(m("on_idle", "progs"), 2)),
        Row(bm, f"agent side's whole-process CPU: WorkloadWaits ticking 1/s over {threads} threads, "
            f"{m('on', 'waits_per_tick'):,.0f} wait records read per tick ({span('on', 'agent')})",
            round(m("on", "agent"), 2), "% of a core", "", "probes off (same process, same imports)", round(m("off", "agent"), 3)),
        Row(bm, f"the followed process's own CPU, programs attached (as it sees them; includes bpf_stats' clock reads; "
            f"{span('on', 'gen', '{:.1f}')})", round(m("on", "gen"), 1), "% of a core", "", "same load, probes off",
            round(m("off", "gen"), 1)),
    ]
    for fn in ("on_wf_switch", "on_wf_waking"):
        rows.append(Row(bm, f"{fn}, followed threads: kernel time per run ({span('on', fn, '{:.0f}')})", round(m("on", fn), 1),
                        "ns/run", "", "same programs, load not followed", round(m("on_idle", fn), 1)))
    rss_on, rss_off = m("on", "rss"), m("off", "rss")
    rows.append(Row(bm, f"agent side's RSS following {threads} threads (max over each window, median of {len(got['on'])})",
                    round(rss_on, 1), "MB", f"<= baseline + {RSS_MB:.0f}", "probes off (same process, same imports)",
                    round(rss_off, 1), rss_on - rss_off <= RSS_MB))
    return rows


# ------------------------------------------------------------------------------------ cost centres
def _edit_costs(exe: Path, quick: bool, edits: dict[str, Callable[[str], str] | None]
                ) -> dict[tuple[str, str], list[float]]:
    """Each edit of the programs (``as_is`` among them) attached in turn, round after round, under the
    tracked load: (edit, program) -> kernel ns per run, one figure a window."""
    from triscope.agent.ebpf import progstats

    rounds, secs = (2, 2.0) if quick else (4, 3.0)
    load = Tracked(exe)
    progs: dict[str, W.Programs] = {}
    per: dict[tuple[str, str], list[float]] = {}
    try:
        for k, edit in edits.items():
            progs[k] = W.Programs.load(["waitfor"], edit)
            progs[k].waitfor.track(load.gen.pids)          # type: ignore[attr-defined]
        with progstats.stats_enabled():
            for _ in range(rounds):
                for k, p in progs.items():
                    p.attach("waitfor")
                    time.sleep(0.3)
                    p.waitfor.read()                        # type: ignore[attr-defined]
                    w = Window(p.ids("waitfor"))
                    w.start()
                    time.sleep(secs)
                    d, _sw, _dt = w.stop()
                    p.waitfor.read()                        # type: ignore[attr-defined]  (drained as the agent does)
                    p.detach()
                    for fn in ("on_wf_switch", "on_wf_waking"):
                        t, n = d.get(fn, (0, 0))
                        per.setdefault((k, fn), []).append(t / n if n else float("nan"))
    finally:
        for p in progs.values():
            p.close()
        load.close()
    return per


def cost_centres(exe: Path, quick: bool) -> list[Row]:
    """The tracked path's programs with parts left out or changed (``wfload.EDITS``), under the
    tracked load, each attached in turn: kernel time per run of the two programs."""
    per = _edit_costs(exe, quick, W.EDITS)
    words = {"no_regs": "without reading the blocked syscall (WF_NO_REGS)",
             "fallback": "the path without the scheduler's BTF (WF_SCHED off: a hash lookup and a clock read per "
                         "wakeup, the wait closed there)",
             "no_last_wait": "every wait added to the wf_wait hash (the last wait not kept in the thread's entry)"}
    rows = []
    for k, what in words.items():
        for fn in ("on_wf_switch", "on_wf_waking"):
            xs = per[(k, fn)]
            rows.append(Row("waitfor cost centres", f"{fn}, followed threads, {what} ({_span(xs)})", round(_med(xs), 1),
                            "ns/run", "", "as it is, alternated with it", round(_med(per[("as_is", fn)]), 1)))
    return rows


def prototypes(exe: Path, quick: bool) -> list[Row]:
    """The tracked path as it is (a thread's entry in an array slot, the run queue's clock) against
    each part as it was before (``wfload.PROTOTYPES``), alternated under the tracked load."""
    per = _edit_costs(exe, quick, W.PROTOTYPES)
    words = {"hash": "entries in the wf_cur hash instead of array slots",
             "ktime": "bpf_ktime_get_ns instead of the run queue's clock",
             "before": "both, as before (hash + bpf_ktime_get_ns)"}
    rows = []
    for fn in ("on_wf_switch", "on_wf_waking"):
        base = round(_med(per[("as_is", fn)]), 1)
        rows += [Row("waitfor slots and clock", f"{fn}, followed threads, {what} ({_span(per[(k, fn)])})",
                     round(_med(per[(k, fn)]), 1), "ns/run", "", f"as it is, alternated with it "
                     f"({_span(per[('as_is', fn)])})", base) for k, what in words.items()]
    return rows


def run(quick: bool = False) -> list[Row]:
    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as td:
        exe = W.build_gen(Path(td))
        progs = W.Programs.load(["waitfor", "empty", "empty_raw", "proto_raw", "sys_filter", "sys_filter_raw",
                                 "irq_raw", "irq_classic"])
        try:
            rows += untracked(exe, progs, quick)
            rows += hand_off(exe, progs, quick)
            rows += syscalls(exe, progs, quick)
            rows += irq_markers(exe, progs, quick)
        finally:
            progs.close()
        rows += tracked(exe, quick)
        rows += cost_centres(exe, quick)
        rows += prototypes(exe, quick)
    return rows


if __name__ == "__main__":
    for r in run("--quick" in sys.argv):
        base = f"  (baseline {r.baseline}: {r.baseline_value})" if r.baseline else ""
        ok = "" if r.ok is None else ("  ok" if r.ok else "  MISSED")
        print(f"{r.figure[:110]:110} {r.value:>10} {r.unit:12} {r.target:10}{base}{ok}")
