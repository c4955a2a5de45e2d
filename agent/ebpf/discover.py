"""What this host offers the probes, found without bcc: tracefs, tracepoints and their fields,
kernel headers, privileges.  Used to plan the program and by ``ebpf_doctor()``.
"""

from __future__ import annotations

import ctypes
import logging
import os
import platform
from dataclasses import dataclass, field
from pathlib import Path

from triscope.agent.ebpf.btfoffsets import waitfor_defines
from triscope.agent.ebpf.layout import PROBES, ProbeSpec

log = logging.getLogger(__name__)

TRACEFS_CANDIDATES = ("/sys/kernel/tracing", "/sys/kernel/debug/tracing")
# where Debian/Ubuntu's python3-bpfcc puts the bcc module; TRISCOPE_BCC_PATH overrides (images, private prefixes)
DEFAULT_BCC_PATH = os.environ.get("TRISCOPE_BCC_PATH", "/usr/lib/python3/dist-packages")

HINT_BCC = "install Debian/Ubuntu python3-bpfcc and libbpfcc (apt-get install python3-bpfcc libbpfcc)"
HINT_HEADERS = ("install linux-headers-amd64 and link /lib/modules/$(uname -r)/build to /usr/src/linux-headers-*-amd64 "
                "(and .../source to -common); `make run` does this")
HINT_TRACEFS = "mount -t tracefs nodev /sys/kernel/tracing (the agent does this itself when it runs as root)"
HINT_PERM = "run the agent as root, or grant CAP_BPF, CAP_PERFMON and CAP_SYS_RESOURCE"
HINT_AER = ("kernel built without CONFIG_PCIEAER (no ras:aer_event); a kernel with CONFIG_PCIEAER=y enables it — "
            "until then the sysfs AER collector is the fallback where the kernel exposes aer_dev_* files")
HINT_TP = "this kernel does not have the tracepoint (CONFIG option off or older kernel); nothing to install"


def find_tracefs(candidates: tuple[str, ...] = TRACEFS_CANDIDATES) -> str | None:
    for c in candidates:
        if os.path.isdir(os.path.join(c, "events")):
            return c
    return None


def mount_tracefs(target: str = "/sys/kernel/tracing") -> tuple[bool, str]:
    """Mount tracefs at ``target``; returns (ok, message).  Needs CAP_SYS_ADMIN."""

    if os.path.isdir(os.path.join(target, "events")):
        return True, "already mounted"
    libc = ctypes.CDLL(None, use_errno=True)
    ret = libc.mount(b"nodev", target.encode(), b"tracefs", 0, None)
    if ret != 0:
        e = ctypes.get_errno()
        return False, f"mount tracefs on {target}: {os.strerror(e)}"
    return True, f"mounted tracefs on {target}"


def ensure_tracefs(allow_mount: bool = True, candidates: tuple[str, ...] = TRACEFS_CANDIDATES) -> tuple[str | None, str]:
    """The tracefs directory, mounting it when missing and allowed; (path or None, why)."""

    found = find_tracefs(candidates)
    if found:
        return found, "ok"
    for c in candidates:
        if os.path.ismount(c) and not os.access(c, os.R_OK | os.X_OK):
            return None, f"no permission to read tracefs at {c} (euid {os.geteuid()})"
    if not allow_mount:
        return None, "tracefs is not mounted"
    ok, msg = mount_tracefs(candidates[0])
    if ok:
        log.info("%s", msg)
        return candidates[0], msg
    return None, f"tracefs is not mounted and could not be mounted ({msg})"


def tracepoint_fields(tracefs: str, tp: str) -> list[str] | None:
    """Field names of ``category:event`` from its tracefs format file, or None when absent."""

    cat, ev = tp.split(":", 1)
    try:
        text = Path(tracefs, "events", cat, ev, "format").read_text()
    except (FileNotFoundError, NotADirectoryError):
        return None
    except PermissionError:
        return None
    names = []
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("field:"):
            continue
        decl = line[len("field:"):].split(";", 1)[0].strip()
        name = decl.split()[-1]
        if "[" in name:
            name = name.split("[", 1)[0]
        if name.startswith("common_"):
            continue
        names.append(name)
    return names


