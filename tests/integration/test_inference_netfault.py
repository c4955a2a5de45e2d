"""The ``net_drop`` knob: which drop tool the host has, and (as root, in a private network namespace so
the machine's own loopback is never touched) a real drop rule that makes TCP retransmit, removed again.

Where no tool works (not root, no nft/iptables/tc), the service must say so on /metrics and in the
admin answer; that is asserted instead.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from examples.inference.netfault import NetFault, detect  # noqa: E402

# brings the namespace's loopback up with SIOCGIFFLAGS / SIOCSIFFLAGS (no iproute2 needed)
LO_UP = """
import fcntl, socket, struct, sys
with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as _s:
    _req = struct.pack("16sH", b"lo", 0)
    _flags = struct.unpack("16sH", fcntl.ioctl(_s.fileno(), 0x8913, _req)[:18])[1]
    fcntl.ioctl(_s.fileno(), 0x8914, struct.pack("16sH", b"lo", _flags | 0x1))
"""


def _netns_ok() -> str | None:
    """None when this process can run commands in a fresh network namespace, else why not."""
    if os.geteuid() != 0:
        return "not root: no network namespace, no drop rules"
    if shutil.which("unshare") is None:
        return "unshare (util-linux) not installed"
    p = subprocess.run(["unshare", "-n", sys.executable, "-c", LO_UP], capture_output=True, text=True)
    if p.returncode != 0:
        return f"cannot make a network namespace here: {p.stderr.strip().splitlines()[-1:]}"
    return None


def _in_netns(code: str, timeout: float = 120) -> dict:
    script = LO_UP + f"sys.path.insert(0, {str(REPO)!r})\n" + textwrap.dedent(code)
    p = subprocess.run(["unshare", "-n", sys.executable, "-c", script], capture_output=True, text=True,
                       timeout=timeout, cwd=REPO)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_detection_without_root_says_so():
    d = detect(euid=lambda: 1000)
    assert d.method == "none" and not d.available and d.reason == \
        "net_drop needs root (CAP_NET_ADMIN) to install a drop rule"


def test_detection_without_tools_lists_what_is_missing():
    d = detect(euid=lambda: 0, which=lambda name: None)
    assert not d.available
    assert d.reason == "no drop tool works here: nft not installed; iptables not installed; tc not installed"


def test_detection_prefers_nft_then_iptables_then_tc():
    calls: list[list[str]] = []

    def run(cmd, stdin=None):
        calls.append(list(cmd))
        return (1, "Error: Could not process rule: Operation not supported") if cmd[0] == "nft" else (0, "")
    d = detect(euid=lambda: 0, which=lambda name: f"/usr/sbin/{name}", run=run)
    assert d.method == "iptables" and d.available
    assert calls[0] == ["nft", "list", "tables"] and calls[1][0] == "iptables"
    d = detect(euid=lambda: 0, which=lambda name: "/usr/sbin/tc" if name == "tc" else None, run=run)
    assert d.method == "tc-netem" and d.available


def test_unavailable_tool_applies_nothing_and_says_why():
    nf = NetFault(8123, detection=detect(euid=lambda: 1000))
    assert nf.apply(0.1) is False and nf.applied == 0.0
    assert "needs root" in nf.reason()
    assert nf.apply(0.0) is True      # removing nothing is fine


NETNS_SERVICE = """
import json, subprocess, time, urllib.request
from examples.inference.server import InferenceServer, build_service
from examples.inference.loadgen import LoadSpec, make_payloads, run_load
from prometheus_client.parser import text_string_to_metric_families

def retrans():
    rows = [line.split() for line in open("/proc/net/snmp") if line.startswith("Tcp:")]
    return int(rows[1][rows[0].index("RetransSegs")])

def post(url, body):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())

def metrics(url):
    text = urllib.request.urlopen(url + "/metrics", timeout=60).read().decode()
    return {s.name: s for f in text_string_to_metric_families(text) for s in f.samples}

srv = InferenceServer()
svc = build_service("cpu", port=srv.port, net_tool="auto", neighbour=False)
srv.attach(svc).start()
nf = svc.netfault
out = {"method": nf.method, "available": nf.available, "reason": nf.reason(), "port": srv.port}
payloads = make_payloads(seed=2, images=2, audios=1, texts=4, audio_seconds=(1, 1))
spec = LoadSpec(url=srv.url, rate=12, duration=2.5, mix={"image": 1.0}, concurrency=4, timeout=60)
r0 = retrans()
out["before"] = run_load(spec, payloads).to_dict()
r1 = retrans()
out["reply"] = post(srv.url + "/admin/knobs", {"net_drop": 0.1})
m = metrics(srv.url)
out["metric_applied"] = m["inference_net_drop_applied_ratio"].value
out["metric_info"] = m["inference_net_fault_info"].labels
if nf.method == "nft":
    out["rule"] = subprocess.run(["nft", "list", "table", "inet", nf.table], capture_output=True, text=True).stdout
