"""The agent DaemonSet's exec liveness probe, run as the kubelet would (``HOST_IP`` set) against
the real /metrics server with mutual TLS (``client_auth_type: RequireAndVerifyClientCert``, which
deploy/web-config.example.yaml offers): the probe has no client certificate, and must still tell a
live server (it ends the handshake) from a stuck one (it answers nothing).  The probe against plain
TLS + basic auth is tested in test_deploy_manifests.py."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from tls_support import make_certs

from triscope.agent.exporter import make_sources, serve
from triscope.web.config import load

DAEMONSET = Path(__file__).resolve().parents[2] / "deploy" / "kustomize" / "base" / "agent-daemonset.yaml"


def _probe(port: int) -> list[str]:
    ds = next(d for d in yaml.safe_load_all(DAEMONSET.read_text()) if d and d.get("kind") == "DaemonSet")
    agent = next(c for c in ds["spec"]["template"]["spec"]["containers"] if c["name"] == "agent")
    cmd = agent["livenessProbe"]["exec"]["command"]
    assert cmd[0] == "python3" and "9464" in cmd[-1]
    return [sys.executable, *cmd[1:-1], cmd[-1].replace("9464", str(port))]


@pytest.mark.parametrize("max_version", ["", "  max_version: TLS12\n"])
def test_liveness_probe_passes_with_mutual_tls_and_fails_on_a_stuck_port(tmp_path: Path, max_version: str) -> None:
    certs = make_certs(tmp_path / "certs")
    cfg = tmp_path / "web.yml"
    cfg.write_text(f"tls_server_config:\n  cert_file: {certs.cert}\n  key_file: {certs.key}\n"
                   f"  client_ca_file: {certs.ca}\n  client_auth_type: RequireAndVerifyClientCert\n{max_version}")
    env = {**os.environ, "HOST_IP": "127.0.0.1"}
    process, tick = make_sources()
    server, _ = serve(process, "127.0.0.1", 0, tick, web=load(cfg))
    try:
        r = subprocess.run(_probe(server.server_address[1]), env=env, capture_output=True, text=True, timeout=20)
        assert r.returncode == 0, r.stderr
    finally:
        server.shutdown()
    if max_version:
        return
    with socket.create_server(("127.0.0.1", 0), backlog=8) as stuck:   # listens, never accepts
        r = subprocess.run(_probe(stuck.getsockname()[1]), env=env, capture_output=True, text=True, timeout=20)
        assert r.returncode != 0
