"""npu-smi parsing on the real captured outputs (tests/fixtures/npu-smi) and on edge cases in the same shapes."""

from __future__ import annotations

import pytest
from conftest import FIXTURES

from triscope.agent.collectors.npu import health_value, info_samples, parse_info, parse_kv, parse_usages

NPU = FIXTURES / "npu-smi"
MIB = 1024 * 1024


def _by(samples, name):
    return {(s.labels["npu"], s.labels["chip"]): s.value for s in samples if s.name == name}


def test_910a_real_output():
    info = parse_info((NPU / "info-910a-24.1.RC2.txt").read_text())
    assert info.version == "24.1.RC2"
    assert [(c.npu, c.chip) for c in info.chips] == [(str(i), "0") for i in range(8)]
    c3 = info.chips[3]
    assert (c3.health, c3.bus_id) == ("Warning", "0000:01:00.0")
    s = info_samples(info)
    health = _by(s, "triscope_npu_health")
    assert health[("3", "0")] == 1 and health[("7", "0")] == 1 and health[("0", "0")] == 0
    assert _by(s, "triscope_npu_power_watts")[("3", "0")] == pytest.approx(206.9)
    assert _by(s, "triscope_npu_temperature_celsius")[("7", "0")] == 42
    assert _by(s, "triscope_npu_memory_used_bytes")[("3", "0")] == 3616 * MIB
    assert _by(s, "triscope_npu_memory_total_bytes")[("3", "0")] == 15039 * MIB
    assert _by(s, "triscope_npu_hbm_total_bytes")[("0", "0")] == 32768 * MIB
    assert _by(s, "triscope_npu_hbm_used_bytes")[("0", "0")] == 0
    assert _by(s, "triscope_npu_hugepages_used")[("5", "0")] == 1232
    assert _by(s, "triscope_npu_aicore_utilization_ratio")[("1", "0")] == 0.0
    # process table lists NPUs 0 and 1 only (cut): counts for those, nothing invented for the others
    procs = _by(s, "triscope_npu_processes")
    assert procs == {("0", "0"): 4, ("1", "0"): 4}
    assert _by(s, "triscope_npu_process_memory_bytes")[("1", "0")] == 4 * 686 * MIB


def test_310_real_output_chip_device_layout():
    info = parse_info((NPU / "info-310-21.0.4.txt").read_text())
    assert info.version == "21.0.4"
    assert [(c.npu, c.chip, c.device) for c in info.chips] == [("6", "0", "3"), ("6", "1", "4"), ("6", "2", "5"), ("6", "3", "6")]
    assert info.processes is None
    s = info_samples(info)
    assert _by(s, "triscope_npu_temperature_celsius") == {("6", "0"): 73, ("6", "1"): 74, ("6", "2"): 70, ("6", "3"): 65}
    assert _by(s, "triscope_npu_memory_used_bytes")[("6", "0")] == 2703 * MIB
    assert _by(s, "triscope_npu_memory_total_bytes")[("6", "3")] == 8192 * MIB
    assert _by(s, "triscope_npu_hugepages_capacity")[("6", "2")] == 970
    assert not _by(s, "triscope_npu_hbm_total_bytes"), "310 has no HBM column"
    assert not _by(s, "triscope_npu_processes"), "no process table: no process samples"
    info_lab = [x.labels for x in s if x.name == "triscope_npu_info"]
    assert {"npu": "6", "chip": "1", "name": "310", "bus_id": "0000:8a:00.0", "device": "4"} in info_lab


