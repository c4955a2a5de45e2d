"""Fault injection against the real agent process: hostile scrape targets (trickle, hang, endless
body, garbage, redirect loop, escape sequences), a target that turns slow mid-run, slowloris
clients on /metrics, and SIGTERM while all of that goes on.

Targets (issue 16): 1 tick/s kept (±5 %) under every source fault; a normal scrape answered in
< 1 s while a slow client holds a connection; SIGTERM → exit within 5 s with every tick written.
The figures each test measured are printed (``pytest -s``) for docs/reliability.md.
"""

from __future__ import annotations

import os
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from conftest import free_port
from hostile import HostileTarget, Slowloris

from triscope.store import Store

pytestmark = [pytest.mark.slow]

TRISCOPE = [sys.executable, "-m", "triscope"]
HOSTILE = ("trickle", "trickle_head", "hang", "huge", "garbage", "redirect", "refuse_body")


@dataclass
class RunningAgent:
    proc: subprocess.Popen[str]
    db: str
    port: int
    node: str
    targets: dict[str, HostileTarget]
    started: float
    log: Path
    figures: dict[str, object] = field(default_factory=dict)

    def metrics(self, timeout: float = 5.0) -> str:
        return urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=timeout).read().decode()

    def gauge(self, name: str, collector: str) -> float | None:
        want = f'{name}{{collector="{collector}"}} '
        for line in self.metrics().splitlines():
            if line.startswith(want):
                return float(line.split()[-1])
        return None


def instance(t: HostileTarget) -> str:
    return f"scrape:127.0.0.1:{t.port}"


def wait_ticks(agent: RunningAgent, n: int, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if agent.proc.poll() is not None:
            raise AssertionError(f"agent exited early ({agent.proc.returncode}): {agent.log.read_text()}")
        try:
            for line in agent.metrics(timeout=1).splitlines():
                if line.startswith("triscope_ticks_total ") and float(line.split()[-1]) >= n:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"no {n} ticks: {agent.log.read_text()}")


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningAgent]:
    tmp = tmp_path_factory.mktemp("faults-agent")
    targets = {mode: HostileTarget(mode) for mode in HOSTILE}
    targets["healthy"] = HostileTarget("ok")
    targets["turns_slow"] = HostileTarget("ok")
    db = f"sqlite:///{tmp / 'faults.db'}"
    port = free_port()
    log = tmp / "agent.log"
    cmd = [*TRISCOPE, "agent", "--db", db, "--interval", "1", "--node", "faulty-node",
           "--listen", f"127.0.0.1:{port}", "--spool", str(tmp / "spool"), "--no-nvml", "--no-npu"]
    for t in targets.values():
        cmd += ["--scrape", t.url]
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, text=True, cwd=tmp,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
    handle = RunningAgent(proc, db, port, "faulty-node", targets, time.monotonic(), log)
    try:
        wait_ticks(handle, 2)
        yield handle
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        for t in targets.values():
            t.close()
        print("\nagent fault figures:", handle.figures)


def test_hostile_targets_are_down_and_the_healthy_one_fresh(agent: RunningAgent) -> None:
    wait_ticks(agent, 5)
    for mode in HOSTILE:
        assert agent.gauge("triscope_collector_up", instance(agent.targets[mode])) == 0.0, mode
    name = instance(agent.targets["healthy"])
    assert agent.gauge("triscope_collector_up", name) == 1.0
    staleness = agent.gauge("triscope_collector_staleness_seconds", name)
    assert staleness is not None and staleness < 0.5
    # every tick waited for the sources at most their budget (a quarter of the 1 s interval)
    durations = [float(line.split()[-1]) for line in agent.metrics().splitlines()
                 if line.startswith("triscope_tick_duration_seconds ")]
    assert durations and durations[0] < 0.6, durations


