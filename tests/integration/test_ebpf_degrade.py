"""eBPF without BCC, AER decoding on recorded field values, AER program through the verifier."""

from __future__ import annotations

import os
import struct
import time

import pytest

from triscope.agent.collectors.ebpf import EbpfCollector
from triscope.agent.ebpf.bpfsys import BpfMap, sum_u64_percpu
from triscope.agent.ebpf.decode import decode_aer, decode_peer, decode_rare
from triscope.agent.ebpf.doctor import ebpf_doctor
from triscope.agent.ebpf.layout import PEER_KEY, PROBES, RARE_EVENT
from triscope.agent.ebpf.loader import run_loader
from triscope.core.samples import Sample

pytestmark = pytest.mark.ebpf


def test_bcc_unavailable_in_the_child_degrades_without_crashing(tmp_path):
    # the loader child gets a bcc path without bcc (the venv has none of its own): it cannot import it
    c = EbpfCollector(bcc_path=str(tmp_path))
    try:
        assert not any(c.attached.values())
        for spec in PROBES:
            assert c.reasons[spec.name], spec.name
        assert c.fatal == "bcc"
        assert c.reasons["tcp_retransmit"].startswith("BCC missing")
        assert "No module named 'bcc'" in c.reasons["tcp_retransmit"]
        assert "python3-bpfcc" in c.hints["tcp_retransmit"]
        av = c.check()
        assert not av.ok and "BCC missing" in av.reason and "python3-bpfcc" in av.hint
        items = list(c.collect(time.time()))
        attached = {s.labels["probe"]: s.value for s in items if isinstance(s, Sample) and s.name == "triscope_probe_attached"}
        assert attached == {p.name: 0.0 for p in PROBES}
        assert not [s for s in items if s.name == "triscope_tcp_retransmits_total"]  # procfs fallback stays on
    finally:
        c.close()


def test_missing_tracefs_reports_why(tmp_path):
    c = EbpfCollector(tracefs=str(tmp_path))  # a tracefs without these events
    try:
        assert not any(c.attached.values())
        assert all(r.startswith("tracepoint absent") for r in c.reasons.values())
    finally:
        c.close()


# Field values of ras:aer_event records as the kernel emits them (dev_name, status, severity,
# tlp_header_valid, tlp_header) and the text the kernel's TP_printk renders for them.
RECORDED = [
    # "0000:00:1c.5 PCIe Bus Error: severity=Corrected, type=Physical Layer, Receiver Error"
    (("0000:00:1c.5", 0x00000001, 2, 0, (0, 0, 0, 0)), "corrected", ["Receiver Error"], "warning"),
    # corrected: Bad TLP | Replay Timer Timeout
    (("0000:3b:00.0", 0x00001040, 2, 0, (0, 0, 0, 0)), "corrected", ["Bad TLP", "Replay Timer Timeout"], "warning"),
    # uncorrected non-fatal: Completion Timeout, TLP header logged
    (("0000:af:00.0", 0x00004000, 0, 1, (0x40000001, 0x0000000f, 0xfee00000, 0x00000000)),
     "nonfatal", ["Completion Timeout"], "error"),
    # fatal: Malformed TLP | Surprise Down Error
    (("0000:17:00.0", 0x00040020, 1, 1, (0x4a000001, 0x01000004, 0x00000000, 0x00000000)),
     "fatal", ["Surprise Down Error", "Malformed TLP"], "critical"),
]


@pytest.mark.parametrize("fields,severity,errors,event_severity", RECORDED)
def test_aer_decode_on_recorded_values(fields, severity, errors, event_severity):
    dev, status, sev, tlp_valid, tlp = fields
    ev = decode_aer(dev, status, sev, tlp_valid, tlp)
    assert ev["kind"] == "aer"
    assert ev["details"]["device"] == dev
    assert ev["details"]["severity"] == severity
    assert ev["details"]["errors"] == errors
    assert ev["details"]["status"] == f"0x{status:08x}"
    assert ev["severity"] == event_severity
    if tlp_valid:
        assert ev["details"]["tlp_header"] == " ".join(f"{w:08x}" for w in tlp)
    else:
        assert "tlp_header" not in ev["details"]
    # the same values through the ring-buffer record layout the BPF program writes
    raw = RARE_EVENT.pack(time.monotonic_ns(), 0, 2, status, sev, tlp_valid, *tlp, dev.encode(), b"")
    ev2 = decode_rare(raw)
    assert ev2 is not None and ev2["details"] == ev["details"] and abs(ev2["ts"] - time.time()) < 1


def test_peer_keys_decode():
    v4 = PEER_KEY.pack(2, 8080, 0, bytes([10, 0, 0, 7]) + bytes(12))
    assert decode_peer(v4) == "10.0.0.7:8080"
    v6 = PEER_KEY.pack(10, 443, 0, bytes.fromhex("20010db8000000000000000000000001"))
    assert decode_peer(v6) == "[2001:db8::1]:443"
    mapped = PEER_KEY.pack(10, 22, 0, bytes.fromhex("00000000000000000000ffff7f000001"))
    assert decode_peer(mapped) == "127.0.0.1:22"


def test_aer_program_passes_the_verifier():
    """This kernel has no ras:aer_event: compile the AER section against the record layout and load
    it into the kernel (verifier) without attaching."""

    res = run_loader(["WANT_AER", "AER_HAS_TLP", "AER_SYNTHETIC_ARGS"], [], load_only=["on_aer_event"])
    try:
        assert not res.fatal, res.error
        assert res.loaded == {"on_aer_event": True}, res.load_errors
        assert "rare_events" in res.maps and "counters" in res.maps
    finally:
        res.close()


