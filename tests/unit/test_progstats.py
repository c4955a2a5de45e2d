"""The arithmetic and name handling of ``agent/ebpf/progstats.py`` (no kernel needed)."""

from __future__ import annotations

import math
import struct

from triscope.agent.ebpf import progstats


def test_delta_per_run_total() -> None:
    a = {"on_wf_switch": (1_000, 10), "on_wf_waking": (500, 5), "gone": (7, 7)}
    b = {"on_wf_switch": (3_000, 30), "on_wf_waking": (500, 5), "new": (40, 2)}
    d = progstats.delta(a, b)
    assert d == {"on_wf_switch": (2_000, 20), "on_wf_waking": (0, 0), "new": (40, 2)}
    per = progstats.per_run(d)
    assert per["on_wf_switch"] == 100.0 and per["new"] == 20.0 and math.isnan(per["on_wf_waking"])
    assert progstats.total(d) == (2_040, 22)


def test_truncated_names() -> None:
    got = progstats._truncated(progstats.WAITFOR_FNS)
    assert got["on_wf_softirq_e"] == ["on_wf_softirq_entry", "on_wf_softirq_exit"]
    assert got["on_wf_hrtimer_e"] == ["on_wf_hrtimer_entry", "on_wf_hrtimer_exit"]
    assert got["on_wf_switch"] == ["on_wf_switch"] and got["on_wf_irq_entry"] == ["on_wf_irq_entry"]


def _btf(types: list[tuple[int, int, bytes]], names: bytes) -> bytes:
    body = b"".join(struct.pack("<III", n, info, 4) + extra for n, info, extra in types)
    hdr = struct.pack("<HBBI4I", 0xEB9F, 1, 0, 24, 0, len(body), len(body), len(names))
    return hdr + body + names


def test_btf_type_name() -> None:
    names = b"\0int\0on_wf_softirq_entry\0"
    int_t = (1, 1 << 24, struct.pack("<I", 32))                 # INT: 4 extra bytes
    proto = (0, (13 << 24) | 1, struct.pack("<II", 0, 1))        # FUNC_PROTO, one parameter
    func = (5, 12 << 24, b"")                                    # FUNC "on_wf_softirq_entry"
    blob = _btf([int_t, proto, func], names)
    assert progstats._btf_type_name(blob, 3) == "on_wf_softirq_entry"
    assert progstats._btf_type_name(blob, 1) == "int"
    assert progstats._btf_type_name(blob, 9) == ""
    assert progstats._btf_type_name(b"nope", 1) == ""