CAP_SYS_ADMIN = 21
CAP_PERFMON = 38
CAP_BPF = 39


def bpf_privileges(status: str = "/proc/self/status") -> tuple[bool, str]:
    """Can this process load tracing programs?  CAP_SYS_ADMIN, or CAP_BPF with CAP_PERFMON."""

    try:
        with open(status) as f:
            cap = next(int(line.split()[1], 16) for line in f if line.startswith("CapEff:"))
    except (OSError, StopIteration, ValueError):
        return os.geteuid() == 0, "capabilities unknown"
    if cap >> CAP_SYS_ADMIN & 1 or (cap >> CAP_BPF & 1 and cap >> CAP_PERFMON & 1):
        return True, "ok"
    return False, f"no permission: needs CAP_BPF and CAP_PERFMON or root (euid {os.geteuid()}, CapEff {cap:#x})"


def kernel_headers(release: str | None = None, modules: str = "/lib/modules") -> tuple[bool, str]:
    rel = release or platform.release()
    build = Path(modules, rel, "build")
    if (build / "include" / "linux" / "kconfig.h").exists() or (build / "include" / "generated").exists():
        return True, f"{build} -> {os.path.realpath(build)}"
    if Path("/sys/kernel/kheaders.tar.xz").exists():
        return True, "kernel provides /sys/kernel/kheaders.tar.xz"
    return False, f"no kernel headers at {build}"


def bcc_present(bcc_path: str = DEFAULT_BCC_PATH) -> tuple[bool, str]:
    if not Path(bcc_path, "bcc", "__init__.py").exists():
        return False, f"BCC Python module not found under {bcc_path}"
    import ctypes.util

    if not ctypes.util.find_library("bcc") and not any(
        Path(d, "libbcc.so.0").exists() for d in ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib")
    ):
        return False, "libbcc.so not found"
    return True, f"bcc under {bcc_path}"


@dataclass
class ProbePlan:
    spec: ProbeSpec
    tracepoints: list[str] = field(default_factory=list)   # present on this kernel
    fields: dict[str, list[str]] = field(default_factory=dict)
    reason: str = ""                                        # why not, when tracepoints is empty
    hint: str = ""

    @property
    def ok(self) -> bool:
        return bool(self.tracepoints)

    def attach_entries(self) -> list[dict[str, str]]:
        """What the loader child attaches for this probe: one program per tracepoint."""
        fns = dict(zip(self.spec.tracepoints, self.spec.fns, strict=True)) if self.spec.fns else {}
        return [{"probe": self.spec.name, "tp": tp, "kind": self.spec.kind, "fn": fns.get(tp, self.spec.fn)}
                for tp in self.tracepoints]


def _plan_all(p: ProbePlan, tracefs: str) -> None:
    """A probe of several programs (``spec.fns``): every tracepoint, with its fields, or none."""
    missing, bad = [], []
    for tp in p.spec.tracepoints:
        f = tracepoint_fields(tracefs, tp)
        if f is None:
            missing.append(tp)
            continue
        want = [x.rsplit(":", 1)[1] for x in p.spec.fields if x.rsplit(":", 1)[0] == tp]
        lacks = [x for x in want if x not in f]
        if lacks:
            bad.append(f"{tp} lacks fields {lacks}")
        p.fields[tp] = f
    if missing or bad:
        p.fields.clear()
        p.reason = "; ".join(([f"tracepoint absent: {', '.join(missing)}"] if missing else [])
                             + ([f"unexpected tracepoint layout: {'; '.join(bad)}"] if bad else []))
        p.hint = HINT_TP if missing and not bad else "this kernel's tracepoint differs from what the probe reads; probe left off"
        return
    p.tracepoints = list(p.spec.tracepoints)


