"""Turn raw map keys and ring-buffer records into labels and events (pure functions, no bcc)."""

from __future__ import annotations

import ipaddress
import time
from typing import Any

from triscope.agent.ebpf.layout import PEER_KEY, RARE_AER, RARE_EVENT, RARE_IOMMU_FAULT

# PCIe AER status bits (include/uapi/linux/pci_regs.h, as printed by the kernel's ras:aer_event)
AER_CORRECTABLE_BITS = {
    0: "Receiver Error",
    6: "Bad TLP",
    7: "Bad DLLP",
    8: "RELAY_NUM Rollover",
    12: "Replay Timer Timeout",
    13: "Advisory Non-Fatal Error",
    14: "Corrected Internal Error",
    15: "Header Log Overflow",
}
AER_UNCORRECTABLE_BITS = {
    0: "Undefined",
    4: "Data Link Protocol Error",
    5: "Surprise Down Error",
    12: "Poisoned TLP",
    13: "Flow Control Protocol Error",
    14: "Completion Timeout",
    15: "Completer Abort",
    16: "Unexpected Completion",
    17: "Receiver Overflow",
    18: "Malformed TLP",
    19: "ECRC Error",
    20: "Unsupported Request Error",
    21: "ACS Violation",
    22: "Uncorrectable Internal Error",
    23: "MC Blocked TLP",
    24: "AtomicOp Egress Blocked",
    25: "TLP Prefix Blocked Error",
    26: "Poisoned TLP Egress Blocked",
}
# severity as the tracepoint carries it: AER_NONFATAL 0, AER_FATAL 1, AER_CORRECTABLE 2
AER_SEVERITY = {0: "nonfatal", 1: "fatal", 2: "corrected"}
AER_EVENT_SEVERITY = {"corrected": "warning", "nonfatal": "error", "fatal": "critical"}


def aer_severity_name(sev: int) -> str:
    return AER_SEVERITY.get(sev, f"unknown({sev})")


def aer_status_names(status: int, severity: int) -> list[str]:
    """The error names set in ``status`` (correctable table for severity 2, else uncorrectable)."""

    table = AER_CORRECTABLE_BITS if severity == 2 else AER_UNCORRECTABLE_BITS
    names = []
    for bit in range(32):
        if status & (1 << bit):
            names.append(table.get(bit, f"bit {bit}"))
    return names


def decode_aer(device: str, status: int, severity: int, tlp_valid: int = 0,
               tlp: tuple[int, ...] | list[int] = (), ts: float = 0.0) -> dict[str, Any]:
    """The ``aer`` event for one ``ras:aer_event`` record's fields."""

    sev = aer_severity_name(severity)
    names = aer_status_names(status, severity)
    details: dict[str, Any] = {
        "device": device,
        "severity": sev,
        "status": f"0x{status:08x}",
        "errors": names,
    }
    if tlp_valid:
        details["tlp_header"] = " ".join(f"{w:08x}" for w in tlp)
    return {
        "kind": "aer",
        "severity": AER_EVENT_SEVERITY.get(sev, "error"),
        "message": f"PCIe AER {sev} error on {device}: {', '.join(names) or 'no status bits'}",
        "details": details,
        "ts": ts,
    }


def cstr(b: bytes) -> str:
    return b.split(b"\0", 1)[0].decode(errors="replace")


def ktime_to_epoch(ts_ns: int) -> float:
    """bpf_ktime_get_ns() (CLOCK_MONOTONIC) to epoch seconds."""

    return time.time() - (time.monotonic_ns() - ts_ns) / 1e9


def decode_rare(raw: bytes) -> dict[str, Any] | None:
    """One ring-buffer record to an event dict (``kind``, ``message``, ``severity``, ``details``, ``ts``)."""

    if len(raw) < RARE_EVENT.size:
        return None
    ts_ns, addr, kind, status, severity, tlp_valid, t0, t1, t2, t3, dev, drv = RARE_EVENT.unpack_from(raw)
    ts = ktime_to_epoch(ts_ns)
    if kind == RARE_IOMMU_FAULT:
        d = cstr(dev) or "unknown"
        return {
            "kind": "iommu_fault",
            "severity": "error",
            "message": f"IOMMU page fault on {d} ({cstr(drv) or '?'}) at iova 0x{addr:x}",
            "details": {"device": d, "driver": cstr(drv), "iova": f"0x{addr:x}", "flags": f"0x{status:x}"},
            "ts": ts,
        }
    if kind == RARE_AER:
        return decode_aer(cstr(dev) or "unknown", status, severity, tlp_valid, (t0, t1, t2, t3), ts)
    return None


def decode_peer(key: bytes) -> str:
    """``address:port`` of a tcp_peers key (IPv6 in brackets)."""

    family, dport, _pad, addr = PEER_KEY.unpack(key)
    if family == 10:
        ip = ipaddress.IPv6Address(addr)
        mapped = ip.ipv4_mapped
        return f"{mapped}:{dport}" if mapped else f"[{ip}]:{dport}"
    return f"{ipaddress.IPv4Address(addr[:4])}:{dport}"
