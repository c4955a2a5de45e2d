"""``ebpf_doctor()``: which probes can run on this host, and for each that cannot, why and what to do.

Static checks first (tracefs, tracepoints, BCC, kernel headers, privileges); then, when those
pass and ``attach`` is true, a real compile + attach in the loader child, reported per probe and
detached again.
"""

from __future__ import annotations

from typing import Any

from triscope.agent.collectors.ebpf import EbpfCollector
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
    return [rows[p.spec.name] for p in plans]
