#!/usr/bin/env python3
"""Count the kernel's DMA mapping tracepoints once a second (BCC), as JSON lines on stdout.

A stand-alone check that BCC and the ``dma`` tracepoints work on a GPU host, independent of the
agent: ``dma_probe.py --seconds 60 > dma.jsonl``.  Each line: ``{"ts", "counts": {tp: n},
"bytes": {tp: b}}`` with the per-second increase (bytes for ``dma_map_phys``/``dma_unmap_phys``,
scatter-gather entries for ``dma_map_sg``/``dma_unmap_sg``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

TPS = ["dma_map_phys", "dma_unmap_phys", "dma_map_sg", "dma_unmap_sg", "dma_map_page", "dma_unmap_page"]

PROG_HEAD = r"""
#include <linux/dma-direction.h>
BPF_ARRAY(cnt, u64, 16);
BPF_ARRAY(byt, u64, 16);
static __always_inline void bump(int i, u64 b) {
    u64 *c = cnt.lookup(&i); if (c) __sync_fetch_and_add(c, 1);
    u64 *s = byt.lookup(&i); if (s) __sync_fetch_and_add(s, b);
}
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--tracefs", default="/sys/kernel/tracing")
    args = ap.parse_args()
    from bcc import BPF  # Debian python3-bpfcc

    present = [tp for tp in TPS if os.path.isdir(f"{args.tracefs}/events/dma/{tp}")]
    prog = PROG_HEAD
    for i, tp in enumerate(present):
        size = ("args->full_ents" if "unmap" not in tp else "0") if tp.endswith("_sg") else "args->size"
        prog += f"TRACEPOINT_PROBE(dma, {tp}) {{ bump({i}, {size}); return 0; }}\n"
    try:
        b = BPF(text=prog)
    except Exception:  # noqa: BLE001 - BCC reports a failed compile as a bare Exception
        # field names differ between kernels: fall back to counting only
        prog = PROG_HEAD + "".join(f"TRACEPOINT_PROBE(dma, {tp}) {{ bump({i}, 0); return 0; }}\n"
                                   for i, tp in enumerate(present))
        b = BPF(text=prog)
    print(json.dumps({"attached": present}), flush=True)
    prev = [0] * len(present), [0] * len(present)
    end = time.monotonic() + args.seconds
    while time.monotonic() < end:
        time.sleep(1.0)
        c = [b["cnt"][i].value for i in range(len(present))]
        s = [b["byt"][i].value for i in range(len(present))]
        rec = {"ts": time.time(),
               "counts": {tp: c[i] - prev[0][i] for i, tp in enumerate(present)},
               "bytes": {tp: s[i] - prev[1][i] for i, tp in enumerate(present)}}
        prev = c, s
        print(json.dumps(rec), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
