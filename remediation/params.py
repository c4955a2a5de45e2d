"""Each action's ``params`` as the policy writes them, validated.

``triscope.remediation.policy`` validates a rule's params with its action's model (a knobs-file
fallback's is ``triscope.remediation.filefallback.KnobsFileParams``) and the action
receives that model in its ``ActionContext``; the engine picks the action by the model's class
(``triscope.remediation.dispatch``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Literal

from pydantic import AfterValidator, BeforeValidator, Field, model_validator

from triscope.core.configfile import ConfigModel, problem, show
from triscope.core.durations import Duration
from triscope.remediation.targets import PER_WORKLOAD, kube_name_pattern

_CONFIGMAP_KEY = re.compile(r"^[-._a-zA-Z0-9]{1,253}$")


def _kube_name_template(value: str) -> str:
    if not kube_name_pattern().match(value.replace(PER_WORKLOAD, "x")):
        raise ValueError(f"{show(value)} is not a valid Kubernetes name (with {PER_WORKLOAD} for the workload's)")
    return value


def _configmap_key(value: str) -> str:
    if not _CONFIGMAP_KEY.match(value.replace(PER_WORKLOAD, "x")):
        raise ValueError(f"{show(value)} is not a valid ConfigMap key")
    return value


def _text(value: object) -> object:
    """A number written where text belongs (``value: 1``) as text; anything else as it is."""
    return str(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else value


def _positive(seconds: float) -> float:
    if seconds <= 0:
        raise ValueError("must be longer than 0s")
    return seconds


def _argv(value: object) -> list[str]:
    if not isinstance(value, list) or not value or not all(
            isinstance(a, (str, int, float)) and not isinstance(a, bool) for a in value):
        raise ValueError("must be a non-empty list of arguments (fixed in the policy, no shell), "
                         f"not {show(value)}")
    return [str(a) for a in value]


class RollingRestartParams(ConfigModel):
    """``rolling_restart``: follow the rollout (``follow``) for at most ``timeout``."""

    timeout: Duration = 300.0
    follow: bool = True


class DependencyFallbackParams(ConfigModel):
    """``dependency_fallback``: set ``key`` of ConfigMap ``configmap`` to ``value``; revert after
    ``hold`` clear, or ``ttl`` at the latest."""

    configmap: Annotated[str, AfterValidator(_kube_name_template)]
    key: Annotated[str, AfterValidator(_configmap_key)]
    value: Annotated[str, BeforeValidator(_text)] = "fallback"
    ttl: Annotated[Duration, AfterValidator(_positive)] = 1800.0
    hold: Duration = 300.0


class RescheduleWeights(ConfigModel):
    """Weights of the node cost's parts (``node_cost``)."""

    compute: Annotated[float, Field(ge=0.0, le=1000.0)] = 1.0
    link: Annotated[float, Field(ge=0.0, le=1000.0)] = 1.0
    storage: Annotated[float, Field(ge=0.0, le=1000.0)] = 1.0

    @model_validator(mode="after")
    def _one_positive(self) -> RescheduleWeights:
        if not (self.compute or self.link or self.storage):
            raise problem("at least one weight must be positive")
        return self


class RescheduleParams(ConfigModel):
    """``reschedule``: candidate choice (``weights``, ``affinity_weight``), eviction, cordon."""

    weights: RescheduleWeights = RescheduleWeights()
    eviction_timeout: Duration = 120.0
    affinity_weight: Annotated[int, Field(ge=1, le=100)] = 100
    cordon: bool = True


class IsolateAcceleratorParams(ConfigModel):
    """``isolate_accelerator``: take the one accelerator the trigger names out of service with a DRA
    ``DeviceTaintRule`` on the device its driver publishes (``triscope.remediation.isolate``):
    ``NoSchedule``, or ``NoExecute`` when ``evict`` (Kubernetes evicts the pods whose claims hold it;
    ``eviction: eviction_api`` keeps ``NoSchedule`` and evicts them through the Eviction API,
    PodDisruptionBudgets respected for ``eviction_timeout``); the rule is deleted once the verdict has been
    healthy for ``untaint_after``.  Where no ResourceSlice publishes the GPU, ``without_dra`` says what
    to do instead: ``refuse`` (nothing) or ``cordon`` the node as ``reschedule`` does."""

    eviction_timeout: Duration = 120.0
    untaint_after: Annotated[Duration, AfterValidator(_positive)] = 600.0
    evict: bool = True
    eviction: Literal["noexecute", "eviction_api"] = "noexecute"
    without_dra: Literal["refuse", "cordon"] = "refuse"


PLACEHOLDERS = ("node", "namespace", "deployment", "pod", "gpu", "npu", "chip")
"""What a ``command``'s argv may carry from the trigger, as ``{NAME}`` inside a word: ``node``, ``namespace``
and ``deployment`` are the rule's target fields (resolved as for every action); ``pod``, ``gpu``, ``npu``
and ``chip`` the trigger's own labels (a verdict's: the pod and accelerator it names)."""
TARGET_PLACEHOLDERS = ("node", "namespace", "deployment")
_PLACEHOLDER = re.compile(r"\{([a-z_]+)\}")


def placeholders(word: str) -> list[str]:
    """The ``{NAME}`` placeholders of one argv word, in order."""
    return [m[1] for m in _PLACEHOLDER.finditer(word)]


def fill_argv(argv: list[str], values: Mapping[str, str]) -> list[str]:
    """Each ``{NAME}`` replaced by its value; every value a Kubernetes name with no leading ``-``, so it
    stays inside its own argv word and cannot become an option.  ``ValueError`` otherwise."""
    out = []
    for word in argv:
        def one(m: re.Match[str]) -> str:
            v = values.get(m[1], "")
            if not v or v.startswith("-") or len(v) > 253 or not kube_name_pattern().match(v):
                raise ValueError(f"{{{m[1]}}} is {v!r}: not a Kubernetes name")
            return v
        out.append(_PLACEHOLDER.sub(one, word))
    return out


class CommandParams(ConfigModel):
    """``command``: the argv fixed in the policy (no shell), killed after ``timeout``.  ``{node}``,
    ``{namespace}``, ``{deployment}``, ``{pod}``, ``{gpu}``, ``{npu}``, ``{chip}`` in a word carry the
    trigger's target (each value checked as a Kubernetes name, no leading ``-``, one argv word);
    ``literal_targets: true`` lets a verdict trigger run an argv whose targets are fixed in the policy
    (said in the audit row and the Event)."""

    argv: Annotated[list[str], BeforeValidator(_argv)]
    timeout: Duration = 30.0
    literal_targets: bool = False

    @model_validator(mode="after")
    def _known_placeholders(self) -> CommandParams:
        if placeholders(self.argv[0]):
            raise problem("the program is fixed in the policy: no placeholder in argv[0]", "argv", 0)
        for i, word in enumerate(self.argv):
            for name in placeholders(word):
                if name not in PLACEHOLDERS:
                    raise problem(f"unknown placeholder {{{name}}} (known: "
                                  + ", ".join(f"{{{p}}}" for p in PLACEHOLDERS) + ")", "argv", i)
        return self

    @property
    def uses(self) -> list[str]:
        """The placeholders the argv carries, each once, in order."""
        seen: dict[str, None] = {}
        for w in self.argv:
            for p in placeholders(w):
                seen.setdefault(p, None)
        return list(seen)

