"""Where the agent's CPU went, from a py-spy raw profile (``PROFILE_AGENT=1`` in the host lab).

    python -m examples.hostlab.profile_summary examples/hostlab/traces/h200-lab-3.agent-profile.txt.gz --seconds 270.85

Samples whose innermost frame is a wait (a sleeping thread py-spy counted) are left out; each part
of the agent is the samples with its frame anywhere on the stack.  At py-spy's 1 kHz a sample is
1 ms, so ms/s is samples over the run's seconds.  ``--us``: the in-process sampler's profile
(examples/hostlab/selfprof, where py-spy cannot travel), weighted by microseconds of CPU.
"""

from __future__ import annotations

import argparse
import gzip
import sys
from collections import Counter

WAITS = ("wait (threading", "Condition.wait", "Event.wait", "Queue.get", "select (", "sleep")
PARTS = {
    "NVML per-process utilization (SM shares)": "nvmlDeviceGetProcessUtilization",
    "the store writer": "StoreWriter._run",
    "the NVML collector on the tick": "NvmlCollector.collect",
    "the mismatch tracker": "MismatchTracker.process",
    "per-workload TCP": "WorkloadTcp.read",
    "  of which whole-table sock_diag dumps": "tcp_counters (",
    "the PCIe link collector (sysfs)": "PcieLinkCollector.collect",
    "the NVML XID thread": "NvmlCollector._xid_loop",
    "the workloads collector on the tick": "WorkloadsCollector.collect",
    "process lists (NVML and the process tree)": "WorkloadsCollector._list_processes",
    "eBPF maps": "EbpfCollector.collect",
    "wait-for: the programs' records read": "WaitFor.",
    "wait-for: chains and shares": "WaitChain.",
    "wait-for: fd and socket indexes": "FdIndex.",
    "wait-for: per-workload waits": "WorkloadWaits.",
    "threads with no Python frame (native)": "(no Python frame)",
}


def summary(lines: list[str], seconds: float, us: bool = False, top: int = 0) -> list[str]:
    """``us``: counts are microseconds of CPU (the in-process sampler, examples/hostlab/selfprof),
    not 1 ms py-spy samples; its own line is left out and no stack is a wait (a waiting thread used
    no CPU); ``top``: a second table, the ``top`` triscope functions by inclusive time."""
    parts: Counter[str] = Counter()
    total = 0
    for line in lines:
        stack, _, n = line.rpartition(" ")
        frames = stack.split(";")
        if not stack or (not us and any(w in frames[-1] for w in WAITS)) or (us and frames[0].endswith(": selfprof")):
            continue
        total += int(n)
        for name, frame in PARTS.items():
            if any(frame in f for f in frames):
                parts[name] += int(n)
    per_ms = 1000 if us else 1
    funcs: Counter[str] = Counter()     # inclusive time per triscope function (each counted once a stack)
    for line in lines:
        stack, _, n = line.rpartition(" ")
        frames = stack.split(";")
        if not stack or (not us and any(w in frames[-1] for w in WAITS)) or (us and frames[0].endswith(": selfprof")):
            continue
        for name in {f.split(" (")[0] for f in frames[1:] if "triscope/" in f or "(no Python" in f}:
            funcs[name] += int(n)
    active = f"{total / per_ms:.0f} ms of CPU" if us else f"{total} samples"
    out = [f"active: {active}, {total / per_ms / seconds:.2f} ms/s", "| where | ms/s | share |", "|---|---|---|"]
    out += [f"| {name} | {v / per_ms / seconds:.2f} | {100 * v / max(total, 1):.0f} % |" for name, v in parts.most_common()]
    if top:
        out += ["", f"| function (inclusive, top {top}) | ms/s | share |", "|---|---|---|"]
        out += [f"| {name} | {v / per_ms / seconds:.2f} | {100 * v / max(total, 1):.0f} % |" for name, v in funcs.most_common(top)]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m examples.hostlab.profile_summary", description=__doc__.split("\n\n")[0])
    ap.add_argument("profile", help="py-spy --format raw output (.gz read as gzip)")
    ap.add_argument("--seconds", type=float, required=True, help="how long the agent ran while sampled")
    ap.add_argument("--us", action="store_true",
                    help="the profile is the in-process sampler's (counts are microseconds of CPU)")
    ap.add_argument("--top", type=int, default=0, metavar="N",
                    help="also the N triscope functions with the most CPU, inclusive of what they call")
    args = ap.parse_args(argv)
    opener = gzip.open if args.profile.endswith(".gz") else open
    with opener(args.profile, "rt") as f:
        print("\n".join(summary(f.read().splitlines(), args.seconds, args.us, args.top)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
