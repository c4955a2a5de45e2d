"""Remediation policies: a YAML file of rules (trigger, action, target, limits) and global settings.

The file is read by ``triscope.core.yamlsafe`` (every value keeps its line) and validated by the
pydantic models below (``PolicyFile``; each action's ``params`` model is in
``triscope.remediation.params``, each trigger's form in ``triscope.remediation.trigger_forms``).  A malformed policy is refused with one line,
``FILE:LINE: field: what is wrong`` (the first problem in the file).  Unknown keys are errors (a
typo in ``cooldown`` must not silently mean "no cooldown").  Durations take every form of
``triscope.core.durations`` (``30s``, ``5m``, ``1h30m``, ``7d``, ``1w``, ``500ms``, seconds).  What the
engine uses are the frozen dataclasses ``Policy``, ``Rule``, ``Trigger``, ``Settings``..., built
from the validated models.  See ``deploy/policy.example.yaml`` and ``docs/remediation.md``.
"""

from __future__ import annotations

import fnmatch
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Discriminator, Field, ValidationInfo, model_validator

from triscope.analysis.slo import load_slo_file
from triscope.core import yamlsafe
from triscope.core.configfile import ConfigFileError, ConfigModel, fail, problem, show, variant
from triscope.core.configfile import validate as validate_config
from triscope.core.durations import Duration
from triscope.remediation.filefallback import FallbackParams, KnobsFileParams
from triscope.remediation.filefallback import target_problem as knobs_file_target_problem
from triscope.remediation.params import (
    PLACEHOLDERS,
    TARGET_PLACEHOLDERS,
    CommandParams,
    DependencyFallbackParams,
    IsolateAcceleratorParams,
    RescheduleParams,
    RollingRestartParams,
)
from triscope.remediation.settings import Settings, SettingsModel
from triscope.remediation.targets import (
    PER_WORKLOAD,
    TargetField,
    TargetModel,
    TargetReference,
    WorkloadReference,
)
from triscope.remediation.trigger_forms import (
    MetricTrigger,
    MismatchTrigger,
    SLOTrigger,
    Trigger,
    TriggerModel,
    XidTrigger,
    metric_scope,
)

ACTIONS = ("rolling_restart", "dependency_fallback", "reschedule", "isolate_accelerator", "command")
# target fields each action needs
ACTION_TARGETS: dict[str, tuple[str, ...]] = {
    "rolling_restart": ("namespace", "deployment"),
    "dependency_fallback": ("namespace",),
    "reschedule": ("node", "namespace", "deployment"),
    "isolate_accelerator": ("node",),        # + the accelerator the trigger names (resolve_rule_target)
    "command": (),
}
NODE_ACTIONS = ("reschedule", "isolate_accelerator")   # actions that cordon, drain or taint on a node: node allow-list

_NAME = re.compile(r"^[a-z0-9]([a-z0-9_.-]{0,126}[a-z0-9])?$")


class PolicyError(ConfigFileError):
    """A policy problem: ``file:line: field: what is wrong`` (``.file``, ``.line``, ``.reason``)."""


# runtime objects ---------------------------------------------------------------------------------
ActionParams = (RollingRestartParams | DependencyFallbackParams | KnobsFileParams | RescheduleParams
                | IsolateAcceleratorParams | CommandParams)
"""A rule's params: its action's validated model (a knobs-file fallback's is ``KnobsFileParams``)."""
_ACTION_PARAMS = (RollingRestartParams, DependencyFallbackParams, KnobsFileParams, RescheduleParams,
                  IsolateAcceleratorParams, CommandParams)


@dataclass(frozen=True)
class Rule:
    name: str
    trigger: Trigger
    action: str
    target: dict[str, TargetField]
    params: ActionParams
    cooldown_s: float = 600.0
    max_actions: int = 6
    per_s: float = 3600.0
    dry_run: bool = False
    line: int = 0

    @property
    def workload_field(self) -> str | None:
        """The target field taken from the trigger's workload (``{from: workload}``), if any."""
        return next((name for name, f in self.target.items() if f.from_workload), None)

    @property
    def knobs_file(self) -> bool:
        """A ``dependency_fallback`` off Kubernetes: a knobs file, not a ConfigMap (``filefallback``)."""
        return isinstance(self.params, KnobsFileParams)


