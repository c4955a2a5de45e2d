"""The ``net_drop`` knob: drop a share of the service port's TCP packets, so TCP retransmits for real.

Which tool, in this order (the first that exists and works):

* ``nft``: a table ``inet triscope_drop_<port>`` with an input rule (``tcp dport <port>``) and an output
  rule (``tcp sport <port>``), each ``numgen random mod 10000 < ratio*10000 drop``.  Removing it deletes
  the table.  Needs the kernel's nf_tables with numgen.
* ``iptables``: the same two rules with ``-m statistic --mode random --probability ratio`` and a comment
  naming the port, inserted at the top of INPUT and OUTPUT; removed with ``-D``.
* ``tc`` netem: a ``prio`` root qdisc on the device (``--net-dev``, ``lo`` by default) with a netem
  ``loss`` band that a u32 filter sends the port's packets to (both directions).  Only on a device whose
  root qdisc is still the default: the service never replaces another root qdisc.  Needs the kernel's
  sch_prio, sch_netem and cls_u32.

Both directions are dropped: the client's retransmits show on the client's host, the server's (its
replies) on the service's node, where the agent counts ``tcp:tcp_retransmit_skb``.

Root (CAP_NET_ADMIN) is needed.  When no tool works, ``available`` is False and ``reason`` says why
in one line; the service then exports ``inference_net_fault_info{available="false",reason=...}`` and
applies nothing.  Rules are per network namespace; the service removes its rule when it stops and,
at start, any rule a killed instance on the same port left behind.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass

METHODS = ("nft", "iptables", "tc-netem")
Runner = Callable[[Sequence[str], str | None], tuple[int, str]]


def _run(cmd: Sequence[str], stdin: str | None = None) -> tuple[int, str]:
    try:
        p = subprocess.run(list(cmd), input=stdin, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as e:
        return 127, str(e)
    return p.returncode, (p.stderr or p.stdout).strip()


def _first_line(text: str) -> str:
    for line in text.splitlines():
        if line.strip():
            return line.strip()
    return ""


@dataclass(frozen=True, slots=True)
class Detection:
    method: str            # nft | iptables | tc-netem | none
    available: bool
    reason: str            # why not, or what it will do


def detect(prefer: str | None = None, run: Runner = _run, which: Callable[[str], str | None] = shutil.which,
           euid: Callable[[], int] = os.geteuid) -> Detection:
    """Which drop tool this host can use.  Checks that it exists and answers, not that the kernel has
    every module: ``NetFault.apply`` reports a kernel refusal as unavailable too."""
    order = [prefer] if prefer else list(METHODS)
    if euid() != 0:
        return Detection("none", False, "net_drop needs root (CAP_NET_ADMIN) to install a drop rule")
    missing: list[str] = []
    for m in order:
        if m == "nft":
            if which("nft") is None:
                missing.append("nft not installed")
                continue
            rc, out = run(["nft", "list", "tables"], None)
            if rc == 0:
                return Detection("nft", True, "nft random-drop rules on the service port (input and output)")
            missing.append(f"nft: {_first_line(out)}")
        elif m == "iptables":
            if which("iptables") is None:
                missing.append("iptables not installed")
                continue
            rc, out = run(["iptables", "-w", "-S", "INPUT"], None)
            if rc == 0:
                return Detection("iptables", True, "iptables statistic-match drop rules on the service port")
            missing.append(f"iptables: {_first_line(out)}")
        elif m == "tc-netem":
            if which("tc") is None:
                missing.append("tc not installed")
                continue
            return Detection("tc-netem", True, "tc prio + netem loss band for the service port")
        else:
            missing.append(f"unknown method {m!r}")
    return Detection("none", False, "no drop tool works here: " + "; ".join(missing))


class NetFault:
    """Apply / change / remove the drop rule for one port.  ``apply(0)`` removes it."""

    def __init__(self, port: int, dev: str = "lo", prefer: str | None = None, run: Runner = _run,
                 detection: Detection | None = None) -> None:
        self.port = int(port)
        self.dev = dev
        self._run = run
        self.detection = detection or detect(prefer, run=run)
        self.applied = 0.0
        self.last_error: str | None = None
        if self.detection.available:
            self._remove(quiet=True)   # whatever a killed instance on this port left behind

    @property
    def method(self) -> str:
        return self.detection.method

    @property
    def available(self) -> bool:
        return self.detection.available

    def reason(self) -> str:
        return self.last_error or self.detection.reason

    def apply(self, ratio: float) -> bool:
        """Drop ``ratio`` (0 <= ratio < 1) of the port's packets; True when the host now does so."""
        ratio = float(ratio)
        if ratio <= 0:
            ok = self._remove()
            if ok:
                self.applied = 0.0
            return ok
        if not self.detection.available:
            self.last_error = self.detection.reason
            return False
        self._remove(quiet=True)
        if self.method == "nft":
            ok, err = self._nft_add(ratio)
        elif self.method == "iptables":
            ok, err = self._ipt_add(ratio)
        else:
            ok, err = self._tc_add(ratio)
        if ok:
            self.applied = ratio
            self.last_error = None
        else:
            self._remove(quiet=True)
            self.applied = 0.0
            self.last_error = f"{self.method} refused the drop rule: {err}"
        return ok

    # -- nft ----------------------------------------------------------------------------------
    @property
    def table(self) -> str:
        return f"triscope_drop_{self.port}"

    def _nft_add(self, ratio: float) -> tuple[bool, str]:
        thr = max(1, min(9999, round(ratio * 10000)))
        script = (
            f"table inet {self.table} {{\n"
            f"  chain input {{ type filter hook input priority -10; policy accept;\n"
            f"    tcp dport {self.port} numgen random mod 10000 < {thr} counter drop\n  }}\n"
            f"  chain output {{ type filter hook output priority -10; policy accept;\n"
            f"    tcp sport {self.port} numgen random mod 10000 < {thr} counter drop\n  }}\n"
            f"}}\n")
        rc, out = self._run(["nft", "-f", "-"], script)
        return rc == 0, _first_line(out)

    # -- iptables -----------------------------------------------------------------------------
    def _ipt_rules(self, ratio: float) -> list[list[str]]:
        p = f"{ratio:.4f}"
        tag = ["-m", "comment", "--comment", f"triscope-drop-{self.port}"]
        return [["INPUT", "-p", "tcp", "--dport", str(self.port), "-m", "statistic", "--mode", "random",
                 "--probability", p, *tag, "-j", "DROP"],
                ["OUTPUT", "-p", "tcp", "--sport", str(self.port), "-m", "statistic", "--mode", "random",
                 "--probability", p, *tag, "-j", "DROP"]]

    def _ipt_add(self, ratio: float) -> tuple[bool, str]:
        for rule in self._ipt_rules(ratio):
            rc, out = self._run(["iptables", "-w", "-I", rule[0], "1", *rule[1:]], None)
            if rc != 0:
                return False, _first_line(out)
        return True, ""

    def _ipt_remove(self) -> bool:
        ok = True
        tag = f"triscope-drop-{self.port}"
        for chain in ("INPUT", "OUTPUT"):
            rc, out = self._run(["iptables", "-w", "-S", chain], None)
            if rc != 0:
                ok = False
                continue
            for line in out.splitlines() if rc == 0 else []:
                if tag in line and line.startswith("-A "):
                    args = line.split()[1:]
                    args = [a.strip('"') for a in args]
                    rc2, _ = self._run(["iptables", "-w", "-D", *args], None)
                    ok = ok and rc2 == 0
        return ok

    # -- tc netem -----------------------------------------------------------------------------
    def _tc_root_is_ours(self) -> bool | None:
        """True: our prio root; False: the default root (nothing to remove); None: someone else's root."""
        rc, out = self._run(["tc", "qdisc", "show", "dev", self.dev], None)
        if rc != 0:
            return None
        first = _first_line(out)
        if first.startswith("qdisc noqueue") or first.startswith("qdisc pfifo_fast") or not first:
            return False
        if first.startswith("qdisc prio 7e57:") and "netem" in out:
            return True
        return None

    def _tc_add(self, ratio: float) -> tuple[bool, str]:
        state = self._tc_root_is_ours()
        if state is None:
            return False, f"{self.dev} already has a root qdisc that is not the default; not replacing it"
        cmds = [
            ["tc", "qdisc", "add", "dev", self.dev, "root", "handle", "7e57:", "prio", "bands", "4",
             "priomap", "1", "2", "2", "2", "1", "2", "0", "0", "1", "1", "1", "1", "1", "1", "1", "1"],
            ["tc", "qdisc", "add", "dev", self.dev, "parent", "7e57:4", "handle", "7e58:", "netem", "loss",
             f"{ratio * 100:.2f}%"],
            ["tc", "filter", "add", "dev", self.dev, "parent", "7e57:", "protocol", "ip", "prio", "1", "u32",
             "match", "ip", "dport", str(self.port), "0xffff", "flowid", "7e57:4"],
            ["tc", "filter", "add", "dev", self.dev, "parent", "7e57:", "protocol", "ip", "prio", "1", "u32",
             "match", "ip", "sport", str(self.port), "0xffff", "flowid", "7e57:4"],
        ]
        for c in cmds:
            rc, out = self._run(c, None)
            if rc != 0:
                return False, _first_line(out) or f"{' '.join(c[:4])} failed"
        return True, ""

    # -- removal ------------------------------------------------------------------------------
    def _remove(self, quiet: bool = False) -> bool:
        if not self.detection.available:
            return True
        if self.method == "nft":
            rc, out = self._run(["nft", "list", "table", "inet", self.table], None)
            if rc != 0:
                return True   # no such table: nothing to remove
            rc, out = self._run(["nft", "delete", "table", "inet", self.table], None)
            ok = rc == 0
        elif self.method == "iptables":
            ok = self._ipt_remove()
            out = "iptables -D failed"
        else:
            state = self._tc_root_is_ours()
            if state is not True:
                return True
            rc, out = self._run(["tc", "qdisc", "del", "dev", self.dev, "root"], None)
            ok = rc == 0
        if not ok and not quiet:
            self.last_error = f"{self.method}: could not remove the drop rule: {_first_line(out)}"
        return ok

    def close(self) -> None:
        if self.applied > 0:
            self.apply(0.0)
