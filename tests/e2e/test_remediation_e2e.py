"""End to end with the real Debian ``prometheus`` and ``prometheus-alertmanager``.

The agent exports real TCP retransmit counts on /metrics; Prometheus scrapes it every second and
evaluates ``TriscopeTcpRetransmitStorm`` from ``deploy/prometheus/triscope-rules.yaml`` (only its
``for:`` is shortened); Alertmanager routes the alert with a bearer token to two engines running
the shipped example policy against the Kubernetes test server: ``triscope remediate --dry-run`` (a
process of its own) and a live engine.  Real loopback SYN retransmits make the alert fire.

Which workload: the example policy restarts the Deployment the alert names by ``namespace`` and
``pod`` (resolved through ownerReferences: Pod -> ReplicaSet -> Deployment) or ``workload``.  In
production those labels are the agent's per-accelerator series labels (docs/workloads.md: the agent
labels a GPU's series with the pod using it, from NVML's process list and the kubelet's
pod-resources API).  They cannot come from the agent here: this host has no GPU, so the agent
attributes no process to a pod, and the retransmit counter is a node series without workload
labels anyway.  So the scrape target carries ``namespace`` and ``pod`` (of a real pod of
``inference/web`` on the test server) as static labels, standing in for them; nothing names the
Deployment: both engines find it from the pod through the API, as in production.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml
from conftest import free_port, wait_for_port
from kube_server import KubeTestServer, open_store

from triscope.remediation.policy import parse_policy
from triscope.remediation.service import start
from triscope.store import audit
from triscope.web.loopback import syn_retransmits

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "deploy" / "prometheus" / "triscope-rules.yaml"
EXAMPLE = REPO / "deploy" / "policy.example.yaml"
ALERTMANAGER = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
PROMETHEUS = shutil.which("prometheus")

pytestmark = [pytest.mark.prometheus, pytest.mark.slow, pytest.mark.timeout(120)]


def _wait(pred, timeout: float, what: str, step: float = 0.25):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            v = pred()
        except OSError:  # Prometheus answers 503 until its TSDB is ready; connection refused while starting
            v = None
        if v:
            return v
        time.sleep(step)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def _get_json(url: str) -> dict:  # type: ignore[type-arg]
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read())


def test_retransmit_storm_alert_drives_dry_run_and_live_restart(tmp_path: Path) -> None:
    assert PROMETHEUS and ALERTMANAGER, "prometheus / prometheus-alertmanager are not installed (make test installs them)"
    t_start = time.monotonic()
    procs: list[subprocess.Popen[bytes]] = []
    token = tmp_path / "webhook-token"
    token.write_text("e2e-token-123-456789\n")
    # the rollout replaces web's pods after 2 s: both engines resolve the alert's pod before it goes
    kube = KubeTestServer(rollout_delay=2.0).start()
    kube.add_node("e2e-node")
    kube.add_node("spare")
    kube.add_deployment("inference", "web", replicas=2)
    web_pod = kube.pods_of("inference", "web")[0]["metadata"]["name"]
    in_cluster = EXAMPLE.read_text().replace("    mode: none\n", f"    mode: url\n    url: {kube.url}\n", 1)
    assert kube.url in in_cluster
    live_handle = None
    try:
        # the agent: real /proc/net/snmp retransmits on /metrics, stored in its own database
        agent_port = free_port()
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "triscope", "agent", "--db", f"sqlite:///{tmp_path / 'agent.db'}",
             "--listen", f"127.0.0.1:{agent_port}", "--no-ebpf", "--no-nvml", "--no-npu", "--interval", "1",
             "--node", "e2e-node", "--spool", str(tmp_path / "spool")],
            cwd=REPO, stdout=subprocess.DEVNULL, stderr=open(tmp_path / "agent.log", "wb")))  # noqa: SIM115

        # engine 1: `triscope remediate --dry-run` with the shipped example policy, reading the API
        # (as deploy/kustomize runs it first): it resolves the pod, reads the Deployment, writes nothing
        dry_db = f"sqlite:///{tmp_path / 'dry.db'}"
        open_store(dry_db).close()
        dry_port = free_port()
        dry_policy = tmp_path / "policy.yaml"
        dry_policy.write_text(in_cluster)
        shutil.copy(EXAMPLE.parent / "slo.example.yaml", tmp_path / "slo.example.yaml")
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "triscope", "remediate", "--db", dry_db, "--policy", str(dry_policy), "--dry-run",
             "--listen", f"127.0.0.1:{dry_port}", "--token-file", str(token)],
            cwd=REPO, stdout=subprocess.DEVNULL, stderr=open(tmp_path / "engine.log", "wb")))  # noqa: SIM115

        # engine 2: live, the same example policy pointed at the Kubernetes test server
        live_store = open_store(f"sqlite:///{tmp_path / 'live.db'}")
        live_port = free_port()
        live_handle = start(live_store, parse_policy(in_cluster, str(EXAMPLE)), listen=("127.0.0.1", live_port),
                            token="e2e-token-123-456789")

        # Alertmanager: route Triscope* alerts to both engines with the bearer token from a file
        am_port = free_port()
        hook = {"send_resolved": True, "http_config": {"authorization": {"type": "Bearer",
                                                                         "credentials_file": str(token)}}}
        am_cfg = {
            "route": {"receiver": "triscope", "group_by": ["alertname", "node", "namespace", "pod"],
                      "group_wait": "1s", "group_interval": "1s", "repeat_interval": "1h"},
            "receivers": [{"name": "triscope", "webhook_configs": [
                {**hook, "url": f"http://127.0.0.1:{dry_port}/api/v1/alerts"},
                {**hook, "url": f"http://127.0.0.1:{live_port}/api/v1/alerts"}]}],
        }
        (tmp_path / "am.yml").write_text(yaml.safe_dump(am_cfg))
        procs.append(subprocess.Popen(
            [ALERTMANAGER, f"--config.file={tmp_path / 'am.yml'}", f"--storage.path={tmp_path / 'am-data'}",
             f"--web.listen-address=127.0.0.1:{am_port}", "--cluster.listen-address="],
            stdout=subprocess.DEVNULL, stderr=open(tmp_path / "am.log", "wb")))  # noqa: SIM115

        # Prometheus: the rule from deploy/ with a short `for:`; the node, and the pod standing in for the
        # agent's workload labels (see the module's doc), as target labels
        rules = yaml.safe_load(RULES.read_text())
        rule = next(r for g in rules["groups"] for r in g["rules"] if r.get("alert") == "TriscopeTcpRetransmitStorm")
        rule["for"] = "2s"
        (tmp_path / "rules.yml").write_text(yaml.safe_dump(rules))
        prom_port = free_port()
        prom_cfg = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(tmp_path / "rules.yml")],
            "alerting": {"alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{am_port}"]}]}]},
            "scrape_configs": [{"job_name": "triscope-agent", "static_configs": [{
                "targets": [f"127.0.0.1:{agent_port}"],
                "labels": {"node": "e2e-node", "namespace": "inference", "pod": web_pod}}]}],
        }
        (tmp_path / "prom.yml").write_text(yaml.safe_dump(prom_cfg))
        res = subprocess.run(["promtool", "check", "config", str(tmp_path / "prom.yml")], capture_output=True, text=True)
        assert res.returncode == 0, res.stdout + res.stderr
        procs.append(subprocess.Popen(
            [PROMETHEUS, f"--config.file={tmp_path / 'prom.yml'}", f"--storage.tsdb.path={tmp_path / 'prom-data'}",
             f"--web.listen-address=127.0.0.1:{prom_port}", "--rules.alert.resend-delay=1s",
             "--rules.alert.for-grace-period=1s"],
            stdout=subprocess.DEVNULL, stderr=open(tmp_path / "prom.log", "wb")))  # noqa: SIM115

        for port in (agent_port, dry_port, am_port, prom_port):
            wait_for_port(port, timeout=30)
        prom = f"http://127.0.0.1:{prom_port}"
        _wait(lambda: any(t["health"] == "up" for t in _get_json(f"{prom}/api/v1/targets")["data"]["activeTargets"]),
              20, "Prometheus to scrape the agent")
        assert audit.audit_log(live_store) == []

        # real SYN retransmits on loopback until the alert has fired and both engines decided
        with syn_retransmits(connections=600):
            _wait(lambda: [a for a in _get_json(f"{prom}/api/v1/alerts")["data"]["alerts"] if a["state"] == "firing"],
                  30, "TriscopeTcpRetransmitStorm to fire")
            live_rows = _wait(lambda: [r for r in audit.audit_log(live_store) if r.outcome != "in_progress"],
                              30, "the live engine's decision")
            dry_store = open_store(dry_db)
            dry_rows = _wait(lambda: audit.audit_log(dry_store), 30, "the dry-run engine's decision")
        elapsed = time.monotonic() - t_start

        live = live_rows[0]
        assert (live.rule, live.action, live.outcome) == ("restart-on-retransmit-storm", "rolling_restart", "acted"), live
        assert live.target == "deployment inference/web" and live.trigger_kind == "alert"
        assert live.params["workload"] == {"namespace": "inference", "workload": "Deployment/web", "kind": "Deployment",
                                           "name": "web", "pod": web_pod, "via": "ownerReferences"}
        assert "TriscopeTcpRetransmitStorm firing" in live.trigger
        assert live.response["rollout"]["complete"] is True
        patches = kube.calls("PATCH", "/apis/apps/v1/namespaces/inference/deployments/web")
        assert len(patches) == 1 and patches[0].content_type == "application/strategic-merge-patch+json"
        assert "kubectl.kubernetes.io/restartedAt" in patches[0].body["spec"]["template"]["metadata"]["annotations"]
        kev = _wait(lambda: [e for e in kube.list("events", "inference") if e["reason"] == "RemediationActed"], 10,
                    "the Kubernetes Event")
        assert kev[0]["involvedObject"]["name"] == "web"
        # the pod was read through the API (its ReplicaSet too), by each engine, and only the live one wrote
        assert len(kube.calls("GET", f"/api/v1/namespaces/inference/pods/{web_pod}")) == 2
        assert len(kube.calls("GET", "/apis/apps/v1/namespaces/inference/replicasets/web-")) == 2

        dry = dry_rows[0]
        assert (dry.rule, dry.outcome, dry.dry_run) == ("restart-on-retransmit-storm", "dry_run", True)
        assert dry.target == "deployment inference/web" and dry.params["workload"]["pod"] == web_pod
        tl = _wait(lambda: dry_store.events(node="e2e-node", kinds=["remediation"]), 10, "the timeline event")
        assert tl[0].details["outcome"] == "dry_run"
        dry_store.close()
        assert elapsed < 60, f"end to end took {elapsed:.1f}s"
        # the engine's own metrics pass promtool and count the decision
        with urllib.request.urlopen(f"http://127.0.0.1:{live_port}/metrics", timeout=5) as r:
            text = r.read().decode()
        acted = [ln for ln in text.splitlines()
                 if ln.startswith('triscope_remediation_actions_total{action="rolling_restart",outcome="acted"}')]
        assert acted and float(acted[0].split()[-1]) >= 1
        res = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True)
        assert res.returncode == 0, res.stdout + res.stderr
    finally:
        if live_handle is not None:
            live_handle.stop()
        for p in reversed(procs):
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
        kube.stop()
