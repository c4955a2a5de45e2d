"""Where the agent's CPU went, from a py-spy raw profile (``PROFILE_AGENT=1`` in the host lab).

    python -m examples.hostlab.profile_summary examples/hostlab/traces/h200-lab-3.agent-profile.txt.gz --seconds 270.85

Samples whose innermost frame is a wait (a sleeping thread py-spy counted) are left out; each part
of the agent is the samples with its frame anywhere on the stack.  At py-spy's 1 kHz a sample is
1 ms, so ms/s is samples over the run's seconds.
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
}


def summary(lines: list[str], seconds: float) -> list[str]:
    parts: Counter[str] = Counter()
    total = 0
    for line in lines:
        stack, _, n = line.rpartition(" ")
        frames = stack.split(";")
        if not stack or any(w in frames[-1] for w in WAITS):
            continue
        total += int(n)
        for name, frame in PARTS.items():
            if any(frame in f for f in frames):
                parts[name] += int(n)
    out = [f"active: {total} samples, {total / seconds:.2f} ms/s", "| where | ms/s | share |", "|---|---|---|"]
    out += [f"| {name} | {v / seconds:.2f} | {100 * v / max(total, 1):.0f} % |" for name, v in parts.most_common()]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m examples.hostlab.profile_summary", description=__doc__.split("\n\n")[0])
    ap.add_argument("profile", help="py-spy --format raw output (.gz read as gzip)")
    ap.add_argument("--seconds", type=float, required=True, help="how long the agent ran while sampled")
    args = ap.parse_args(argv)
    opener = gzip.open if args.profile.endswith(".gz") else open
    with opener(args.profile, "rt") as f:
        print("\n".join(summary(f.read().splitlines(), args.seconds)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
