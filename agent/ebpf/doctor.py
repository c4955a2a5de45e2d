"""``ebpf_doctor()``: which probes can run on this host, and for each that cannot, why and what to do.

Static checks first (tracefs, tracepoints, BCC, kernel headers, privileges); then, when those
pass and ``attach`` is true, a real compile + attach in the loader child, reported per probe and
detached again.

``waitfor_path_row()``: which path the wait-for programs take on this kernel: the scheduler's own
structures read through offsets from the kernel's BTF (a wakeup of a followed thread only notes its
waker), or the slower fallback without them (a hash lookup and a clock read per wakeup).  A row of
its own beside the probes (``waitfor_sched_btf``): ``ok`` on the fast path, off with what is missing.
"""

from __future__ import annotations

from typing import Any

from triscope.agent.collectors.ebpf import EbpfCollector
from triscope.agent.ebpf.btfoffsets import BTF_VMLINUX, waitfor_defines
from triscope.agent.ebpf.discover import (
    DEFAULT_BCC_PATH,
    HINT_BCC,
    HINT_HEADERS,
    HINT_PERM,
    HINT_TRACEFS,
    bcc_present,
    bpf_privileges,
    find_tracefs,
    kernel_headers,
    plan_probes,
)

Row = tuple[str, bool, str, str]

WAITFOR_PATH_ROW = "waitfor_sched_btf"
HINT_SCHED_BTF = ("a kernel built with CONFIG_DEBUG_INFO_BTF=y and CONFIG_SCHED_INFO=y (most distribution kernels); "
                  "the wait-for evidence is the same either way, only its cost per wakeup differs")


def waitfor_path_row(btf: str = BTF_VMLINUX) -> Row:
    """(``waitfor_sched_btf``, fast path?, which path and why, hint): what ``defines_for`` gives the
    program on this kernel (the same ``waitfor_defines``)."""
    defines, missing = waitfor_defines(btf)
    if defines:
        offs = ", ".join(d for d in defines if d.startswith("WF_OFF_"))
        return (WAITFOR_PATH_ROW, True, "wait-for: the scheduler's structures found in the kernel's BTF "
                f"({btf}: {offs}): a wakeup of a followed thread only notes its waker, the run-queue wait is "
                "the scheduler's own sched_info", "")
    return (WAITFOR_PATH_ROW, False, f"wait-for on the slower fallback path ({missing or 'no BTF'}; {btf}): "
            "each wakeup of a followed thread looks up its entry and reads the clock", HINT_SCHED_BTF)


def _blockers(bcc_path: str) -> list[tuple[str, str]]:
    """(reason, hint) of each host-wide check that stops every probe: BCC, kernel headers, privileges."""
    blockers: list[tuple[str, str]] = []
    ok, why = bcc_present(bcc_path)
    if not ok:
        blockers.append((f"BCC missing: {why}", HINT_BCC))
    ok, why = kernel_headers()
    if not ok:
        blockers.append((why, HINT_HEADERS))
    ok, why = bpf_privileges()
    if not ok:
        blockers.append((why, HINT_PERM))
    return blockers


def ebpf_doctor(attach: bool = True, bcc_path: str = DEFAULT_BCC_PATH, **kwargs: Any) -> list[Row]:
    """(probe, ok, reason, hint) for every probe."""

    tracefs = find_tracefs()
    plans = plan_probes(tracefs)
    rows: dict[str, Row] = {}
    for p in plans:
        if not p.ok:
            rows[p.spec.name] = (p.spec.name, False, p.reason, p.hint)
    blockers = _blockers(bcc_path)
    if blockers:
        reason = "; ".join(b[0] for b in blockers)
        hint = "; ".join(b[1] for b in blockers)
        for p in plans:
            if p.ok:
                rows[p.spec.name] = (p.spec.name, False, reason, hint)
    elif attach and (any(p.ok for p in plans) or tracefs is None):
        c = EbpfCollector(bcc_path=bcc_path, **kwargs)
        try:
            for name, ok, reason, hint in c.status():
                if name not in rows or ok:
                    rows[name] = (name, ok, reason, hint)
                elif tracefs is None:
                    rows[name] = (name, ok, reason, hint or HINT_TRACEFS)
        finally:
            c.close()
    else:
        for p in plans:
            if p.ok:
                rows[p.spec.name] = (p.spec.name, True, "tracepoint present: " + ", ".join(p.tracepoints)
                                     + " (not attached: attach=False)", "")
    return _with_waitfor_path([rows[p.spec.name] for p in plans])


def _with_waitfor_path(rows: list[Row]) -> list[Row]:
    """The rows with ``waitfor_sched_btf`` right after the waitfor probe's (where it is planned)."""
    for i, r in enumerate(rows):
        if r[0] == "waitfor":
            path = waitfor_path_row()
            if not r[1]:            # no path in use: off, with what the probe would take
                path = (path[0], False, "the waitfor probe is off; when it runs: " + path[2], path[3])
            return [*rows[:i + 1], path, *rows[i + 1:]]
    return rows
