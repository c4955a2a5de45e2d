"""End to end: ``triscope agent`` as a real process, a real loopback TCP workload that retransmits,
an application endpoint it scrapes, and ``triscope query`` finding all of it in the store."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import free_port
from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server

from triscope.web.loopback import syn_retransmits

TRISCOPE = [sys.executable, "-m", "triscope"]
NODE = "e2e-node"


def triscope(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*TRISCOPE, *args], capture_output=True, text=True, timeout=60, check=check)


def query(db: str, metric: str, *extra: str) -> list[dict]:
    out = triscope("query", "--db", db, "--node", NODE, "--metric", metric, "--since", "600", "--json", *extra)
    return [json.loads(line) for line in out.stdout.splitlines() if line.strip()]


def wait_first_tick(port: int, proc: subprocess.Popen[str], timeout: float = 90.0) -> None:
    """Collectors (and the eBPF compile) are set up before /metrics listens; wait for one tick."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"agent exited early ({proc.returncode}): {proc.stderr.read() if proc.stderr else ''}")
        try:
            body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=1).read().decode()
            if any(line.startswith("triscope_ticks_total") and not line.endswith(" 0.0")
                   for line in body.splitlines()):
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise AssertionError("the agent's /metrics never showed a tick")


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["default", "procfs"])
def test_agent_stores_real_retransmits_and_scraped_slis(tmp_path: Path, mode: str) -> None:
    db = f"sqlite:///{tmp_path / 'tmp.db'}"
    # an application endpoint (an inference server's request counter and latency histogram)
    reg = CollectorRegistry()
    requests = Counter("app_requests", "requests", ["code"], registry=reg)
    latency = Histogram("app_latency_seconds", "latency", registry=reg, buckets=(0.1, 1.0))
    app_port = free_port()
    app_server, _ = start_http_server(app_port, addr="127.0.0.1", registry=reg)
    listen = free_port()
    cmd = [*TRISCOPE, "agent", "--db", db, "--interval", "0.5", "--duration", "6", "--node", NODE,
           "--listen", f"127.0.0.1:{listen}", "--spool", str(tmp_path / "spool"), "--no-nvml", "--no-npu",
           "--scrape", f"http://127.0.0.1:{app_port}/metrics"]
    if mode == "procfs":
        cmd.append("--no-ebpf")  # the /proc/net/snmp fallback owns triscope_tcp_retransmits_total
    agent = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                             env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        wait_first_tick(listen, agent)
        with syn_retransmits(8):
            for i in range(12):
                requests.labels("200").inc()
                latency.observe(0.05 * i)
                time.sleep(0.25)
            rc = agent.wait(timeout=60)
    finally:
        if agent.poll() is None:
            agent.kill()
        app_server.shutdown()
        app_server.server_close()
    err = agent.stderr.read() if agent.stderr else ""
    assert rc == 0, err
    assert "Traceback" not in err, err

    points = query(db, "triscope_tcp_retransmits_total")
    assert len(points) >= 8, points  # ~12 ticks at 0.5 s
    assert all(p["node"] == NODE and p["metric"] == "triscope_tcp_retransmits_total" for p in points)
    assert [p["ts"] for p in points] == sorted(p["ts"] for p in points)
    delta = points[-1]["value"] - points[0]["value"]
    # 8 connects to a never-accepting listener: the dropped SYNs are retransmitted after 1 s
    assert delta >= 7, (mode, delta, points)
    rates = query(db, "triscope_tcp_retransmits_total", "--rate")
    assert max(p["value"] for p in rates) > 0

    # the procfs collectors ran in the same ticks
    assert query(db, "triscope_tcp_segments_out_total")[-1]["value"] > 0
    assert 0 <= query(db, "triscope_cpu_busy_ratio")[-1]["value"] <= 1
    up = {p["labels"]["collector"]: p["value"] for p in query(db, "triscope_collector_up")}
    assert up["tcp"] == 1 and up["cpu"] == 1 and up["pressure"] == 1 and up["aer"] == 0

    # the scraped SLIs are stored under the node with job/instance labels
    req = query(db, "app_requests_total")
    assert req and req[-1]["labels"]["code"] == "200" and req[-1]["labels"]["instance"] == f"127.0.0.1:{app_port}"
    assert req[-1]["value"] - req[0]["value"] >= 8
    buckets = {p["labels"]["le"] for p in query(db, "app_latency_seconds_bucket")}
    assert buckets == {"0.1", "1.0", "+Inf"}


def test_query_contract_errors(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'empty.db'}"
    triscope("db", "upgrade", "--db", db)
    r = triscope("query", "--db", db, "--metric", "no_such_metric_total", "--json", check=False)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "no_such_metric_total" in r.stderr
    r = triscope("agent", "--db", db, "--duration", "1", "--scrape", "localhost:8000", check=False)
    assert r.returncode != 0 and "Traceback" not in r.stderr and "--scrape" in r.stderr