@dataclass(frozen=True)
class Policy:
    path: str
    settings: Settings
    rules: tuple[Rule, ...]

    def rule(self, name: str) -> Rule:
        for r in self.rules:
            if r.name == name:
                return r
        raise KeyError(name)


# value types -------------------------------------------------------------------------------------


def _rule_name(value: str) -> str:
    if not _NAME.match(value):
        raise ValueError(f"{show(value)} is not a rule name: use lower-case letters, digits, '-', '_', '.'")
    return value


_SHELLS = re.compile(r"^((ba|da|z|k|a|c|tc|fi|mk|yash|lk)?sh|busybox)$")
_INTERPRETERS = {"python": "-c", "perl": "-e", "ruby": "-e", "node": "-e", "php": "-r", "lua": "-e", "awk": ""}


def _inline_script(argv: list[str]) -> str:
    """``sh -c`` (``python3 -c``, ``perl -e``...) when the argv runs a script given inline, through ``env``
    too; '' when it does not."""
    words = list(argv)
    while words and os.path.basename(words[0]) == "env":
        words = words[1:]
        while words and (words[0].startswith("-") or "=" in words[0]):   # env's options, VAR=value
            words = words[1:]
    if not words:
        return ""
    prog = os.path.basename(words[0])
    base = re.sub(r"[0-9.]+$", "", prog)
    flags = [w for w in words[1:] if w.startswith("-") and not w.startswith("--")]
    if _SHELLS.match(prog) and any("c" in f[1:] for f in flags):
        return f"{prog} -c"
    opt = _INTERPRETERS.get(base)
    if opt is not None and (opt == "" or any(opt[1] in f[1:] for f in flags)):
        return f"{prog} {opt}".strip()
    return ""


# the file: rules ---------------------------------------------------------------------------------
class LimitsModel(ConfigModel):
    cooldown: Duration = 600.0
    max_actions: Annotated[int, Field(ge=1)] = 6
    per: Duration = 3600.0