def test_a_slow_client_does_not_blind_metrics(agent: RunningAgent) -> None:
    """One slowloris connection (a byte every 2 s) and 300 idle ones: scrapes are still answered fast,
    and the slow one is cut at the request deadline."""
    slow = Slowloris("127.0.0.1", agent.port, gap=2.0)
    idle = []
    for _ in range(300):
        s = socket.create_connection(("127.0.0.1", agent.port), timeout=5)
        idle.append(s)
    try:
        times = []
        for _ in range(10):
            t0 = time.perf_counter()
            body = agent.metrics(timeout=5)
            times.append(time.perf_counter() - t0)
            assert "triscope_ticks_total" in body
            time.sleep(0.3)
        agent.figures["scrape_s_median_under_slowloris"] = round(statistics.median(times), 4)
        agent.figures["scrape_s_max_under_slowloris"] = round(max(times), 4)
        assert max(times) < 1.0, times
        slow.thread.join(15)
        assert slow.closed_by_server_after is not None, "the slow client was never cut off"
        agent.figures["slowloris_cut_after_s"] = round(slow.closed_by_server_after, 1)
        assert slow.closed_by_server_after < 9.0
        # a request head over the limit is refused, not buffered
        with socket.create_connection(("127.0.0.1", agent.port), timeout=5) as s:
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: " + b"b" * 20_000 + b"\r\n\r\n")
            assert s.recv(64).startswith(b"HTTP/1.1 431")
    finally:
        slow.close()
        for s in idle:
            s.close()


def test_a_target_that_turns_slow_is_marked_stale_then_recovers(agent: RunningAgent) -> None:
    t = agent.targets["turns_slow"]
    name = instance(t)
    assert agent.gauge("triscope_collector_up", name) == 1.0
    t.mode = "trickle"
    time.sleep(4.5)
    assert agent.gauge("triscope_collector_up", name) == 0.0
    stale = agent.gauge("triscope_collector_staleness_seconds", name)
    assert stale is not None and stale >= 2.5, stale
    agent.figures["turned_slow_staleness_after_4.5s"] = stale
    t.mode = "ok"
    time.sleep(3.5)   # the trickling read in progress ends at its 2 s deadline, then a fresh one lands
    assert agent.gauge("triscope_collector_up", name) == 1.0
    assert (agent.gauge("triscope_collector_staleness_seconds", name) or 0.0) < 0.5


def test_sigterm_ends_the_agent_within_5s_with_every_tick_written(agent: RunningAgent) -> None:
    wait_ticks(agent, 40)   # one tick skipped under load is 2.5 %, not the whole 5 % margin
    t0 = time.monotonic()
    agent.proc.send_signal(signal.SIGTERM)
    rc = agent.proc.wait(timeout=15)
    took = time.monotonic() - t0
    agent.figures["sigterm_exit_s"] = round(took, 2)
    text = agent.log.read_text()
    assert rc == 0, text
    assert took < 5.0, (took, text)
    assert "Traceback" not in text, text

    st = Store.open(agent.db)
    try:
        [ticks] = st.query("triscope_ticks_total", node=agent.node, start=0, end=time.time() + 10,
                           max_points=None, rate=False)
        n = int(max(ticks.values))
        assert sorted(ticks.values) == [float(i) for i in range(1, n + 1)], "every tick taken is stored, once"
        gaps = [b - a for a, b in zip(ticks.ts, ticks.ts[1:], strict=False)]
        rate = (len(ticks.ts) - 1) / (ticks.ts[-1] - ticks.ts[0])
        agent.figures.update(ticks=n, ticks_per_s=round(rate, 4), tick_gap_max_s=round(max(gaps), 3),
                             tick_gap_median_s=round(statistics.median(gaps), 4))
        assert 0.95 <= rate <= 1.05, (rate, [(round(t, 2), round(g, 3)) for t, g in zip(ticks.ts, gaps, strict=False) if abs(g - 1) > 0.05])
        # no tick is held up by the targets; on a loaded 2-core machine the scheduler may still skip
        # one (a 2 s gap, seen once in a full suite run): one at most
        assert max(gaps) < 2.5 and sum(g > 1.5 for g in gaps) <= 1, gaps
        # the healthy target's samples landed on (nearly) every tick, on the tick's own clock
        [req] = st.query("app_requests_total", node=agent.node, start=0, end=time.time() + 10,
                         max_points=None, rate=False, labels={"instance": f"127.0.0.1:{agent.targets['healthy'].port}"})
        assert len(req.ts) >= n - 2, (len(req.ts), n)
    finally:
        st.close()

    # each hostile target's failure was logged once, escaped: no raw escape sequence reached the log
    for mode in HOSTILE:
        lines = [ln for ln in text.splitlines() if f"collector {instance(agent.targets[mode])} is down" in ln]
        assert len(lines) == 1, (mode, lines)
    assert "\x1b" not in text and "\x07" not in text
    assert "\\x1b" in text   # the escape sequences are there, shown as text
    slow = instance(agent.targets["turns_slow"])
    assert sum(f"collector {slow} is down" in ln for ln in text.splitlines()) == 1
    assert sum(f"collector {slow} is back up" in ln for ln in text.splitlines()) == 1


