"""The bounded stop: a stop that hangs ends with the stacks said, and a second signal ends it at once."""
from __future__ import annotations

import signal
import subprocess
import sys
import time

from conftest import REPO

STUCK = """
import signal, sys, threading, time
from triscope.commands.stopping import bound_the_stop

def wedged_in_the_store():
    threading.Event().wait()          # a job that never returns

done = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: done.set())
print("ready", flush=True)
done.wait()
bound_the_stop("stuck-service", float(sys.argv[1]))
t = threading.Thread(target=wedged_in_the_store)   # not a daemon: the interpreter would wait for it forever
t.start()
t.join()
"""


def _start(bound: float) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", STUCK, str(bound)], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def test_a_stop_that_hangs_ends_past_its_bound_with_every_threads_stack() -> None:
    proc = _start(1.0)
    began = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=20)
    took = time.monotonic() - began
    assert proc.returncode == 1
    assert 0.9 <= took < 15
    assert "stuck-service: did not stop within 1 s" in err
    assert "wedged_in_the_store" in err      # the stack that says where it hung


def test_a_second_signal_during_the_stop_ends_it_at_once() -> None:
    proc = _start(60.0)
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    began = time.monotonic()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 1 and time.monotonic() - began < 10
    assert "stuck-service: stopped at once by a second SIGINT" in err
