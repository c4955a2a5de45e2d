"""A CPU-hungry pod with no GPU: as many busy processes as asked (default: one per core).

    python -m examples.hostlab.burner --name lab-hog --procs 16

A batch job, a compactor, a misbehaving log shipper: ``--procs`` processes (this one and its forked
children, all named ``--name``) each computing in a loop that never sleeps.  Prints ``ready`` once all
run; the whole process group is killed to stop it.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys

from .backend import set_comm


def spin() -> None:
    buf = b"x" * 4096
    while True:
        hashlib.sha256(buf).digest()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--name", required=True)
    ap.add_argument("--procs", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args(argv)
    set_comm(args.name)
    for _ in range(args.procs - 1):
        if os.fork() == 0:
            spin()
    print("ready", flush=True)
    sys.stdout.close()
    spin()
    return 0


if __name__ == "__main__":
    sys.exit(main())
