"""``isolate_accelerator``: one GPU out of service through a DRA ``DeviceTaintRule``, and back in once healthy.

Kubernetes honours a device taint where a DRA driver publishes the GPU in a ``ResourceSlice``: the
scheduler allocates no claim to a tainted device (``NoSchedule``) and kube-controller-manager's device
taint eviction controller deletes the pods whose claims hold it (``NoExecute``).  So the action:

1. reads the GPU's identity the agent stored from NVML (``triscope_gpu_info``: UUID, PCI bus id);
2. finds the device that is this GPU in the node's ``ResourceSlice``s (``triscope.remediation.dra``);
3. creates a ``DeviceTaintRule`` selecting exactly it — driver, pool and device, never fewer — named
   from node and device, labelled and annotated as the engine's with the decision (a 409 finds the
   engine's own rule from an earlier run and adopts it); ``NoSchedule``, ``NoExecute`` when
   ``evict`` (or ``NoSchedule`` and the engine's own evictions through the Eviction API, PDBs
   respected, with ``eviction: eviction_api``);
4. in dry-run, creates the rule with ``effect: None`` instead (the scheduler and the eviction
   controller ignore it; the controller's status on it says what ``NoExecute`` would evict) and says
   which pods the agent saw holding the device.

Where no ResourceSlice publishes the GPU (a device-plugin cluster, a driver that publishes neither
UUID nor bus id, no identity stored, or no ``DeviceTaintRule`` served), nothing can take one GPU out
of scheduling: the policy's ``without_dra`` decides — ``refuse`` (nothing done, the reason says why)
or ``cordon`` (the node, as ``reschedule`` does, a node-level action that says so).  Neither writes
anything that claims the GPU was isolated.

:func:`release_healthy` (a scheduler job) deletes each of the engine's rules whose GPU's verdict has been
healthy for the rule's ``untaint_after``, reading what it needs from the rule itself, so an engine
restarted since still releases what an earlier one took.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from triscope.core.timeparse import format_rfc3339
from triscope.core.vocabulary import IO_STATES, accelerator_labels
from triscope.remediation import dra
from triscope.remediation.actions import (
    CORDON_OWNER,
    ActionContext,
    ActionResult,
    checked_node,
    decided_at,
    evict_all,
    node_allowed,
)
from triscope.remediation.kube.adapter import KubeAdapter
from triscope.remediation.kube.errors import KubeError
from triscope.remediation.kube.views import RuleWrite
from triscope.remediation.params import IsolateAcceleratorParams

if TYPE_CHECKING:
    from triscope.store.reader import StoreReader

log = logging.getLogger(__name__)
GPU_INFO = "triscope_gpu_info"


def pods_on_accelerator(store: StoreReader, node: str, accelerator: str, now: float,
                        stale_s: float = 120.0) -> list[tuple[str, str]]:
    """(namespace, pod) of every pod the agent attributed to ``accelerator`` of ``node`` (from the kubelet's
    pod-resources, named by its verdicts) within the last ``stale_s``: the verdict history's runs."""
    out: set[tuple[str, str]] = set()
    for r in store.verdict_runs(node, now - stale_s, now + 5.0):
        namespace, pod = r.workload[0], r.workload[1]
        if r.accelerator == accelerator and namespace and pod:
            out.add((namespace, pod))
    return sorted(out)


def gpu_identity(store: StoreReader, node: str, accelerator: str) -> tuple[str, str]:
    """(UUID, PCI bus id) of the GPU ``accelerator`` (``gpu=N``) of ``node``, from the newest
    ``triscope_gpu_info`` the agent stored; ("", "") for an NPU or a GPU with none stored."""
    gpu = accelerator_labels(accelerator).get("gpu")
    if gpu is None:
        return "", ""
    infos = [lv for lv in store.latest(node, metric=GPU_INFO) if str(lv.info.labels.get("gpu", "")) == gpu]
    if not infos:
        return "", ""
    lab = max(infos, key=lambda lv: lv.ts).info.labels
    return str(lab.get("uuid") or ""), str(lab.get("bus_id") or "")


