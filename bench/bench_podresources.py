"""Why the kubelet's pod-resources answer is decoded by hand: resident memory and decode time of the
hand decoder (``agent/workloads/podresources.py``) against classes protoc generates from the
kubelet's ``.proto`` (``tests/proto/podresources_v1.proto``), in a process that holds the agent's
modules (the CLI, ``triscope agent``'s runtime, every collector, h2), as the agent does.

Each figure is the median over fresh processes (one process per measurement, so nothing is shared
between them): the RSS a step adds (``VmRSS`` after minus before, after a ``gc.collect()``) and
its time.  Answers: a typical node (110 pods x 8 GPUs) and one at the client's 4 MiB cap.
Needs grpcio-tools (a test dependency) to generate the module.  docs/host-collectors.md quotes it.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.common import Row

ROOT = Path(__file__).resolve().parents[1]
PROTO = ROOT / "tests" / "proto" / "podresources_v1.proto"

CHILD = r"""
import gc, importlib, json, pkgutil, sys, time
def rss():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("VmRSS:")) / 1024
mode, gen, payload = sys.argv[1], sys.argv[2], sys.argv[3]
import triscope.cli, triscope.commands.agent, triscope.agent.runtime  # noqa: F401
import triscope.agent.collectors as cols, triscope.agent.workloads as wls
for pkg in (cols, wls):
    for m in pkgutil.iter_modules(pkg.__path__):
        try:
            importlib.import_module(f"{pkg.__name__}.{m.name}")
        except Exception:
            pass
import h2.config, h2.connection, h2.events  # noqa: F401 - the client's HTTP/2, either way
from triscope.agent.workloads.podresources import decode_list_response
data = open(payload, "rb").read() if payload != "-" else b""
gc.collect()
r0, t = rss(), 0.0
if mode.startswith("generated"):
    sys.path.insert(0, gen)
    import podresources_v1_pb2 as pb
    if data:
        t0 = time.perf_counter()
        msg = pb.ListPodResourcesResponse.FromString(data)
        owners = [(p.namespace, p.name, c.name, d.resource_name, i) for p in msg.pod_resources
                  for c in p.containers for d in c.devices for i in d.device_ids]
        t = time.perf_counter() - t0
elif data and mode == "capped":      # the agent's own caps: refused while the container is decoded
    from triscope.agent.workloads.podresources import PodResourcesError
    t0 = time.perf_counter()
    try:
        owners = decode_list_response(data).owners
    except PodResourcesError:
        owners = []
    t = time.perf_counter() - t0
elif data:
    t0 = time.perf_counter()
    owners = decode_list_response(data, max_owners=10**9).owners
    t = time.perf_counter() - t0
gc.collect()
print(json.dumps({"rss_mb": rss() - r0, "ms": t * 1000}))
"""


def _answer(pb: object, pods: int, gpus: int, long_names: bool) -> bytes:
    r = pb.ListPodResourcesResponse()  # type: ignore[attr-defined]
    for i in range(pods):
        p = r.pod_resources.add(name=("p" * 200 if long_names else "vit-7f9c-") + str(i), namespace="inference")
        c = p.containers.add(name="c" * 200 if long_names else "server")
        d = c.devices.add(resource_name="nvidia.com/gpu")
        d.device_ids.extend([("G" * 1000 if long_names else "GPU-5b1c0e3a-1111-2222-3333-4444555566") + str(g)
                             for g in range(gpus)])
    return bytes(r.SerializeToString())


def run(quick: bool = False) -> list[Row]:
    try:
        from grpc_tools import protoc
    except ImportError:
        return [Row("pod-resources decode", "grpcio-tools not installed (a test dependency)", float("nan"), "",
                    ok=False)]
    reps = 3 if quick else 5
    with tempfile.TemporaryDirectory() as td:
        if protoc.main(["protoc", f"-I{PROTO.parent}", f"--python_out={td}", str(PROTO)]) != 0:
            return [Row("pod-resources decode", "protoc failed", float("nan"), "", ok=False)]
        sys.path.insert(0, td)
        try:
            import podresources_v1_pb2 as pb
        finally:
            sys.path.remove(td)
        typical, cap, one = Path(td, "typical.bin"), Path(td, "cap.bin"), Path(td, "one.bin")
        typical.write_bytes(_answer(pb, 110, 8, False))
        cap.write_bytes(_answer(pb, 2900, 1, True))      # ~4 MiB, the client's cap
        one.write_bytes(_one_container(pb, 590_000))     # ~3.9 MiB: one container, 590,000 device IDs
        cases = {"import": ("-",), "typical": (str(typical),), "cap": (str(cap),), "one": (str(one),)}
        got: dict[tuple[str, str], list[dict[str, float]]] = {}
        for _ in range(reps):
            for way in ("generated", "hand"):
                for case, (payload,) in cases.items():
                    if (way == "hand" and case == "import") or (way == "generated" and case == "one"):
                        continue
                    mode = "capped" if case == "one" else way
                    out = subprocess.run([sys.executable, "-c", CHILD, mode, td, payload], capture_output=True,
                                         text=True, cwd=td, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
                    if out.returncode != 0:
                        return [Row("pod-resources decode", f"child failed: {out.stderr[-300:]}", float("nan"), "",
                                    ok=False)]
                    got.setdefault((way, case), []).append(json.loads(out.stdout.strip().splitlines()[-1]))
        size_typical, size_cap, size_one = typical.stat().st_size, cap.stat().st_size, one.stat().st_size

    def med(way: str, case: str, key: str) -> float:
        return round(statistics.median(r[key] for r in got[(way, case)]), 2)

    rows = [Row("pod-resources decode", "agent RSS added by importing protobuf + the generated module",
                med("generated", "import", "rss_mb"), "MB")]
    for case, label in (("typical", f"a typical answer (110 pods x 8 GPUs, {size_typical / 1024:.0f} KiB)"),
                        ("cap", f"an answer at the 4 MiB cap ({size_cap / 2**20:.1f} MiB)")):
        rows.append(Row("pod-resources decode", f"agent RSS added, decoding {label} by hand", med("hand", case, "rss_mb"),
                        "MB", "", "generated classes (import included)", med("generated", case, "rss_mb")))
        rows.append(Row("pod-resources decode", f"decode time, {label}, by hand", med("hand", case, "ms"), "ms",
                        "", "generated classes", med("generated", case, "ms")))
    one_label = f"one container with 590,000 device IDs ({size_one / 2**20:.1f} MiB), refused at the 20,001st"
    one_rss, one_ms = med("hand", "one", "rss_mb"), med("hand", "one", "ms")
    rows.append(Row("pod-resources decode", f"agent RSS added, {one_label} (whole, then refused, before: "
                    "+417 MB, issue 43)", one_rss, "MB", "<= 20", ok=one_rss <= 20))
    rows.append(Row("pod-resources decode", f"decode time, {one_label} (3.1 s before)", one_ms, "ms", "<= 200",
                    ok=one_ms <= 200))
    return rows


def _one_container(pb: object, ids: int) -> bytes:
    r = pb.ListPodResourcesResponse()  # type: ignore[attr-defined]
    c = r.pod_resources.add(name="p", namespace="ns").containers.add(name="c")
    c.devices.add(resource_name="nvidia.com/gpu").device_ids.extend(f"{i:x}" for i in range(ids))
    return bytes(r.SerializeToString())


if __name__ == "__main__":
    for r in run("--quick" in sys.argv):
        base = f"  (baseline {r.baseline}: {r.baseline_value})" if r.baseline else ""
        print(f"{r.figure:90} {r.value:>8} {r.unit:4}{base}")