class _RuleModel(ConfigModel):
    name: Annotated[str, AfterValidator(_rule_name)]
    trigger: TriggerModel
    action: str
    target: TargetModel = TargetModel()
    params: Any = None
    limits: LimitsModel = LimitsModel()
    dry_run: bool = False

    @model_validator(mode="after")
    def _targets_given(self) -> _RuleModel:
        on_file = isinstance(self.params, KnobsFileParams)
        trouble = knobs_file_target_problem(self.target, on_file, isinstance(self.trigger, SLOTrigger))
        if trouble is not None:
            raise trouble
        if on_file:
            return self   # named by the trigger's workload label only (checked above)
        scope = self._trigger_scope()
        if scope == "node":
            self._node_wide_trigger()
        if self.action == "isolate_accelerator" and scope != "verdict":
            raise problem("isolate_accelerator acts on the one accelerator a trigger names: use a mismatch, xid or "
                          "per-accelerator metric trigger (an alert or a node-wide metric names none)", "action")
        for need in ACTION_TARGETS.get(self.action, ()):
            if getattr(self.target, need) is None:
                raise problem(f"action {self.action} needs target.{need} (a name or {{label: LABEL}})", "target")
        if scope == "verdict":
            self._targets_from_the_verdict()
        if isinstance(self.params, CommandParams):
            self._command_carries_its_target(scope == "verdict")
        self._target_can_resolve()
        return self

    def _command_carries_its_target(self, verdict: bool) -> None:
        """A ``command``'s placeholders name target fields the rule has; on a verdict trigger its argv
        carries the target (a placeholder) or the rule says ``literal_targets: true``: ``kubectl rollout
        restart deploy/x`` would act on a workload the verdict did not name."""
        assert isinstance(self.params, CommandParams)
        p = self.params
        for name in p.uses:
            if name in TARGET_PLACEHOLDERS and getattr(self.target, name) is None:
                raise problem(f"the argv uses {{{name}}}: give target.{name}"
                              + (" ({from: workload})" if name == "deployment" else f" ({{label: {name}}})"), "params",
                              "argv")
        if not verdict or p.literal_targets:
            return
        what = self._what_fires()
        script = _inline_script(p.argv)
        if script:
            raise problem(f"{what} acts only on what it names: {script} runs a script whose targets the engine cannot "
                          "check; run the program itself with the target in a placeholder, or say "
                          "params.literal_targets: true", "params", "argv")
        if not p.uses:
            raise problem(f"{what} acts only on what it names: this command's argv carries no target; put it in a "
                          "placeholder (" + ", ".join(f"{{{n}}}" for n in PLACEHOLDERS) + "), or say "
                          "params.literal_targets: true (shown in the audit and the Event)", "params", "argv")

    def _trigger_scope(self) -> str:
        """``verdict``: the trigger fires for one accelerator or workload (a mismatch state, an XID, a
        per-accelerator or per-workload metric) and may act only on what it names; ``node``: a
        node-wide metric; ``free``: an alert, an SLO or an application's metric (explicit targets,
        inside the allow-lists)."""
        t = self.trigger
        if isinstance(t, MismatchTrigger | XidTrigger):
            return "verdict"
        if isinstance(t, MetricTrigger):
            return {"accelerator": "verdict", "node": "node"}.get(metric_scope(t.metric), "free")
        return "free"

    def _what_fires(self) -> str:
        t = self.trigger
        if isinstance(t, MismatchTrigger):
            return "a mismatch trigger"
        if isinstance(t, XidTrigger):
            return "an xid trigger"
        return f"a per-accelerator metric trigger ({t.metric})" if isinstance(t, MetricTrigger) else "this trigger"

    def _node_wide_trigger(self) -> None:
        """A node-wide metric names no workload: only the node itself may be acted on (``command``)."""
        assert isinstance(self.trigger, MetricTrigger)
        if self.action != "command":
            raise problem(f"{self.trigger.metric} is node-wide (no gpu, npu or workload label): it names no workload, "
                          f"so it cannot drive {self.action}; only a node-scoped action (command) on the firing "
                          "node, or trigger on the verdict (mismatch) or an alert", "action")
        node = self.target.node
        if node is not None and not (isinstance(node, TargetReference) and node.label == "node"
                                     and node.default is None):
            raise problem("a node-wide trigger acts on the node it fired on: node: {label: node} (no name, no "
                          "default)", "target", "node")

    def _targets_from_the_verdict(self) -> None:
        """Every target field from what the trigger names: the workload, its namespace, the node."""
        what = self._what_fires()
        dep, ns, node = self.target.deployment, self.target.namespace, self.target.node
        if dep is not None and not isinstance(dep, WorkloadReference):
            raise problem(f"{what} acts only on the workload it names: deployment: {{from: workload}} (a name or "
                          "another label could act on a workload the verdict did not name)", "target", "deployment")
        if ns is not None and not (isinstance(ns, TargetReference) and ns.label == "namespace"):
            raise problem(f"{what} acts only in its workload's namespace: namespace: {{label: namespace}} (not a name "
                          "or another label)", "target", "namespace")
        if node is not None and not (isinstance(node, TargetReference) and node.label == "node"
                                     and node.default is None):
            raise problem(f"{what} acts only on the node it fired on: node: {{label: node}} (no name, no default)",
                          "target", "node", *(("default",) if getattr(node, "default", None) else ()))
        if self.action == "dependency_fallback" and isinstance(self.params, DependencyFallbackParams):
            p = self.params
            if dep is None:
                raise problem(f"{what} acts only on the workload it names: a ConfigMap fallback needs "
                              "deployment: {from: workload}", "target")
            if PER_WORKLOAD not in p.configmap and PER_WORKLOAD not in p.key:
                raise problem(f"{what} switches one workload's dependency, not a namespace's: put "
                              f"{PER_WORKLOAD} in params.configmap or params.key (e.g. key: "
                              f"'{PER_WORKLOAD}.mode'), or use a knobs file", "params")

    def _target_can_resolve(self) -> None:
        """Refuse a target that could act on a workload the trigger did not name, or could name none."""
        dep, ns = self.target.deployment, self.target.namespace
        if isinstance(dep, TargetReference) and dep.default is not None:
            raise problem("a deployment target has no default: a trigger without the label is suppressed (rail "
                          "target) rather than acting on a workload it did not name", "target", "deployment", "default")
        if not isinstance(dep, WorkloadReference | TargetReference):
            return
        if isinstance(self.trigger, SLOTrigger):
            raise problem("an slo trigger names no workload (its labels are the node's): give a deployment name, or "
                          "trigger on an alert or on per-accelerator data", "target", "deployment")
        if isinstance(ns, TargetReference) and ns.default is not None:
            raise problem("the deployment comes from the trigger: a default namespace would pair it with a namespace "
                          "the trigger did not name (leave the default out)", "target", "namespace", "default")

    def to_rule(self, slo_file: str, line: int) -> Rule:
        params = self.params
        if not isinstance(params, _ACTION_PARAMS):   # an unknown action never validates
            raise TypeError(f"rule {self.name}: no params model for action {self.action!r}")
        return Rule(name=self.name, trigger=self.trigger.to_trigger(slo_file), action=self.action,
                    target=self.target.fields(), params=params, cooldown_s=self.limits.cooldown,
                    max_actions=self.limits.max_actions, per_s=max(1.0, self.limits.per), dry_run=self.dry_run,
                    line=line)