def _locate(ctx: ActionContext[IsolateAcceleratorParams], kube: KubeAdapter, node: str,
            acc: str) -> tuple[dra.DraDevice | None, str, dict[str, object]]:
    """(the device that is the GPU, why there is none, what was looked at)."""
    uuid, bus = gpu_identity(ctx.store, node, acc)
    seen: dict[str, object] = {"uuid": uuid, "bus_id": bus}
    if not uuid and not bus:
        return None, (f"the agent stored no UUID or PCI bus id for {acc} of {node} ({GPU_INFO}), so no "
                      "ResourceSlice device can be matched to it"), seen
    served = kube.dra_versions()
    seen["served"] = served
    if "resourceslices" not in served:
        return None, "this cluster serves no ResourceSlices (resource.k8s.io): its GPUs are not allocated through DRA", seen
    devs = dra.devices(kube.resource_slices(node), node)
    seen["devices"] = len(devs)
    dev, why = dra.find_device(devs, uuid=uuid, bus_id=bus)
    if dev is None:
        return None, f"no ResourceSlice publishes {acc} of {node}: {why}", seen
    seen["device"] = {"driver": dev.driver, "pool": dev.pool, "device": dev.name}
    if "devicetaintrules" not in served:
        return None, (f"{dev.describe()} is {acc}, but this API server serves no DeviceTaintRule (resource.k8s.io "
                      "v1 from Kubernetes 1.37, v1beta2 in 1.36 with the DRADeviceTaintRules feature gate)"), seen
    return dev, "", seen


def _without_dra(ctx: ActionContext[IsolateAcceleratorParams], kube: KubeAdapter, why: str,
                 pods: list[tuple[str, str]], resp: dict[str, object]) -> ActionResult:
    """No device to taint: the policy's ``without_dra`` (refuse, or cordon the node), said in those words."""
    node, acc, p = ctx.names["node"], ctx.names["accelerator"], ctx.params
    resp["isolated"] = False
    resp["without_dra"] = p.without_dra
    resp["why"] = why
    if p.without_dra == "refuse":
        return ActionResult("suppressed", f"refused to isolate {acc} on {node}: {why}; without a device DRA publishes "
                            "no API takes one GPU out of scheduling, and the policy says without_dra: refuse: "
                            "nothing was done (no taint, no cordon, no eviction)", resp, rail="live_state")
    names = [f"{ns}/{pod}" for ns, pod in pods]
    if ctx.dry_run:
        return ActionResult("dry_run", f"would cordon node {node} instead of isolating {acc} (without_dra: cordon, "
                            f"a node-level action): {why}; and evict {len(pods)} pod(s) holding it: "
                            + (", ".join(names) or "none"), resp)
    cordon = kube.cordon(node, by=CORDON_OWNER)
    resp["cordon"] = cordon
    ctx.on_issued(time.time())
    blocked = evict_all(kube, pods, p.eviction_timeout, resp)
    if blocked is not None:
        return ActionResult("failed", f"cordoned node {node} instead of isolating {acc} (without_dra: cordon): "
                            f"{why}; {blocked}", resp, issued_ts=time.time())
    cordoned = ("cordoned" if cordon["result"] in ("cordoned", "already_ours")
                else f"left node {node} as it was ({cordon['result']})")
    return ActionResult("acted", f"{cordoned} node {node} instead of isolating {acc} (without_dra: cordon, a "
                        f"node-level action: no new pod lands on any of its accelerators): {why}; evicted "
                        f"{len(pods)} pod(s) holding {acc}" + (f" ({', '.join(names)})" if pods else "")
                        + f"; uncordon it (kubectl uncordon {node}) once the GPU is fixed", resp,
                        issued_ts=time.time())


