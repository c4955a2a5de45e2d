"""The real Prometheus (Debian ``prometheus``) scrapes the real agent over TLS with basic auth, as a
ServiceMonitor with ``scheme: https``, ``tlsConfig`` and ``basicAuth`` makes it do: the target is up
and a triscope metric arrives; a second job with a wrong password sees the target down (401), and
one speaking plain HTTP to the TLS port gets nothing.  And the real Alertmanager delivers to the
remediation webhook over TLS."""

from __future__ import annotations

import base64
import http.client
import json
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml
from conftest import free_port
from tls_support import bcrypt_hash, make_certs

REPO = Path(__file__).resolve().parents[2]
PROMETHEUS = shutil.which("prometheus")

pytestmark = [pytest.mark.prometheus, pytest.mark.slow, pytest.mark.timeout(150)]


def _wait(pred, timeout: float, what: str):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = pred()
        except OSError:   # not listening yet, or Prometheus' TSDB not ready (503)
            last = None
        if last:
            return last
        time.sleep(0.3)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def _api(port: int, path: str) -> dict:  # type: ignore[type-arg]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
        return json.loads(r.read())


def test_prometheus_scrapes_the_agent_over_tls_with_basic_auth(tmp_path: Path) -> None:
    assert PROMETHEUS, "prometheus is not installed (make test installs it)"
    certs = make_certs(tmp_path / "certs")
    web = tmp_path / "web-config.yml"
    web.write_text(yaml.safe_dump({
        "tls_server_config": {"cert_file": str(certs.cert), "key_file": str(certs.key), "min_version": "TLS12"},
        "basic_auth_users": {"prometheus": bcrypt_hash("scrape-pass", rounds=10)}}))
    agent_port, prom_port = free_port(), free_port()
    procs: list[subprocess.Popen[bytes]] = []
    try:
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "triscope", "agent", "--db", f"sqlite:///{tmp_path / 'agent.db'}",
             "--listen", f"127.0.0.1:{agent_port}", "--web.config.file", str(web), "--no-ebpf", "--no-nvml",
             "--no-npu", "--no-workloads", "--interval", "1", "--node", "tls-node", "--spool", str(tmp_path / "spool")],
            cwd=REPO, stdout=subprocess.DEVNULL, stderr=open(tmp_path / "agent.log", "wb")))  # noqa: SIM115
        target = {"static_configs": [{"targets": [f"127.0.0.1:{agent_port}"]}]}
        tls = {"scheme": "https", "tls_config": {"ca_file": str(certs.ca), "server_name": "localhost"}}
        prom_cfg = {"global": {"scrape_interval": "1s", "scrape_timeout": "900ms"}, "scrape_configs": [
            {"job_name": "agent-tls", **tls, "basic_auth": {"username": "prometheus", "password": "scrape-pass"},
             **target},
            {"job_name": "agent-wrong-password", **tls, "basic_auth": {"username": "prometheus", "password": "nope"},
             **target},
            {"job_name": "agent-plain-http", "basic_auth": {"username": "prometheus", "password": "scrape-pass"},
             **target}]}
        (tmp_path / "prom.yml").write_text(yaml.safe_dump(prom_cfg))
        procs.append(subprocess.Popen(
            [PROMETHEUS, f"--config.file={tmp_path / 'prom.yml'}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{prom_port}"],
            stdout=subprocess.DEVNULL, stderr=open(tmp_path / "prom.log", "wb")))  # noqa: SIM115

        def targets() -> dict[str, dict] | None:  # type: ignore[type-arg]
            active = _api(prom_port, "/api/v1/targets")["data"]["activeTargets"]
            by_job = {t["labels"]["job"]: t for t in active}
            done = len(by_job) == 3 and all(t["health"] != "unknown" for t in by_job.values())
            return by_job if done and by_job["agent-tls"]["health"] == "up" else None

        try:
            by_job = _wait(targets, 60, "Prometheus to scrape the three jobs (agent-tls up)")
        except AssertionError:
            raise AssertionError(f"{(tmp_path / 'agent.log').read_text()[-2000:]}\n"
                                 f"{(tmp_path / 'prom.log').read_text()[-2000:]}") from None
        assert by_job["agent-wrong-password"]["health"] == "down"
        assert "401" in by_job["agent-wrong-password"]["lastError"], by_job["agent-wrong-password"]["lastError"]
        assert by_job["agent-plain-http"]["health"] == "down"

        q = urllib.parse.quote('triscope_tcp_retransmits_total{job="agent-tls"}')
        result = _wait(lambda: _api(prom_port, f"/api/v1/query?query={q}")["data"]["result"], 20,
                       "a triscope metric scraped over TLS")
        assert result[0]["metric"]["instance"] == f"127.0.0.1:{agent_port}"
        q = urllib.parse.quote('up{job="agent-wrong-password"} or up{job="agent-plain-http"}')
        ups = _api(prom_port, f"/api/v1/query?query={q}")["data"]["result"]
        assert sorted(r["value"][1] for r in ups) == ["0", "0"]
        q = urllib.parse.quote('count({job="agent-wrong-password", __name__=~"triscope_.*"})')
        assert _api(prom_port, f"/api/v1/query?query={q}")["data"]["result"] == []

        # and a plain client with a wrong password: 401 with WWW-Authenticate: Basic
        conn = http.client.HTTPSConnection("127.0.0.1", agent_port, context=certs.client_context(), timeout=5)
        conn.request("GET", "/metrics", headers={"Authorization": "Basic " + base64.b64encode(b"prometheus:x").decode()})
        r = conn.getresponse()
        assert (r.status, r.getheader("WWW-Authenticate")) == (401, "Basic") and b"triscope_" not in r.read()
        conn.close()
    finally:
        _stop(procs)


