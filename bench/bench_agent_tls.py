"""The agent's /metrics with TLS and basic auth on (``--web.config.file``, as the shipped DaemonSet
runs it) against the same agent in plain HTTP, both started together and scraped once a second over
kept-alive connections, as Prometheus scrapes: CPU and resident memory of each over one window, and
the time of one scrape.  The password is a real cost-10 bcrypt hash; the cache of verified
credentials is what keeps it out of every scrape (the first scrape pays it).

Both agents run ``--no-ebpf --no-nvml --no-npu`` so the comparison is /metrics and the process,
not probe loading.  ``python -m bench --only agent_tls --results /tmp/x.md``.

Then a third agent, just started (nothing cached), under a password spray from 64 source addresses
(``tests/spray.py``: 160 new TLS connections a second, each with a new wrong password): the first
scrape with the right password, 26 scrapes on fresh connections 0.3 s apart, and the agent's CPU
over them (issue 43, item 5).
"""

from __future__ import annotations

import base64
import http.client
import os
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.bench_ebpf import CLK_TCK, ROOT, _cpu_ticks, _rss_mb
from bench.common import Row, free_port, wait_port

PASSWORD = "bench-scrape-password"


def _certs(folder: Path) -> None:
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                    "-days", "1", "-subj", "/CN=bench", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(folder / "tls.key"), "-out", str(folder / "tls.crt")], check=True, capture_output=True)


def _conn(port: int, ctx: ssl.SSLContext | None) -> http.client.HTTPConnection:
    if ctx is None:
        return http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    return http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=5)


def _scrape(conn: http.client.HTTPConnection, headers: dict[str, str]) -> tuple[int, float]:
    t0 = time.perf_counter()
    conn.request("GET", "/metrics", headers=headers)
    r = conn.getresponse()
    r.read()
    return r.status, time.perf_counter() - t0


def run(quick: bool = False) -> list[Row]:
    import bcrypt

    window, warmup = (15.0, 5.0) if quick else (60.0, 5.0)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with tempfile.TemporaryDirectory() as td:
        tmp = Path(td)
        _certs(tmp)
        hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(10)).decode()
        (tmp / "web.yml").write_text(f"tls_server_config:\n  cert_file: tls.crt\n  key_file: tls.key\n"
                                     f"basic_auth_users:\n  prometheus: '{hashed}'\n")
        ctx = ssl.create_default_context(cafile=str(tmp / "tls.crt"))
        auth = {"Authorization": "Basic " + base64.b64encode(f"prometheus:{PASSWORD}".encode()).decode()}
        ports = {"plain": free_port(), "tls": free_port()}
        procs = {}
        for name, port in ports.items():
            web = ["--web.config.file", str(tmp / "web.yml")] if name == "tls" else []
            subprocess.run([sys.executable, "-m", "triscope", "db", "upgrade", "--db", f"sqlite:///{td}/{name}.db"],
                           check=True, capture_output=True, env=env, cwd=td)
            procs[name] = subprocess.Popen(
                [sys.executable, "-m", "triscope", "agent", "--db", f"sqlite:///{td}/{name}.db", "--no-migrate",
                 "--interval", "1", "--spool", f"{td}/spool-{name}", "--listen", f"127.0.0.1:{port}",
                 "--no-ebpf", "--no-nvml", "--no-npu", "--duration", str(int(window + warmup + 60)), *web],
                stdout=subprocess.DEVNULL, stderr=open(f"{td}/{name}.log", "w"), cwd=td, env=env)  # noqa: SIM115
        try:
            for name, port in ports.items():
                if not wait_port(port, 60):
                    return [Row("agent /metrics TLS", f"{name} agent did not listen: "
                                f"{Path(td, name + '.log').read_text()[-300:]}", float("nan"), "", ok=False)]
            conns = {"plain": _conn(ports["plain"], None), "tls": _conn(ports["tls"], ctx)}
            heads = {"plain": {}, "tls": auth}
            first = _scrape(conns["tls"], auth)   # the one bcrypt
            assert first[0] == 200, first
            end = time.monotonic() + warmup
            while time.monotonic() < end:
                for n in conns:
                    _scrape(conns[n], heads[n])
                time.sleep(1)
            cpu0 = {n: _cpu_ticks(p.pid) for n, p in procs.items()}
            rss: dict[str, list[float]] = {n: [] for n in procs}
            took: dict[str, list[float]] = {n: [] for n in procs}
            t0 = time.monotonic()
            while time.monotonic() - t0 < window:
                for n in conns:
                    status, dt = _scrape(conns[n], heads[n])
                    assert status == 200, (n, status)
                    took[n].append(dt * 1000)
                    rss[n].append(_rss_mb(procs[n].pid))
                time.sleep(max(0.0, 1.0 - (time.monotonic() - t0) % 1.0))
            elapsed = time.monotonic() - t0
            cpu = {n: (_cpu_ticks(p.pid) - cpu0[n]) / CLK_TCK / elapsed * 100 for n, p in procs.items()}
            # a wrong password answered 401 (and a new one costs one bcrypt, off the event loop)
            bad = {"Authorization": "Basic " + base64.b64encode(b"prometheus:wrong").decode()}
            status_bad, bad_s = _scrape(conns["tls"], bad)
        finally:
            for p in procs.values():
                p.terminate()
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
        spray_rows = _spray(tmp, env, ctx, auth, quick)
    label = f"{int(window)} s, 1 s interval, --no-ebpf, scraped 1/s kept alive"
    base = "same agent, plain HTTP, same run"
    return [
        Row("agent /metrics TLS", f"agent CPU, TLS + basic auth (bcrypt cost 10, cached) ({label})",
            round(cpu["tls"], 2), "% of a core", "<= 0.5", base, round(cpu["plain"], 2), cpu["tls"] <= 0.5),
        Row("agent /metrics TLS", "agent steady RSS, TLS + basic auth (max)", round(max(rss["tls"]), 1), "MB",
            "<= 60", base, round(max(rss["plain"]), 1), max(rss["tls"]) <= 60),
        Row("agent /metrics TLS", "one scrape, client side (median)", round(statistics.median(took["tls"]), 2), "ms",
            "<= 5", base, round(statistics.median(took["plain"]), 2), statistics.median(took["tls"]) <= 5),
        Row("agent /metrics TLS", "first scrape with the password (one bcrypt, cost 10)", round(first[1] * 1000, 1),
            "ms", "", "", None, None),
        Row("agent /metrics TLS", f"a wrong password: {status_bad} (one bcrypt)", round(bad_s * 1000, 1), "ms",
            "401", "", None, status_bad == 401),
        *spray_rows,
    ]


