"""``kill -9`` of the remediation engine at random moments under a stream of alerts.

The engine runs as a real process (``triscope remediate``, acting, not dry-run) against the
Kubernetes test server; a sender posts a stream of distinct alerts over HTTP with the bearer token
(a failed post is retried until it gets its 202, as Alertmanager retries a failed notification);
the engine is SIGKILLed at random moments and started again.  Then:

* phase A, no re-delivery: every alert that got a 202 has exactly one decision (an engine killed
  right after the 202 decides it from the store's inbox when it starts again);
* phase B, every alert is delivered again (Alertmanager's ``repeat_interval``): still exactly one
  decision per alert that is not a ``duplicate`` suppression.  Re-deliveries do write audit rows
  (``suppressed``/``duplicate``, as the audit log records every delivery); they are excluded;
* each acting decision's restart PATCH reached the test server at least once, and every PATCH for
  a decision carries the ``restartedAt`` fixed by that decision (an action re-run after a kill
  does not restart the Deployment a second time).

The rails (cooldown, rate limit, hourly cap, in-flight cap, breaker) are set wide open and every
alert targets its own Deployment, so they cannot mask a lost or doubled decision.  Runs on SQLite
and on the real PostgreSQL server.  Prints the figures (alerts, kills, decisions, lost, doubled,
actions reaching the server).
"""

from __future__ import annotations

import collections
import http.client
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import free_port
from kube_server import KubeTestServer, alert_payload, open_store

from triscope.store import audit

REPO = Path(__file__).resolve().parents[2]
TOKEN = "fault-token-7f3a"
STARTS = "2099-01-01T00:00:00Z"
N_ALERTS = 200
KILLS = 7

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

POLICY = """version: 1
settings:
  namespaces: [inference]
  max_actions_per_hour: 1000000
  max_in_flight: 64
  workers: 16
  breaker: {{window: 1m, max_targets: 1000000, max_percent: 100, min_population: 1000000}}
  evaluate_interval: 1s
  kubernetes: {{mode: url, url: "{url}", events: false}}
rules:
  - name: restart
    trigger: {{alert: FaultStorm}}
    action: rolling_restart
    target: {{namespace: {{label: namespace}}, deployment: {{label: deployment}}}}
    params: {{timeout: 30s, follow: true}}
    limits: {{cooldown: 0s, max_actions: 1000000, per: 1h}}
"""


def listen_port() -> int:
    """A free port below the ephemeral range: while the engine is down, no outgoing connection
    (the sender's, the engine's to PostgreSQL or to the API server) can be given it."""
    rng = random.Random()
    for _ in range(200):
        port = rng.randint(20000, 32000)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    return free_port()