def plan_probes(tracefs: str | None, wanted: set[str] | None = None) -> list[ProbePlan]:
    plans = []
    for spec in PROBES:
        if wanted is not None and spec.name not in wanted:
            continue
        p = ProbePlan(spec)
        if tracefs is None:
            p.reason, p.hint = "no tracefs", HINT_TRACEFS
            plans.append(p)
            continue
        if spec.fns:
            _plan_all(p, tracefs)
            plans.append(p)
            continue
        bad_layout = []
        for tp in spec.tracepoints:
            f = tracepoint_fields(tracefs, tp)
            if f is None:
                continue
            missing = [x for x in spec.fields if x not in f]
            if missing:
                bad_layout.append(f"{tp} lacks fields {missing}")
                continue
            p.tracepoints.append(tp)
            p.fields[tp] = f
        if not p.tracepoints:
            if bad_layout:
                p.reason = "unexpected tracepoint layout: " + "; ".join(bad_layout)
                p.hint = "this kernel's tracepoint differs from what the probe reads; probe left off"
            else:
                p.reason = "tracepoint absent: " + ", ".join(spec.tracepoints)
                p.hint = HINT_AER if spec.name == "aer" else HINT_TP
        plans.append(p)
    by_name = {p.spec.name: p for p in plans}
    for p in plans:
        need = by_name.get(p.spec.requires) if p.spec.requires else None
        if p.spec.requires and p.ok and (need is None or not need.ok):
            p.tracepoints = []
            p.reason = f"needs the {p.spec.requires} probe, which is off" + (f" ({need.reason})" if need else "")
            p.hint = need.hint if need else ""
    return plans


def defines_for(plans: list[ProbePlan]) -> list[str]:
    """``-D`` names for the program from the probes planned (and their tracepoint formats)."""

    out: list[str] = []
    for p in plans:
        if not p.ok:
            continue
        if p.spec.define not in out:
            out.append(p.spec.define)
        fields = set().union(*p.fields.values())
        if p.spec.name == "tcp_retransmit":
            if "err" in fields:
                out.append("TCP_SKB_HAS_ERR")
            if "state" in fields:
                out.append("TCP_SKB_HAS_STATE")
        if p.spec.name == "dma_map_sg" and "full_ents" in fields:
            out.append("DMA_SG_HAS_FULL_ENTS")
        if p.spec.name == "aer" and {"tlp_header_valid", "tlp_header"} <= fields:
            out.append("AER_HAS_TLP")
        if p.spec.name == "waitfor":
            out.append(f"WF_BITS_WORDS={(pid_max() + 63) // 64}")
            if not Path(BTF_VMLINUX).exists():
                out.append("WF_NO_REGS")      # no kernel BTF: the blocked syscall is not read (its waker still is)
            out += waitfor_defines()[0]       # none: the slower path (a hash lookup and a clock read per wakeup)
    return out


BTF_VMLINUX = "/sys/kernel/btf/vmlinux"


def pid_max(path: str = "/proc/sys/kernel/pid_max") -> int:
    """The highest pid + 1 this kernel hands out (the wait-for bit arrays' size)."""
    try:
        return max(1, min(int(Path(path).read_text().split()[0]), 1 << 22))
    except (OSError, ValueError, IndexError):
        return 1 << 22


def classify_error(text: str) -> tuple[str, str]:
    """(reason, hint) from a BCC/kernel error message."""

    t = text.lower()
    if "no module named 'bcc'" in t or "libbcc" in t and ("cannot open" in t or "not found" in t):
        return f"BCC missing ({text.strip().splitlines()[-1] if text.strip() else text})", HINT_BCC
    if "kernel headers" in t or "kheaders" in t or "linux/kconfig.h" in t or "modprobe" in t and "kheaders" in t:
        return "no kernel headers", HINT_HEADERS
    if "operation not permitted" in t or "permission denied" in t or "eperm" in t or "eacces" in t:
        return "no permission", HINT_PERM
    if "no such file or directory" in t and ("tracepoint" in t or "tracing" in t):
        return "tracepoint absent", HINT_TP
    last = text.strip().splitlines()[-1] if text.strip() else "unknown error"
    return f"failed: {last[:300]}", ""