class RollingRestartRule(_RuleModel):
    action: Literal["rolling_restart"]
    params: RollingRestartParams = RollingRestartParams()


class DependencyFallbackRule(_RuleModel):
    action: Literal["dependency_fallback"]
    params: FallbackParams   # a ConfigMap's key, or a knobs file per workload (off Kubernetes)


class RescheduleRule(_RuleModel):
    action: Literal["reschedule"]
    params: RescheduleParams = RescheduleParams()


class IsolateAcceleratorRule(_RuleModel):
    action: Literal["isolate_accelerator"]
    params: IsolateAcceleratorParams = IsolateAcceleratorParams()


class CommandRule(_RuleModel):
    action: Literal["command"]
    params: CommandParams


def _unknown_action(value: Any) -> Any:
    raise ValueError(f"unknown action {show(value)} (one of: {', '.join(ACTIONS)})")


class _UnknownActionRule(_RuleModel):
    """A rule whose action is missing or unknown: says so, with every other problem of the rule."""

    action: Annotated[Any, AfterValidator(_unknown_action)]


def _rule_action(value: Any) -> str:
    action = value.get("action") if isinstance(value, dict) else None
    return f"<{action}>" if isinstance(action, str) and action in ACTIONS else "<unknown action>"


RuleModel = Annotated[
    Annotated[RollingRestartRule, variant("rolling_restart")]
    | Annotated[DependencyFallbackRule, variant("dependency_fallback")]
    | Annotated[RescheduleRule, variant("reschedule")]
    | Annotated[IsolateAcceleratorRule, variant("isolate_accelerator")] | Annotated[CommandRule, variant("command")]
    | Annotated[_UnknownActionRule, variant("unknown action")],
    Discriminator(_rule_action)]


def _version(value: Any) -> int:
    if value != 1 or isinstance(value, bool):
        raise ValueError(f"unsupported policy version {show(value)} (this triscope reads version 1)")
    return 1