def test_map_reads_batch_and_key_by_key_agree():
    res = run_loader(["WANT_IOMMU_MAP"], [{"probe": "iommu_map", "tp": "iommu:map", "kind": "raw", "fn": "on_iommu_map"}],
                     counters_rows=False)
    try:
        assert not res.fatal, res.error
        m = BpfMap(res.maps.pop("counters"))
        batch = m.items()
        m2 = BpfMap(os.dup(m.fd))
        m2._batch_ok = False
        slow = m2.items()
        assert len(batch) == len(slow) == 32
        assert [(k, sum_u64_percpu(m, v, 1)) for k, v in batch] == [(k, sum_u64_percpu(m2, v, 1)) for k, v in slow]
        assert struct.unpack("<I", batch[5][0])[0] == 5
        assert m.syscalls < m2.syscalls  # one batch call vs 33 + 32
        m.close()
        m2.close()
    finally:
        res.close()


def test_doctor_rows():
    rows = ebpf_doctor()
    by = {r[0]: r for r in rows}
    assert set(by) == {p.name for p in PROBES} | {"waitfor_sched_btf"}   # + which wait-for path
    assert by["tcp_retransmit"][1] is True
    assert by["aer"][1] is False and "tracepoint absent" in by["aer"][2] and by["aer"][3]
    rows = ebpf_doctor(bcc_path="/nonexistent")
    assert all(not ok for _, ok, _, _ in rows)
    assert "python3-bpfcc" in {r[0]: r for r in rows}["tcp_retransmit"][3]


def test_unprivileged_agent_says_no_permission(tmp_path):
    """The collector in a process without root / CAP_BPF: no crash, every probe off with the reason."""

    import subprocess
    import sys

    code = (
        "import json\n"
        "from triscope.agent.collectors.ebpf import EbpfCollector\n"
        "c = EbpfCollector()\n"
        "items = c.collect(0)\n"
        "print(json.dumps({'attached': c.attached, 'reasons': c.reasons, 'hints': c.hints, 'ok': c.check().ok,\n"
        "                  'exported': {s.labels['probe']: s.value for s in items}}))\n"
    )
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c", code],
        capture_output=True, text=True, cwd=str(tmp_path), env={**os.environ, "PYTHONPATH": root}, timeout=60,
    )
    assert out.returncode == 0, out.stderr
    import json

    data = json.loads(out.stdout.strip().splitlines()[-1])
    assert not any(data["attached"].values())
    assert set(data["exported"].values()) == {0.0}
    assert data["ok"] is False
    for name, reason in data["reasons"].items():
        assert reason.startswith("no permission"), (name, reason)
        assert "CAP_BPF" in data["hints"][name]


def test_counters_mapped_into_memory_equal_the_syscall_read():
    """The rows layout read as memory (no syscall) gives what BPF_MAP_LOOKUP_BATCH reads from the
    same map, and both count every event the kernel side saw."""
    from triscope.agent.collectors.ebpf import _getppid_nr
    from triscope.agent.ebpf import layout as L
    from triscope.agent.ebpf.bpfsys import Counters, possible_cpus

    res = run_loader(["WANT_SELFTEST", f"SELFTEST_PID={os.getpid()}", f"SELFTEST_NR={_getppid_nr()}"],
                     [{"probe": "selftest", "tp": "raw_syscalls:sys_enter", "kind": "raw", "fn": "on_selftest"}],
                     counters_rows=True)
    try:
        assert not res.fatal, res.error
        assert res.attachments and res.attachments[0].ok, res.attachments
        c = Counters(res.maps.pop("counters"), L.N_COUNTERS)
        assert c.mapped
        before = c.read()
        for _ in range(7):
            os.getppid()
        mem = c.read()
        m = BpfMap(os.dup(c.map.fd))
        rows = m.items()   # plain array: one 256-byte row per possible CPU
        assert len(rows) == possible_cpus()
        by_syscall = [sum(struct.unpack_from("<32Q", v)[i] for _, v in rows) for i in range(L.N_COUNTERS)]
        assert mem == by_syscall
        assert mem[L.C_IOMMU_FAULT] - before[L.C_IOMMU_FAULT] == 7
        assert mem[L.C_DMA_EVENTS] - before[L.C_DMA_EVENTS] == 7
        assert m.syscalls >= 1 and c.map.syscalls == 0   # the mapped read made no syscall
        m.close()
        c.close()
    finally:
        res.close()


def test_counters_rows_read_with_a_syscall_where_the_mapping_is_refused():
    """This kernel never refuses the mapping, so a second reader of the same map drops its mapped
    view: its syscall read of the rows gives the same totals."""
    from triscope.agent.collectors.ebpf import _getppid_nr
    from triscope.agent.ebpf import layout as L
    from triscope.agent.ebpf.bpfsys import Counters

    res = run_loader(["WANT_SELFTEST", f"SELFTEST_PID={os.getpid()}", f"SELFTEST_NR={_getppid_nr()}"],
                     [{"probe": "selftest", "tp": "raw_syscalls:sys_enter", "kind": "raw", "fn": "on_selftest"}])
    try:
        assert not res.fatal, res.error
        mapped = Counters(res.maps.pop("counters"), L.N_COUNTERS)
        unmapped = Counters(os.dup(mapped.map.fd), L.N_COUNTERS)
        assert unmapped._view is not None
        unmapped._view.release()
        unmapped._view = None
        for _ in range(3):
            os.getppid()
        assert unmapped.read() == mapped.read() and mapped.read()[L.C_DMA_EVENTS] >= 3
        assert unmapped.map.syscalls >= 1
        mapped.close()
        unmapped.close()
    finally:
        res.close()
