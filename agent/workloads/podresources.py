"""Which pod and container hold each device: the kubelet's pod-resources API, read as dcgm-exporter does.

The kubelet serves ``v1.PodResourcesLister`` (gRPC) on the unix socket
``/var/lib/kubelet/pod-resources/kubelet.sock``; ``List`` answers, for every pod on the node, its
containers and the device IDs each was given per resource name (``nvidia.com/gpu`` → GPU UUIDs
such as ``GPU-5b1c…`` — with time-slicing ``GPU-5b1c…::3`` — or ``MIG-…``; ``huawei.com/Ascend910``
→ ``Ascend910-0``; dynamic resources (DRA) → driver, pool and device name).  The agent needs no
Kubernetes API access for that, only the socket (mounted read-only into the DaemonSet).

The call is small and rare (once per ``refresh`` seconds, off the tick), so it is made here
without the gRPC runtime: one HTTP/2 request over the socket (the ``h2`` protocol library) and
the answer's protobuf decoded by hand for the few fields read — the wire format of the kubelet's
``api.proto`` (field numbers in ``_decode_*``).  ``tests/podresources_server.py`` serves the same
``.proto`` with the real gRPC runtime, so this client is tested against the protocol, not
against itself.

Why by hand and not through classes generated from that ``.proto`` (as OTLP is read, next
door): memory, measured (``python -m bench --only podresources``; docs/host-collectors.md, "Why
the pod-resources answer is decoded by hand").  The agent does not load protobuf unless
``--otlp-listen`` is on; importing it with the generated module adds 2.5 MB to the agent's
resident memory (3.1 MB after a typical answer) against 0.2 MB for this decoder, on every
Kubernetes node.  This decoder is slower: 1.4 ms against 0.5 ms for a node of 110 pods with 8
GPUs each, once every 30 s, off the tick.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import struct
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from urllib.parse import unquote

from triscope.core.textsafe import label_text, one_line

if TYPE_CHECKING:   # imported only where a socket is there to ask (off Kubernetes, never)
    import h2.connection

log = logging.getLogger(__name__)

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
MAX_MESSAGE = 4 << 20
"""The largest answer read: a node of 110 pods with 8 GPUs each answers in ~60 KiB; a 16 MiB answer took
30 s and 1.85 GB to decode, stalling the agent."""
MAX_OWNERS = 20_000
"""The most (pod, container, device) entries taken from one answer (110 pods x 16 containers x 8 devices
is 14,080)."""


class PodResourcesError(Exception):
    """Why no answer was taken.  ``reason``: a short stable key, counted per refusal
    (``PodResourcesWatch.refused``, ``triscope_pod_resources_refused_total``) when the kubelet did
    answer but the agent would not take it (``too_large``, ``too_many_devices``, ``too_many_fields``,
    ``decode_timeout``, ``malformed``); ``""`` for a kubelet that did not answer."""

    def __init__(self, message: str, reason: str = "") -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class DeviceOwner:
    """One device given to one container."""

    namespace: str
    pod: str
    container: str
    resource: str            # e.g. nvidia.com/gpu, or the DRA driver name
    device_id: str           # as the plugin named it (a GPU UUID, with any ::N sharing suffix removed)


@dataclass
class PodResources:
    owners: list[DeviceOwner] = field(default_factory=list)

    def by_device(self) -> dict[str, list[DeviceOwner]]:
        out: dict[str, list[DeviceOwner]] = {}
        for o in self.owners:
            out.setdefault(o.device_id, []).append(o)
        return out


# protobuf wire format ---------------------------------------------------------------------------------
# The answer is read in place (memoryview slices, never a copy of a pod's or a container's bytes), and
# every field the decoder steps over, and every device ID it takes, is counted as it goes: a kubelet
# answer of one container with a million device IDs is refused at the 20,001st, not after it was all
# decoded (3.1 s and +417 MB before).  The deadline is checked every ``_CHECK_EVERY`` fields, inside a
# container as well.
TEXT_BYTES = 1024
"""The bytes of one string field decoded: a label value keeps 256 characters (``label_text``), at most
4 bytes each in UTF-8."""
MAX_FIELDS = 10 * MAX_OWNERS
"""The most protobuf fields stepped over in one answer (a node at ``MAX_OWNERS`` devices has ~3 per
device): an answer of a million tiny unknown fields is refused, not walked."""
DECODE_S = 0.5
"""The most time one answer's decoding may take, within the call's own timeout: a node of 110 pods x 8
GPUs decodes in ~1.4 ms, one at ``MAX_OWNERS`` in ~40 ms."""
_CHECK_EVERY = 1024


class _Budget:
    """What decoding one answer may still do: device entries taken, fields stepped over, time."""

    __slots__ = ("deadline", "entries", "fields", "max_entries", "max_fields")

    def __init__(self, max_entries: int, max_fields: int, deadline: float | None) -> None:
        self.max_entries, self.max_fields, self.deadline = max_entries, max_fields, deadline
        self.entries = self.fields = 0

    def entry(self) -> None:
        self.entries += 1
        if self.entries > self.max_entries:
            raise PodResourcesError(f"pod-resources answer lists more than {self.max_entries} devices of containers: "
                                    "not taken", "too_many_devices")

    def check(self) -> None:
        if self.fields > self.max_fields:
            raise PodResourcesError(f"pod-resources answer holds more than {self.max_fields} protobuf fields: "
                                    "not taken", "too_many_fields")
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise PodResourcesError("pod-resources answer not decoded within the timeout: not taken", "decode_timeout")


def _varint(buf: memoryview, i: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        if i >= len(buf):
            raise PodResourcesError("truncated varint in the pod-resources answer", "malformed")
        b = buf[i]
        i += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, i
        shift += 7
        if shift > 63:
            raise PodResourcesError("varint too long in the pod-resources answer", "malformed")


def _fields(buf: memoryview, budget: _Budget) -> Iterator[tuple[int, int, int | memoryview]]:
    """(field number, wire type, value) of one message, length-delimited values as views into the
    answer; unknown fields are skipped by the caller.  Every field counts against ``budget``."""
    i, end = 0, len(buf)
    while i < end:
        budget.fields += 1
        if not budget.fields % _CHECK_EVERY:
            budget.check()
        key, i = _varint(buf, i)
        num, wt = key >> 3, key & 7
        if wt == 0:
            v, i = _varint(buf, i)
            yield num, wt, v
        elif wt == 1:
            yield num, wt, buf[i:i + 8]
            i += 8
        elif wt == 2:
            n, i = _varint(buf, i)
            if i + n > end:
                raise PodResourcesError("truncated field in the pod-resources answer", "malformed")
            yield num, wt, buf[i:i + n]
            i += n
        elif wt == 5:
            yield num, wt, buf[i:i + 4]
            i += 4
        else:
            raise PodResourcesError(f"unsupported protobuf wire type {wt} in the pod-resources answer", "malformed")


def _text(v: int | memoryview) -> str:
    """A string field of the answer, as a label value: its first ``TEXT_BYTES`` decoded, non-printable
    characters (controls, bidi overrides) replaced, bounded."""
    return label_text(str(v[:TEXT_BYTES], "utf-8", "replace")) if isinstance(v, memoryview) else ""


def _decode_devices(buf: memoryview, budget: _Budget, out: list[tuple[str, str]]) -> None:
    """A ``ContainerDevices``' (resource, device ID) pairs into ``out``, each ID counted as it is read."""
    resource, ids = "", []
    for num, wt, v in _fields(buf, budget):
        if num == 1 and wt == 2:
            resource = _text(v)
        elif num == 2 and wt == 2:
            budget.entry()
            ids.append(_text(v))
    out += [(resource, i) for i in ids]


