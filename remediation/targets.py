"""What a rule acts on: the names every part of the engine shares, in one module that imports
nothing else of ``triscope.remediation``.

* the policy's target forms (``TargetModel``: a name, ``{label: L, default: D}``,
  ``{from: workload}``) and what the engine keeps of them (``TargetField``);
* ``KubeName`` / ``Text``: the value types a policy writes names in;
* ``PER_WORKLOAD``: ``{deployment}`` in a ConfigMap fallback's names;
* ``Target``: the target of one decision, resolved (its key for cooldowns and the breaker, its
  description, the names, the workload it was found from), from the decision to its audit row.

The policy (``policy.py``), the actions (``actions.py``, ``filefallback.py``), the settings, the
workload resolution and the engine import these from here, at their top.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Literal

from pydantic import AfterValidator, Discriminator, Field

from triscope.core.configfile import ConfigModel, show, variant

_KUBE_NAME = re.compile(r"^[a-z0-9]([a-z0-9_.-]{0,126}[a-z0-9])?$")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


def _kube_name(value: str) -> str:
    if not _KUBE_NAME.match(value):
        raise ValueError(f"{show(value)} is not a valid Kubernetes name")
    return value


def _non_empty(value: str) -> str:
    if not value.strip():
        raise ValueError("must be a non-empty string")
    return value


def _label_name(value: str) -> str:
    if not _LABEL_NAME.fullmatch(value):
        raise ValueError(f"{show(value)} is not a label name")
    return value


KubeName = Annotated[str, AfterValidator(_kube_name)]
"""A Kubernetes object name as a policy writes it (namespace, Deployment, ConfigMap, node)."""
Text = Annotated[str, AfterValidator(_non_empty)]
"""A non-empty string of the policy."""
LabelName = Annotated[str, AfterValidator(_label_name)]
"""A Prometheus label name."""

PER_WORKLOAD = "{deployment}"
"""In a ConfigMap fallback's ``configmap`` or ``key``: the name of the workload the trigger names."""


def kube_name_pattern() -> re.Pattern[str]:
    """The pattern ``KubeName`` checks (for names with ``{deployment}`` in them)."""
    return _KUBE_NAME


def per_workload(template: str, fields: Mapping[str, str]) -> str:
    """``template`` with ``{deployment}`` replaced by the target's deployment."""
    return template.replace(PER_WORKLOAD, fields.get("deployment", ""))


# what the engine keeps of a rule's target ---------------------------------------------------------
@dataclass(frozen=True)
class TargetField:
    literal: str | None = None
    label: str | None = None
    default: str | None = None
    from_workload: bool = False          # deployment: {from: workload}: the trigger's workload (remediation/workloads.py)
    workload_label: str = "workload"     # ... read from these labels of the trigger
    pod_label: str = "pod"


@dataclass(frozen=True)
class Target:
    """The target of one decision, resolved from the trigger: what the rails check, the action acts
    on and the audit row names.

    ``fields``: the names (``namespace``, ``deployment``, ``node``, ``accelerator``, ``state``; a
    knobs file's ``workload``, ``name``, ``file``...); ``key``: cooldowns, the breaker and active
    fallbacks; ``workload``: the workload the names were found from (the audit row's
    ``params.workload``), when one was."""

    key: str
    description: str
    fields: Mapping[str, str] = field(default_factory=dict)
    node: str | None = None
    workload: Mapping[str, str] | None = None

    @property
    def namespace(self) -> str | None:
        return self.fields.get("namespace")

    def name(self, what: str) -> str:
        """One of the names (``""`` when the target has none by that name)."""
        return self.fields.get(what, "")


# the policy's forms ------------------------------------------------------------------------------
class TargetReference(ConfigModel):
    label: Text
    default: KubeName | None = None


class WorkloadReference(ConfigModel):
    """``deployment: {from: workload}``: the workload the trigger names: its ``workload`` label
    (``Deployment/NAME``), else its ``pod`` label resolved through ownerReferences."""

    from_: Annotated[Literal["workload"], Field(alias="from")]
    workload_label: LabelName = "workload"
    pod_label: LabelName = "pod"


class LabelWorkloadReference(ConfigModel):
    """``workload: {from: workload}``: the workload the trigger's ``workload`` label names (``cmd:NAME``,
    ``unit:NAME.service``, ``Kind/NAME``); no pod lookup, no default."""

    from_: Annotated[Literal["workload"], Field(alias="from")]
    workload_label: LabelName = "workload"


def _target_form(value: object) -> str:
    return "<name>" if isinstance(value, str) else "<reference>" if isinstance(value, dict) else "<other>"


def _workload_form(value: object) -> str:
    if isinstance(value, dict) and "from" in value:
        return "<workload>"
    return _target_form(value)


def _label_workload_form(value: object) -> str:
    return "<workload>" if isinstance(value, dict) and "from" in value else "<other>"


def _not_a_target(value: object) -> object:
    raise ValueError(f"must be a name or {{label: LABEL, default: NAME}}, not {show(value)}")


def _not_a_workload_target(value: object) -> object:
    raise ValueError(f"must be a name or {{label: LABEL, default: NAME}}, not {show(value)} (for a deployment: a "
                     "name, {label: LABEL} or {from: workload}; never a default)")


def _not_a_label_workload(value: object) -> object:
    raise ValueError(f"must be {{from: workload}}, not {show(value)}: a knobs file is named by the trigger's workload "
                     "label, never by a name written here")


TargetValue = Annotated[
    Annotated[KubeName, variant("name")] | Annotated[TargetReference, variant("reference")]
    | Annotated[object, AfterValidator(_not_a_target), variant("other")],
    Discriminator(_target_form)]

WorkloadTargetValue = Annotated[
    Annotated[KubeName, variant("name")] | Annotated[TargetReference, variant("reference")]
    | Annotated[WorkloadReference, variant("workload")]
    | Annotated[object, AfterValidator(_not_a_workload_target), variant("other")],
    Discriminator(_workload_form)]

LabelWorkloadValue = Annotated[
    Annotated[LabelWorkloadReference, variant("workload")]
    | Annotated[object, AfterValidator(_not_a_label_workload), variant("other")],
    Discriminator(_label_workload_form)]
"""``target.workload`` of a rule (only a knobs-file fallback takes one)."""


class TargetModel(ConfigModel):
    namespace: TargetValue | None = None
    deployment: WorkloadTargetValue | None = None
    node: TargetValue | None = None
    workload: LabelWorkloadValue | None = None

    def fields(self) -> dict[str, TargetField]:
        out = {}
        given: tuple[tuple[str, object], ...] = (("namespace", self.namespace), ("deployment", self.deployment),
                                                 ("node", self.node), ("workload", self.workload))
        for name, v in given:
            if isinstance(v, str):
                out[name] = TargetField(literal=v)
            elif isinstance(v, TargetReference):
                out[name] = TargetField(label=v.label, default=v.default)
            elif isinstance(v, WorkloadReference):
                out[name] = TargetField(from_workload=True, workload_label=v.workload_label, pod_label=v.pod_label)
            elif isinstance(v, LabelWorkloadReference):
                out[name] = TargetField(from_workload=True, workload_label=v.workload_label, pod_label="")
        return out


__all__ = ["PER_WORKLOAD", "KubeName", "LabelName", "LabelWorkloadReference",
           "LabelWorkloadValue", "Target", "TargetField", "TargetModel", "TargetReference", "TargetValue", "Text",
           "WorkloadReference", "WorkloadTargetValue", "kube_name_pattern", "per_workload"]
