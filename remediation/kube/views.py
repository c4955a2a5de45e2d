"""The Kubernetes adapter's typed side: the results its verbs answer and the views of the objects it reads.

The client's untyped JSON stays in the adapter and here: an object read comes back as a frozen view
(``Deployment``, ``Node``, ``ConfigMap``) built by its ``of``; a verb answers a ``TypedDict``, JSON-able
as it is, so an action can put it in its audit response.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NotRequired, TypedDict

RESTARTED_AT = "kubectl.kubernetes.io/restartedAt"  # what `kubectl rollout restart` sets
CORDONED_BY = "triscope.io/cordoned-by"
CORDONED_AT = "triscope.io/cordoned-at"
CONTROL_PLANE_KEYS = ("node-role.kubernetes.io/control-plane", "node-role.kubernetes.io/master")
BLOCKING_EFFECTS = ("NoSchedule", "NoExecute")


# typed results: what the verbs answer (JSON-able as they are, for the audit row's response) -------------
class DeploymentHealth(TypedDict):
    desired: int
    available: int
    updated: int
    paused: bool
    generation: int
    observed_generation: int


class RolloutStatus(DeploymentHealth):
    complete: bool


class RestartResult(TypedDict):
    restartedAt: str
    generation: int | None
    resourceVersion: str | None
    already: NotRequired[bool]


class PreferredNode(TypedDict):
    preferred_node: str
    weight: int
    generation: int | None


class EvictionResult(TypedDict):
    pod: str
    evicted: bool
    attempts: int
    note: NotRequired[str]


class CordonResult(TypedDict):
    node: str
    result: str                  # cordoned | already_ours | cordoned_by_other | uncordoned | not_cordoned
    cordoned_by: NotRequired[str | None]
    note: NotRequired[str]


class RuleWrite(TypedDict):
    """What ``create_device_taint_rule`` did: ``created``, or found the engine's own rule (``adopted``,
    its effect as found) or a rule of that name someone else owns (``not_ours``)."""

    name: str
    result: str                  # created | adopted | not_ours
    effect: str
    api_version: str


class NodeConditionWrite(TypedDict):
    node: str
    type: str
    status: str
    reason: str
    changed: bool


class ConfigMapWrite(TypedDict):
    previous: dict[str, str | None]
    resourceVersion: str
    created: bool


# typed views of the objects read ------------------------------------------------------------------
def _str_map(value: Any) -> dict[str, str]:
    return {str(a): str(b) for a, b in value.items()} if isinstance(value, dict) else {}


@dataclass(frozen=True)
class Toleration:
    key: str = ""
    operator: str = "Equal"
    value: str = ""
    effect: str = ""

    @classmethod
    def of(cls, raw: Mapping[str, Any]) -> Toleration:
        return cls(str(raw.get("key") or ""), str(raw.get("operator") or "Equal"), str(raw.get("value") or ""),
                   str(raw.get("effect") or ""))

    def tolerates(self, taint: Taint) -> bool:
        """The Kubernetes scheduler's rule for one toleration and one taint."""
        if self.effect and self.effect != taint.effect:
            return False
        if not self.key:
            return self.operator == "Exists"
        return self.key == taint.key and (self.operator == "Exists" or self.value == taint.value)


@dataclass(frozen=True)
class Taint:
    key: str
    value: str = ""
    effect: str = ""

    @classmethod
    def of(cls, raw: Mapping[str, Any]) -> Taint:
        return cls(str(raw.get("key") or ""), str(raw.get("value") or ""), str(raw.get("effect") or ""))

    def __str__(self) -> str:
        return f"{self.key}{'=' + self.value if self.value else ''}:{self.effect}"


@dataclass(frozen=True)
class Node:
    """A Node as the actions read it."""

    name: str
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    unschedulable: bool = False
    ready: bool = True
    taints: tuple[Taint, ...] = ()
    conditions: dict[str, dict[str, str]] = field(default_factory=dict)

    @classmethod
    def of(cls, raw: Mapping[str, Any]) -> Node:
        meta = raw.get("metadata") or {}
        conditions = {str(c.get("type")): _str_map(c) for c in (raw.get("status") or {}).get("conditions") or []
                      if isinstance(c, dict) and c.get("type")}
        ready = conditions.get("Ready", {}).get("status", "True") == "True"
        return cls(str(meta.get("name") or ""), _str_map(meta.get("labels")), _str_map(meta.get("annotations")),
                   bool((raw.get("spec") or {}).get("unschedulable")), ready,
                   tuple(Taint.of(t) for t in node_taints(raw)), conditions)

    @property
    def control_plane(self) -> bool:
        """A control-plane node: the ``node-role.kubernetes.io/control-plane`` (or ``master``) label or taint."""
        return any(k in self.labels for k in CONTROL_PLANE_KEYS) or any(t.key in CONTROL_PLANE_KEYS for t in self.taints)

    @property
    def cordoned_by(self) -> str | None:
        return self.annotations.get(CORDONED_BY)

    def untolerated(self, tolerations: tuple[Toleration, ...]) -> list[str]:
        """The NoSchedule / NoExecute taints ``tolerations`` do not tolerate, as ``key=value:Effect``."""
        return [str(t) for t in self.taints
                if t.effect in BLOCKING_EFFECTS and not any(tol.tolerates(t) for tol in tolerations)]


@dataclass(frozen=True)
class Deployment:
    """A Deployment as the actions read it: its health, its pod template's scheduling constraints."""

    namespace: str
    name: str
    health: DeploymentHealth
    replicas: int                                   # status.replicas: every pod, old and new
    resource_version: str
    restarted_at: str | None                        # the pod template's RESTARTED_AT annotation
    match_labels: dict[str, str]
    node_selector: dict[str, str]
    tolerations: tuple[Toleration, ...]

    @classmethod
    def of(cls, raw: Mapping[str, Any]) -> Deployment:
        meta, spec, st = raw.get("metadata") or {}, raw.get("spec") or {}, raw.get("status") or {}
        tmpl = spec.get("template") or {}
        pod = tmpl.get("spec") or {}
        desired = int(spec["replicas"]) if spec.get("replicas") is not None else 1
        health: DeploymentHealth = {
            "desired": desired, "available": int(st.get("availableReplicas") or 0),
            "updated": int(st.get("updatedReplicas") or 0), "paused": bool(spec.get("paused")),
            "generation": int(meta.get("generation") or 0), "observed_generation": int(st.get("observedGeneration") or 0)}
        tmpl_ann = (tmpl.get("metadata") or {}).get("annotations") or {}
        return cls(str(meta.get("namespace") or ""), str(meta.get("name") or ""), health, int(st.get("replicas") or 0),
                   str(meta.get("resourceVersion") or ""), tmpl_ann.get(RESTARTED_AT),
                   _str_map((spec.get("selector") or {}).get("matchLabels")), _str_map(pod.get("nodeSelector")),
                   tuple(Toleration.of(t) for t in pod.get("tolerations") or []))


@dataclass(frozen=True)
class ConfigMap:
    data: dict[str, str]
    annotations: dict[str, str]

    @classmethod
    def of(cls, raw: Mapping[str, Any]) -> ConfigMap:
        return cls(_str_map(raw.get("data")), _str_map((raw.get("metadata") or {}).get("annotations")))


def node_taints(node: Mapping[str, Any]) -> list[dict[str, Any]]:
    return list((node.get("spec") or {}).get("taints") or [])