def _live_effect(p: IsolateAcceleratorParams) -> str:
    return "NoExecute" if p.evict and p.eviction == "noexecute" else "NoSchedule"


def isolate_accelerator(ctx: ActionContext[IsolateAcceleratorParams]) -> ActionResult:
    node_name, acc = ctx.names["node"], ctx.names["accelerator"]
    outside = node_allowed(ctx, node_name)
    if outside is not None:
        return outside
    p = ctx.params
    now = decided_at(ctx)
    allowed = ctx.settings.namespaces if ctx.settings is not None else ()
    holders = pods_on_accelerator(ctx.store, node_name, acc, now)
    pods = [(ns, pod) for ns, pod in holders if not allowed or ns in allowed]
    names = [f"{ns}/{pod}" for ns, pod in pods]
    resp: dict[str, object] = {"node": node_name, "accelerator": acc, "holding": [f"{ns}/{pod}" for ns, pod in holders],
                               "outside_allow_list": [f"{ns}/{pod}" for ns, pod in holders
                                                      if allowed and ns not in allowed]}
    if ctx.dry_run and ctx.kube is None:
        return ActionResult("dry_run", f"would look {acc} of {node_name} up in its ResourceSlices and taint it "
                            "(live state not checked: no Kubernetes API configured)", {**resp, "checked": False})
    kube = ctx.need_kube()
    checked = checked_node(ctx, kube, node_name)
    if isinstance(checked, ActionResult):
        return checked
    dev, why, seen = _locate(ctx, kube, node_name, acc)
    resp["dra"] = seen
    evicting = pods if p.evict and p.eviction == "eviction_api" else []
    if dev is None:
        return _without_dra(ctx, kube, why, pods if p.evict else [], resp)
    live = _live_effect(p)
    effect = "None" if ctx.dry_run else live
    name = dra.rule_name(node_name, dev)
    iso: dra.Isolation = {"node": node_name, "accelerator": acc, "state": ctx.names.get("state", ""),
                          "since": format_rfc3339(now), "since_ts": now, "rule": ctx.rule_name,
                          "decision": ctx.decision_id, "untaint_after": p.untaint_after, "uuid": str(seen["uuid"]),
                          "bus_id": str(seen["bus_id"]), "dry_run": ctx.dry_run, "by": CORDON_OWNER}
    body = dra.rule_body(name, dev, effect, iso, "v1")     # refuses a selector without driver, pool and device
    resp["rule"] = {"name": name, "driver": dev.driver, "pool": dev.pool, "device": dev.name, "effect": effect}
    what = f"{acc} on {node_name} ({dev.describe()})"
    write = kube.create_device_taint_rule(body)
    resp["write"] = write
    if write["result"] == "not_ours":
        return ActionResult("suppressed", f"a DeviceTaintRule named {name} exists and is not the engine's (no "
                            f"{dra.MANAGED_BY}={dra.MANAGER} label): left alone, {what} not tainted", resp,
                            rail="live_state")
    if ctx.dry_run:
        return _dry_run(kube, name, what, write, live, names, resp)
    if write["result"] == "adopted" and write["effect"] != effect:
        # the engine's own rule with another effect (a dry-run's None, or the policy changed): replace it
        old = kube.get_device_taint_rule(name)
        kube.delete_device_taint_rule(name, old.uid)
        write = kube.create_device_taint_rule(body)
        write["result"] = "replaced" if write["result"] == "created" else write["result"]
        resp["write"] = write
    ctx.on_issued(time.time())
    done = {"created": "created", "replaced": "replaced the engine's earlier rule with",
            "adopted": "found (and adopted) the engine's own"}.get(write["result"], write["result"])
    text = f"tainted {what}: {done} DeviceTaintRule {name} ({effect}, {write['api_version']})"
    blocked = evict_all(kube, evicting, p.eviction_timeout, resp) if evicting else None
    if blocked is not None:
        return ActionResult("failed", f"{text}; {blocked}", resp, issued_ts=time.time())
    if effect == "NoExecute":
        text += f"; Kubernetes evicts the pods whose claims hold it (the agent saw {len(pods)}: {', '.join(names) or 'none'})"
    elif evicting:
        text += f"; evicted {len(evicting)} pod(s) holding it through the Eviction API ({', '.join(names)})"
    else:
        text += "; no new claim gets it, the pods holding it keep running (evict: false)"
    return ActionResult("acted", text + "; the node's other devices and their pods untouched", resp,
                        issued_ts=time.time())


