"""A small filesystem a test creates, fills and empties: a size-limited tmpfs mounted on a folder
of the test's own (a real kernel filesystem that answers ENOSPC, nothing simulated).

Mounting needs root.  Under ``make test`` (which runs as root, ``.ci/run`` included) a test that
needs one must run: where it cannot be mounted the test **fails** with the reason, it never
skips.  Only a developer's run as an ordinary user (not under ``make test``) skips it.
``make test`` says it is the suite by ``TRISCOPE_SUITE=1`` in the environment.
"""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

PAGE = 4096


def must_run() -> bool:
    """True where a root-only test may not skip: as root, or under ``make test``."""
    return os.geteuid() == 0 or os.environ.get("TRISCOPE_SUITE") == "1"


def cannot(reason: str) -> None:
    """Fail (root, or ``make test``) or skip (an ordinary user's own run) with ``reason``."""
    if must_run():
        pytest.fail(f"{reason} (this test must run under 'make test' and as root; it does not skip)")
    pytest.skip(reason)


@contextlib.contextmanager
def small_tmpfs(where: Path, size: int) -> Iterator[Path]:
    """A tmpfs of ``size`` bytes mounted on ``where`` (created), unmounted afterwards."""
    if os.geteuid() != 0:
        cannot("needs root to mount a small tmpfs")
    where.mkdir(parents=True, exist_ok=True)
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(where)],
                         capture_output=True, text=True)
    if res.returncode != 0:
        cannot(f"cannot mount a tmpfs of {size} bytes on {where}: {res.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill(fs: Path, name: str = "filler") -> Path:
    """Take every free byte of the filesystem at ``fs`` with one file (pages first, then bytes);
    returns the file (remove it to give the space back)."""
    path = fs / name
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        for chunk in (b"\0" * (64 * PAGE), b"\0" * PAGE, b"\0"):
            while True:
                try:
                    if os.write(fd, chunk) < len(chunk):
                        break
                except OSError as e:
                    if e.errno != errno.ENOSPC:
                        raise
                    break
    finally:
        os.close(fd)
    return path


def free_bytes(fs: Path) -> int:
    st = os.statvfs(fs)
    return st.f_bavail * st.f_frsize