def test_edge_cases_health_spacing_na_and_idle_npus():
    info = parse_info((NPU / "info-910b-edge-cases.txt").read_text())
    s = info_samples(info)
    assert _by(s, "triscope_npu_health") == {("0", "0"): 2, ("1", "0"): 3, ("2", "0"): 0, ("3", "0"): -1}
    assert _by(s, "triscope_npu_hbm_used_bytes")[("0", "0")] == 58626 * MIB      # "58626/ 65536"
    assert _by(s, "triscope_npu_hbm_total_bytes")[("1", "0")] == 65536 * MIB     # "65536 /65536"
    assert _by(s, "triscope_npu_hbm_used_bytes")[("2", "0")] == 3395 * MIB       # "3395/65536", squeezed columns
    assert _by(s, "triscope_npu_hugepages_used")[("1", "0")] == 12               # "12/ 15"
    assert ("1", "0") not in _by(s, "triscope_npu_power_watts")                  # "-" is no value, not 0
    assert ("3", "0") not in _by(s, "triscope_npu_temperature_celsius")          # "NA"
    assert ("3", "0") not in _by(s, "triscope_npu_hbm_used_bytes")
    assert _by(s, "triscope_npu_aicore_utilization_ratio")[("1", "0")] == 1.0
    # "No running processes found in NPU 0/2" -> 0; NPU 1 has two; NPU 3 not listed -> no sample
    assert _by(s, "triscope_npu_processes") == {("0", "0"): 0, ("1", "0"): 2, ("2", "0"): 0}
    assert _by(s, "triscope_npu_process_memory_bytes")[("1", "0")] == 64000 * MIB


def test_unknown_extra_column_does_not_shift_known_ones():
    text = """
| npu-smi 99.0                 Version: 99.0                                          |
| NPU   Name      | Health   | Power(W)  Temp(C)  Fan(%)  Hugepages-Usage(page)        |
| Chip  Phy-ID    | Bus-Id   | AICore(%)  Vector(%)  Memory-Usage(MB)  HBM-Usage(MB)  |
+=================+==========+=======================================================+
| 5     Ascend910 | Warning  | 180.5     50       33      10 / 20                      |
| 1     9         | 0000:9D:00.0 | 55    44     100 / 200   3000 / 65536              |
"""
    info = parse_info(text)
    c = info.chips[0]
    assert (c.npu, c.chip, c.device, c.health) == ("5", "1", "9", "Warning")
    s = info_samples(info)
    assert _by(s, "triscope_npu_power_watts")[("5", "1")] == 180.5
    assert _by(s, "triscope_npu_hugepages_used")[("5", "1")] == 10
    assert _by(s, "triscope_npu_aicore_utilization_ratio")[("5", "1")] == pytest.approx(0.55)
    assert _by(s, "triscope_npu_memory_used_bytes")[("5", "1")] == 100 * MIB
    assert _by(s, "triscope_npu_hbm_total_bytes")[("5", "1")] == 65536 * MIB
    assert c.values["fan"] == 33 and c.values["vector"] == 44


@pytest.mark.parametrize("text,value", [("OK", 0), ("Warning", 1), ("Alarm", 2), ("Critical", 3),
                                        ("warning", 1), (" OK ", 0), ("Unknown", -1), ("NA", -1), ("", -1)])
def test_health_mapping(text, value):
    assert health_value(text) == value


def test_not_a_table_is_an_error():
    with pytest.raises(ValueError, match="device table"):
        parse_info("dcmi module initialize failed. ret is -8005\n")


def test_usages_real_and_multichip():
    u = parse_usages((NPU / "info-t-usages.txt").read_text())
    assert set(u) == {"0"}
    assert u["0"]["triscope_npu_hbm_bandwidth_utilization_ratio"] == 0.0
    assert "triscope_npu_aicpu_utilization_ratio" in u["0"]
    m = parse_usages((NPU / "info-t-usages-multichip.txt").read_text())
    assert m["0"]["triscope_npu_aivector_utilization_ratio"] == pytest.approx(0.12)
    assert m["0"]["triscope_npu_utilization_ratio"] == pytest.approx(0.73)
    assert m["1"] == {"triscope_npu_hbm_bandwidth_utilization_ratio": pytest.approx(0.30)}  # NA skipped
    assert not any("future" in k for d in m.values() for k in d)


def test_key_value_form():
    kv = dict(parse_kv((NPU / "info-t-health.txt").read_text()))
    assert kv == {"Health Status": "OK", "Error Code": "NA", "Error Information": "NA"}
    assert dict(parse_kv("Bus Id     : 0000:C1:00.0\n"))["Bus Id"] == "0000:C1:00.0"
