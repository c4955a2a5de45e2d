"""Compile and attach the probes in a short-lived child, hand the fds to the agent.

The child (``python -m agent.ebpf.loader CONFIG FD``) imports bcc, compiles ``probes.bpf.c`` once
with the sections this kernel supports, attaches every planned tracepoint, sends the map fds and
the attachments' fds (perf-event fds of classic tracepoints, raw-tracepoint fds) over a Unix
socket with ``socket.send_fds`` and leaves with ``os._exit`` — bcc's own cleanup would detach what
it just handed over.  The parent never imports bcc, so LLVM never lives in the agent.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from triscope.agent.ebpf.bpfsys import possible_cpus
from triscope.agent.ebpf.discover import DEFAULT_BCC_PATH
from triscope.agent.ebpf.layout import DMA_KEYS_MAX, MAPS, PEERS_MAX, WF_THREADS_MAX, WF_WAITS_MAX

SOURCE = Path(__file__).with_name("probes.bpf.c")
# compiled as one text after SOURCE: sections of their own, switched on by their defines
EXTRA_SOURCES = (Path(__file__).with_name("waitfor.bpf.c"),)
# the directory the ``triscope`` package was imported from: the child imports the same code
_ROOT = Path(sys.modules["triscope"].__file__ or ".").parent.parent


@dataclass
class Attachment:
    probe: str
    tracepoint: str
    kind: str
    ok: bool
    error: str = ""
    fd: int = -1


@dataclass
class LoadResult:
    fatal: str = ""                       # set when nothing could be loaded (bcc missing, compile error)
    error: str = ""                       # the detail (last lines of the child's stderr)
    maps: dict[str, int] = field(default_factory=dict)
    attachments: list[Attachment] = field(default_factory=list)
    loaded: dict[str, bool] = field(default_factory=dict)   # load_only mode: function -> verifier ok
    load_errors: dict[str, str] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)

    def close(self) -> None:
        for fd in list(self.maps.values()) + [a.fd for a in self.attachments if a.fd >= 0]:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.maps.clear()
        for a in self.attachments:
            a.fd = -1


def run_loader(defines: list[str], attach: list[dict[str, str]], *, python: str | None = None,
               bcc_path: str | None = DEFAULT_BCC_PATH, timeout: float = 60.0,
               load_only: list[str] | None = None, extra_cflags: list[str] | None = None,
               env: dict[str, str] | None = None, source: str | Path | None = None,
               maps: list[str] | None = None, counters_rows: bool = True) -> LoadResult:
    """Spawn the loader child and receive its fds.  Never raises for load problems: see ``fatal``.

    ``attach``: ``[{"probe", "tp", "kind" ("tracepoint"|"raw"), "fn"}]``; kinds ``uprobe`` and
    ``uretprobe`` also carry ``path`` (a library or executable) and ``sym`` (the symbol): their
    perf-event fds come back like a tracepoint's (closing them detaches); with ``skip_endbr64``
    a function that starts with ``endbr64`` is probed just past it (its ``tp`` comes back + "+4").
    ``load_only``: functions to load as tracepoint programs without attaching (verifier check).
    ``counters_rows``: the counters as one mmapable row per possible CPU (Linux 5.5+), else the
    per-CPU array of older kernels (``triscope.agent.ebpf.bpfsys.Counters`` reads either).
    """

    t0 = time.monotonic()
    cfg = {
        "source": [str(source)] if source else [str(p) for p in (SOURCE, *EXTRA_SOURCES)],
        "bcc_path": bcc_path or "",
        "cflags": [f"-D{d}" for d in defines] + [f"-DPEERS_MAX={PEERS_MAX}", f"-DDMA_KEYS_MAX={DMA_KEYS_MAX}",
                                                 f"-DWF_THREADS_MAX={WF_THREADS_MAX}", f"-DWF_WAITS_MAX={WF_WAITS_MAX}"]
        + ([f"-DCOUNTERS_ROWS={possible_cpus()}"] if counters_rows else []) + list(extra_cflags or []),
        "attach": attach,
        "load_only": load_only or [],
        "maps": list(maps if maps is not None else MAPS),
    }
    parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    child_env = dict(os.environ if env is None else env)
    child_env["PYTHONPATH"] = str(_ROOT) + (os.pathsep + child_env["PYTHONPATH"] if child_env.get("PYTHONPATH") else "")
    res = LoadResult()
    with tempfile.TemporaryFile() as errf, parent:
        try:
            proc = subprocess.Popen(
                [python or sys.executable, "-m", "triscope.agent.ebpf.loader", json.dumps(cfg), str(child.fileno())],
                pass_fds=[child.fileno()], stdin=subprocess.DEVNULL, stdout=errf, stderr=errf,
                env=child_env, close_fds=True,
            )
        except OSError as e:
            child.close()
            res.fatal, res.error = "spawn", f"cannot start the loader: {e}"
            return res
        child.close()
        parent.settimeout(timeout)
        msg, fds = b"", list[int]()
        try:
            msg, fds, flags, _ = socket.recv_fds(parent, 1 << 20, 256)
        except (TimeoutError, OSError) as e:
            res.fatal, res.error = "timeout", f"loader did not answer: {e}"
        finally:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        errf.seek(0)
        stderr = errf.read().decode(errors="replace")
    for fd in fds:
        os.set_inheritable(fd, False)
    if not msg:
        res.fatal = res.fatal or "crashed"
        res.error = (res.error + "\n" if res.error else "") + (stderr[-2000:] or f"loader exited with {proc.returncode}")
        for fd in fds:
            os.close(fd)
        return res
    data = json.loads(msg)
    res.timings = dict(data.get("timings", {}))
    res.timings["total"] = time.monotonic() - t0
    if data.get("fatal"):
        res.fatal = data["fatal"]
        res.error = data.get("error", "") + ("\n" + stderr[-2000:] if stderr.strip() else "")
        for fd in fds:
            os.close(fd)
        return res
    for name, idx in data.get("maps", {}).items():
        res.maps[name] = fds[idx]
    for a in data.get("attach", []):
        idx = a.get("fd_index", -1)
        res.attachments.append(Attachment(a["probe"], a["tp"], a["kind"], bool(a["ok"]), a.get("error", ""),
                                          fds[idx] if idx >= 0 else -1))
    res.loaded = {k: bool(v) for k, v in data.get("loaded", {}).items()}
    res.load_errors = dict(data.get("load_errors", {}))
    used = set(res.maps.values()) | {a.fd for a in res.attachments}
    for fd in fds:
        if fd not in used:
            os.close(fd)
    return res


# ------------------------------------------------------------------------------------------- child
def _child(cfg: dict, sock: socket.socket) -> None:
    timings: dict[str, float] = {}
    t0 = time.monotonic()

    def send(payload: dict, fds: list[int] | None = None) -> None:
        payload["timings"] = timings
        socket.send_fds(sock, [json.dumps(payload).encode()], fds or [])

    try:
        if cfg["bcc_path"]:
            sys.path.insert(0, cfg["bcc_path"])
        from bcc import BPF
    except Exception as e:  # noqa: BLE001 - reported to the parent
        send({"fatal": "bcc", "error": f"{type(e).__name__}: {e}"})
        return
    timings["import_bcc"] = time.monotonic() - t0
    t1 = time.monotonic()
    try:
        srcs = cfg["source"] if isinstance(cfg["source"], list) else [cfg["source"]]
        text = "\n".join(Path(x).read_text() for x in srcs)
        b = BPF(text=text, cflags=cfg["cflags"])
    except Exception as e:  # noqa: BLE001 - BCC reports a failed compile as a bare Exception: told to the parent
        send({"fatal": "compile", "error": f"{type(e).__name__}: {e}"})
        return
    timings["compile"] = time.monotonic() - t1
    t2 = time.monotonic()
    fds: list[int] = []
    results = []
    for a in cfg["attach"]:
        r = {"probe": a["probe"], "tp": a["tp"], "kind": a["kind"], "ok": False, "fd_index": -1}
        try:
            if a["kind"] == "raw":
                ev = a["tp"].split(":", 1)[1]
                b.attach_raw_tracepoint(tp=ev, fn_name=a["fn"])
                fd = b.raw_tracepoint_fds[ev.encode()]
            elif a["kind"] in ("uprobe", "uretprobe"):
                before = set(b.uprobe_fds)
                attach_fn = b.attach_uprobe if a["kind"] == "uprobe" else b.attach_uretprobe
                past = _past_endbr64(BPF, a["path"], a["sym"]) if a.get("skip_endbr64") else None
                if past is None:
                    attach_fn(name=a["path"], sym=a["sym"], fn_name=a["fn"])
                else:
                    attach_fn(name=a["path"], addr=past, fn_name=a["fn"])
                    r["tp"] = a["tp"] + "+4"
                fd = next(v for k, v in b.uprobe_fds.items() if k not in before)
            else:
                b.attach_tracepoint(tp=a["tp"], fn_name=a["fn"])
                fd = b.tracepoint_fds[a["tp"].encode()]
            r["ok"] = True
            r["fd_index"] = len(fds)
            fds.append(fd)
        except Exception as e:  # noqa: BLE001 - BCC's attach errors are bare Exceptions: each probe's told to the parent
            r["error"] = f"{type(e).__name__}: {e}"
        results.append(r)
    loaded, load_errors = {}, {}
    for fn in cfg.get("load_only", []):
        try:
            b.load_func(fn, BPF.TRACEPOINT)
            loaded[fn] = True
        except Exception as e:  # noqa: BLE001 - BCC's load errors are bare Exceptions: each told to the parent
            loaded[fn] = False
            load_errors[fn] = f"{type(e).__name__}: {e}"
    timings["attach"] = time.monotonic() - t2
    maps = {}
    for name in cfg["maps"]:
        try:
            t = b.get_table(name)
        except Exception:  # noqa: BLE001 - the section is off
            continue
        maps[name] = len(fds)
        fds.append(t.map_fd)
    timings["child_total"] = time.monotonic() - t0
    send({"maps": maps, "attach": results, "loaded": loaded, "load_errors": load_errors}, fds)


def _past_endbr64(bpf_cls: type, path: str, sym: str) -> int | None:
    """The address just past a function's first instruction when that is ``endbr64`` (the x86_64
    CET landing pad: it changes no register and no memory), else None.  The kernel emulates some
    first instructions of a uprobe (push, nop, jumps) but single-steps others out of line, endbr64
    among them: about ten times the cost on a VM (bench/bench_cuda_uprobes.py); a probe just past
    it sees the same registers and stack."""
    try:
        module, off = bpf_cls._check_path_symbol(path, sym, None, -1)  # type: ignore[attr-defined]
        with open(module, "rb") as f:
            f.seek(off)
            if f.read(4) != b"\xf3\x0f\x1e\xfa":
                return None
        addrs = bpf_cls.get_user_addresses(path, f"^{sym}$")  # type: ignore[attr-defined]
        return next(iter(addrs)) + 4 if len(addrs) == 1 else None
    except Exception:  # noqa: BLE001 - BCC reports a symbol it cannot resolve as a bare Exception: probe at the symbol
        return None


def main(argv: list[str]) -> None:
    cfg = json.loads(argv[0])
    sock = socket.socket(fileno=int(argv[1]))
    try:
        _child(cfg, sock)
    except BaseException as e:  # noqa: BLE001 - the loader child tells its parent why it crashed, whatever it was
        with contextlib.suppress(Exception):
            socket.send_fds(sock, [json.dumps({"fatal": "crashed", "error": f"{type(e).__name__}: {e}"}).encode()], [])
    sys.stdout.flush()
    sys.stderr.flush()
    # bcc's atexit cleanup would detach the tracepoints whose fds the agent now holds
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1:])
