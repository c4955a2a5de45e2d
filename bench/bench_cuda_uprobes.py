"""CUDA driver uprobes: what one probed call costs the application.

A C loop (compiled with gcc here) ``dlopen``s the stand-in driver library
(``examples/hostlab/fakecuda.c``) and calls one entry point N times, timing the loop; run without
any probe attached (the named baseline, measured in the same run, before and after), then with
``CudaCalls`` attached and the loop's process tracked:

- the launch probe: one uprobe on ``cuLaunchKernel`` (entry only: a per-thread count);
- a sync entry point: uprobe + uretprobe on ``cuStreamSynchronize`` (an empty queue: the call
  itself costs tens of ns, the rest is the probe pair: what every sync/copy call pays);
- the launch probe for a process that is NOT tracked (the filter's miss: what other CUDA
  processes on the node pay while the probe is attached).

Each figure is the median over runs of the loop; the difference to the no-probe baseline is the
probe's cost per call.  At 10,000 launches/s, cost x 10,000 / 1 s is the share of a core the
launch probe takes from the launching thread: the launch probe is off by default unless that is
under 1 %.  ``uprobe_cost()`` also runs against another library (the real libcuda on a GPU host:
``examples/hostlab/cuda_probe_check.py``), calling entry points that return at once without a
context.
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common import Row

LOOP_C = r"""
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
typedef int (*launch_t)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void *,
                        void **, void **);
typedef int (*one_t)(void *);
static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}
/* loop LIB SYMBOL N REPS: prints "ready", waits for a line, then the ns per call of each rep */
int main(int argc, char **argv) {
    if (argc < 5) return 2;
    void *h = dlopen(argv[1], RTLD_NOW);
    if (!h) { fprintf(stderr, "%s\n", dlerror()); return 1; }
    void *f = dlsym(h, argv[2]);
    if (!f) { fprintf(stderr, "no %s\n", argv[2]); return 1; }
    long n = atol(argv[3]);
    int reps = atoi(argv[4]), launch = strncmp(argv[2], "cuLaunchKernel", 14) == 0;
    char line[64];
    printf("ready\n");
    fflush(stdout);
    if (!fgets(line, sizeof line, stdin)) return 1;
    for (int r = 0; r < reps; r++) {
        double t0 = now();
        if (launch)
            for (long i = 0; i < n; i++) ((launch_t)f)(0, 0, 1, 1, 1, 1, 1, 0, 0, 0, 0);
        else
            for (long i = 0; i < n; i++) ((one_t)f)(0);
        printf("%.2f\n", (now() - t0) / n);
        fflush(stdout);
    }
    return 0;
}
"""


@dataclass
class LoopRun:
    ns_per_call: float          # median over reps
    calls: int
    pid: int
    tid: int


def compile_loop(tmp: Path) -> Path:
    src = tmp / "cuda_loop.c"
    src.write_text(LOOP_C)
    exe = tmp / "cuda_loop"
    subprocess.run(["gcc", "-O2", "-o", str(exe), str(src), "-ldl"], check=True, capture_output=True, text=True)
    return exe


def run_loop(exe: Path, lib: str, sym: str, n: int, reps: int, track: Callable[[int], None] | None = None) -> LoopRun:
    """One process: ``reps`` timed loops of ``n`` calls; ``track(pid)`` is called before they start."""
    cmd = [str(exe), lib, sym, str(n), str(reps)]
    if shutil.which("taskset"):
        cmd = ["taskset", "-c", "0", *cmd]
    p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert p.stdin is not None and p.stdout is not None
    if p.stdout.readline().strip() != "ready":
        err = p.stderr.read() if p.stderr else ""
        p.wait()
        raise RuntimeError(f"loop did not start: {err.strip()}")
    if track is not None:
        track(p.pid)
    p.stdin.write("go\n")
    p.stdin.flush()
    vals = [float(p.stdout.readline()) for _ in range(reps)]
    p.wait(30)
    return LoopRun(statistics.median(vals), n * reps, p.pid, p.pid)


@dataclass
class Cost:
    base_ns: float              # no probe attached, best of the before/after medians
    launch_ns: float            # launch probe, tracked process: added per call
    pair_ns: float              # uprobe + uretprobe (sync entry point), tracked: added per call
    untracked_ns: float         # launch probe, process not tracked: added per call
    pair_base_ns: float
    launches_counted: int
    launches_made: int
    syncs_counted: int
    syncs_made: int

    @property
    def launch_core_pct_at_10k(self) -> float:
        return self.launch_ns * 10_000 / 1e9 * 100


def uprobe_cost(lib: str, *, n: int = 200_000, reps: int = 7, launch_sym: str = "cuLaunchKernel",
                sync_sym: str = "cuStreamSynchronize", tmp: Path | None = None, **cuda_kwargs: Any) -> Cost:
    """Per-call cost of the probes on ``lib`` (median of ``reps`` loops of ``n`` calls each)."""
    from triscope.agent.collectors.cudacalls import CudaCalls

    with tempfile.TemporaryDirectory() as td:
        exe = compile_loop(tmp or Path(td))
        base1 = run_loop(exe, lib, launch_sym, n, reps).ns_per_call
        pbase1 = run_loop(exe, lib, sync_sym, n, reps).ns_per_call
        cc = CudaCalls(launch_probe=True, libraries=[lib], search_host=False, **cuda_kwargs)
        try:
            if not any(ok for name, ok, _r, _h in cc.status() if name == "cuda_launch"):
                raise RuntimeError(f"probes did not attach: {cc.status()}")
            untracked = run_loop(exe, lib, launch_sym, n, reps).ns_per_call
            tracked: list[int] = []

            def track(pid: int) -> None:
                tracked[:] = [pid]
                cc.track(tracked)

            cc.read()
            launched = run_loop(exe, lib, launch_sym, n, reps, track)
            got = cc.read().get(launched.tid)
            paired = run_loop(exe, lib, sync_sym, n, reps, track)
            got_sync = cc.read().get(paired.tid)
        finally:
            cc.close()
        base2 = run_loop(exe, lib, launch_sym, n, reps).ns_per_call
        pbase2 = run_loop(exe, lib, sync_sym, n, reps).ns_per_call
    base, pbase = min(base1, base2), min(pbase1, pbase2)
    return Cost(base, launched.ns_per_call - base, paired.ns_per_call - pbase, untracked - base, pbase,
                (got.launches or 0) if got else 0, launched.calls, got_sync.sync_calls if got_sync else 0, paired.calls)


# builds of the stand-in whose entry points start with a known instruction (checked by
# first_instruction(): the kernel emulates some, single-steps the others out of line)
BUILDS = {
    "push": ("-O0", "-fcf-protection=none"),          # every function: push %rbp (emulated)
    "default": ("-O2",),                              # cuLaunchKernel: sub $0x8,%rsp (single-stepped)
    "endbr64": ("-O2", "-fcf-protection=full"),       # endbr64, then push (sync) / sub (launch)
}


def first_instruction(lib: str, sym: str) -> str:
    """The symbol's first instruction (objdump), or '?'."""
    if not shutil.which("objdump"):
        return "?"
    out = subprocess.run(["objdump", "-d", "--no-show-raw-insn", lib], capture_output=True, text=True).stdout
    lines = out.split(f"<{sym}>:\n", 1)
    if len(lines) < 2:
        return "?"
    first = lines[1].splitlines()[0].split("\t", 1)
    return " ".join(first[-1].split()) if first else "?"


