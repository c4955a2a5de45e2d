"""The command line: help everywhere, one clear line for bad input, query output shapes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from triscope.cli import build_parser
from triscope.core.samples import Sample, Tick
from triscope.store import Store
from triscope.store.db import upgrade


def triscope(*args: str, cwd: Path | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "triscope", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=timeout)


def _subcommands() -> list[str]:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    return sorted(sub.choices)  # type: ignore[union-attr]


def test_every_subcommand_has_help() -> None:
    names = _subcommands()
    for required in ("run", "agent", "db", "query", "doctor"):
        assert required in names
    for name in names:
        res = triscope(name, "--help")
        assert res.returncode == 0, (name, res.stderr)
        assert "usage: triscope " + name in res.stdout
        assert len(res.stdout.splitlines()) > 3


@pytest.fixture
def seeded(sqlite_url: str) -> str:
    upgrade(sqlite_url)
    st = Store.open(sqlite_url)
    import time

    now = time.time()
    st.write_ticks("n1", [Tick(now - 10 + i, [Sample("triscope_tcp_retransmits_total", float(i * 3), {}, "counter"),
                                               Sample("triscope_tcp_sockets", 5.0, {"state": "time_wait"})])
                          for i in range(10)])
    return sqlite_url


def test_query_json_points(seeded: str) -> None:
    res = triscope("query", "--db", seeded, "--metric", "triscope_tcp_retransmits_total", "--node", "n1", "--json")
    assert res.returncode == 0, res.stderr
    points = [json.loads(line) for line in res.stdout.splitlines()]
    assert len(points) == 10
    assert set(points[0]) >= {"ts", "value", "labels"}
    assert [p["value"] for p in points] == [float(i * 3) for i in range(10)]
    rate = triscope("query", "--db", seeded, "--metric", "triscope_tcp_retransmits_total", "--rate", "--json")
    assert {json.loads(line)["value"] for line in rate.stdout.splitlines()} == {3.0}


def test_query_table_is_readable(seeded: str) -> None:
    res = triscope("query", "--db", seeded, "--metric", "triscope_tcp_sockets", "--label", "state=time_wait")
    assert res.returncode == 0
    assert res.stdout.startswith("# triscope_tcp_sockets{state='time_wait'} node=n1 points=10")


@pytest.mark.parametrize("args, message", [
    (["query", "--metric", "no_such_metric"], "unknown metric 'no_such_metric'"),
    (["query", "--metric", "triscope_tcp_sockets", "--node", "ghost"], "unknown node 'ghost'"),
    (["query", "--metric", "triscope_tcp_sockets", "--start", "yesterday-ish"], "cannot read time"),
])
def test_bad_query_input_is_one_line(seeded: str, args: list[str], message: str) -> None:
    res = triscope(*args, "--db", seeded)
    assert res.returncode == 2
    assert message in res.stderr
    assert "Traceback" not in res.stderr and len(res.stderr.strip().splitlines()) == 1


def test_unreachable_database_is_one_line(unused_port: int) -> None:
    res = triscope("query", "--db", f"postgresql://nobody@127.0.0.1:{unused_port}/x", "--metric", "m")
    assert res.returncode == 2
    assert "unreachable" in res.stderr and "Traceback" not in res.stderr


def test_malformed_urls_are_one_line(tmp_path: Path) -> None:
    res = triscope("db", "upgrade", "--db", "mysql://x/y")
    assert res.returncode == 2 and "only sqlite and postgresql" in res.stderr
    res = triscope("agent", "--db", f"sqlite:///{tmp_path}/a.db", "--scrape", "ftp://host/metrics", "--duration", "1")
    assert res.returncode == 2 and "--scrape 'ftp://host/metrics'" in res.stderr and "Traceback" not in res.stderr
    res = triscope("agent", "--db", f"sqlite:///{tmp_path}/a.db", "--listen", "localhost:http", "--duration", "1")
    assert res.returncode == 2 and "not HOST:PORT" in res.stderr
    for bad in ("-5", "0", "nan"):
        res = triscope("agent", "--db", f"sqlite:///{tmp_path}/a.db", "--spool-max-mb", bad, "--duration", "1")
        assert res.returncode == 2 and "--spool-max-mb must be a size of at least 1 MB" in res.stderr, res.stderr


def test_schema_missing_says_what_to_run(tmp_path: Path) -> None:
    res = triscope("query", "--db", f"sqlite:///{tmp_path}/empty.db", "--metric", "m")
    assert res.returncode == 2 and "triscope db upgrade" in res.stderr


def test_doctor_lists_every_collector() -> None:
    res = triscope("doctor", "--json")
    assert res.returncode == 0, res.stderr
    rows = json.loads(res.stdout)
    names = {r["name"] for r in rows}
    assert {"tcp", "cpu", "pressure"} <= names
    assert all(r["ok"] or r["reason"] for r in rows)  # every 'off' says why
    text = triscope("doctor").stdout
    assert "ok" in text


def test_output_into_a_closed_pipe_is_quiet(sqlite_url: str) -> None:
    """`triscope query ... | head -1` must not end in a traceback."""
    import time

    upgrade(sqlite_url)
    st = Store.open(sqlite_url)
    now = time.time()
    st.write_ticks("n1", [Tick(now - 5000 + i, [Sample("triscope_tcp_sockets", 1.0, {"state": "x"})])
                          for i in range(5000)])  # far more output than a pipe buffer holds
    proc = subprocess.Popen([sys.executable, "-m", "triscope", "query", "--db", sqlite_url, "--metric",
                             "triscope_tcp_sockets", "--since", "6000", "--json"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, bufsize=0)
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.read(10)
    proc.stdout.close()  # the reader goes away after the first bytes
    err = proc.stderr.read().decode()
    proc.wait(30)
    assert "Traceback" not in err and "BrokenPipe" not in err, err


def test_sigint_stops_the_agent_even_when_inherited_ignored(tmp_path: Path) -> None:
    """A shell that starts a job in the background leaves SIGINT ignored; the agent sets its own."""
    import signal
    import subprocess
    import sys
    import time

    p = subprocess.Popen([sys.executable, "-m", "triscope", "agent", "--db", f"sqlite:///{tmp_path}/a.db", "--listen",
                          "off", "--no-ebpf", "--no-nvml", "--no-npu", "--spool", str(tmp_path / "spool"),
                          "--duration", "60"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        time.sleep(4)
        p.send_signal(signal.SIGINT)
        out, _ = p.communicate(timeout=20)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0, out
