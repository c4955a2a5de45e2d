"""Huge pages for the agent's code and heap, on this machine's kernel (THP mode madvise here)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from triscope.agent import hugepages as hp

REPO = Path(__file__).resolve().parents[2]
MB = 1 << 20


def test_spans() -> None:
    assert hp.aligned_span(0x41F000, 0x945000, 2 * MB) == (0x600000, 0x800000)
    assert hp.aligned_span(0x41F000, 0x5FF000, 2 * MB) is None
    maps = [hp.Mapping(0x400000, 0x41F000, "r--p", "/usr/bin/py"),
            hp.Mapping(0x41F000, 0x6D2000, "r-xp", "/usr/bin/py"),
            hp.Mapping(0x6D2000, 0x945000, "r--p", "/usr/bin/py"),
            hp.Mapping(0x945000, 0x990000, "rw-p", "/usr/bin/py"),
            hp.Mapping(0x990000, 0xA00000, "rw-p", "")]
    code, lo, hi = hp.text_span(maps, 0x500000) or (None, 0, 0)
    assert code is maps[1] and (lo, hi) == (0x400000, 0x945000)   # header, code, read-only data; not .data
    assert hp.text_span(maps, 0x950000) is None                    # not executable
    assert hp.text_span(maps, 0x10) is None


@pytest.mark.skipif(hp.thp_mode() in ("never", "unavailable"), reason="transparent huge pages are off on this host")
def test_interpreter_code_moves_onto_huge_pages_and_keeps_running() -> None:
    """In a fresh single-threaded interpreter: the code is moved, lands on huge pages, and the
    interpreter goes on running (imports, C extensions, threads) on the moved code."""
    code = (
        "from triscope.agent import hugepages as hp\n"
        "r = hp.remap_text()\n"
        "import json, sqlite3, threading, hashlib\n"
        "t = threading.Thread(target=lambda: sum(range(10**5))); t.start(); t.join()\n"
        "db = sqlite3.connect(':memory:'); db.execute('create table t (x)'); db.execute('insert into t values (1)')\n"
        "print(json.dumps({'moved': r.moved, 'huge': r.huge, 'note': r.note, 'path': r.path,\n"
        "                  'x': db.execute('select x from t').fetchone()[0], 'md5': hashlib.md5(b'a').hexdigest()}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    import json

    got = json.loads(out.stdout)
    assert got["note"] == "" and got["moved"] >= 2 * MB, got
    assert got["huge"] == got["moved"], got          # every moved byte on a huge page
    assert got["x"] == 1 and got["md5"] == "0cc175b9c0f1b6a831c399e269772661"


def test_code_is_not_moved_once_threads_run() -> None:
    import threading

    ev = threading.Event()
    t = threading.Thread(target=ev.wait)
    t.start()
    try:
        r = hp.remap_text()
    finally:
        ev.set()
        t.join()
    assert r.moved == 0 and "single-threaded" in r.note


@pytest.mark.skipif(hp.thp_mode() in ("never", "unavailable"), reason="transparent huge pages are off on this host")
def test_dense_heap_goes_onto_huge_pages_sparse_mappings_do_not() -> None:
    import mmap

    dense = mmap.mmap(-1, 8 * MB, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    sparse = mmap.mmap(-1, 8 * MB, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        for i in range(0, 8 * MB, 4096):
            dense[i] = 1
        for i in range(0, 8 * MB, 64 * 4096):          # 1 page in 64 resident
            sparse[i] = 1
        import ctypes

        def addr(m: mmap.mmap) -> int:
            return ctypes.addressof(ctypes.c_char.from_buffer(m))

        d, s = addr(dense), addr(sparse)
        res = hp.advise_heap()
        assert res.advised >= 2 * MB, res
        assert hp.anon_huge_bytes(d, d + 8 * MB) >= 6 * MB     # whole aligned 2 MiB ranges inside it
        assert hp.anon_huge_bytes(s, s + 8 * MB) == 0          # a sparse mapping does not grow to 2 MiB pages
        assert dense[4096 * 7] == 1 and sparse[64 * 4096] == 1
    finally:
        # the buffers' exported pointers must go before the mappings close
        import gc

        gc.collect()
        dense.close()
        sparse.close()


def _operator_env() -> dict[str, str]:
    """This environment without the heap variables: as an operator who set none of them."""
    return {k: v for k, v in os.environ.items() if k not in hp.HEAP_ENV and k != hp.REEXEC_MARK}


def test_heap_reexec_respects_the_operator_and_runs_once() -> None:
    base = {"PATH": "/usr/bin"}
    assert "PYTHONMALLOC already set" in (hp.heap_reexec_blocker({**base, "PYTHONMALLOC": "pymalloc"}) or "")
    assert "glibc.malloc tunables" in (hp.heap_reexec_blocker({**base, "GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}) or "")
    # an unrelated tunable of the operator's does not stop it (ours are appended to it)
    assert "GLIBC_TUNABLES" not in (hp.heap_reexec_blocker({**base, "GLIBC_TUNABLES": "glibc.pthread.rseq=0"}) or "")
    assert "already started" in (hp.heap_reexec_blocker({**base, hp.REEXEC_MARK: "{}"}) or "")


def test_glibc_version_gate() -> None:
    import platform

    ver = hp.glibc_version()
    if platform.libc_ver()[0] == "glibc":
        assert ver is not None and ver >= (2, 17)
    else:
        assert ver is None


def test_restarted_image_gives_children_the_operators_environment_and_keeps_its_name() -> None:
    """What the restarted agent does first: drop the heap variables from os.environ (the probe
    loader and npu-smi it starts run as the operator started the agent) and take back its name."""
    code = (
        "import os, subprocess\n"
        "from triscope.agent import hugepages as hp\n"
        "ok = hp.after_heap_reexec()\n"
        "child = subprocess.run(['env'], capture_output=True, text=True).stdout\n"
        "print(ok, open('/proc/self/comm').read().strip(), 'PYTHONMALLOC' in child, 'GLIBC_TUNABLES' in child,\n"
        "      hp.REEXEC_MARK in child)\n"
    )
    env = {**os.environ, **hp.HEAP_ENV, hp.REEXEC_MARK: json.dumps({"comm": "triscope", "tunables": None})}
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "triscope", "False", "False", "False"]
    # the operator's own tunables come back as they were
    code2 = ("import os\nfrom triscope.agent import hugepages as hp\nhp.after_heap_reexec()\n"
             "print(os.environ.get('GLIBC_TUNABLES'), os.environ.get('PYTHONMALLOC'))\n")
    env = {**os.environ, "PYTHONMALLOC": "malloc", "GLIBC_TUNABLES": f"glibc.pthread.rseq=0:{hp.HEAP_TUNABLES}",
           hp.REEXEC_MARK: json.dumps({"comm": "", "tunables": "glibc.pthread.rseq=0"})}
    out = subprocess.run([sys.executable, "-c", code2], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["glibc.pthread.rseq=0", "None"], out.stderr


@pytest.mark.skipif(hp.heap_reexec_blocker({}) is not None, reason="no compact heap on this host (THP off or not glibc)")
@pytest.mark.parametrize("operator_env", [{}, {"PYTHONMALLOC": "pymalloc"}])
def test_agent_starts_again_with_objects_on_the_huge_page_heap(tmp_path: Path, operator_env: dict[str, str]) -> None:
    """`triscope agent` as an operator starts it: same PID and name after the restart, the log says
    which heap it runs on, and an operator's own PYTHONMALLOC is left alone."""
    import time

    env = _operator_env()
    triscope = Path(sys.executable).parent / "triscope"
    p = subprocess.Popen([str(triscope), "agent", "--db", f"sqlite:///{tmp_path}/t.db", "--listen", "off", "--no-ebpf",
                          "--spool", str(tmp_path / "spool"), "--duration", "4", "--huge-pages"],
                         env={**env, **operator_env}, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    seen = set()
    try:
        deadline = time.monotonic() + 30
        while p.poll() is None and time.monotonic() < deadline:
            try:
                with open(f"/proc/{p.pid}/environ", "rb") as f, open(f"/proc/{p.pid}/comm") as c:
                    seen.add((b"PYTHONMALLOC=malloc" in f.read(), c.read().strip()))
            except OSError:
                pass
            time.sleep(0.05)
        _out, err = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 0, err
    if operator_env:
        assert "PYTHONMALLOC already set by the operator" in err, err
        assert (True, "triscope") not in seen
    else:
        assert "Python objects on glibc's heap" in err, err
        assert (True, "triscope") in seen        # the same process (PID), restarted with the compact heap, same name


def test_by_default_the_agent_leaves_its_process_alone(tmp_path: Path) -> None:
    """Without --huge-pages: no restart with another allocator (its environment never changes), and
    nothing about huge pages in its log, even at -v (the code remap and heap advice log there)."""
    import time

    env = _operator_env()
    triscope = Path(sys.executable).parent / "triscope"
    p = subprocess.Popen([str(triscope), "agent", "--db", f"sqlite:///{tmp_path}/t.db", "--listen", "off", "--no-ebpf",
                          "--spool", str(tmp_path / "spool"), "--duration", "3", "-v"],
                         env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    environs = []
    try:
        deadline = time.monotonic() + 30
        while p.poll() is None and time.monotonic() < deadline:
            try:
                with open(f"/proc/{p.pid}/environ", "rb") as f:
                    environs.append(f.read())
            except OSError:
                pass
            time.sleep(0.1)
        _out, err = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 0, err
    assert environs and not any(b"PYTHONMALLOC=malloc" in e or hp.REEXEC_MARK.encode() in e for e in environs)
    assert "huge pages" not in err.lower(), err


def test_agent_run_from_another_program_is_not_started_again(tmp_path: Path) -> None:
    """main(["agent", ...]) inside another program must not execv that program's command line."""
    env = _operator_env()
    code = ("import os, sys\nfrom triscope.cli import main\nprint('pid', os.getpid(), flush=True)\n"
            f"rc = main(['agent', '--db', 'sqlite:///{tmp_path}/t.db', '--listen', 'off', '--no-ebpf', "
            f"'--spool', '{tmp_path}/spool', '--duration', '2', '--huge-pages'])\nprint('rc', rc)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("pid ") == 1 and "rc 0" in out.stdout, out.stdout
    assert "called from another program" in out.stderr, out.stderr


@pytest.mark.skipif(hp.heap_reexec_blocker({}) is not None, reason="no compact heap on this host (THP off or not glibc)")
def test_agent_with_stdout_closed_still_starts_again(tmp_path: Path) -> None:
    """Some launchers start daemons with descriptor 1 closed (sys.stdout is None then)."""
    env = _operator_env()
    triscope = Path(sys.executable).parent / "triscope"
    cmd = (f"exec 1>&-; exec {triscope} agent --db sqlite:///{tmp_path}/t.db --listen off --no-ebpf "
           f"--spool {tmp_path}/spool --duration 2 --huge-pages")
    out = subprocess.run(["sh", "-c", cmd], env=env, capture_output=False, stderr=subprocess.PIPE, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert "Python objects on glibc's heap" in out.stderr, out.stderr