def _spray(tmp: Path, env: dict[str, str], ctx: ssl.SSLContext, auth: dict[str, str], quick: bool) -> list[Row]:
    """A fresh TLS agent (the password not cached) under a spray from 64 addresses."""
    import json
    import signal

    port = free_port()
    subprocess.run([sys.executable, "-m", "triscope", "db", "upgrade", "--db", f"sqlite:///{tmp}/spray.db"],
                   check=True, capture_output=True, env=env, cwd=tmp)
    agent = subprocess.Popen(
        [sys.executable, "-m", "triscope", "agent", "--db", f"sqlite:///{tmp}/spray.db", "--no-migrate",
         "--interval", "1", "--spool", f"{tmp}/spool-spray", "--listen", f"127.0.0.1:{port}", "--no-ebpf",
         "--no-nvml", "--no-npu", "--duration", "120", "--web.config.file", str(tmp / "web.yml")],
        stdout=subprocess.DEVNULL, stderr=open(tmp / "spray-agent.log", "w"), cwd=tmp, env=env)  # noqa: SIM115
    spray = None
    try:
        if not wait_port(port, 60):
            return [Row("agent /metrics spray", "agent did not listen", float("nan"), "", ok=False)]
        spray = subprocess.Popen([sys.executable, str(ROOT / "tests" / "spray.py"), "spray", "--port", str(port),
                                  "--ca", str(tmp / "tls.crt"), "--rate", "160", "--sources", "64",
                                  "--seconds", "100", "--out", str(tmp / "spray.json")], cwd=tmp, env=env)
        time.sleep(2.0)
        cpu0, t0 = _cpu_ticks(agent.pid), time.monotonic()
        got = []
        for _ in range(12 if quick else 26):
            t1 = time.monotonic()
            conn = _conn(port, ctx)
            try:
                got.append(_scrape(conn, auth))
            except (OSError, ssl.SSLError) as e:
                got.append((type(e).__name__, time.perf_counter() - t1))   # type: ignore[arg-type]
            finally:
                conn.close()
            time.sleep(max(0.0, 0.3 - (time.monotonic() - t1)))
        cpu = (_cpu_ticks(agent.pid) - cpu0) / CLK_TCK / (time.monotonic() - t0) * 100
        spray.send_signal(signal.SIGTERM)
        spray.wait(30)
        sprayed = json.loads((tmp / "spray.json").read_text())
    finally:
        if spray is not None and spray.poll() is None:
            spray.kill()
        agent.terminate()
        try:
            agent.wait(10)
        except subprocess.TimeoutExpired:
            agent.kill()
    first_status, first_s = got[0]
    ok = sum(1 for s, _ in got if s == 200)
    label = "spray from 64 addresses, 160 new TLS connections/s each with a new wrong password, bcrypt cost 10"
    return [
        Row("agent /metrics spray", f"first scrape with the right password, nothing cached ({label}): {first_status}",
            round(first_s * 1000, 1), "ms", "<= 1000 and 200", "", None, first_status == 200 and first_s <= 1.0),
        Row("agent /metrics spray", f"scrapes answered 200 on fresh connections during the spray (of {len(got)})",
            ok, "", f"{len(got)}", "", None, ok == len(got)),
        Row("agent /metrics spray", "agent CPU under the spray", round(cpu, 1), "% of a core", "<= 50", "", None,
            cpu <= 50),
        Row("agent /metrics spray", "spray offered (new connections with a wrong password a second)",
            round(sprayed["offered"], 1), "/s", ">= 150", "", None, sprayed["offered"] >= 150),
        Row("agent /metrics spray", "of them reaching HTTP (the rest closed before TLS: addresses refused again and "
            "again)", round(sprayed["rate"], 1), "/s", "", "", None, None),
    ]


if __name__ == "__main__":
    for r in run("--quick" in sys.argv):
        print(r)