elif nf.method == "iptables":
    out["rule"] = subprocess.run(["iptables", "-S"], capture_output=True, text=True).stdout
r2 = retrans()
out["during"] = run_load(spec, payloads).to_dict()
r3 = retrans()
out["reply_off"] = post(srv.url + "/admin/knobs", {"net_drop": 0})
if nf.method == "nft":
    out["rule_after"] = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True).stdout
elif nf.method == "iptables":
    out["rule_after"] = subprocess.run(["iptables", "-S"], capture_output=True, text=True).stdout
out["retrans_before"] = r1 - r0
out["retrans_during"] = r3 - r2
srv.stop()
print(json.dumps(out))
"""


def test_net_drop_in_a_private_namespace_retransmits_or_reports_unavailable():
    why = _netns_ok()
    if why is not None:
        # no namespace to try it in: what the service says on this host is the check
        d = detect()
        assert not d.available or d.method in ("nft", "iptables", "tc-netem")
        if os.geteuid() != 0:
            assert d.reason.startswith("net_drop needs root")
        pytest.skip(f"real drop rule not tried: {why}")
    out = _in_netns(NETNS_SERVICE, timeout=240)
    assert out["before"]["ok"] == out["before"]["sent"] > 0
    # no tool, or tc detected on a kernel without netem: the knob must say it was not applied
    if (not out["available"] or out["method"] == "tc-netem") and out["reply"]["applied"]["net_drop"] == 0:
        assert out["reply"]["warnings"] and out["reply"]["warnings"][0].startswith("net_drop: not applied:")
        assert out["metric_applied"] == 0.0
        if not out["available"]:
            assert out["metric_info"]["available"] == "false" and out["metric_info"]["reason"] == out["reason"]
        return
    assert out["available"] and out["reply"]["warnings"] == []
    assert out["reply"]["applied"]["net_drop"] == 0.1 and out["metric_applied"] == 0.1
    assert out["metric_info"]["method"] == out["method"] and out["metric_info"]["available"] == "true"
    if out["method"] == "nft":
        assert f"tcp dport {out['port']}" in out["rule"] and f"tcp sport {out['port']}" in out["rule"]
        assert f"triscope_drop_{out['port']}" not in out["rule_after"]
    elif out["method"] == "iptables":
        assert f"triscope-drop-{out['port']}" in out["rule"] and f"triscope-drop-{out['port']}" not in out["rule_after"]
    # the requests still complete (TCP recovers) but the kernel had to retransmit, and only with the rule
    assert out["during"]["ok"] == out["during"]["sent"] > 0
    # (loopback retransmits a little on its own: tail-loss probes count as retransmits)
    assert out["retrans_during"] >= max(8, out["retrans_before"] + 5), (out["retrans_before"], out["retrans_during"])
    assert out["reply_off"]["applied"]["net_drop"] == 0.0


def test_tc_netem_applies_or_reports_the_kernel_refusal():
    why = _netns_ok()
    if why is not None:
        pytest.skip(f"not tried: {why}")
    if shutil.which("tc") is None:
        pytest.skip("tc (iproute2) not installed")
    out = _in_netns("""
        import json, subprocess
        from examples.inference.netfault import NetFault
        nf = NetFault(8765, dev="lo", prefer="tc-netem")
        ok = nf.apply(0.1)
        shown = subprocess.run(["tc", "qdisc", "show", "dev", "lo"], capture_output=True, text=True).stdout
        removed = nf.apply(0.0)
        after = subprocess.run(["tc", "qdisc", "show", "dev", "lo"], capture_output=True, text=True).stdout
        print(json.dumps({"ok": ok, "reason": nf.reason(), "shown": shown, "removed": removed, "after": after}))
    """)
    if out["ok"]:
        assert "netem" in out["shown"] and "loss 10%" in out["shown"]
    else:
        assert out["reason"].startswith("tc-netem refused the drop rule: ")
    # either way the device is back to its default root qdisc
    assert out["removed"] and out["after"].startswith("qdisc noqueue")
