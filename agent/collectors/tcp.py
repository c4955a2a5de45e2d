"""TCP counters from procfs: retransmits, segments sent, ESTABLISHED and TIME_WAIT sockets.

Sources (all O(1) reads, no walk over the socket tables):

- ``/proc/net/snmp`` ``Tcp:`` rows: ``RetransSegs`` -> ``triscope_tcp_retransmits_total`` (only when
  ``emit_retransmits``; the agent turns it off while the eBPF ``tcp:tcp_retransmit_skb`` probe
  runs, which then owns that metric), ``OutSegs`` -> ``triscope_tcp_segments_out_total``,
  ``CurrEstab`` -> ``triscope_tcp_sockets{state="established"}``.  The TCP MIB counts IPv4 and
  IPv6 together.
- ``/proc/net/sockstat`` ``TCP: ... tw N`` -> ``triscope_tcp_sockets{state="time_wait"}`` (the
  TIME_WAIT table is shared by IPv4 and IPv6).

``/proc/net`` is per network namespace: inside a container the agent sees the pod's own
network unless it runs with the host's network namespace (``hostNetwork: true``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

from triscope.agent.collectors.base import Availability, BaseCollector, CollectorUnavailable, OpenFiles
from triscope.core.samples import Sample


def parse_snmp(text: str) -> dict[str, dict[str, int]]:
    """``/proc/net/snmp`` (and ``netstat``): pairs of header/value rows per protocol prefix.

    Returns ``{"Tcp": {"RetransSegs": 21, ...}, "Ip": {...}}``.  Raises ``ValueError`` on a
    header row without its value row or with a different number of fields.
    """

    out: dict[str, dict[str, int]] = {}
    pending: dict[str, list[str]] = {}
    for line in text.splitlines():
        if ":" not in line:
            continue
        proto, _, rest = line.partition(":")
        fields = rest.split()
        if proto not in pending:
            pending[proto] = fields
            continue
        header = pending.pop(proto)
        if len(header) != len(fields):
            raise ValueError(f"{proto}: {len(header)} names but {len(fields)} values")
        out[proto] = {name: int(value) for name, value in zip(header, fields, strict=True)}
    if pending:
        raise ValueError(f"header row without values for {', '.join(sorted(pending))}")
    return out


def parse_sockstat(text: str) -> dict[str, dict[str, int]]:
    """``/proc/net/sockstat``: ``TCP: inuse 1 orphan 0 tw 0 alloc 1 mem 154`` -> ``{"TCP": {...}}``."""

    out: dict[str, dict[str, int]] = {}
    for line in text.splitlines():
        proto, sep, rest = line.partition(":")
        if not sep:
            continue
        words = rest.split()
        out[proto.strip()] = {words[i]: int(words[i + 1]) for i in range(0, len(words) - 1, 2)}
    return out


class TcpCollector(BaseCollector):
    name = "tcp"

    def __init__(self, proc: str = "/proc", emit_retransmits: bool = True) -> None:
        self.proc = proc
        self.emit_retransmits = emit_retransmits
        self._files = OpenFiles()

    def _read(self, rel: str) -> str:
        return self._files.read(os.path.join(self.proc, rel))

    def close(self) -> None:
        self._files.close()

    def check(self) -> Availability:
        path = os.path.join(self.proc, "net/snmp")
        try:
            tcp = parse_snmp(self._read("net/snmp")).get("Tcp")
        except FileNotFoundError:
            return Availability(False, f"{path} not found (procfs not mounted at {self.proc}?)",
                                "mount procfs, or pass the host's /proc to the agent")
        except (OSError, ValueError) as e:
            return Availability(False, f"cannot read {path}: {e}", "check the agent's permissions on procfs")
        if not tcp or "RetransSegs" not in tcp:
            return Availability(False, f"{path} has no Tcp RetransSegs counter",
                                "the kernel's TCP MIB is missing: is this a network namespace without TCP?")
        if not os.path.exists(os.path.join(self.proc, "net/sockstat")):
            return Availability(True, "ok (no net/sockstat: TIME_WAIT count unavailable)", "")
        return Availability(True)

    def collect(self, now: float) -> Iterator[Sample]:
        try:
            tcp = parse_snmp(self._read("net/snmp"))["Tcp"]
        except (OSError, ValueError, KeyError) as e:
            raise CollectorUnavailable(f"cannot read {self.proc}/net/snmp Tcp counters: {e}",
                                       "check that procfs is mounted and readable") from e
        if self.emit_retransmits:
            yield Sample("triscope_tcp_retransmits_total", float(tcp["RetransSegs"]), {}, "counter")
        if "OutSegs" in tcp:
            yield Sample("triscope_tcp_segments_out_total", float(tcp["OutSegs"]), {}, "counter")
        if "CurrEstab" in tcp:
            yield Sample("triscope_tcp_sockets", float(tcp["CurrEstab"]), {"state": "established"}, "gauge")
        try:
            sock = parse_sockstat(self._read("net/sockstat"))
        except (OSError, ValueError):
            return  # TIME_WAIT is a nice-to-have; snmp above is the core of this collector
        tw = sock.get("TCP", {}).get("tw")
        if tw is not None:
            yield Sample("triscope_tcp_sockets", float(tw), {"state": "time_wait"}, "gauge")