def test_duration_is_honoured_with_a_trickling_target(tmp_path: Path) -> None:
    trickle = HostileTarget("trickle")
    try:
        t0 = time.monotonic()
        r = subprocess.run([*TRISCOPE, "agent", "--db", f"sqlite:///{tmp_path / 'd.db'}", "--interval", "1",
                            "--duration", "4", "--listen", "off", "--no-ebpf", "--no-nvml", "--no-npu",
                            "--spool", str(tmp_path / "spool"), "--scrape", trickle.url],
                           capture_output=True, text=True, timeout=60, cwd=tmp_path)
        took = time.monotonic() - t0
    finally:
        trickle.close()
    assert r.returncode == 0, r.stderr
    assert took < 4 + 10, took   # start-up (schema upgrade in a child) + 4 s of ticks + shutdown
    st = Store.open(f"sqlite:///{tmp_path / 'd.db'}")
    try:
        [ticks] = st.query("triscope_ticks_total", node=socket.gethostname(), start=0, end=time.time() + 10,
                           max_points=None, rate=False)
        assert 4 <= len(ticks.ts) <= 5, ticks.ts
    finally:
        st.close()


def test_a_deleted_sqlite_file_is_recreated_and_no_later_tick_is_lost(tmp_path: Path) -> None:
    db_file = tmp_path / "node.db"
    port = free_port()
    log = tmp_path / "agent.log"
    with log.open("w") as out:
        proc = subprocess.Popen([*TRISCOPE, "agent", "--db", f"sqlite:///{db_file}", "--interval", "0.5",
                                 "--write-every", "1", "--node", "del-node", "--listen", f"127.0.0.1:{port}",
                                 "--spool", str(tmp_path / "spool"), "--no-ebpf", "--no-nvml", "--no-npu"],
                                stdout=out, stderr=subprocess.STDOUT, text=True, cwd=tmp_path)
    handle = RunningAgent(proc, f"sqlite:///{db_file}", port, "del-node", {}, time.monotonic(), log)
    try:
        wait_ticks(handle, 6)
        ticks_at_delete = next(float(ln.split()[-1]) for ln in handle.metrics().splitlines()
                               if ln.startswith("triscope_ticks_total "))
        for suffix in ("", "-wal", "-shm"):
            Path(f"{db_file}{suffix}").unlink(missing_ok=True)
        wait_ticks(handle, int(ticks_at_delete) + 10)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    text = log.read_text()
    assert "Traceback" not in text, text
    noticed = [ln for ln in text.splitlines() if "was deleted under the running agent" in ln]
    assert len(noticed) == 1, text
    assert db_file.exists()
    st = Store.open(f"sqlite:///{db_file}")
    try:
        [ticks] = st.query("triscope_ticks_total", node="del-node", start=0, end=time.time() + 10,
                           max_points=None, rate=False)
    finally:
        st.close()
    values = sorted(ticks.values)
    # the new file holds every tick from the one in flight when the file went away to the last
    assert values == [float(i) for i in range(int(values[0]), int(values[-1]) + 1)], values
    assert values[0] <= ticks_at_delete + 1, (values[0], ticks_at_delete)
    assert values[-1] >= ticks_at_delete + 10


@pytest.mark.parametrize("case", ["directory", "no_parent", "not_sqlite", "bad_header_body"])
def test_a_db_path_that_cannot_work_is_a_startup_error(tmp_path: Path, case: str) -> None:
    if case == "directory":
        path, words = tmp_path / "adir", "is a directory"
        path.mkdir()
    elif case == "no_parent":
        path, words = tmp_path / "missing" / "x.db", "does not exist"
    elif case == "not_sqlite":
        path, words = tmp_path / "junk.db", "not a SQLite database"
        path.write_bytes(b"\x1b[2Jjunk" * 1000)
    else:
        path, words = tmp_path / "broken.db", "file is not a database"
        path.write_bytes(b"SQLite format 3\x00" + os.urandom(8000))
    r = subprocess.run([*TRISCOPE, "agent", "--db", f"sqlite:///{path}", "--duration", "2", "--listen", "off",
                        "--no-ebpf", "--no-nvml", "--no-npu", "--spool", str(tmp_path / "spool")],
                       capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert r.returncode != 0, r.stderr
    assert "Traceback" not in r.stderr
    errors = [ln for ln in r.stderr.splitlines() if "error" in ln.lower()]
    assert len(errors) == 1 and words in errors[0], r.stderr
    assert "sqlalche.me" not in r.stderr
