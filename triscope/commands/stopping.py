"""A bounded stop for the long-running commands (``remediate``, ``run``).

SIGTERM starts an orderly stop; a stop that has not ended within its bound (a job stuck in the
store, a thread that never returns) would otherwise hold the process until systemd or the kubelet
kills it, saying nothing.  :func:`bound_the_stop` arms a watchdog when the stop begins: past the
bound it writes why and every thread's stack to stderr (what the next look needs) and ends the
process with exit status 1; 5 s later ``faulthandler``'s own timer, a C thread that needs neither
the GIL nor Python's stderr buffer, dumps the stacks and exits with 1 if the watchdog could not.  A second SIGTERM or SIGINT during the stop ends it at once.
"""
from __future__ import annotations

import contextlib
import faulthandler
import os
import signal
import sys
import threading
import time

EXIT_STUCK = 1


def bound_the_stop(what: str, seconds: float) -> None:
    """Arm the watchdog for a stop that began now (call it once, when the stop starts)."""
    began = time.monotonic()

    def _watch() -> None:
        time.sleep(seconds)
        _give_up(what, f"did not stop within {seconds:g} s", began)

    threading.Thread(target=_watch, name="stop-watchdog", daemon=True).start()
    # the backstop, in C: a thread holding the GIL or stuck on a full stderr pipe cannot hold it up
    with contextlib.suppress(Exception):
        faulthandler.dump_traceback_later(seconds + 5.0, exit=True, file=sys.__stderr__ or sys.stderr)

    def _again(signum: int, frame: object) -> None:   # a second signal: the operator insists
        _give_up(what, f"stopped at once by a second {signal.Signals(signum).name}", began)

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _again)
        signal.signal(signal.SIGINT, _again)


def _give_up(what: str, why: str, began: float) -> None:
    err = sys.__stderr__ or sys.stderr
    try:
        err.write(f"{what}: {why} ({time.monotonic() - began:.1f} s after the stop began); "
                  "the threads still running:\n")
        err.flush()
        faulthandler.dump_traceback(file=err, all_threads=True)
        err.flush()
    finally:
        os._exit(EXIT_STUCK)
