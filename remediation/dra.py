"""One GPU in DRA's terms: which device of the node's ``ResourceSlice``s it is, and the ``DeviceTaintRule``
that takes it (and only it) out of service.

Pure functions over the API's JSON (``resource.k8s.io/v1``, the same shapes in ``v1beta2``); the
calls themselves are :class:`triscope.remediation.kube.adapter.KubeAdapter`'s.

* A DRA driver publishes each device in a ``ResourceSlice`` (``spec.driver``, ``spec.pool.name``,
  ``spec.nodeName``, ``spec.devices[].name`` and its ``attributes``).  The device that is one GPU is
  found by what the agent knows of it from NVML: its **UUID** (an attribute named ``uuid`` in any
  domain: NVIDIA's DRA driver publishes ``uuid: {string: GPU-...}``) or, when no device carries that
  UUID, its **PCI bus id** (the standard ``resource.kubernetes.io/pciBusID``, or a driver's
  ``pciBusID`` / ``pcieBusID``).  Only the slices of a pool's newest ``generation`` count (older ones
  are being replaced by the driver).  Two devices matching is an ambiguity, never a guess.
* A ``DeviceTaintRule`` is cluster-scoped; its ``spec.deviceSelector`` is ANDed and **an empty
  selector matches every device of the cluster**: :func:`rule_body` refuses to build one without
  ``driver``, ``pool`` and ``device`` all set (``IncompleteSelector``).
* Its name derives from node and device (:func:`rule_name`), so a decision re-run, or an engine
  restarted since, finds its own rule (409 AlreadyExists on create) and adopts it; the label
  ``app.kubernetes.io/managed-by: triscope`` and the annotation ``triscope.io/isolation`` (JSON:
  node, accelerator, state, since, rule, decision, untaint_after, the device's UUID / bus id) say
  whose it is and why.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypedDict, cast

GROUP = "resource.k8s.io"
VERSIONS = ("v1", "v1beta2")
"""The ``resource.k8s.io`` versions the engine speaks, preferred first: ``DeviceTaintRule`` is
``v1`` from Kubernetes 1.37, ``v1beta2`` in 1.36 (behind the ``DRADeviceTaintRules`` gate)."""
MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGER = "triscope"
COMPONENT_LABEL = "triscope.io/action"
COMPONENT = "isolate-accelerator"
RULE_SELECTOR = f"{MANAGED_BY}={MANAGER},{COMPONENT_LABEL}={COMPONENT}"
ISOLATION = "triscope.io/isolation"
"""The rule's annotation: JSON of :class:`Isolation` (what the engine decided, and when to release it)."""
TAINT_KEY = "triscope.io/accelerator-degraded"
EFFECTS = ("None", "NoSchedule", "NoExecute")
UUID_NAMES = ("uuid",)
BUS_ID_NAMES = ("pcibusid", "pciebusid")
_NAME_CHARS = re.compile(r"[^a-z0-9.-]+")


class IncompleteSelector(ValueError):
    """A DeviceTaintRule without driver, pool and device: it would taint more than one device."""


class Isolation(TypedDict, total=False):
    """The ``ISOLATION`` annotation of a rule the engine wrote."""

    node: str
    accelerator: str
    state: str
    since: str
    since_ts: float
    rule: str
    decision: int | None
    untaint_after: float
    uuid: str
    bus_id: str
    dry_run: bool
    by: str


@dataclass(frozen=True)
class DraDevice:
    """One device a DRA driver publishes: the triple that names it, and its attributes (as text)."""

    driver: str
    pool: str
    name: str
    node: str = ""
    attributes: Mapping[str, str] = field(default_factory=dict)

    def describe(self) -> str:
        return f"{self.driver}/{self.pool}/{self.name}"


@dataclass(frozen=True)
class TaintRule:
    """A ``DeviceTaintRule`` as the engine reads it."""

    name: str
    driver: str
    pool: str
    device: str
    effect: str
    key: str
    ours: bool
    isolation: Isolation
    uid: str = ""
    conditions: tuple[Mapping[str, Any], ...] = ()

    @classmethod
    def of(cls, raw: Mapping[str, Any]) -> TaintRule:
        meta, spec = raw.get("metadata") or {}, raw.get("spec") or {}
        sel, taint = spec.get("deviceSelector") or {}, spec.get("taint") or {}
        labels = meta.get("labels") or {}
        try:
            iso = json.loads((meta.get("annotations") or {}).get(ISOLATION) or "{}")
        except ValueError:
            iso = {}
        return cls(str(meta.get("name") or ""), str(sel.get("driver") or ""), str(sel.get("pool") or ""),
                   str(sel.get("device") or ""), str(taint.get("effect") or ""), str(taint.get("key") or ""),
                   labels.get(MANAGED_BY) == MANAGER and labels.get(COMPONENT_LABEL) == COMPONENT,
                   cast("Isolation", iso if isinstance(iso, dict) else {}), str(meta.get("uid") or ""),
                   tuple(c for c in ((raw.get("status") or {}).get("conditions") or []) if isinstance(c, dict)))

    def describe(self) -> str:
        return f"DeviceTaintRule {self.name} ({self.driver}/{self.pool}/{self.device}, {self.effect})"


def _attribute_text(value: Any) -> str | None:
    """A ``DeviceAttribute`` (exactly one of string / int / bool / version) as text."""
    if not isinstance(value, dict):
        return None
    for kind in ("string", "version", "int", "bool"):
        if kind in value and value[kind] is not None:
            v = value[kind]
            return ("true" if v else "false") if isinstance(v, bool) else str(v)
    return None


