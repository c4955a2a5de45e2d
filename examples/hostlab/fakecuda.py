"""The stand-in CUDA driver library (``fakecuda.c``): build it, load it, drive it from a child process.

``build(dir)`` compiles ``fakecuda.c`` with gcc into ``<dir>/libcuda.so.1`` (so ``/proc/PID/maps``
of a process that loads it shows a ``libcuda.so.1`` path, as the real driver's does), reusing it
while the source's hash is unchanged.  ``FakeCuda`` calls it through ctypes with the driver's
signatures.  ``Child`` runs ``python -m examples.hostlab.fakecuda child LIB``: a real process that
loads the library and calls it on command (one JSON object a line each way), with a second thread
that never calls the driver — what the uprobe tests and the lab track.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

SOURCE = Path(__file__).with_name("fakecuda.c")
REPO = Path(__file__).resolve().parents[2]
LIBNAME = "libcuda.so.1"


def build(directory: str | os.PathLike[str], cflags: tuple[str, ...] = ("-O2",)) -> Path:
    """``<directory>/libcuda.so.1`` compiled from ``fakecuda.c`` (again only when the source or
    the flags changed).  ``cflags``: the optimisation flags (they decide each entry point's first
    instruction, which decides what a uprobe there costs: bench/bench_cuda_uprobes.py)."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    lib = d / LIBNAME
    stamp = d / (LIBNAME + ".sha256")
    digest = hashlib.sha256(SOURCE.read_bytes() + " ".join(cflags).encode()).hexdigest()
    if lib.exists() and stamp.exists() and stamp.read_text().strip() == digest:
        return lib
    tmp = d / (LIBNAME + f".tmp{os.getpid()}")
    subprocess.run(["gcc", *cflags, "-g0", "-shared", "-fPIC", "-pthread", "-Wall", "-o", str(tmp), str(SOURCE)],
                   check=True, capture_output=True, text=True)
    os.replace(tmp, lib)           # a process that mapped the old file keeps its inode
    stamp.write_text(digest + "\n")
    return lib


_u = ctypes.c_uint
_sz = ctypes.c_size_t
_ptr = ctypes.c_void_p
_dptr = ctypes.c_ulonglong
_SIGS: dict[str, tuple[Any, list[Any]]] = {
    "cuInit": (ctypes.c_int, [_u]),
    "cuCtxSynchronize": (ctypes.c_int, []),
    "cuStreamSynchronize": (ctypes.c_int, [_ptr]),
    "cuStreamSynchronize_ptsz": (ctypes.c_int, [_ptr]),
    "cuEventCreate": (ctypes.c_int, [ctypes.POINTER(_ptr), _u]),
    "cuEventRecord": (ctypes.c_int, [_ptr, _ptr]),
    "cuEventSynchronize": (ctypes.c_int, [_ptr]),
    "cuEventDestroy_v2": (ctypes.c_int, [_ptr]),
    "cuMemAlloc_v2": (ctypes.c_int, [ctypes.POINTER(_dptr), _sz]),
    "cuMemHostAlloc": (ctypes.c_int, [ctypes.POINTER(_ptr), _sz, _u]),
    "cuMemAllocHost_v2": (ctypes.c_int, [ctypes.POINTER(_ptr), _sz]),
    "cuMemFreeHost": (ctypes.c_int, [_ptr]),
    "cuMemHostRegister_v2": (ctypes.c_int, [_ptr, _sz, _u]),
    "cuMemHostUnregister": (ctypes.c_int, [_ptr]),
    "cuMemcpyHtoD_v2": (ctypes.c_int, [_dptr, _ptr, _sz]),
    "cuMemcpyHtoD_v2_ptds": (ctypes.c_int, [_dptr, _ptr, _sz]),
    "cuMemcpyHtoDAsync_v2": (ctypes.c_int, [_dptr, _ptr, _sz, _ptr]),
    "cuMemcpyHtoDAsync_v2_ptsz": (ctypes.c_int, [_dptr, _ptr, _sz, _ptr]),
    "cuMemcpyDtoH_v2": (ctypes.c_int, [_ptr, _dptr, _sz]),
    "cuMemcpyDtoH_v2_ptds": (ctypes.c_int, [_ptr, _dptr, _sz]),
    "cuMemcpyDtoHAsync_v2": (ctypes.c_int, [_ptr, _dptr, _sz, _ptr]),
    "cuMemcpyDtoHAsync_v2_ptsz": (ctypes.c_int, [_ptr, _dptr, _sz, _ptr]),
    "cuMemcpy": (ctypes.c_int, [_dptr, _dptr, _sz]),
    "cuMemcpy_ptds": (ctypes.c_int, [_dptr, _dptr, _sz]),
    "cuMemcpyAsync": (ctypes.c_int, [_dptr, _dptr, _sz, _ptr]),
    "cuMemcpyAsync_ptsz": (ctypes.c_int, [_dptr, _dptr, _sz, _ptr]),
    "cuLaunchKernel": (ctypes.c_int, [_ptr, _u, _u, _u, _u, _u, _u, _u, _ptr, _ptr, _ptr]),
    "cuLaunchKernel_ptsz": (ctypes.c_int, [_ptr, _u, _u, _u, _u, _u, _u, _u, _ptr, _ptr, _ptr]),
    "fake_set_sync_mode": (None, [ctypes.c_int]),
    "fake_set_block_ns": (None, [ctypes.c_ulonglong]),
    "fake_set_bandwidth": (None, [ctypes.c_double, ctypes.c_double]),
    "fake_queued_ns": (ctypes.c_ulonglong, []),
    "fake_busy_ratio": (ctypes.c_double, []),
}


