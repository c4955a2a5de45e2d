"""TCP collector: fixture trees, the real /proc, and real loopback retransmits."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest
from conftest import FIXTURES

from triscope.agent.collectors.base import CollectorUnavailable
from triscope.agent.collectors.tcp import TcpCollector, parse_snmp, parse_sockstat
from triscope.core.metrics import CATALOGUE
from triscope.web.loopback import syn_retransmits


def by_key(samples):
    return {(s.name, tuple(sorted(s.labels.items()))): s for s in samples}


def test_fixture_host_values_and_kinds() -> None:
    got = by_key(TcpCollector(proc=str(FIXTURES / "proc-host1")).collect(1.0))
    assert got[("triscope_tcp_retransmits_total", ())].value == 1284533
    assert got[("triscope_tcp_retransmits_total", ())].kind == "counter"
    assert got[("triscope_tcp_segments_out_total", ())].value == 861204456
    assert got[("triscope_tcp_sockets", (("state", "established"),))].value == 1342
    assert got[("triscope_tcp_sockets", (("state", "time_wait"),))].value == 4187
    assert got[("triscope_tcp_sockets", (("state", "time_wait"),))].kind == "gauge"
    for (name, labels), s in got.items():
        spec = CATALOGUE[name]
        assert spec.kind == s.kind and set(dict(labels)) == set(spec.labels)


def test_retransmits_off_when_ebpf_probe_owns_them() -> None:
    names = {s.name for s in TcpCollector(proc=str(FIXTURES / "proc-host1"), emit_retransmits=False).collect(1.0)}
    assert "triscope_tcp_retransmits_total" not in names
    assert "triscope_tcp_segments_out_total" in names


def test_old_kernel_layout_and_missing_sockstat() -> None:
    got = by_key(TcpCollector(proc=str(FIXTURES / "proc-kernel54")).collect(1.0))
    assert got[("triscope_tcp_retransmits_total", ())].value == 1284533
    no_tw = by_key(TcpCollector(proc=str(FIXTURES / "proc-nopsi")).collect(1.0))
    assert ("triscope_tcp_sockets", (("state", "time_wait"),)) not in no_tw
    assert no_tw[("triscope_tcp_sockets", (("state", "established"),))].value == 1342
    assert "TIME_WAIT" in TcpCollector(proc=str(FIXTURES / "proc-nopsi")).check().reason


def test_parsers_reject_broken_input() -> None:
    with pytest.raises(ValueError, match="Tcp"):
        parse_snmp("Tcp: RetransSegs OutSegs\nTcp: 1\n")
    with pytest.raises(ValueError, match="without values"):
        parse_snmp("Tcp: RetransSegs OutSegs\n")
    assert parse_sockstat("TCP: inuse 1 orphan 0 tw 9 alloc 1 mem 3\n")["TCP"]["tw"] == 9


def test_missing_and_broken_proc(tmp_path: Path) -> None:
    c = TcpCollector(proc=str(tmp_path))
    av = c.check()
    assert not av.ok and "not found" in av.reason and av.hint
    with pytest.raises(CollectorUnavailable, match="net/snmp"):
        list(c.collect(1.0))
    shutil.copytree(FIXTURES / "proc-host1", tmp_path / "p")
    (tmp_path / "p/net/snmp").write_text("Tcp: RetransSegs\nTcp: x\n")
    with pytest.raises(CollectorUnavailable):
        list(TcpCollector(proc=str(tmp_path / "p")).collect(1.0))


def test_real_proc_sees_real_loopback_retransmits() -> None:
    c = TcpCollector()
    assert c.check().ok
    before = {s.name: s.value for s in c.collect(time.time()) if not s.labels}
    with syn_retransmits(6):
        time.sleep(2.5)  # first SYN retransmit after 1 s
        after = {s.name: s.value for s in c.collect(time.time()) if not s.labels}
    assert after["triscope_tcp_retransmits_total"] - before["triscope_tcp_retransmits_total"] >= 6
    assert after["triscope_tcp_segments_out_total"] > before["triscope_tcp_segments_out_total"]