def _decode_dynamic(buf: memoryview, budget: _Budget, out: list[tuple[str, str]]) -> None:
    for num, wt, v in _fields(buf, budget):          # DynamicResource
        if num == 4 and wt == 2 and isinstance(v, memoryview):
            driver = device = ""
            for n2, w2, v2 in _fields(v, budget):    # ClaimResource
                if n2 == 2 and w2 == 2:
                    driver = _text(v2)
                elif n2 == 4 and w2 == 2:
                    device = _text(v2)
            if device:
                budget.entry()
                out.append((driver, device))


def _decode_container(buf: memoryview, budget: _Budget) -> tuple[str, list[tuple[str, str]]]:
    name = ""
    devices: list[tuple[str, str]] = []
    for num, wt, v in _fields(buf, budget):          # ContainerResources
        if num == 1 and wt == 2:
            name = _text(v)
        elif num == 2 and wt == 2 and isinstance(v, memoryview):
            _decode_devices(v, budget, devices)
        elif num == 5 and wt == 2 and isinstance(v, memoryview):
            _decode_dynamic(v, budget, devices)
    return name, devices


def decode_list_response(buf: bytes | bytearray | memoryview, *, max_owners: int = MAX_OWNERS,
                         max_fields: int | None = None, deadline: float | None = None) -> PodResources:
    """The devices of every container; ``PodResourcesError`` past ``max_owners`` entries or
    ``max_fields`` fields (counted while each container is decoded), or past ``deadline``
    (``time.monotonic()``, checked every ``_CHECK_EVERY`` fields): a kubelet cannot make the agent
    decode without bound, in time or memory."""
    budget = _Budget(max_owners, max(MAX_FIELDS, 10 * max_owners) if max_fields is None else max_fields, deadline)
    out = PodResources()
    for num, wt, v in _fields(memoryview(buf), budget):          # ListPodResourcesResponse
        if num != 1 or wt != 2 or not isinstance(v, memoryview):
            continue
        budget.check()
        pod = ns = ""
        containers = []
        for n2, w2, v2 in _fields(v, budget):        # PodResources
            if n2 == 1 and w2 == 2:
                pod = _text(v2)
            elif n2 == 2 and w2 == 2:
                ns = _text(v2)
            elif n2 == 3 and w2 == 2 and isinstance(v2, memoryview):
                containers.append(_decode_container(v2, budget))
        for cname, devices in containers:
            for resource, dev in devices:
                out.owners.append(DeviceOwner(ns, pod, cname, resource, normalise_device_id(dev)))
    return out


