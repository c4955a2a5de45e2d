"""Where the agent's CPU goes, from inside it, where py-spy cannot travel (the GPU machine's call).

    PYTHONPATH=examples/hostlab/selfprof:$PYTHONPATH TRISCOPE_SELFPROF=OUTDIR python3 -m triscope agent ...

Python imports this ``sitecustomize`` at start-up in every process it starts with that path; it does
nothing unless ``TRISCOPE_SELFPROF`` names a folder and the process is the triscope agent.  Then a
thread wakes every ``TRISCOPE_SELFPROF_PERIOD`` seconds (0.1), reads each of the process's threads'
CPU time (``/proc/self/task/TID/schedstat``) and charges what each used since the last wake to the
stack that thread is in now (``sys._current_frames``).  That is a sample of where the CPU went,
weighted by CPU, not by wall time: a thread asleep costs nothing however long it waits.  The lines
are py-spy's raw format with microseconds for counts (``thread (TID): NAME;frame;frame US``), written to
``OUTDIR/agent-profile-PID.txt`` every 30 s and at exit; ``examples.hostlab.profile_summary --us``
reads them.  The sampler's own CPU is its own line (``selfprof``), so it can be taken off.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time
from collections import Counter
from types import CodeType, FrameType


def _cpu_ns(tid: int) -> int:
    try:
        with open(f"/proc/self/task/{tid}/schedstat", "rb") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


_LABELS: dict[tuple[CodeType, int], str] = {}


def _frames(frame: FrameType | None) -> list[str]:
    out = []
    f = frame
    while f is not None:
        key = (f.f_code, f.f_lineno)
        label = _LABELS.get(key)
        if label is None:
            code = key[0]
            label = _LABELS[key] = f"{code.co_qualname} ({_short(code.co_filename)}:{key[1]})"
        out.append(label)
        f = f.f_back
    return out[::-1]


def _short(path: str) -> str:
    i = path.find("triscope/")
    return path[i:] if i >= 0 else os.path.basename(path)


class _Sampler:
    def __init__(self, outdir: str, period: float) -> None:
        self.path = os.path.join(outdir, f"agent-profile-{os.getpid()}.txt")
        self.period = period
        self.last: dict[int, int] = {}
        self.weights: Counter[str] = Counter()
        self.lock = threading.Lock()
        self.started = False

    def run(self) -> None:
        me = threading.get_native_id()
        flushed = time.monotonic()
        while True:
            time.sleep(self.period)
            names = {t.native_id: (t.name, t.ident) for t in threading.enumerate()}
            frames = sys._current_frames()
            try:
                tids = [int(t) for t in os.listdir("/proc/self/task")]
            except OSError:
                continue
            with self.lock:
                self.started = bool(self.last)
                for tid in tids:
                    ns = _cpu_ns(tid)
                    # a thread seen for the first time: all its CPU so far, unless this is the first
                    # sweep (the CPU before the sampler began is nobody's sample)
                    d = ns - self.last.get(tid, 0 if self.started else ns)
                    self.last[tid] = ns
                    if d <= 0:
                        continue
                    name, ident = names.get(tid, ("native", None))
                    if tid == me:
                        key = f"thread ({tid}): selfprof"
                    else:
                        fr = frames.get(ident) if ident is not None else None
                        stack = ";".join(_frames(fr)) if fr is not None else "(no Python frame)"
                        key = f"thread ({tid}): {name};{stack}"
                    self.weights[key] += d // 1000
            if time.monotonic() - flushed > 30:
                self.flush()
                flushed = time.monotonic()

    def flush(self) -> None:
        with self.lock:
            lines = [f"{k} {v}\n" for k, v in self.weights.most_common()]
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            f.writelines(lines)
        os.replace(tmp, self.path)


def _start() -> None:
    outdir = os.environ.get("TRISCOPE_SELFPROF")
    if not outdir:
        return

    def later() -> None:   # sys.argv and the main module are known once start-up is over
        time.sleep(1.0)
        if "triscope" not in sys.modules or "agent" not in sys.argv:
            return
        os.makedirs(outdir, exist_ok=True)
        s = _Sampler(outdir, float(os.environ.get("TRISCOPE_SELFPROF_PERIOD", "0.1")))
        atexit.register(s.flush)
        s.run()

    threading.Thread(target=later, name="selfprof", daemon=True).start()


_start()
