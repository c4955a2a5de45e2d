"""Target resolution: the names a rule acts on, from its target spec and the trigger's labels.

A literal, ``{label: L, default: D}`` or ``{from: workload}`` (the trigger's ``workload`` label, else
its ``pod`` resolved through ownerReferences: ``triscope.remediation.workloads``); a knobs-file
fallback is named by the ``workload`` label alone (``triscope.remediation.filefallback``);
``isolate_accelerator`` adds the accelerator the trigger names, a ``command`` the labels its argv
carries.  Every name is checked as a Kubernetes name.  :func:`target_key` gives the resolved target
its key (cooldowns, the breaker, active fallbacks) and its description.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from triscope.core.vocabulary import accelerator_name
from triscope.remediation import filefallback
from triscope.remediation.filefallback import KnobsFileParams
from triscope.remediation.params import TARGET_PLACEHOLDERS, CommandParams, DependencyFallbackParams
from triscope.remediation.policy import Rule
from triscope.remediation.targets import per_workload
from triscope.remediation.workloads import Owner, ResolveError, WorkloadResolver, target_owner

_K8S_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")


def resolve_target(rule: Rule, labels: Mapping[str, str]) -> tuple[dict[str, str], str]:
    """Target names from the rule's literals and the trigger's labels; an error message when invalid.

    A ``{from: workload}`` field is left out: :func:`resolve_rule_target` resolves it.
    """
    out: dict[str, str] = {}
    for fld, spec in rule.target.items():
        if spec.from_workload:
            continue
        if spec.literal is not None:
            v: str | None = spec.literal
        else:
            v = labels.get(spec.label or "") or spec.default
            if not v:
                return out, f"target {fld}: label {spec.label!r} is missing and there is no default"
        if v is None or len(v) > 253 or not _K8S_NAME.match(v):
            return out, f"target {fld}: {v!r} is not a valid Kubernetes name"
        out[fld] = v
    return out, ""


@dataclass
class TargetResolution:
    """A rule's target for one trigger: the names, or why there are none."""

    target: dict[str, str]
    error: str = ""
    rail: str = "target"          # the rail that suppresses an error (``namespace``: outside the allow-list)
    transient: bool = False       # the error may go away (the API did not answer): a failed decision, not a rail
    owner: Owner | None = None    # the workload a ``{from: workload}`` field resolved to
    workload: dict[str, str] | None = None   # the workload a knobs file was named from (off Kubernetes)


def _knobs_file_target(rule: Rule, params: KnobsFileParams, labels: Mapping[str, str]) -> TargetResolution:
    spec = rule.target["workload"]
    target, err = filefallback.resolve(params, labels, spec.workload_label)
    if err:
        return TargetResolution(target, f"target workload: {err}")
    wl = {"workload": target["workload"], "name": target["name"], "namespace": target.get("namespace", ""),
          "pod": labels.get("pod") or "", "via": "label"}
    return TargetResolution(target, workload=wl)


def resolve_rule_target(rule: Rule, labels: Mapping[str, str], resolver: WorkloadResolver | None, *,
                        namespaces: tuple[str, ...] = (), now: float | None = None) -> TargetResolution:
    """:func:`resolve_target`, then the ``{from: workload}`` field: the trigger's ``workload`` label or its
    ``pod`` resolved through ownerReferences (``triscope.remediation.workloads``).  Pods are looked up
    only in namespaces of the allow-list ``namespaces`` (outside it the namespace rail answers).

    A knobs-file fallback (``rule.knobs_file``) is named by the ``workload`` label alone
    (``triscope.remediation.filefallback``): no pod lookup, no namespace needed."""
    if isinstance(rule.params, KnobsFileParams):
        return _knobs_file_target(rule, rule.params, labels)
    target, err = resolve_target(rule, labels)
    if err:
        return TargetResolution(target, err)
    if rule.action == "isolate_accelerator":
        acc = accelerator_name(labels)
        if not acc:
            return TargetResolution(target, "the trigger names no accelerator (no gpu or npu label): nothing to isolate")
        target["accelerator"] = acc
        target["state"] = labels.get("state") or rule.trigger.state or rule.trigger.kind
    if isinstance(rule.params, CommandParams):
        for name in rule.params.uses:
            if name in TARGET_PLACEHOLDERS:
                continue    # a target field: resolved above (or below, {from: workload})
            v = labels.get(name) or ""
            if not v:
                return TargetResolution(target, f"the argv's {{{name}}}: the trigger has no {name!r} label")
            if v.startswith("-") or len(v) > 253 or not _K8S_NAME.match(v):
                return TargetResolution(target, f"the argv's {{{name}}}: {v!r} is not a valid Kubernetes name")
            target[name] = v
    fld = rule.workload_field
    if fld is None:
        return TargetResolution(target)
    ns = target.get("namespace", "")
    if namespaces and ns not in namespaces:
        return TargetResolution(target, f"namespace {ns!r} is not in the allow-list {list(namespaces)} (its workload "
                                "was not looked up)", rail="namespace")
    try:
        owner = target_owner(rule.target[fld], labels, ns, resolver, kind="Deployment", now=now)
    except ResolveError as e:
        return TargetResolution(target, f"target {fld}: {e.reason}", transient=e.transient)
    if len(owner.name) > 253 or not _K8S_NAME.match(owner.name):
        return TargetResolution(target, f"target {fld}: {owner.name!r} is not a valid Kubernetes name")
    target[fld] = owner.name
    return TargetResolution(target, owner=owner)


def target_key(rule: Rule, target: Mapping[str, str]) -> tuple[str, str]:
    """(key for cooldowns and the breaker, human description)."""
    a, p = rule.action, rule.params
    if a == "rolling_restart":
        return f"deployment/{target['namespace']}/{target['deployment']}", f"deployment {target['namespace']}/{target['deployment']}"
    if isinstance(p, KnobsFileParams):
        return filefallback.target_key(target)
    if isinstance(p, DependencyFallbackParams):
        cm, key = per_workload(p.configmap, target), per_workload(p.key, target)
        return f"configmap/{target['namespace']}/{cm}/{key}", f"configmap {target['namespace']}/{cm} key {key}"
    if a == "isolate_accelerator":
        return (f"accelerator/{target['node']}/{target['accelerator']}",
                f"{target['accelerator']} on node {target['node']}")
    if a == "reschedule":
        return (f"node/{target['node']}/deployment/{target['namespace']}/{target['deployment']}",
                f"deployment {target['namespace']}/{target['deployment']} off node {target['node']}")
    where = target.get("node", "local")
    program = p.argv[0] if isinstance(p, CommandParams) else a
    carried = [f"{n}={target[n]}" for n in (p.uses if isinstance(p, CommandParams) else []) if n != "node" and n in target]
    if carried:   # one cooldown per target the argv carries
        return (f"command/{where}/{rule.name}/{','.join(carried)}",
                f"command {program} for {' '.join(carried)} on {where}")
    return f"command/{where}/{rule.name}", f"command {program} for {where}"