def _check(c: Cost, what: str) -> None:
    if c.launches_counted != c.launches_made or c.syncs_counted != c.syncs_made:
        raise RuntimeError(f"{what}: the probes missed calls: launches {c.launches_counted}/{c.launches_made}, "
                           f"syncs {c.syncs_counted}/{c.syncs_made}")


def run(quick: bool = False) -> list[Row]:
    from examples.hostlab.fakecuda import build

    n, reps = (20_000, 5) if quick else (50_000, 9)
    costs: dict[str, Cost] = {}
    insn: dict[str, tuple[str, str]] = {}
    with tempfile.TemporaryDirectory() as td:
        for name, flags in BUILDS.items():
            lib = str(build(Path(td, name), flags))
            insn[name] = (first_instruction(lib, "cuLaunchKernel"), first_instruction(lib, "cuStreamSynchronize"))
            costs[name] = uprobe_cost(lib, n=n, reps=reps)
            _check(costs[name], name)
        lib = str(build(Path(td, "endbr64"), BUILDS["endbr64"]))
        at_symbol = uprobe_cost(lib, n=n, reps=reps, skip_endbr64=False)
        _check(at_symbol, "endbr64 at the symbol")
    b = "no probe attached (same loop, same run)"
    best = costs["push"]
    pct = best.launch_core_pct_at_10k
    step = costs["default"]
    return [
        Row("cuda uprobes", f"launch probe (one uprobe), tracked, probed instruction emulated ({insn['push'][0]}): "
            "added per launch", round(best.launch_ns), "ns", "<= 1000", b, round(best.base_ns, 1), best.launch_ns <= 1000),
        Row("cuda uprobes", "launch probe at 10,000 launches/s, emulated case (on by default only if < 1 %)",
            round(pct, 2), "% of a core", "< 1", b, 0.0, pct < 1),
        Row("cuda uprobes", f"launch probe, probed instruction single-stepped ({insn['default'][0]}): added per launch",
            round(step.launch_ns), "ns", "", b, round(step.base_ns, 1)),
        Row("cuda uprobes", "launch probe at 10,000 launches/s, single-stepped case",
            round(step.launch_core_pct_at_10k, 2), "% of a core", "", b, 0.0),
        Row("cuda uprobes", f"sync/copy probe pair (uprobe + uretprobe), tracked, {insn['default'][1]}: added per call",
            round(step.pair_ns), "ns", "", b, round(step.pair_base_ns, 1)),
        Row("cuda uprobes", f"probe pair, function starting with {insn['endbr64'][1]}, probed just past it",
            round(costs["endbr64"].pair_ns), "ns", "", "probed at the symbol (endbr64 single-stepped)",
            round(at_symbol.pair_ns)),
        Row("cuda uprobes", "launch probe, process NOT tracked (the filter's miss), emulated case: added per launch",
            round(best.untracked_ns), "ns", "", b, round(best.base_ns, 1)),
    ]


if __name__ == "__main__":
    for r in run("--quick" in sys.argv):
        print(f"{r.figure:80} {r.value:>10} {r.unit:12} {r.target:8} (baseline {r.baseline}: {r.baseline_value})"
              + ("" if r.ok is None else ("  ok" if r.ok else "  MISSED")))