class FakeCuda:
    """The library loaded into this process, every export typed (``lib.cuCtxSynchronize()``...)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = str(path)
        self.lib = ctypes.CDLL(self.path)
        for name, (res, args) in _SIGS.items():
            fn = getattr(self.lib, name)
            fn.restype, fn.argtypes = res, args

    def __getattr__(self, name: str) -> Any:
        return getattr(self.lib, name)

    def check(self, rc: int, what: str) -> None:
        if rc != 0:
            raise RuntimeError(f"{what}: CUresult {rc}")


# ------------------------------------------------------------------------------------- the child
def _serve(path: str) -> None:  # noqa: C901 - one flat dispatch over the commands
    cu = FakeCuda(path)
    cu.check(cu.cuInit(0), "cuInit")
    dev = _dptr()
    cu.check(cu.cuMemAlloc_v2(ctypes.byref(dev), 1 << 30), "cuMemAlloc_v2")
    idle_tid = [0]
    started = threading.Event()

    def idle() -> None:                        # a thread of the process that never calls the driver
        idle_tid[0] = threading.get_native_id()
        started.set()
        x = 0
        while True:                            # a little CPU work, mostly asleep
            x = sum(range(1000)) + x % 7
            time.sleep(0.005)

    threading.Thread(target=idle, daemon=True).start()
    started.wait()
    buffers: dict[int, tuple[str, int, int, Any]] = {}   # id -> (kind, address, bytes, keep-alive)
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd["op"]
        out: dict[str, Any] = {"ok": True}
        t0, c0 = time.perf_counter_ns(), time.thread_time_ns()
        if op == "hello":
            out.update(pid=os.getpid(), tid=threading.get_native_id(), idle_tid=idle_tid[0], dev=dev.value)
        elif op == "config":
            if "block_ns" in cmd:
                cu.fake_set_block_ns(int(cmd["block_ns"]))
            if "blocking" in cmd:
                cu.fake_set_sync_mode(int(cmd["blocking"]))
            cu.fake_set_bandwidth(float(cmd.get("staging_bw", 0)), float(cmd.get("dma_bw", 0)))
        elif op == "launch":
            fn = getattr(cu, cmd.get("sym", "cuLaunchKernel"))
            for _ in range(int(cmd.get("n", 1))):
                cu.check(fn(None, int(cmd.get("grid", 1)), 1, 1, 128, 1, 1, 0, None, None, None), "launch")
        elif op == "sync":
            sym = cmd.get("sym", "cuCtxSynchronize")
            if sym == "cuCtxSynchronize":
                cu.check(cu.cuCtxSynchronize(), sym)
            elif sym == "cuEventSynchronize":
                ev = _ptr()
                cu.check(cu.cuEventCreate(ctypes.byref(ev), 0), "cuEventCreate")
                cu.check(cu.cuEventRecord(ev, None), "cuEventRecord")
                t0, c0 = time.perf_counter_ns(), time.thread_time_ns()
                cu.check(cu.cuEventSynchronize(ev), sym)
                cu.cuEventDestroy_v2(ev)
            else:
                cu.check(getattr(cu, sym)(None), sym)
        elif op == "alloc":
            kind, n = cmd["kind"], int(cmd["bytes"])
            p = _ptr()
            keep: Any = None
            if kind == "hostalloc":
                cu.check(cu.cuMemHostAlloc(ctypes.byref(p), n, 0), kind)
            elif kind == "allochost":
                cu.check(cu.cuMemAllocHost_v2(ctypes.byref(p), n), kind)
            else:                                  # pageable; "register" pins it afterwards
                keep = ctypes.create_string_buffer(n)
                p = _ptr(ctypes.addressof(keep))
                if kind == "register":
                    cu.check(cu.cuMemHostRegister_v2(p, n, 0), kind)
            bid = len(buffers) + 1
            buffers[bid] = (kind, int(p.value or 0), n, keep)
            out.update(id=bid, ptr=int(p.value or 0))
        elif op == "free":
            kind, addr, _n, _keep = buffers[int(cmd["id"])]
            if kind in ("hostalloc", "allochost"):
                cu.check(cu.cuMemFreeHost(_ptr(addr)), "cuMemFreeHost")
                del buffers[int(cmd["id"])]
            elif kind == "register":
                cu.check(cu.cuMemHostUnregister(_ptr(addr)), "cuMemHostUnregister")
                buffers[int(cmd["id"])] = ("pageable", addr, _n, _keep)
        elif op in ("h2d", "d2h", "memcpy"):
            _kind, addr, n, _keep = buffers[int(cmd["id"])]
            addr += int(cmd.get("offset", 0))
            n = int(cmd.get("bytes", n))
            sym = cmd.get("sym", {"h2d": "cuMemcpyHtoDAsync_v2", "d2h": "cuMemcpyDtoHAsync_v2"}.get(op, "cuMemcpyAsync"))
            fn = getattr(cu, sym)
            is_async = "Async" in sym
            if op == "h2d":
                args: list[Any] = [dev.value, _ptr(addr), n]
            elif op == "d2h":
                args = [_ptr(addr), dev.value, n]
            else:
                args = [dev.value, addr, n] if cmd.get("to_device", True) else [addr, dev.value, n]
            t0, c0 = time.perf_counter_ns(), time.thread_time_ns()
            for _ in range(int(cmd.get("n", 1))):
                cu.check(fn(*args, None) if is_async else fn(*args), sym)
        elif op == "busy":
            out.update(ratio=cu.fake_busy_ratio(), queued_ns=cu.fake_queued_ns())
        elif op == "exit":
            print(json.dumps(out), flush=True)
            return
        else:
            out = {"ok": False, "error": f"unknown op {op}"}
        out.update(ns=time.perf_counter_ns() - t0, cpu_ns=time.thread_time_ns() - c0)
        print(json.dumps(out), flush=True)


class Child:
    """A process that loads the library and calls it on command: ``call("sync", sym=...)``."""

    def __init__(self, lib: str | os.PathLike[str], python: str | None = None) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        self.proc = subprocess.Popen([python or sys.executable, "-m", "examples.hostlab.fakecuda", "child", str(lib)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=REPO)
        hello = self.call("hello")
        self.pid: int = hello["pid"]
        self.tid: int = hello["tid"]
        self.idle_tid: int = hello["idle_tid"]

    def call(self, op: str, **kw: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"op": op, **kw}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"fakecuda child exited ({self.proc.wait()})")
        out: dict[str, Any] = json.loads(line)
        if not out.get("ok"):
            raise RuntimeError(out.get("error", "failed"))
        return out

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.call("exit")
                self.proc.wait(5)
            except (OSError, RuntimeError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> Child:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "child":
        _serve(sys.argv[2])
    elif len(sys.argv) == 3 and sys.argv[1] == "build":
        print(build(sys.argv[2]))
    else:
        sys.exit("usage: python -m examples.hostlab.fakecuda build DIR | child LIB")