def wait_for_port(port: int, timeout: float, alive: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and alive.poll() is None:
        with socket.socket() as s:
            s.settimeout(0.2)
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listening on 127.0.0.1:{port}")


def _alert(i: int) -> dict[str, Any]:
    return {"labels": {"alertname": "FaultStorm", "namespace": "inference", "deployment": f"d{i:04d}",
                       "severity": "page"}, "fingerprint": f"fp{i:05d}", "startsAt": STARTS}


def _key(i: int) -> str:
    return f"alert:restart:fp{i:05d}:{STARTS}:firing"


class EngineProcess:
    """``triscope remediate`` as a child process that the test kills with SIGKILL and starts again."""

    def __init__(self, db: str, policy: Path, token_file: Path, log: Path) -> None:
        self.db, self.policy, self.token_file, self.log = db, policy, token_file, log
        self.port = listen_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> None:
        for _attempt in range(3):
            with open(self.log, "ab") as out:
                self.proc = subprocess.Popen(
                    [sys.executable, "-m", "triscope", "remediate", "--db", self.db, "--policy", str(self.policy),
                     "--listen", f"127.0.0.1:{self.port}", "--token-file", str(self.token_file)],
                    cwd=REPO, stdout=out, stderr=out)
            try:
                wait_for_port(self.port, timeout=30, alive=self.proc)
            except TimeoutError:
                code = self.proc.poll()
                tail = self.log.read_text(errors="replace")[-4000:]
                if code == 2 and "cannot listen" in tail:  # someone took the port while it was down
                    self.port = listen_port()
                    continue
                raise AssertionError(f"the engine did not listen within 30 s (exit code {code}); its log ends:\n"
                                     + tail) from None
            self.starts += 1
            return
        raise AssertionError("the engine could not get a port to listen on")

    def kill(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)

    def post(self, alerts: list[dict[str, Any]]) -> int:
        """POST one webhook payload; the HTTP status, or 0 when the engine did not answer."""
        body = json.dumps(alert_payload(alerts)).encode()
        try:
            c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
            c.request("POST", "/api/v1/alerts", body=body, headers={
                "Content-Type": "application/json", "Authorization": f"Bearer {TOKEN}"})
            r = c.getresponse()
            r.read()
            c.close()
            return r.status
        except (OSError, http.client.HTTPException):
            return 0

    def health(self) -> dict[str, Any] | None:
        try:
            c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
            c.request("GET", "/healthz")
            r = c.getresponse()
            data = json.loads(r.read())
            c.close()
            return data if isinstance(data, dict) else None
        except (OSError, http.client.HTTPException, ValueError):
            return None


def _deliver(eng: EngineProcess, batches: list[list[int]], accepted: set[int], stop: threading.Event,
             pace: float) -> int:
    """Post each batch until it gets its 202 (Alertmanager retries a failed notification); returns the posts."""
    posts = 0
    for batch in batches:
        while not stop.is_set():
            posts += 1
            code = eng.post([_alert(i) for i in batch])
            if code == 202:
                accepted.update(batch)
                break
            assert code in (0, 503), f"unexpected answer {code} to a valid payload"
            time.sleep(0.05)
        time.sleep(pace)
    return posts


def _wait_idle(eng: EngineProcess, st: Any, timeout: float = 90.0) -> None:
    """Until the engine has nothing pending, nothing in flight, and the store no undecided trigger or action."""
    deadline = time.monotonic() + timeout
    quiet = 0
    while time.monotonic() < deadline:
        h = eng.health()
        idle = (h is not None and h.get("pending") == 0 and h.get("in_flight") == 0
                and not audit.inbox(st) and not audit.in_progress(st))
        quiet = quiet + 1 if idle else 0
        if quiet >= 3:
            return
        time.sleep(0.2)
    raise AssertionError(f"engine not idle after {timeout}s: {eng.health()}, inbox {len(audit.inbox(st))}, "
                         f"in progress {len(audit.in_progress(st))}")


def _decisions(st: Any) -> tuple[dict[str, list[audit.AuditRow]], int]:
    """Decision rows per trigger key that are not duplicate suppressions, and the number of duplicate rows."""
    rows = audit.audit_log(st, limit=10_000_000, newest_first=False)
    by_key: dict[str, list[audit.AuditRow]] = collections.defaultdict(list)
    dups = 0
    for r in rows:
        if r.rail == "duplicate":
            dups += 1
        else:
            by_key[r.trigger_key].append(r)
    return by_key, dups


def _resumed(log_text: str) -> dict[str, int]:
    """What the restarted engines said they resumed: actions re-run, accepted triggers decided."""
    out = {"actions": 0, "triggers": 0}
    for m in re.finditer(r"resumed after a stop: (\d+) action\(s\) .*?, (\d+) accepted trigger", log_text):
        out["actions"] += int(m.group(1))
        out["triggers"] += int(m.group(2))
    return out


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def test_kill_9_at_random_moments_loses_and_doubles_nothing(backend: str, tmp_path: Path,
                                                           request: pytest.FixtureRequest) -> None:
    seed = int(os.environ.get("TRISCOPE_FAULT_SEED") or time.time_ns() % 1_000_000)
    rng = random.Random(seed)
    t0 = time.monotonic()
    db = f"sqlite:///{tmp_path / 'engine.db'}" if backend == "sqlite" else request.getfixturevalue("pg_url")
    st = open_store(db)
    kube = KubeTestServer(rollout_delay=0.3).start()
    for n in ("node-a", "node-b", "node-c"):
        kube.add_node(n)
    for i in range(N_ALERTS):
        kube.add_deployment("inference", f"d{i:04d}", replicas=1)
    (tmp_path / "token").write_text(TOKEN + "\n")
    (tmp_path / "policy.yaml").write_text(POLICY.format(url=kube.url))
    eng = EngineProcess(db, tmp_path / "policy.yaml", tmp_path / "token", tmp_path / "engine.log")
    try:
        eng.start()
        # the stream: distinct alerts in payloads of 1-3, sent while the engine is killed and restarted
        order = list(range(N_ALERTS))
        batches: list[list[int]] = []
        while order:
            k = rng.randint(1, 3)
            batches.append(order[:k])
            del order[:k]
        accepted: set[int] = set()
        stop = threading.Event()
        posts: list[int] = []
        sender = threading.Thread(target=lambda: posts.append(_deliver(eng, batches, accepted, stop, 0.03)))
        sender.start()
        kill_at: list[float] = []
        for _ in range(KILLS):
            time.sleep(rng.uniform(0.3, 1.5))
            kill_at.append(time.monotonic() - t0)
            eng.kill()
            time.sleep(rng.uniform(0.0, 0.3))
            eng.start()
        sender.join(120)
        stop.set()
        assert not sender.is_alive() and accepted == set(range(N_ALERTS)), "the stream was not delivered"

        # phase A: no re-delivery yet; everything that got a 202 is decided exactly once
        _wait_idle(eng, st)
        by_key, dups_a = _decisions(st)
        lost_a = [i for i in range(N_ALERTS) if not by_key.get(_key(i))]
        doubled_a = [i for i in range(N_ALERTS) if len(by_key.get(_key(i), [])) > 1]

        # phase B: Alertmanager delivers every alert again
        redelivered: set[int] = set()
        _deliver(eng, [[i] for i in range(N_ALERTS)], redelivered, threading.Event(), 0.0)
        _wait_idle(eng, st)
        by_key, dups_b = _decisions(st)
        lost = [i for i in range(N_ALERTS) if not by_key.get(_key(i))]
        doubled = [i for i in range(N_ALERTS) if len(by_key.get(_key(i), [])) > 1]
        decided = [rows[0] for k, rows in by_key.items() if k.startswith("alert:restart:")]
        not_acted = [(r.trigger_key, r.outcome, r.rail, r.reason) for r in decided if r.outcome != "acted"]
        rerun = [r for r in decided if "re-run after the engine restarted" in r.reason]

        # what reached the Kubernetes test server: every PATCH's restartedAt belongs to the decision for
        # that Deployment, and every acting decision's PATCH arrived at least once
        stamps: dict[str, list[str]] = collections.defaultdict(list)
        for call in kube.calls("PATCH", "/apis/apps/v1/namespaces/inference/deployments/"):
            if call.code != 200:  # not applied (a body cut short by the kill, a 409 on a changed resourceVersion)
                continue
            dep = call.path.rsplit("/", 1)[-1]
            stamps[dep].append(call.body["spec"]["template"]["metadata"]["annotations"]["kubectl.kubernetes.io/restartedAt"])
        reached = 0
        wrong_stamp: list[tuple[str, list[str], str]] = []
        for r in decided:
            dep = r.target.rsplit("/", 1)[-1]
            want = r.params["restartedAt"]
            if stamps.get(dep) and all(s == want for s in stamps[dep]):
                reached += 1
            else:
                wrong_stamp.append((dep, stamps.get(dep, []), want))
        repeated = sum(1 for s in stamps.values() if len(s) > 1)
        log_text = (tmp_path / "engine.log").read_text(errors="replace")
        figures = {
            "backend": backend, "seed": seed, "alerts": N_ALERTS, "payloads": len(batches), "posts": posts[0],
            "kills": len(kill_at), "engine_starts": eng.starts, "decisions": len(decided),
            "lost_before_redelivery": len(lost_a), "doubled_before_redelivery": len(doubled_a),
            "lost": len(lost), "doubled": len(doubled), "duplicate_rows": dups_b, "duplicate_rows_phase_a": dups_a,
            "acted": sum(1 for r in decided if r.outcome == "acted"), "actions_re_run_after_kill": len(rerun),
            "actions_reaching_server": reached, "deployments_patched_twice": repeated,
            "restart_patches": sum(len(s) for s in stamps.values()),
            "resumed_at_start": _resumed(log_text),
            "seconds": round(time.monotonic() - t0, 1),
        }
        print("\nFAULTS " + json.dumps(figures))
        assert len(kill_at) == KILLS and eng.starts == KILLS + 1
        assert not lost_a and not doubled_a, (lost_a, doubled_a)
        assert not lost and not doubled, (lost, doubled)
        assert len(decided) == N_ALERTS
        assert not not_acted, not_acted[:5]
        assert not wrong_stamp, wrong_stamp[:5]
        assert reached == N_ALERTS
        assert dups_b >= N_ALERTS  # every re-delivery was recognised (and audited) as a duplicate
        assert "Traceback" not in log_text, log_text[-3000:]
    finally:
        eng.stop()
        kube.stop()
        st.close()
