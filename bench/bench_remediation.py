"""Remediation engine: webhook received -> action issued, under load with duplicate deliveries.

Setup (three processes, so the load generator does not share a GIL with the engine):
* the Kubernetes test server (tests/kube_server.py) with 50 Deployments;
* ``triscope remediate`` on a SQLite store, a policy restarting the Deployment named by the alert
  (``rolling_restart``, ``follow: false``; cooldown 0 and caps out of the way so every alert acts);
* this process: 50 alerts/s for 60 s (``quick``: 10 s), each alert POSTed to the webhook with its
  bearer token, then delivered again 0-0.5 s later (20 % of them a third time), as Alertmanager's
  at-least-once delivery does.

Figures from the audit table: latency = ``issued_ts - received_ts`` (the webhook handler's first
line to the restart PATCH's answer), and how many alerts acted exactly once.
Baseline, same run, same rate: the bare verb ``KubeAdapter.restart_deployment`` called directly
per alert (no webhook, rails, audit or dedupe): the floor the engine's safety adds to.
"""

from __future__ import annotations

import http.client
import json
import os
import queue
import random
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

from bench.common import Row

REPO = Path(__file__).resolve().parent.parent
RATE = 50.0
DEPLOYMENTS = 50
TOKEN = "bench-webhook-token-0123456789"

KUBE_SCRIPT = """
import sys
sys.path.insert(0, {tests!r})
from kube_server import KubeTestServer
s = KubeTestServer(rollout_delay=0.05).start()
for i in range(3):
    s.add_node(f"node-{{i}}")
for i in range({n}):
    s.add_deployment("bench", f"app-{{i}}", replicas=1)
print(s.url, flush=True)
sys.stdin.read()
s.stop()
"""

POLICY = """version: 1
settings:
  namespaces: [bench]
  max_actions_per_hour: 1000000
  max_in_flight: 64
  workers: 8
  breaker: {{window: 1m, max_targets: 1000000, max_percent: 100}}
  kubernetes: {{mode: url, url: "{url}", events: true}}
rules:
  - name: restart
    trigger: {{alert: BenchStorm}}
    action: rolling_restart
    target: {{namespace: {{label: namespace}}, deployment: {{label: deployment}}}}
    params: {{follow: false}}
    limits: {{cooldown: 0s, max_actions: 1000000, per: 1h}}
"""


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _pct(xs: list[float], p: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, int(round(p / 100.0 * len(xs) + 0.5)) - 1))]


def _payload(i: int, starts: str) -> bytes:
    labels = {"alertname": "BenchStorm", "namespace": "bench", "deployment": f"app-{i % DEPLOYMENTS}", "idx": str(i)}
    return json.dumps({"version": "4", "groupKey": f"bench-{i}", "status": "firing", "receiver": "triscope",
                       "groupLabels": {}, "commonLabels": {}, "commonAnnotations": {}, "externalURL": "",
                       "alerts": [{"status": "firing", "labels": labels, "annotations": {}, "startsAt": starts,
                                   "endsAt": "0001-01-01T00:00:00Z", "generatorURL": "",
                                   "fingerprint": f"{i:016x}"}]}).encode()


def _load(port: int, n: int, rate: float) -> tuple[int, list[float], int, float]:
    """Deliver ``n`` alerts at ``rate``/s with duplicates.

    Returns (deliveries, 202 latencies in ms, non-202 answers, achieved rate of first deliveries).
    """
    rng = random.Random(7)
    t0 = time.monotonic() + 0.5
    starts = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    sched: list[tuple[float, int]] = []
    for i in range(n):
        at = t0 + i / rate
        sched.append((at, i))
        sched.append((at + rng.uniform(0.0, 0.5), i))
        if rng.random() < 0.2:
            sched.append((at + rng.uniform(0.0, 1.0), i))
    sched.sort()
    firsts: list[float] = []
    first_seen: set[int] = set()
    work: queue.Queue[tuple[float, int] | None] = queue.Queue()
    lat: list[float] = []
    bad = [0]
    lock = threading.Lock()
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}

    def client() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        while True:
            item = work.get()
            if item is None:
                break
            _, i = item
            t = time.perf_counter()
            try:
                conn.request("POST", "/api/v1/alerts", body=_payload(i, starts), headers=headers)
                r = conn.getresponse()
                r.read()
                ok = r.status == 202
            except (OSError, http.client.HTTPException):
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
                ok = False
            with lock:
                if ok:
                    lat.append((time.perf_counter() - t) * 1000)
                else:
                    bad[0] += 1
        conn.close()

    threads = [threading.Thread(target=client, daemon=True) for _ in range(8)]
    for th in threads:
        th.start()
    for at, i in sched:
        delay = at - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        work.put((at, i))
        if i not in first_seen:
            first_seen.add(i)
            firsts.append(time.monotonic())
    for _ in threads:
        work.put(None)
    for th in threads:
        th.join()
    achieved = (len(firsts) - 1) / (firsts[-1] - firsts[0]) if len(firsts) > 1 else 0.0
    return len(sched), lat, bad[0], achieved