def normalise_device_id(dev: str) -> str:
    """The device a plugin's ID names: a shared GPU's replica suffix (``GPU-…::3``, time-slicing and
    MPS in NVIDIA's plugin) is dropped, as dcgm-exporter does."""
    return dev.split("::", 1)[0]


# gRPC over HTTP/2 on a unix socket ------------------------------------------------------------------------
@dataclass
class _Answer:
    """What the kubelet's HTTP/2 stream brought: the HTTP status, the gRPC status and message (from the
    trailers, or the headers of a trailers-only error) and the length-prefixed message."""

    http_status: str = ""
    status: str | None = None
    message: str = ""
    body: bytearray = field(default_factory=bytearray)
    done: bool = False


def list_pod_resources(path: str = DEFAULT_SOCKET, timeout: float = 2.0) -> PodResources:
    """``v1.PodResourcesLister/List`` on the kubelet's socket, within ``timeout`` seconds in all."""
    deadline = time.monotonic() + timeout
    try:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        sock.connect(path)
    except FileNotFoundError:
        raise PodResourcesError(f"no kubelet pod-resources socket at {path}") from None
    except OSError as e:
        raise PodResourcesError(f"kubelet pod-resources socket {path}: {e.strerror or e}") from None
    try:
        answer = _call(sock, path, timeout, deadline)
    except PodResourcesError:
        raise
    except Exception as e:  # noqa: BLE001 - h2 protocol errors, resets
        raise PodResourcesError(f"kubelet pod-resources socket {path}: {type(e).__name__}: {e}") from None
    finally:
        with contextlib.suppress(OSError):
            sock.close()
    return decode_list_response(_message(answer, path, timeout), deadline=min(deadline, time.monotonic() + DECODE_S))