def test_alertmanager_posts_to_the_webhook_over_tls(tmp_path: Path) -> None:
    """The real Alertmanager delivers to ``triscope remediate --web.config.file`` over HTTPS with its
    bearer token and the CA in ``tls_config``; the engine records and acts on the alert."""
    from kube_server import open_store, policy_text

    from triscope.store import audit

    alertmanager = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
    assert alertmanager, "prometheus-alertmanager is not installed (make test installs it)"
    certs = make_certs(tmp_path / "certs")
    web = tmp_path / "web.yml"
    web.write_text(f"tls_server_config:\n  cert_file: {certs.cert}\n  key_file: {certs.key}\n")
    token = tmp_path / "token"
    token.write_text("am-tls-token-0123456789\n")
    pol = tmp_path / "p.yaml"
    pol.write_text(policy_text("  - name: cmd\n    trigger: {alert: TlsStorm}\n    action: command\n"
                               "    target: {node: {label: node}}\n    params: {argv: [\"true\"]}\n"))
    db = f"sqlite:///{tmp_path / 'engine.db'}"
    open_store(db).close()
    hook_port, am_port = free_port(), free_port()
    procs: list[subprocess.Popen[bytes]] = []
    try:
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "triscope", "remediate", "--db", db, "--policy", str(pol), "--listen",
             f"127.0.0.1:{hook_port}", "--token-file", str(token), "--web.config.file", str(web)],
            cwd=REPO, stdout=subprocess.DEVNULL, stderr=open(tmp_path / "engine.log", "wb")))  # noqa: SIM115
        am_cfg = {"route": {"receiver": "triscope", "group_wait": "0s", "group_interval": "1s",
                            "repeat_interval": "1h"},
                  "receivers": [{"name": "triscope", "webhook_configs": [{
                      "url": f"https://localhost:{hook_port}/api/v1/alerts",
                      "http_config": {"authorization": {"type": "Bearer", "credentials_file": str(token)},
                                      "tls_config": {"ca_file": str(certs.ca)}}}]}]}
        (tmp_path / "am.yml").write_text(yaml.safe_dump(am_cfg))
        procs.append(subprocess.Popen(
            [alertmanager, f"--config.file={tmp_path / 'am.yml'}", f"--storage.path={tmp_path / 'am-data'}",
             f"--web.listen-address=127.0.0.1:{am_port}", "--cluster.listen-address="],
            stdout=subprocess.DEVNULL, stderr=open(tmp_path / "am.log", "wb")))  # noqa: SIM115

        def post_alert() -> bool:
            body = json.dumps([{"labels": {"alertname": "TlsStorm", "node": "n1"}}]).encode()
            req = urllib.request.Request(f"http://127.0.0.1:{am_port}/api/v2/alerts", data=body,
                                         headers={"Content-Type": "application/json"}, method="POST")
            with urllib.request.urlopen(req, timeout=5) as r:
                return r.status == 200

        _wait(post_alert, 30, "Alertmanager to take an alert")
        st = open_store(db)
        try:
            rows = _wait(lambda: [r for r in audit.audit_log(st) if r.outcome != "in_progress"], 30,
                         "the engine to act on the alert Alertmanager delivered over TLS")
        except AssertionError:
            raise AssertionError(f"{(tmp_path / 'am.log').read_text()[-2000:]}\n"
                                 f"{(tmp_path / 'engine.log').read_text()[-2000:]}") from None
        finally:
            st.close()
        assert [r.outcome for r in rows] == ["acted"]
    finally:
        _stop(procs)


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(15)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
