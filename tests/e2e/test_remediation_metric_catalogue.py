"""A ``metric`` trigger is refused on a ``triscope_`` name outside the catalogue: so every name a live
agent exposes or stores must be in it (or, for the process's own metrics rendered at scrape time and
never stored, in ``trigger_forms.EXPORTED_NOT_STORED``, which a trigger is refused on too)."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import free_port

from triscope.core.metrics import CATALOGUE
from triscope.remediation.trigger_forms import EXPORTED_NOT_STORED

SUFFIXES = ("_bucket", "_sum", "_count", "_created")


def _family(name: str) -> str:
    """A sample's metric: ``x_bucket`` of a catalogued histogram ``x`` is ``x``."""
    if name in CATALOGUE:
        return name
    for suf in SUFFIXES:
        if name.endswith(suf) and name[: -len(suf)] in CATALOGUE:
            return name[: -len(suf)]
    return name


@pytest.mark.slow
def test_every_name_a_live_agent_exposes_or_stores_is_catalogued(tmp_path: Path) -> None:
    db = tmp_path / "agent.db"
    port = free_port()
    agent = subprocess.Popen([sys.executable, "-m", "triscope", "agent", "--db", f"sqlite:///{db}", "--interval", "0.5",
                              "--duration", "8", "--node", "cat-node", "--listen", f"127.0.0.1:{port}",
                              "--spool", str(tmp_path / "spool"), "--no-nvml", "--no-npu"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                             env={**os.environ, "PYTHONUNBUFFERED": "1"})
    body = ""
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and agent.poll() is None:
            try:
                body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=1).read().decode()
                if any(ln.startswith("triscope_ticks_total ") and not ln.endswith(" 0.0") for ln in body.splitlines()):
                    time.sleep(1.5)       # a few ticks: counters that appear after the first
                    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=1).read().decode()
                    break
            except OSError:
                pass
            time.sleep(0.1)
        assert agent.wait(timeout=60) == 0, agent.stderr.read() if agent.stderr else ""
    finally:
        if agent.poll() is None:
            agent.kill()
    exposed = {ln.split("{")[0].split(" ")[0] for ln in body.splitlines() if ln.startswith("triscope_")}
    assert "triscope_ticks_total" in exposed and len(exposed) > 20, sorted(exposed)
    outside = {n for n in exposed if _family(n) not in CATALOGUE}
    assert outside == set(EXPORTED_NOT_STORED), sorted(outside)
    with sqlite3.connect(db) as con:
        stored = {r[0] for r in con.execute("select distinct metric from series") if r[0].startswith("triscope_")}
    assert stored and not {n for n in stored if n not in CATALOGUE}, sorted(stored - set(CATALOGUE))
    assert not stored & set(EXPORTED_NOT_STORED)