def _dry_run(kube: KubeAdapter, name: str, what: str, write: RuleWrite, live: str, names: list[str],
             resp: dict[str, object]) -> ActionResult:
    """A dry-run: the rule is there with ``effect: None`` (or the engine's own already was); its status, as
    the eviction controller wrote it, says what ``NoExecute`` would evict."""
    status = ""
    try:
        conds = kube.get_device_taint_rule(name).conditions
        status = "; ".join(str(c.get("message") or "") for c in conds if c.get("message"))
    except KubeError as e:
        log.info("remediation: reading back DeviceTaintRule %s: %s", name, e)
    resp["status"] = status
    if write["result"] == "adopted":
        head = f"would taint {what} with {live}: the engine's DeviceTaintRule {name} is already there ({write['effect']})"
    else:
        head = (f"would taint {what} with {live}: created DeviceTaintRule {name} with effect None (the scheduler and "
                "the eviction controller ignore it)")
    tail = f"; its status: {status}" if status else "; its status will say what NoExecute would evict"
    return ActionResult("dry_run", head + tail + f"; the agent saw {len(names)} pod(s) holding it: "
                        + (", ".join(names) or "none"), resp)


def release_healthy(store: StoreReader, kube: KubeAdapter, now: float, stale_s: float,
                    events_namespace: str | None, *, dry_run: bool = False) -> list[str]:
    """Delete each of the engine's DeviceTaintRules whose GPU's verdict has been healthy (no I/O state, still
    published) for its ``untaint_after``; an ``AcceleratorUntainted`` Event on the node for each.  A dry-run
    engine deletes only its own ``effect: None`` rules.  The names of the rules deleted."""
    out: list[str] = []
    try:
        mine = kube.device_taint_rules()
    except KubeError as e:     # a 403 is logged by the adapter, once a minute
        log.warning("remediation: cannot list the engine's DeviceTaintRules: %s", e)
        return out
    for rule in mine:
        iso = rule.isolation
        node, acc = str(iso.get("node") or ""), str(iso.get("accelerator") or "")
        if not rule.ours or not node or not acc or (dry_run and rule.effect != "None"):
            continue
        after = float(iso.get("untaint_after") or 600.0)
        if now - float(iso.get("since_ts") or 0.0) < after:
            continue
        runs = [r for r in store.verdict_runs(node, now - after, now) if r.accelerator == acc]
        bad = [r for r in runs if r.state in IO_STATES and r.end >= now - after]
        published = any(r.end >= now - stale_s for r in runs)
        if bad or not published:
            continue
        try:
            if not kube.delete_device_taint_rule(rule.name, rule.uid):
                continue
        except KubeError as e:
            log.warning("remediation: cannot delete DeviceTaintRule %s (%s on %s): %s", rule.name, acc, node, e)
            continue
        state = runs[-1].state if runs else "?"
        msg = f"{acc}: verdict healthy ({state}) for {after:g}s: DeviceTaintRule {rule.name} ({rule.effect}) deleted"
        log.info("remediation: node %s %s", node, msg)
        if events_namespace is not None:
            try:
                kube.post_event(events_namespace, {"kind": "Node", "apiVersion": "v1", "name": node},
                                reason="AcceleratorUntainted", message=msg)
            except KubeError as e:
                log.warning("remediation: Event for the release of %s on %s: %s", acc, node, e)
        out.append(rule.name)
    return out