def _call(sock: socket.socket, path: str, timeout: float, deadline: float) -> _Answer:
    """One unary call on a fresh HTTP/2 connection: the request out, the stream's events in, every
    ``recv`` bounded by ``deadline``."""
    import h2.config
    import h2.connection

    conn = h2.connection.H2Connection(config=h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
    conn.initiate_connection()
    sid = conn.get_next_available_stream_id()
    conn.send_headers(sid, [(":method", "POST"), (":scheme", "http"), (":path", "/v1.PodResourcesLister/List"),
                            (":authority", "localhost"), ("content-type", "application/grpc"), ("te", "trailers"),
                            ("grpc-timeout", f"{max(1, int(timeout * 1000))}m"),
                            ("user-agent", "triscope-agent")])
    conn.send_data(sid, b"\x00\x00\x00\x00\x00", end_stream=True)   # an empty ListPodResourcesRequest
    sock.sendall(conn.data_to_send())
    answer = _Answer()
    late = f"kubelet pod-resources socket {path}: no answer within {timeout:g} s"
    while not answer.done:
        left = deadline - time.monotonic()
        if left <= 0:
            raise PodResourcesError(late)
        sock.settimeout(left)
        try:
            data = sock.recv(65536)
        except TimeoutError:
            raise PodResourcesError(late) from None
        if not data:
            raise PodResourcesError(f"kubelet pod-resources socket {path}: closed before the answer ended")
        for ev in conn.receive_data(data):
            _take(conn, ev, answer)
        out = conn.data_to_send()
        if out:
            sock.sendall(out)
    return answer


def _take(conn: h2.connection.H2Connection, ev: object, answer: _Answer) -> None:
    """One h2 event of the stream into ``answer``."""
    import h2.events

    if isinstance(ev, h2.events.ResponseReceived):
        hdrs = _headers(ev.headers)
        answer.http_status = str(hdrs.get(":status", ""))
        if "grpc-status" in hdrs:     # trailers-only answer (an error)
            answer.status, answer.message = str(hdrs["grpc-status"]), str(hdrs.get("grpc-message", ""))
    elif isinstance(ev, h2.events.DataReceived):
        answer.body += ev.data
        conn.acknowledge_received_data(ev.flow_controlled_length or 0, ev.stream_id or 0)
        body = answer.body
        # the gRPC length prefix says the size before the message comes: refused at once when over
        if len(body) > MAX_MESSAGE + 5 or (len(body) >= 5 and int.from_bytes(body[1:5], "big") > MAX_MESSAGE):
            raise PodResourcesError(f"pod-resources answer larger than {MAX_MESSAGE >> 20} MiB: not taken", "too_large")
    elif isinstance(ev, h2.events.TrailersReceived):
        hdrs = _headers(ev.headers)
        answer.status, answer.message = str(hdrs.get("grpc-status", "")), str(hdrs.get("grpc-message", ""))
    elif isinstance(ev, h2.events.StreamEnded | h2.events.StreamReset | h2.events.ConnectionTerminated):
        answer.done = True


def _message(answer: _Answer, path: str, timeout: float) -> memoryview:
    """The ``ListPodResourcesResponse`` bytes of a successful call, else ``PodResourcesError`` saying why."""
    if answer.http_status and answer.http_status != "200":
        raise PodResourcesError(f"kubelet pod-resources: HTTP {answer.http_status}")
    if answer.status == "4":   # DEADLINE_EXCEEDED: the kubelet ran out of the grpc-timeout we sent, our own deadline
        raise PodResourcesError(f"kubelet pod-resources socket {path}: no answer within {timeout:g} s "
                                f"(the kubelet's deadline passed)")
    if answer.status not in (None, "0"):
        # grpc-message is percent-encoded (gRPC's HTTP/2 spec) and the kubelet's text: decoded, then
        # every control character escaped before it reaches a log line or a stored event
        raise PodResourcesError(f"kubelet pod-resources: gRPC status {answer.status} "
                                f"{one_line(unquote(answer.message), 200)}".strip())
    body = answer.body
    if len(body) < 5:
        raise PodResourcesError("kubelet pod-resources: empty answer")
    compressed, length = body[0], struct.unpack(">I", bytes(body[1:5]))[0]
    if compressed:
        raise PodResourcesError("kubelet pod-resources: compressed answer (not asked for)", "malformed")
    if length != len(body) - 5:
        raise PodResourcesError(f"kubelet pod-resources: message of {length} bytes in {len(body) - 5}", "malformed")
    return memoryview(body)[5:]      # read in place: no copy of up to 4 MiB


def _headers(raw: object) -> dict[str, str]:
    """h2 hands headers as (name, value) pairs, str with ``header_encoding`` set, bytes without."""
    out: dict[str, str] = {}
    for k, v in raw or ():  # type: ignore[attr-defined]
        out[k.decode() if isinstance(k, bytes) else str(k)] = v.decode() if isinstance(v, bytes) else str(v)
    return out


# the agent's view: refreshed off the tick, degraded once ------------------------------------------------
class PodResourcesWatch:
    """The latest ``List`` answer, refreshed by its caller (the workloads collector's worker, off the
    tick) when ``due()``: every ``every`` seconds.

    No socket is normal off Kubernetes: one info line, and the agent never imports the HTTP/2
    library.  A socket that errors (kubelet down, wrong protocol, no permission) degrades once:
    one warning with the reason and one ``collector`` event, then one line when it answers again.
    Meanwhile the last good answer stands in for ``keep_s`` seconds (pods change rarely; a kubelet
    restart should not strip the labels), then the owners are dropped.

    An answer the kubelet gave but the agent will not take (over 4 MiB, over ``MAX_OWNERS`` devices,
    too many fields, not decoded in time, malformed) is **refused**: counted by its reason in
    ``refused`` (``triscope_pod_resources_refused_total{reason}``), and one warning per new reason says
    so and what mapping stands meanwhile (the last good one, under the same ``keep_s``).
    """

    def __init__(self, path: str = DEFAULT_SOCKET, *, every: float = 30.0, timeout: float = 2.0,
                 keep_s: float = 300.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.path = path
        self.every = every
        self.timeout = timeout
        self.keep_s = keep_s
        self.clock = clock
        self.state = "unread"          # unread, missing, ok, error
        self.reason = "not read yet"
        self.owners: dict[str, list[DeviceOwner]] = {}
        self.pods = 0
        self.refused: dict[str, int] = {}      # reason -> answers refused (counted, every one)
        self._next = 0.0
        self._good_at: float | None = None

    def due(self) -> bool:
        return self.clock() >= self._next

    @property
    def next_due(self) -> float:
        return self._next

    def refresh(self) -> list[tuple[str, str]]:
        """Ask the kubelet now.  Returns (severity, message) for each change of state worth an event."""
        self._next = self.clock() + self.every
        changes: list[tuple[str, str]] = []
        if not os.path.exists(self.path):
            if self.state != "missing":
                if self.state in ("ok", "error") and self._good_at is not None:
                    log.warning("kubelet pod-resources socket %s is gone; pods are not named until it returns",
                                self.path)
                    changes.append(("warning", f"kubelet pod-resources socket {self.path} is gone"))
                else:
                    log.info("no kubelet pod-resources socket at %s (not on Kubernetes, or not mounted): "
                             "workloads are named by unit or command", self.path)
            self.state, self.reason = "missing", f"no kubelet pod-resources socket at {self.path}"
            self._expire()
            return changes
        try:
            res = list_pod_resources(self.path, timeout=self.timeout)
        except PodResourcesError as e:
            if e.reason:
                self.refused[e.reason] = self.refused.get(e.reason, 0) + 1
                if self.state != "error" or not self.reason.startswith(f"refused ({e.reason})"):
                    log.warning("kubelet pod-resources: answer refused (%s): %s; %s", e.reason, e, self._standing())
                    changes.append(("warning", f"kubelet pod-resources answer refused ({e.reason}): {e}"))
                self.state, self.reason = "error", f"refused ({e.reason}): {e}"
                self._expire()
                return changes
            if self.state != "error":
                log.warning("kubelet pod-resources: %s; pods are not named until it answers", e)
                changes.append(("warning", f"kubelet pod-resources unavailable: {e}"))
            self.state, self.reason = "error", str(e)
            self._expire()
            return changes
        if self.state == "error" or (self.state == "missing" and self._good_at is not None):
            log.warning("kubelet pod-resources answers again (%s)", self.path)
            changes.append(("info", f"kubelet pod-resources answers again ({self.path})"))
        self.owners = res.by_device()
        self.pods = len({(o.namespace, o.pod) for o in res.owners})
        self.state, self.reason = "ok", f"{self.pods} pod(s) with devices, {len(self.owners)} device(s)"
        self._good_at = self.clock()
        return changes

    def _standing(self) -> str:
        """What names pods while no answer is taken, for the log line."""
        if self._good_at is None or not self.owners:
            return "no earlier answer: pods are not named from pod-resources until one is taken"
        return (f"the previous answer ({self.pods} pod(s), {len(self.owners)} device(s), read "
                f"{self.clock() - self._good_at:.0f} s ago) stands for up to {self.keep_s:g} s")

    def _expire(self) -> None:
        if self._good_at is None or self.clock() - self._good_at > self.keep_s:
            self.owners = {}


def probe(path: str = DEFAULT_SOCKET, timeout: float = 2.0) -> tuple[bool, str, str]:
    """For ``triscope doctor``: (reachable, what it said, what to do)."""
    if not os.path.exists(path):
        return (False, f"no kubelet pod-resources socket at {path} (normal off Kubernetes)",
                "on Kubernetes, mount /var/lib/kubelet/pod-resources read-only into the agent (deploy/kustomize)")
    try:
        res = list_pod_resources(path, timeout=timeout)
    except PodResourcesError as e:
        return False, str(e), "check that the kubelet runs and the agent may read its socket (root)"
    pods = len({(o.namespace, o.pod) for o in res.owners})
    return True, f"{path}: {pods} pod(s) hold {len(res.by_device())} device(s)", ""
