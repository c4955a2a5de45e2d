"""``triscope doctor``: which collectors and probes can run here, and what to do about the others."""

from __future__ import annotations

import argparse
import json
from typing import Any


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("doctor", help="which collectors/probes can run on this host, and why not",
                       description="Check every collector and eBPF probe on this host: 'ok', or the reason it "
                       "cannot run and what to install or change.")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--proc", default="/proc", help=argparse.SUPPRESS)
    p.add_argument("--sys", default="/sys", help=argparse.SUPPRESS)
    p.add_argument("--pod-resources-socket", metavar="PATH", default="/var/lib/kubelet/pod-resources/kubelet.sock",
                   help="the kubelet's pod-resources socket to check (default "
                        "/var/lib/kubelet/pod-resources/kubelet.sock)")
    p.set_defaults(func=cmd_doctor)


def gather(proc: str = "/proc", sys_: str = "/sys",
           pod_resources_socket: str = "/var/lib/kubelet/pod-resources/kubelet.sock") -> list[dict[str, Any]]:
    from triscope.agent.registry import AgentOptions, build_collectors

    rows: list[dict[str, Any]] = []
    try:
        from triscope.agent.doctor import host_doctor, pod_resources_doctor
        for name, ok, reason, hint in host_doctor(proc, sys_):
            rows.append({"kind": "collector", "name": name, "ok": ok, "reason": reason, "hint": hint})
        name, ok, reason, hint = pod_resources_doctor(pod_resources_socket)
        rows.append({"kind": "source", "name": name, "ok": ok, "reason": reason, "hint": hint})
    except ImportError:
        pass
    seen = {r["name"] for r in rows}
    collectors = build_collectors(AgentOptions(proc=proc, sys=sys_, ebpf=False,
                                               pod_resources_socket=pod_resources_socket))
    for c in collectors:
        if c.name in seen:
            continue
        try:
            av = c.check()
            rows.append({"kind": "collector", "name": c.name, "ok": av.ok, "reason": av.reason, "hint": av.hint})
        finally:
            c.close()
    try:
        from triscope.agent.ebpf.doctor import ebpf_doctor
        for probe, ok, reason, hint in ebpf_doctor():
            rows.append({"kind": "probe", "name": probe, "ok": ok, "reason": reason, "hint": hint})
    except ImportError:
        rows.append({"kind": "probe", "name": "ebpf", "ok": False, "reason": "eBPF support not installed",
                     "hint": ""})
    try:        # the CUDA driver's uprobes: attached to the node's libcuda where there is one, then detached
        from triscope.agent.collectors.cudacalls import CudaCalls
        cc = CudaCalls()
        try:
            for probe, ok, reason, hint in cc.status():
                rows.append({"kind": "probe", "name": probe, "ok": ok, "reason": reason, "hint": hint})
        finally:
            cc.close()
    except ImportError:
        pass
    return rows


def cmd_doctor(args: argparse.Namespace) -> int:
    rows = gather(args.proc, args.sys, args.pod_resources_socket)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    width = max(len(r["name"]) for r in rows) if rows else 10
    for r in rows:
        status = "ok" if r["ok"] else "off"
        line = f"{r['kind']:<9} {r['name']:<{width}}  {status:<3}"
        if not r["ok"]:
            line += f"  {r['reason']}"
            if r["hint"]:
                line += f" — {r['hint']}"
        print(line)
    return 0