# the file ----------------------------------------------------------------------------------------
class PolicyFile(ConfigModel):
    """A policy file, ``version: 1``: settings and a non-empty list of rules."""

    version: Annotated[Any, AfterValidator(_version)] = 1
    settings: SettingsModel = SettingsModel()
    rules: Annotated[list[RuleModel], Field(min_length=1)]

    @model_validator(mode="after")
    def _rules_within_settings(self, info: ValidationInfo) -> PolicyFile:
        doc = (info.context or {}).get("doc")
        s = self.settings
        seen: dict[str, int] = {}
        for i, r in enumerate(self.rules):
            if r.name in seen:
                first = seen[r.name]
                where = f"line {doc.line(('rules', first, 'name'))}" if doc else f"rules[{first}]"
                raise problem(f"duplicate rule name {r.name!r} (first on {where})", "rules", i, "name")
            seen[r.name] = i
            ns = r.target.namespace
            if r.action != "command" and s.namespaces and isinstance(ns, str) and ns not in s.namespaces:
                raise problem(f"namespace {ns!r} is not in settings.namespaces {s.namespaces}",
                              "rules", i, "target", "namespace")
            if r.action in NODE_ACTIONS:
                self._check_node_target(r, i)
            if isinstance(r.trigger, SLOTrigger) and not s.slo_file:
                raise problem("slo triggers need settings.slo_file (the SLO spec file)", "rules", i, "trigger", "slo")
        if any(r.action != "command" and not isinstance(r.params, KnobsFileParams) for r in self.rules) \
                and not s.namespaces:
            raise problem("required when a rule acts on Kubernetes (the namespace allow-list)", "settings", "namespaces")
        return self

    def _check_node_target(self, r: _RuleModel, i: int) -> None:
        s = self.settings
        if not (s.node_names or s.node_selector):
            raise problem(f"{r.action} cordons and drains nodes: settings.node_names or settings.node_selector "
                          "(the node allow-list) is required", "rules", i, "action")
        patterns = s.node_names or []
        node = r.target.node
        for name, at in ((node, ()), (getattr(node, "default", None), ("default",))):
            if isinstance(name, str) and patterns and not any(fnmatch.fnmatchcase(name, p) for p in patterns):
                raise problem(f"node {name!r} is not in settings.node_names {patterns}",
                              "rules", i, "target", "node", *at)


# loading -----------------------------------------------------------------------------------------
def parse_policy(text: str, file: str = "<policy>") -> Policy:
    """A policy from its text; raises ``PolicyError`` (``FILE:LINE: field: what is wrong``)."""
    try:
        doc = yamlsafe.parse(text, file)
    except yamlsafe.YAMLFileError as e:
        raise PolicyError(file, e.line, e.reason) from None
    model = validate_config(PolicyFile, doc, error=PolicyError)
    slo_file, slo_ids = _slo_file(model.settings.slo_file, doc)
    rules = []
    for i, r in enumerate(model.rules):
        if isinstance(r.trigger, SLOTrigger) and slo_ids is not None and r.trigger.slo not in slo_ids:
            raise fail(doc, ("rules", i, "trigger", "slo"), f"no SLO {r.trigger.slo!r} in {slo_file} "
                       f"(there are: {', '.join(sorted(set(slo_ids.values())))})", PolicyError)
        rules.append(r.to_rule(slo_file, doc.line(("rules", i)) or 0))
    return Policy(file, model.settings.to_settings(slo_file), tuple(rules))


def _slo_file(value: str | None, doc: yamlsafe.Document) -> tuple[str, dict[str, str] | None]:
    """The SLO file's absolute path (relative paths: to the policy's folder) and its SLOs
    (name and service-name, each to its id); no file: ``("", None)``."""
    if not value:
        return "", None
    at = ("settings", "slo_file")
    path = Path(value).expanduser()
    if not path.is_absolute():
        path = (Path(doc.file).resolve().parent / path) if doc.file and not doc.file.startswith("<") \
            else path.resolve()
    if not path.is_file():
        raise fail(doc, at, f"{value!r}: no such file ({path})", PolicyError)
    try:
        specs = load_slo_file(path)
    except Exception as e:  # noqa: BLE001 - the SLO file's own one-line error, under the policy's line
        raise fail(doc, at, f"{value!r}: {e}", PolicyError) from None
    return str(path), {**{s.id: s.id for s in specs}, **{s.name: s.id for s in specs}}


def load_policy(path: str | os.PathLike[str]) -> Policy:
    try:
        text = yamlsafe.read_text(path)
    except yamlsafe.YAMLFileError as e:
        raise PolicyError(str(path), e.line, e.reason) from None
    return parse_policy(text, str(path))