def devices(slices: Sequence[Mapping[str, Any]], node: str) -> list[DraDevice]:
    """The devices the ``ResourceSlice``s publish for ``node`` (``spec.nodeName``), from the newest
    generation of each (driver, pool) only."""
    newest: dict[tuple[str, str], int] = {}
    for s in slices:
        spec = s.get("spec") or {}
        pool = spec.get("pool") or {}
        key = (str(spec.get("driver") or ""), str(pool.get("name") or ""))
        newest[key] = max(newest.get(key, 0), int(pool.get("generation") or 0))
    out = []
    for s in slices:
        spec = s.get("spec") or {}
        pool = spec.get("pool") or {}
        driver, pool_name = str(spec.get("driver") or ""), str(pool.get("name") or "")
        if spec.get("nodeName") != node or int(pool.get("generation") or 0) < newest[(driver, pool_name)]:
            continue
        for d in spec.get("devices") or []:
            attrs = {str(a): t for a, v in (d.get("attributes") or {}).items()
                     if (t := _attribute_text(v)) is not None}
            out.append(DraDevice(driver, pool_name, str(d.get("name") or ""), node, attrs))
    return out


def _bare(attribute: str) -> str:
    """An attribute's name without its domain, lower case: ``resource.kubernetes.io/pciBusID`` -> ``pcibusid``."""
    return attribute.rsplit("/", 1)[-1].lower()


def normalise_bus_id(bus_id: str) -> str:
    """``00000000:17:00.0`` (NVML) and ``0000:17:00.0`` (sysfs, the standard attribute) alike: lower
    case, the domain as 4 hex digits."""
    b = bus_id.strip().lower()
    dom, sep, rest = b.partition(":")
    if not sep or rest.count(":") != 1:
        return b
    try:
        return f"{int(dom, 16):04x}:{rest}"
    except ValueError:
        return b


def find_device(devs: list[DraDevice], *, uuid: str = "", bus_id: str = "") -> tuple[DraDevice | None, str]:
    """The one device that is the GPU with ``uuid`` (else ``bus_id``); (None, why) when none or several are."""
    if uuid:
        hits = [d for d in devs if any(_bare(a) in UUID_NAMES and v.lower() == uuid.lower()
                                       for a, v in d.attributes.items())]
        if len(hits) == 1:
            return hits[0], ""
        if len(hits) > 1:
            return None, (f"{len(hits)} devices carry UUID {uuid} (" + ", ".join(d.describe() for d in hits)
                          + "): not guessing which one")
    if bus_id:
        want = normalise_bus_id(bus_id)
        hits = [d for d in devs if any(_bare(a) in BUS_ID_NAMES and normalise_bus_id(v) == want
                                       for a, v in d.attributes.items())]
        if len(hits) == 1:
            return hits[0], ""
        if len(hits) > 1:
            return None, (f"{len(hits)} devices carry PCI bus id {bus_id} (" + ", ".join(d.describe() for d in hits)
                          + "): not guessing which one")
    said = " / ".join(x for x in (f"UUID {uuid}" if uuid else "", f"PCI bus id {bus_id}" if bus_id else "") if x)
    if not devs:
        return None, "no ResourceSlice publishes a device of this node"
    return None, (f"none of the {len(devs)} device(s) the node's ResourceSlices publish carries {said} "
                  f"(drivers: {', '.join(sorted({d.driver for d in devs}))})")


def rule_name(node: str, dev: DraDevice) -> str:
    """``triscope-NODE-DEVICE-HASH``: a DNS subdomain (<= 253), the same for the same device of the same
    node, distinct for devices of one name in two pools or drivers."""
    h = hashlib.sha256(f"{dev.driver}\0{dev.pool}\0{dev.name}".encode()).hexdigest()[:10]
    base = _NAME_CHARS.sub("-", f"{node}-{dev.name}".lower()).strip("-.")[:200].strip("-.")
    return f"triscope-{base}-{h}"


def rule_body(name: str, dev: DraDevice, effect: str, isolation: Isolation, api_version: str) -> dict[str, Any]:
    """The ``DeviceTaintRule`` that taints exactly ``dev``: driver, pool and device all set."""
    if not (dev.driver and dev.pool and dev.name):
        raise IncompleteSelector(f"refusing a DeviceTaintRule without driver, pool and device (got driver "
                                 f"{dev.driver!r}, pool {dev.pool!r}, device {dev.name!r}): an empty or partial "
                                 "selector taints every matching device of the cluster")
    if effect not in EFFECTS:
        raise ValueError(f"a device taint's effect is one of {', '.join(EFFECTS)}, not {effect!r}")
    return {"apiVersion": f"{GROUP}/{api_version}", "kind": "DeviceTaintRule",
            "metadata": {"name": name, "labels": {MANAGED_BY: MANAGER, COMPONENT_LABEL: COMPONENT},
                         "annotations": {ISOLATION: json.dumps(isolation, sort_keys=True)}},
            "spec": {"deviceSelector": {"driver": dev.driver, "pool": dev.pool, "device": dev.name},
                     "taint": {"key": TAINT_KEY, "value": _label_value(isolation.get("state") or "degraded"),
                               "effect": effect}}}


def _label_value(text: str) -> str:
    v = re.sub(r"[^A-Za-z0-9_.-]+", "-", text)[:63].strip("-_.")
    return v or "degraded"