def _baseline(kube_url: str, n: int, rate: float) -> list[float]:
    """The bare verb at the same rate: KubeAdapter.restart_deployment, one thread per in-flight call."""
    from triscope.remediation.kube.adapter import KubeAdapter

    ka = KubeAdapter.connect(url=kube_url)
    lat: list[float] = []
    lock = threading.Lock()
    work: queue.Queue[int | None] = queue.Queue()

    def worker() -> None:
        while True:
            i = work.get()
            if i is None:
                break
            t = time.perf_counter()
            ka.restart_deployment("bench", f"app-{i % DEPLOYMENTS}")
            with lock:
                lat.append((time.perf_counter() - t) * 1000)

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(8)]
    for th in threads:
        th.start()
    t0 = time.monotonic()
    for i in range(n):
        delay = t0 + i / rate - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        work.put(i)
    for _ in threads:
        work.put(None)
    for th in threads:
        th.join()
    ka.close()
    return lat


def run(quick: bool = False) -> list[Row]:
    from triscope.store import Store, audit

    duration = 10.0 if quick else 60.0
    n = int(RATE * duration)
    tmp = Path(tempfile.mkdtemp(prefix="triscope-bench-rem-"))
    db = f"sqlite:///{tmp / 'bench.db'}"
    st = Store.open(db)
    st.upgrade()
    (tmp / "token").write_text(TOKEN)
    kube = subprocess.Popen([sys.executable, "-c", KUBE_SCRIPT.format(tests=str(REPO / "tests"), n=DEPLOYMENTS)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    engine = None
    try:
        kube_url = (kube.stdout.readline() if kube.stdout else "").strip()
        if not kube_url.startswith("http"):
            raise RuntimeError("the Kubernetes test server did not start")
        (tmp / "policy.yaml").write_text(POLICY.format(url=kube_url))
        port = _free_port()
        engine = subprocess.Popen(
            [sys.executable, "-m", "triscope", "remediate", "--db", db, "--policy", str(tmp / "policy.yaml"),
             "--listen", f"127.0.0.1:{port}", "--token-file", str(tmp / "token")],
            cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        deadline = time.monotonic() + 30
        while True:
            try:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
                c.request("GET", "/healthz")
                c.getresponse().read()
                c.close()
                break
            except OSError:
                if time.monotonic() > deadline or engine.poll() is not None:
                    raise RuntimeError("triscope remediate did not start") from None
                time.sleep(0.1)
        deliveries, accept_ms, rejected, achieved = _load(port, n, RATE)
        # wait for every delivery to be decided (one audit row each)
        deadline = time.monotonic() + 120
        rows: list[audit.AuditRow] = []
        while time.monotonic() < deadline:
            rows = audit.audit_log(st, limit=deliveries * 2)
            if len(rows) >= deliveries - rejected and not any(r.outcome == "in_progress" for r in rows):
                break
            time.sleep(0.5)
        acted: dict[str, int] = {}
        lat = []
        for r in rows:
            if r.outcome == "acted":
                fp = r.trigger_key.split(":")[2]
                acted[fp] = acted.get(fp, 0) + 1
                if r.issued_ts and r.received_ts:
                    lat.append((r.issued_ts - r.received_ts) * 1000)
        once = sum(1 for v in acted.values() if v == 1)
        doubled = sum(1 for v in acted.values() if v > 1)
        lost = n - len(acted)
        base = _baseline(kube_url, int(RATE * min(duration, 20.0)), RATE)
    finally:
        if engine is not None:
            engine.terminate()
            try:
                engine.wait(20)
            except subprocess.TimeoutExpired:
                engine.kill()
        if kube.stdin:
            kube.stdin.close()
        try:
            kube.wait(10)
        except subprocess.TimeoutExpired:
            kube.kill()
        st.close()
    p99 = _pct(lat, 99)
    name = "remediation webhook"
    load = f"{RATE:g} alerts/s x {duration:g}s, {deliveries} deliveries"
    return [
        Row(name, f"received -> action issued, p99 ({load})", round(p99, 1), "ms", "<= 250",
            "bare KubeAdapter.restart_deployment per alert (no webhook/rails/audit/dedupe)",
            round(_pct(base, 99), 1), ok=p99 <= 250),
        Row(name, "received -> action issued, p50", round(_pct(lat, 50), 1), "ms", "",
            "bare restart_deployment p50", round(_pct(base, 50), 1)),
        Row(name, f"alerts acted on exactly once (of {n}; lost {lost}, doubled {doubled})", once, "alerts",
            f"= {n}", "deliveries sent incl. duplicates", deliveries, ok=once == n and lost == 0 and doubled == 0),
        Row(name, "webhook 202 answer time seen by the sender, p99", round(_pct(accept_ms, 99), 1), "ms", "",
            "", None),
        Row(name, "alert rate achieved", round(achieved, 1), "alerts/s", f">= {RATE * 0.95:g}",
            "", None, ok=achieved >= RATE * 0.95 and rejected == 0),
    ]


if __name__ == "__main__":
    for row in run(quick="--quick" in sys.argv):
        print(row)
