"""The host lab's stand-in service (examples/hostlab/service.py): its GPU's busy share follows the work
it is given, it names itself, and its loader workers are its own child processes (what the agent's
process set finds).  The lab's recordings are replayed by tests/unit/test_verdict_acceptance.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from conftest import REPO

from triscope.agent.workloads.processset import ProcessTree


def test_the_stand_in_service_does_the_work_it_is_given(tmp_path: Path) -> None:
    busy = tmp_path / "b.busy"
    p = subprocess.Popen([sys.executable, "-m", "examples.hostlab.service", "--name", "lab-t", "--busy-file", str(busy),
                          "--workers", "2", "--item-ms", "2", "--gpu-ms", "20", "--rate", "20"], cwd=REPO,
                         stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        time.sleep(2.5)
        share = float(busy.read_text())
        assert 0.2 <= share <= 0.6, share                  # 20 batches/s x 20 ms: ~0.4 of the GPU
        assert Path(f"/proc/{p.pid}/comm").read_text().strip() == "lab-t"
        tree = ProcessTree()
        tree.refresh()
        assert len(tree.descendants(p.pid)) >= 2           # its loader workers
    finally:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
