"""Container builds: the agent entrypoint's kernel-header provisioning, run for real on fixture trees,
and the Containerfiles' promises (non-root server image, BCC from Debian, no pip "bcc")."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ENTRY = REPO / "deploy" / "containers" / "agent-entrypoint.sh"
KVER = platform.release()


def run_entry(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    full = {"PATH": os.environ["PATH"], "TRISCOPE_MODULES_DIR": str(tmp_path / "lib-modules"),
            "TRISCOPE_HOST_MODULES": str(tmp_path / "host" / "lib" / "modules"),
            "TRISCOPE_HOST_USR_SRC": str(tmp_path / "host" / "usr" / "src"),
            "TRISCOPE_IMAGE_USR_SRC": str(tmp_path / "image" / "usr" / "src"),
            "TRISCOPE_KHEADERS": str(tmp_path / "no-kheaders.tar.xz"), **env}
    (tmp_path / "lib-modules").mkdir(exist_ok=True)
    return subprocess.run(["sh", str(ENTRY), "echo", "agent-started"], capture_output=True, text=True, env=full,
                          timeout=30)


def test_links_the_nodes_own_headers_when_the_host_has_them(tmp_path: Path) -> None:
    host_build = tmp_path / "host" / "usr" / "src" / f"linux-headers-{KVER}"
    (host_build / "include").mkdir(parents=True)
    host_mods = tmp_path / "host" / "lib" / "modules" / KVER
    host_mods.mkdir(parents=True)
    # the host's link is absolute, pointing into the host's /usr/src
    (host_mods / "build").symlink_to(f"/usr/src/linux-headers-{KVER}")
    out = run_entry(tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "agent-started"          # exec'd the command
    link = tmp_path / "lib-modules" / KVER / "build"
    assert link.resolve() == host_build.resolve()
    assert "headers from: node" in out.stderr


def test_falls_back_to_the_images_generic_headers(tmp_path: Path) -> None:
    src = tmp_path / "image" / "usr" / "src"
    (src / "linux-headers-6.1.0-40-amd64" / "include").mkdir(parents=True)
    (src / "linux-headers-6.1.0-40-common" / "include").mkdir(parents=True)
    (src / "linux-headers-6.1.0-9-amd64").mkdir(parents=True)      # older: sort -V must not pick it
    out = run_entry(tmp_path)
    assert out.returncode == 0, out.stderr
    mods = tmp_path / "lib-modules" / KVER
    assert (mods / "build").resolve().name == "linux-headers-6.1.0-40-amd64"
    assert (mods / "source").resolve().name == "linux-headers-6.1.0-40-common"
    assert "image (linux-headers-6.1.0-40-amd64)" in out.stderr


def test_prefers_kheaders_and_never_fails_without_any_headers(tmp_path: Path) -> None:
    kh = tmp_path / "kheaders.tar.xz"
    kh.write_bytes(b"")
    out = run_entry(tmp_path, TRISCOPE_KHEADERS=str(kh))
    assert out.returncode == 0 and out.stdout.strip() == "agent-started"
    assert not (tmp_path / "lib-modules" / KVER / "build").exists()     # BCC unpacks kheaders itself
    out = run_entry(tmp_path / "lib-modules")   # nothing anywhere: still starts, says so
    assert out.returncode == 0 and "kheaders or none" in out.stderr


def test_containerfiles_keep_their_promises() -> None:
    agent = (REPO / "deploy" / "containers" / "agent.Containerfile").read_text()
    server = (REPO / "deploy" / "containers" / "server.Containerfile").read_text()
    assert "python3-bpfcc" in agent and "libbpfcc" in agent and "linux-headers-amd64" in agent
    assert "--system-site-packages" in agent           # the venv must see Debian's bcc module
    assert "pip install bcc" not in agent               # PyPI's bcc is an unrelated package
    assert "agent-entrypoint.sh" in agent
    assert "USER 10001:10001" in server and "bpfcc" not in server
    for text in (agent, server):
        for line in text.splitlines():
            if line.startswith("COPY") and "--from" not in line:
                src = line.split()[1:-1]
                for s in src:
                    assert (REPO / s).exists(), f"COPY source {s} does not exist"
