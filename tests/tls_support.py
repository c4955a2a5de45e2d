"""Throwaway certificates for the TLS tests, made by the real ``openssl`` CLI: a CA, a server
certificate for 127.0.0.1 / localhost signed by it, and a client certificate (mutual TLS)."""

from __future__ import annotations

import shutil
import ssl
import subprocess
from dataclasses import dataclass
from pathlib import Path

import bcrypt

OPENSSL = shutil.which("openssl")


@dataclass(frozen=True)
class Certs:
    ca: Path
    cert: Path
    key: Path
    client_cert: Path
    client_key: Path

    def client_context(self, *, with_client_cert: bool = False) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.ca))
        if with_client_cert:
            ctx.load_cert_chain(str(self.client_cert), str(self.client_key))
        return ctx


def _run(*args: str, cwd: Path) -> None:
    assert OPENSSL, "openssl is not installed (scripts/setup-system.sh installs it)"
    subprocess.run([OPENSSL, *args], cwd=cwd, check=True, capture_output=True)


def make_certs(folder: Path) -> Certs:
    folder.mkdir(parents=True, exist_ok=True)
    _run("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2",
         "-subj", "/CN=triscope test CA", "-keyout", "ca.key", "-out", "ca.crt",
         "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
         cwd=folder)
    for name, ext in (("server", "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n"),
                      ("client", "extendedKeyUsage=clientAuth\n")):
        _run("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-subj", f"/CN={name}",
             "-keyout", f"{name}.key", "-out", f"{name}.csr", cwd=folder)
        (folder / f"{name}.ext").write_text(ext)
        _run("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
             "-days", "2", "-out", f"{name}.crt", "-extfile", f"{name}.ext", cwd=folder)
    return Certs(folder / "ca.crt", folder / "server.crt", folder / "server.key", folder / "client.crt",
                 folder / "client.key")


def bcrypt_hash(password: str, rounds: int = 4) -> str:
    """A bcrypt hash as htpasswd -B writes it (cost 4 keeps tests quick; the format is the same)."""
    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds)).decode()
