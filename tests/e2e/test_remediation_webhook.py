"""The Alertmanager webhook (auth, validation, 202) and the ``triscope remediate`` process."""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import free_port, wait_for_port
from kube_server import alert_payload, open_store, policy_text, webhook_payload

from triscope.remediation.engine import Engine
from triscope.remediation.policy import parse_policy
from triscope.remediation.service import start
from triscope.store import audit

REPO = Path(__file__).resolve().parents[2]
RULES = """  - name: cmd
    trigger: {alert: Storm}
    action: command
    target: {node: {label: node}}
    params: {argv: ["true"]}
"""


@pytest.fixture
def hook(tmp_path: Path) -> Iterator[tuple[str, int, Any]]:
    st = open_store(f"sqlite:///{tmp_path / 't.db'}")
    port = free_port()
    h = start(st, parse_policy(policy_text(RULES)), listen=("127.0.0.1", port), token="s3cret-webhook-token", dry_run=True,
              max_body=4096)
    yield "127.0.0.1", port, h
    h.stop()
    st.close()


def post(host: str, port: int, body: bytes, token: str | None = "s3cret-webhook-token", path: str = "/api/v1/alerts") -> tuple[int, dict[str, Any]]:
    c = http.client.HTTPConnection(host, port, timeout=10)
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    c.request("POST", path, body=body, headers=headers)
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, json.loads(data) if data else {}


def test_webhook_auth_validation_and_accept(hook: tuple[str, int, Any]) -> None:
    host, port, h = hook
    good = json.dumps(alert_payload([{"labels": {"alertname": "Storm", "node": "n1"}}])).encode()
    assert post(host, port, good, token=None)[0] == 401
    assert post(host, port, good, token="wrong")[0] == 401
    code, body = post(host, port, b"{not json")
    assert code == 400 and "not valid JSON" in body["error"]
    code, body = post(host, port, json.dumps({"version": "3", "alerts": []}).encode())
    assert code == 400 and "version" in body["error"]
    bad = alert_payload([{"labels": {"alertname": "Storm"}}])
    bad["alerts"][0]["status"] = "burning"
    code, body = post(host, port, json.dumps(bad).encode())
    assert code == 400 and "alerts[0].status" in body["error"]
    bad = alert_payload([{"labels": {"alertname": "Storm", "n": 1}}])  # type: ignore[dict-item]
    assert post(host, port, json.dumps(bad).encode())[0] == 400
    code, body = post(host, port, b"x" * 5000)
    assert code == 413 and "too large" in body["error"]
    assert audit.audit_log(h.engine.store) == []  # nothing rejected reached the engine
    code, body = post(host, port, good)
    assert code == 202 and body == {"status": "accepted", "alerts": 1, "matched": 1}
    assert h.engine.drain()
    assert [r.outcome for r in audit.audit_log(h.engine.store)] == ["dry_run"]
    c = http.client.HTTPConnection(host, port, timeout=5)
    c.request("GET", "/metrics")
    text = c.getresponse().read().decode()
    assert 'triscope_remediation_actions_total{action="command",outcome="dry_run"}' in text
    c.request("GET", "/healthz")
    assert json.loads(c.getresponse().read())["breaker"] == "closed"


def _cli(args: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "triscope", "remediate", *args], capture_output=True, text=True,
                          cwd=REPO, timeout=60, env={**os.environ, **(env or {})})


def test_cli_refuses_to_start_without_token(tmp_path: Path) -> None:
    pol = tmp_path / "p.yaml"
    pol.write_text(policy_text(RULES))
    db = f"sqlite:///{tmp_path / 't.db'}"
    open_store(db).close()
    env = {"TRISCOPE_WEBHOOK_TOKEN": ""}
    res = _cli(["--db", db, "--policy", str(pol)], env)
    assert res.returncode == 2 and "no webhook token" in res.stderr
    res = _cli(["--db", db, "--policy", str(pol), "--listen", "0.0.0.0:0", "--insecure-no-auth"], env)
    assert res.returncode == 2 and "only allowed on loopback" in res.stderr
    res = _cli(["--db", db, "--policy", str(pol), "--token-file", str(tmp_path / "missing")], env)
    assert res.returncode == 2 and "cannot read --token-file" in res.stderr


