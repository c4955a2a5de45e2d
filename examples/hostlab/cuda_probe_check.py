"""Device check of the CUDA driver uprobes (``CudaCalls``) on a real GPU host with PyTorch.

    . examples/workload/h200_setup.sh; OUT=/tmp/out python3 -m examples.hostlab.cuda_probe_check
    .venv/bin/python -m examples.hostlab.cuda_probe_check --stand-in     # the same run on the CPU host lab

A child process does PyTorch work in phases (pinned H2D copies: ``pin_memory()`` +
``.to('cuda', non_blocking=True)``; pageable H2D copies; ``torch.cuda.synchronize()`` after
matmuls; ``.item()``; 10,000 small kernel launches; D2H copies).  Around each phase the check reads
``CudaCalls`` (launch probe on) and prints which libcuda entry points fired (counts), the
sync/copy seconds and bytes, the pinned/pageable split it derived, the launches, and which
threads drove the GPU; then the probes' cost per call on the real library (a C loop calling
entry points that return at once without a context, with and without the probes:
``bench/bench_cuda_uprobes.py``), the first bytes of each probed entry point (the instruction a
uprobe lands on decides its cost: emulated or single-stepped), and where the pinned, pageable and
device pointers fall in the child's ``/proc/PID/maps``.  Writes ``cuda_probe_check.json`` to
``$OUT`` (or ``--out``).  ``--stand-in``: the same phases on the stand-in driver
(``fakecuda.c``) without PyTorch.  Each part is caught and reported; the whole run stays under
~90 s.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import select
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import asdict
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
PHASES = ["pinned_h2d", "pageable_h2d", "synchronize", "item", "launches", "d2h"]
MB = 1 << 20

WORKER = r'''
import json, os, sys, threading, time
backend, lib = sys.argv[1], sys.argv[2]

def where(addr):
    """The /proc/self/maps line holding an address."""
    with open("/proc/self/maps") as f:
        for ln in f:
            a, b = (int(x, 16) for x in ln.split()[0].split("-"))
            if a <= addr < b:
                return ln.strip()
    return ""

if backend == "torch":
    import torch
    dev = torch.zeros(1, device="cuda"); torch.cuda.synchronize()
    def pinned_h2d():
        x = torch.empty(16 << 20, dtype=torch.float32).pin_memory()
        for _ in range(20):
            x.to("cuda", non_blocking=True)
        torch.cuda.synchronize()
        return {"copies": 20, "bytes": 20 * x.nbytes, "ptr_maps": where(x.data_ptr())}
    def pageable_h2d():
        y = torch.empty(16 << 20, dtype=torch.float32)
        for _ in range(20):
            y.to("cuda")
        torch.cuda.synchronize()
        return {"copies": 20, "bytes": 20 * y.nbytes, "ptr_maps": where(y.data_ptr())}
    a = torch.randn(4096, 4096, device="cuda")
    def synchronize():
        for _ in range(10):
            a @ a
            torch.cuda.synchronize()
        return {"syncs": 10, "device_ptr_maps": where(a.data_ptr())}
    def item():
        return {"items": 200, "sum": sum((a[:8, :8].sum()).item() for _ in range(200))}
    def launches():
        s = torch.zeros(1, device="cuda")
        for _ in range(10000):
            s.add_(1)
        torch.cuda.synchronize()
        return {"launches": 10000}
    def d2h():
        g = torch.randn(16 << 20, device="cuda")
        for _ in range(5):
            g.cpu()
        h = torch.empty(16 << 20, pin_memory=True)
        for _ in range(5):
            h.copy_(g, non_blocking=True)
        torch.cuda.synchronize()
        return {"pageable_copies": 5, "pinned_copies": 5, "bytes": 10 * g.nbytes}
else:
    import ctypes
    from examples.hostlab.fakecuda import FakeCuda
    cu = FakeCuda(lib); cu.cuInit(0); cu.fake_set_block_ns(200_000); cu.fake_set_bandwidth(2e9, 25e9)
    dp = ctypes.c_ulonglong(); cu.cuMemAlloc_v2(ctypes.byref(dp), 1 << 30)
    def pinned_h2d():
        p = ctypes.c_void_p(); cu.cuMemHostAlloc(ctypes.byref(p), 64 << 20, 0)
        for _ in range(20):
            cu.cuMemcpyHtoDAsync_v2(dp.value, p, 64 << 20, None)
        cu.cuCtxSynchronize()
        return {"copies": 20, "bytes": 20 * (64 << 20), "ptr_maps": where(p.value)}
    def pageable_h2d():
        y = ctypes.create_string_buffer(64 << 20)
        for _ in range(20):
            cu.cuMemcpyHtoD_v2(dp.value, y, 64 << 20)
        return {"copies": 20, "bytes": 20 * (64 << 20), "ptr_maps": where(ctypes.addressof(y))}
    def synchronize():
        for _ in range(10):
            cu.cuLaunchKernel(None, 100, 1, 1, 128, 1, 1, 0, None, None, None)
            cu.cuCtxSynchronize()
        return {"syncs": 10, "device_ptr_maps": where(dp.value)}
    def item():
        out = ctypes.create_string_buffer(4)
        for _ in range(200):
            cu.cuLaunchKernel(None, 1, 1, 1, 128, 1, 1, 0, None, None, None)
            cu.cuMemcpyDtoHAsync_v2(out, dp.value, 4, None)
            cu.cuStreamSynchronize(None)
        return {"items": 200}
    def launches():
        for _ in range(10000):
            cu.cuLaunchKernel(None, 0, 1, 1, 128, 1, 1, 0, None, None, None)
        cu.cuCtxSynchronize()
        return {"launches": 10000}
    def d2h():
        g = ctypes.create_string_buffer(16 << 20)
        for _ in range(5):
            cu.cuMemcpyDtoH_v2(g, dp.value, 16 << 20)
        return {"pageable_copies": 5, "bytes": 5 * (16 << 20)}
phases = {f.__name__: f for f in (pinned_h2d, pageable_h2d, synchronize, item, launches, d2h)}
print(json.dumps({"pid": os.getpid(), "tid": threading.get_native_id()}), flush=True)
for line in sys.stdin:
    name = line.strip()
    t0 = time.perf_counter()
    try:
        out = {"ok": True, "evidence": phases[name]()}
    except Exception as e:
        out = {"ok": False, "error": f"{type(e).__name__}: {e}"}
    out.update(phase=name, wall_s=time.perf_counter() - t0, tid=threading.get_native_id())
    print(json.dumps(out), flush=True)
'''


def _line(proc: subprocess.Popen, timeout: float, err: Path) -> dict[str, Any]:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    if not ready:
        raise TimeoutError(f"no answer in {timeout:.0f} s")
    line = proc.stdout.readline()
    if not line:
        raise RuntimeError(f"worker exited ({proc.wait()}): {err.read_text()[-2000:] if err.exists() else ''}")
    out: dict[str, Any] = json.loads(line)
    return out


def _sum(api: dict[int, Any]) -> dict[str, Any]:
    """Per phase: the ApiTime fields summed over threads, and who drove."""
    tot: dict[str, Any] = {}
    for t in api.values():
        for k, v in asdict(t).items():
            if k in ("tid", "tgid", "sync_open", "pinned_ranges_complete") or v is None:
                continue
            tot[k] = round(tot.get(k, 0) + v, 6)
    tot["driving_tids"] = sorted(api)
    tot["pinned_ranges_complete"] = all(t.pinned_ranges_complete for t in api.values()) if api else None
    return tot


def symbol_heads(path: str, names: list[str]) -> dict[str, str]:
    """The first 8 bytes (hex) of each named function in an ELF64 shared object's dynamic symbols."""
    data = Path(path).read_bytes()
    phoff, shoff = struct.unpack_from("<QQ", data, 0x20)
    phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", data, 0x36)
    loads = []
    for i in range(phnum):
        p_type, _fl, p_off, p_vaddr, _pa, p_filesz = struct.unpack_from("<IIQQQQ", data, phoff + i * phentsize)
        if p_type == 1:
            loads.append((p_vaddr, p_off, p_filesz))
    secs = [struct.unpack_from("<IIQQQQII", data, shoff + i * shentsize) for i in range(shnum)]
    want, out = set(names), {}
    for _n, sh_type, _f, _a, off, size, link, _i in secs:
        if sh_type != 11:                                         # SHT_DYNSYM
            continue
        stroff = secs[link][4]
        for j in range(size // 24):
            st_name, _info, _o, _shndx, value, _size = struct.unpack_from("<IBBHQQ", data, off + j * 24)
            name = data[stroff + st_name:data.index(b"\0", stroff + st_name)].decode(errors="replace")
            if name in want and value:
                for va, po, fs in loads:
                    if va <= value < va + fs:
                        out[name] = data[value - va + po:value - va + po + 8].hex(" ")
    return out


def _insn(head: str) -> str:
    b = bytes.fromhex(head.replace(" ", ""))
    if b[:4] == b"\xf3\x0f\x1e\xfa":
        return "endbr64 (probed just past it)"
    if b[:1] in (b"\x55", b"\x53") or (b[:1] == b"\x41" and 0x50 <= b[1] <= 0x57):
        return "push (emulated)"
    if b[:1] == b"\xe9":
        return "jmp (emulated)"
    return "other (probably single-stepped)"


def main(argv: list[str] | None = None) -> int:  # noqa: C901 - one straight run, each part caught
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT", ""))
    ap.add_argument("--stand-in", action="store_true", help="the stand-in driver instead of PyTorch on a GPU")
    ap.add_argument("--phase-timeout", type=float, default=20.0)
    a = ap.parse_args(argv)
    t_start = time.monotonic()
    sys.path.insert(0, str(REPO))
    res: dict[str, Any] = {"machine": f"{platform.node()} {platform.release()} python {platform.python_version()}",
                           "phases": {}, "errors": []}
    worker: subprocess.Popen | None = None
    cc = None
    lib = ""
    tmp = tempfile.mkdtemp(prefix="cuda-check-")
    errf = Path(tmp, "worker.err")
    try:
        from triscope.agent.collectors.cudacalls import SYMBOLS, CudaCalls

        if a.stand_in:
            from examples.hostlab.fakecuda import build
            lib = str(build(tmp))
        cc = CudaCalls(launch_probe=True, libraries=[lib] if lib else (), search_host=not lib)
        res["status_at_start"] = cc.status()
        time.sleep(0.05)    # a process start is known to a 10 ms tick: started after the attach, surely
        env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        with open(errf, "w") as err:                    # a file: a chatty worker never blocks on it
            worker = subprocess.Popen([sys.executable, "-c", WORKER, "stand-in" if lib else "torch", lib or "-"],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True, env=env,
                                      cwd=REPO)
        hello = _line(worker, 60, errf)
        res["worker"] = hello
        cc.track([hello["pid"]])
        res["status"] = cc.status()
        libs = [lb.attach_path for lb in cc.libraries.values() if lb.attached]
        lib = lib or (libs[0] if libs else "")
        for name in PHASES:
            if time.monotonic() - t_start > 60:
                res["errors"].append(f"{name}: skipped, time budget")
                continue
            try:
                cc.read()
                s0 = cc.symbol_calls()
                assert worker.stdin is not None
                worker.stdin.write(name + "\n")
                worker.stdin.flush()
                reply = _line(worker, a.phase_timeout, errf)
                api = cc.read()
                s1 = cc.symbol_calls()
                fired = {k: v - s0.get(k, 0) for k, v in s1.items() if v - s0.get(k, 0)}
                res["phases"][name] = {"worker": reply, "symbols": fired, "api": _sum(api)}
            except Exception as e:  # noqa: BLE001 - one phase failing must not stop the check
                res["errors"].append(f"{name}: {type(e).__name__}: {e}")
                if isinstance(e, TimeoutError | RuntimeError):
                    break
        if lib:
            try:
                heads = symbol_heads(lib, [n for _i, n, _k in SYMBOLS])
                res["first_bytes"] = {n: f"{h}  {_insn(h)}" for n, h in heads.items()}
            except Exception as e:  # noqa: BLE001 - reported, the rest goes on
                res["errors"].append(f"first bytes: {type(e).__name__}: {e}")
    except Exception as e:  # noqa: BLE001 - the check reports whatever broke and still writes its JSON
        res["errors"].append(f"setup: {type(e).__name__}: {e}\n{traceback.format_exc()[-1500:]}")
    finally:
        if worker is not None:
            worker.kill()
            worker.wait()
        if cc is not None:
            cc.close()
    if lib and shutil.which("gcc") and time.monotonic() - t_start < 70:
        try:
            from bench.bench_cuda_uprobes import uprobe_cost
            c = uprobe_cost(lib, n=10_000, reps=5, launch_sym="cuLaunchKernel", sync_sym="cuCtxSynchronize")
            res["cost"] = {**asdict(c), "launch_core_pct_at_10k": c.launch_core_pct_at_10k}
        except Exception as e:  # noqa: BLE001 - reported, the JSON is still written
            res["errors"].append(f"cost: {type(e).__name__}: {e}")
    elif lib:
        res["errors"].append("cost: not measured (no gcc, or out of time)")
    res["seconds"] = round(time.monotonic() - t_start, 1)
    _print(res)
    if a.out:
        Path(a.out).mkdir(parents=True, exist_ok=True)
        Path(a.out, "cuda_probe_check.json").write_text(json.dumps(res, indent=1, default=str))
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


def _print(res: dict[str, Any]) -> None:
    print(f"machine: {res['machine']}")
    for row in res.get("status", res.get("status_at_start", [])):
        print("status:", row)
    for name, p in res["phases"].items():
        w, api = p["worker"], p["api"]
        print(f"\n== {name}: worker {w.get('wall_s', 0):.3f} s ok={w.get('ok')} {w.get('error', '')}")
        print("   symbols fired:", p["symbols"] or "none")
        print(f"   sync {api.get('sync_seconds', 0):.4f} s / {api.get('sync_calls', 0)} calls; "
              f"h2d pinned {api.get('h2d_pinned_seconds', 0):.4f} s {api.get('h2d_pinned_bytes', 0) / MB:.0f} MiB "
              f"{api.get('h2d_pinned_calls', 0)} calls; pageable {api.get('h2d_pageable_seconds', 0):.4f} s "
              f"{api.get('h2d_pageable_bytes', 0) / MB:.0f} MiB {api.get('h2d_pageable_calls', 0)} calls; "
              f"unified {api.get('unified_bytes', 0) / MB:.0f} MiB {api.get('unified_calls', 0)} calls; "
              f"d2h {api.get('d2h_seconds', 0):.4f} s {api.get('d2h_bytes', 0) / MB:.0f} MiB; "
              f"launches {api.get('launches')}; driving {api.get('driving_tids')} "
              f"(worker thread {w.get('tid')}); ranges complete {api.get('pinned_ranges_complete')}")
        for k, v in (w.get("evidence") or {}).items():
            if "maps" in k:
                print(f"   {k}: {v}")
    for n, h in res.get("first_bytes", {}).items():
        print(f"first bytes {n}: {h}")
    if res.get("cost"):
        c = res["cost"]
        print(f"\nuprobe cost per call: launch {c['launch_ns']:.0f} ns ({c['launch_core_pct_at_10k']:.2f} % of a core "
              f"at 10,000/s), sync pair {c['pair_ns']:.0f} ns, untracked {c['untracked_ns']:.0f} ns "
              f"(no probe: {c['base_ns']:.0f} ns); counted {c['launches_counted']}/{c['launches_made']} launches")
    for e in res["errors"]:
        print("ERROR:", e)
    print(f"done in {res['seconds']} s")


if __name__ == "__main__":
    sys.exit(main())