def test_cli_serves_webhook_with_token_file(tmp_path: Path) -> None:
    pol = tmp_path / "p.yaml"
    pol.write_text(policy_text(RULES))
    tok = tmp_path / "token"
    tok.write_text("file-token-0123456789\n")
    db = f"sqlite:///{tmp_path / 't.db'}"
    open_store(db).close()
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "triscope", "remediate", "--db", db, "--policy", str(pol),
                             "--listen", f"127.0.0.1:{port}", "--token-file", str(tok)], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for_port(port, timeout=30)
        body = json.dumps(alert_payload([{"labels": {"alertname": "Storm", "node": "n1"}}])).encode()
        assert post("127.0.0.1", port, body, token="s3cret-webhook-token")[0] == 401
        assert post("127.0.0.1", port, body, token="file-token-0123456789")[0] == 202
        st = open_store(db)
        deadline = time.time() + 10
        while time.time() < deadline and not [r for r in audit.audit_log(st) if r.outcome != "in_progress"]:
            time.sleep(0.1)
        assert [r.outcome for r in audit.audit_log(st)] == ["acted"]
        st.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "webhook: POST" in out


def test_leader_election_one_acts_and_takeover(tmp_path: Path) -> None:
    from kube_server import KubeTestServer

    from triscope.remediation.kube.adapter import KubeAdapter
    from triscope.remediation.leader import LeaderElector

    srv = KubeTestServer().start()
    try:
        a = LeaderElector(KubeAdapter.connect(url=srv.url), "default", "lease", "a", lease_duration_s=1)
        b = LeaderElector(KubeAdapter.connect(url=srv.url), "default", "lease", "b", lease_duration_s=1)
        assert a.step() and not b.step()
        assert a.step() and not b.step()  # renewals keep it
        lease = srv.get("leases", "default", "lease")
        assert lease["spec"]["holderIdentity"] == "a" and lease["spec"]["leaseTransitions"] == 0
        time.sleep(1.2)  # a stops renewing (crashed): b takes over once the lease expired
        assert b.step()
        lease = srv.get("leases", "default", "lease")
        assert lease["spec"]["holderIdentity"] == "b" and lease["spec"]["leaseTransitions"] == 1
        assert not a.step()
        # an engine that is not the leader answers but does not act
        st = open_store(f"sqlite:///{tmp_path / 't.db'}")
        eng = Engine(st, parse_policy(policy_text(RULES)), leader=a)
        eng.submit_alerts(webhook_payload([{"labels": {"alertname": "Storm", "node": "n1"}}]))
        assert eng.drain()
        eng.close()
        assert [(r.outcome, r.rail) for r in audit.audit_log(st)] == [("suppressed", "leader")]
        st.close()
        b.release()
        assert srv.get("leases", "default", "lease")["spec"].get("holderIdentity") is None
        assert a.step()  # released: taken at once
    finally:
        srv.stop()


def test_start_embedded_dry_run_with_example_policy(tmp_path: Path) -> None:
    from triscope.remediation.service import start_embedded

    url = f"sqlite:///{tmp_path / 't.db'}"
    open_store(url).close()
    port = free_port()
    h = start_embedded(url, None, ("127.0.0.1", port))
    try:
        assert h.engine.dry_run and len(h.engine.policy.rules) == 6
        assert {j.id for j in h.scheduler.get_jobs()} == {"evaluate-triggers", "fallback-reverts", "prune-deliveries",
                                                          "resume-inbox"}
        assert all(j.max_instances == 1 and j.coalesce for j in h.scheduler.get_jobs())
        # the example restarts the workload the alert names (namespace + workload, or a pod resolved
        # through the API: there is none here, so a pod alone cannot be resolved and is suppressed)
        body = json.dumps(alert_payload([{"labels": {"alertname": "TriscopeTcpRetransmitStorm", "severity": "warning",
                                                     "namespace": "inference", "workload": "Deployment/web",
                                                     "node": "n1"}}])).encode()
        assert post("127.0.0.1", port, body, token=None)[0] == 202
        assert h.engine.drain()
        row = audit.audit_log(h.engine.store)[0]
        assert (row.rule, row.outcome, row.target) == ("restart-on-retransmit-storm", "dry_run", "deployment inference/web")
        assert "live state not checked" in row.reason
        body = json.dumps(alert_payload([{"labels": {"alertname": "TriscopeTcpRetransmitStorm", "severity": "warning",
                                                     "namespace": "inference", "pod": "web-6d4f9-x2x7q",
                                                     "node": "n1"}}])).encode()
        assert post("127.0.0.1", port, body, token=None)[0] == 202
        assert h.engine.drain()
        row = audit.audit_log(h.engine.store)[0]
        assert (row.outcome, row.rail) == ("suppressed", "target")
        assert "no Kubernetes API configured" in row.reason and "web-6d4f9-x2x7q" in row.reason
    finally:
        h.stop()


def test_follower_answers_503_and_is_not_ready(tmp_path: Path) -> None:
    from kube_server import KubeTestServer

    from triscope.remediation.kube.adapter import KubeAdapter
    from triscope.remediation.leader import LeaderElector

    srv = KubeTestServer().start()
    st = open_store(f"sqlite:///{tmp_path / 't.db'}")
    other = LeaderElector(KubeAdapter.connect(url=srv.url), "default", "triscope-remediation", "other", 30)
    assert other.step()
    text = policy_text(RULES, settings=f"  kubernetes: {{mode: url, url: '{srv.url}'}}\n"
                                       "  leader_election: {enabled: true, lease_duration: 30s, renew_every: 1s}\n")
    port = free_port()
    h = start(st, parse_policy(text), listen=("127.0.0.1", port), token="s3cret-webhook-token")
    try:
        body = json.dumps(alert_payload([{"labels": {"alertname": "Storm", "node": "n1"}}])).encode()
        assert post("127.0.0.1", port, body)[0] == 503
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        c.request("GET", "/readyz")
        r = c.getresponse()
        r.read()
        assert r.status == 503
        other.release()  # the leader steps down: this replica takes the lease within renew_every
        deadline = time.time() + 10
        while time.time() < deadline and not h.engine.status()["leader"]:
            time.sleep(0.1)
        c.request("GET", "/readyz")
        r = c.getresponse()
        r.read()
        assert r.status == 200
        assert post("127.0.0.1", port, body)[0] == 202
        assert h.engine.drain()
        assert [r.outcome for r in audit.audit_log(st)] == ["acted"]
    finally:
        h.stop()
        st.close()
        srv.stop()


def test_webhook_switched_from_dry_run_to_acting_mid_episode_acts(tmp_path: Path) -> None:
    """``triscope remediate --dry-run`` answers an alert, is stopped and started acting on the same store;
    Alertmanager re-delivers the still-firing alert to the webhook: the acting engine acts, once."""
    st = open_store(f"sqlite:///{tmp_path / 't.db'}")
    pol = parse_policy(policy_text(RULES + "    limits: {cooldown: 1h}\n"))
    body = json.dumps(alert_payload([{"labels": {"alertname": "Storm", "node": "n1"}}])).encode()

    def deliver(dry_run: bool, times: int = 1) -> list[tuple[str, str | None, bool]]:
        port = free_port()
        h = start(st, pol, listen=("127.0.0.1", port), token="s3cret-webhook-token", dry_run=dry_run)
        try:
            before = {r.id for r in audit.audit_log(st, limit=1000)}
            for _ in range(times):
                assert post("127.0.0.1", port, body)[0] == 202
                assert h.engine.drain()
        finally:
            h.stop()
        return [(r.outcome, r.rail, r.dry_run) for r in audit.audit_log(st, limit=1000, newest_first=False)
                if r.id not in before]

    try:
        assert deliver(dry_run=True, times=2) == [("dry_run", None, True), ("suppressed", "duplicate", True)]
        assert deliver(dry_run=False, times=2) == [("acted", None, False), ("suppressed", "duplicate", False)]
        assert deliver(dry_run=True) == [("suppressed", "duplicate", True)]
    finally:
        st.close()
