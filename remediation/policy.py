"""Remediation policies: a YAML file of rules (trigger, action, target, limits) and global settings.

The file is composed with PyYAML's node API so every value keeps its line: a malformed policy is
refused with ``FILE:LINE: reason``.  Unknown keys are errors (a typo in ``cooldown`` must not
silently mean "no cooldown").  See ``deploy/policy.example.yaml`` and ``docs/remediation.md``.
"""

from __future__ import annotations

import fnmatch
import os
import re
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from triscope import yamlsafe
from triscope.labels import Matcher

ACTIONS = ("rolling_restart", "dependency_fallback", "reschedule", "command")
TRIGGER_KINDS = ("alert", "metric", "mismatch", "slo", "xid")
# target fields each action needs
ACTION_TARGETS: dict[str, tuple[str, ...]] = {
    "rolling_restart": ("namespace", "deployment"),
    "dependency_fallback": ("namespace",),
    "reschedule": ("node", "namespace", "deployment"),
    "command": (),
}
TARGET_FIELDS = ("namespace", "deployment", "node")
NODE_ACTIONS = ("reschedule",)   # actions that cordon or drain a Kubernetes node: bounded by the node allow-list
_DUR = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_DUR_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}
_NAME = re.compile(r"^[a-z0-9]([a-z0-9_.-]{0,126}[a-z0-9])?$")
_NODE_PATTERN = re.compile(r"^[a-z0-9.*?\[\]!-]{1,253}$")
_LABEL_KEY = re.compile(r"^([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")
_MATCHER = re.compile(r"^\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*\"?(.*?)\"?\s*$")
OPS = {">": lambda a, b: a > b, ">=": lambda a, b: a >= b, "<": lambda a, b: a < b, "<=": lambda a, b: a <= b,
       "==": lambda a, b: a == b, "!=": lambda a, b: a != b}


class PolicyError(Exception):
    """A policy problem: ``file:line: reason``."""

    def __init__(self, file: str, line: int | None, reason: str) -> None:
        self.file, self.line, self.reason = file, line, reason
        super().__init__(f"{file}:{line}: {reason}" if line else f"{file}: {reason}")


# model -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Trigger:
    kind: str                                   # alert | metric | mismatch | slo | xid
    alert: str = ""
    matchers: tuple[Matcher, ...] = ()
    metric: str = ""
    labels: tuple[tuple[str, str], ...] = ()
    op: str = ">"
    threshold: float = 0.0
    for_s: float = 0.0
    state: str = ""
    slo: str = ""
    slo_status: str = "page"
    xid_codes: tuple[int, ...] = ()
    within_s: float = 300.0
    nodes: tuple[Matcher, ...] = ()              # stored-data triggers: which nodes (by node labels / name)
    slo_file: str = ""                           # slo triggers: the SLO spec file (settings.slo_file)

    def describe(self) -> str:
        if self.kind == "alert":
            m = ",".join(f"{x.name}{x.op}{x.value}" for x in self.matchers)
            return f"alert {self.alert}" + (f"{{{m}}}" if m else "")
        if self.kind == "metric":
            lab = ",".join(f"{k}={v}" for k, v in self.labels)
            return f"{self.metric}{{{lab}}} {self.op} {self.threshold:g} for {self.for_s:g}s"
        if self.kind == "mismatch":
            return f"mismatch state {self.state} for {self.for_s:g}s"
        if self.kind == "slo":
            return f"SLO {self.slo} status {self.slo_status}" + (f" for {self.for_s:g}s" if self.for_s else "")
        return f"XID {','.join(map(str, self.xid_codes))} within {self.within_s:g}s"


@dataclass(frozen=True)
class TargetField:
    literal: str | None = None
    label: str | None = None
    default: str | None = None


@dataclass(frozen=True)
class Rule:
    name: str
    trigger: Trigger
    action: str
    target: dict[str, TargetField]
    params: dict[str, Any]
    cooldown_s: float = 600.0
    max_actions: int = 6
    per_s: float = 3600.0
    dry_run: bool = False
    line: int = 0


@dataclass(frozen=True)
class BreakerSettings:
    window_s: float = 900.0
    max_targets: int = 5
    max_percent: float = 50.0
    min_population: int = 4   # the percentage applies once at least this many nodes/targets are known


@dataclass(frozen=True)
class KubeSettings:
    mode: str = "none"        # none | kubeconfig | in-cluster | url
    kubeconfig: str | None = None
    context: str | None = None
    url: str | None = None
    token_file: str | None = None
    ca_file: str | None = None
    verify_ssl: bool = True
    events: bool = True
    events_namespace: str = "default"


@dataclass(frozen=True)
class LeaderSettings:
    enabled: bool = False
    namespace: str = "default"
    lease: str = "triscope-remediation"
    lease_duration_s: float = 15.0
    renew_every_s: float = 5.0


@dataclass(frozen=True)
class Settings:
    dry_run: bool = False
    namespaces: tuple[str, ...] = ()
    max_actions_per_hour: int = 30
    max_in_flight: int = 4
    breaker: BreakerSettings = field(default_factory=BreakerSettings)
    evaluate_interval_s: float = 15.0
    dedupe_retention_s: float = 7 * 86400.0
    engine_id: str = ""
    kubernetes: KubeSettings = field(default_factory=KubeSettings)
    leader_election: LeaderSettings = field(default_factory=LeaderSettings)
    workers: int = 8
    slo_file: str = ""
    node_names: tuple[str, ...] = ()                       # glob patterns of node names actions may touch
    node_selector: tuple[tuple[str, str], ...] = ()        # labels (key, value) such a node must carry

    @property
    def nodes_bounded(self) -> bool:
        return bool(self.node_names or self.node_selector)

    def node_name_allowed(self, name: str) -> bool:
        """Does ``name`` match the node allow-list's name patterns (no patterns: any name)?"""
        return not self.node_names or any(fnmatch.fnmatchcase(name, p) for p in self.node_names)

    def node_labels_allowed(self, labels: dict[str, str]) -> bool:
        """Does a node with ``labels`` carry every label of the node selector (no selector: yes)?"""
        return all(labels.get(k) == v for k, v in self.node_selector)

    def describe_nodes(self) -> str:
        parts = []
        if self.node_names:
            parts.append(f"names {list(self.node_names)}")
        if self.node_selector:
            parts.append("labels " + ",".join(f"{k}={v}" for k, v in self.node_selector))
        return " and ".join(parts) or "any node"


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


# parsing -----------------------------------------------------------------------------------------
class _Doc:
    """Plain Python values plus the line of every path, from the safe YAML loader (``triscope.yamlsafe``)."""

    def __init__(self, text: str, file: str) -> None:
        self.file = file
        try:
            doc = yamlsafe.parse(text, file)
        except yamlsafe.YAMLFileError as e:
            raise PolicyError(file, e.line, e.reason) from None
        self.lines = doc.lines
        self.root = doc.root

    def line(self, path: tuple[Any, ...]) -> int | None:
        while path not in self.lines and path:
            path = path[:-1]
        return self.lines.get(path)

    def err(self, path: tuple[Any, ...], reason: str) -> PolicyError:
        return PolicyError(self.file, self.line(path), reason)


def parse_duration(v: Any) -> float | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, int | float):
        return float(v) if v >= 0 else None
    if isinstance(v, str):
        m = _DUR.match(v)
        if m:
            return float(m.group(1)) * _DUR_UNITS[m.group(2)]
    return None


class _Parser:
    def __init__(self, doc: _Doc) -> None:
        self.d = doc
        self.slos: dict[str, Any] | None = None
        self.slo_path = ""

    # typed getters ----------------------------------------------------------------------------
    def mapping(self, v: Any, path: tuple[Any, ...], allowed: tuple[str, ...], what: str) -> dict[str, Any]:
        if v is None:
            return {}
        if not isinstance(v, dict):
            raise self.d.err(path, f"{what} must be a mapping, not {type(v).__name__}")
        for k in v:
            if k not in allowed:
                raise self.d.err(path + (k,), f"unknown key {k!r} in {what} (allowed: {', '.join(allowed)})")
        return v

    def duration(self, m: dict[str, Any], key: str, path: tuple[Any, ...], default: float) -> float:
        if key not in m:
            return default
        d = parse_duration(m[key])
        if d is None:
            raise self.d.err(path + (key,), f"{key}: {m[key]!r} is not a duration (e.g. 30s, 5m, 1h)")
        return d

    def integer(self, m: dict[str, Any], key: str, path: tuple[Any, ...], default: int, lo: int = 0,
                hi: int | None = None) -> int:
        if key not in m:
            return default
        v = m[key]
        if isinstance(v, bool) or not isinstance(v, int) or v < lo or (hi is not None and v > hi):
            rng = f">= {lo}" + (f" and <= {hi}" if hi is not None else "")
            raise self.d.err(path + (key,), f"{key} must be an integer {rng}, not {v!r}")
        return v

    def number(self, m: dict[str, Any], key: str, path: tuple[Any, ...], default: float | None,
               lo: float | None = None, hi: float | None = None) -> float:
        if key not in m:
            if default is None:
                raise self.d.err(path, f"missing required key {key!r}")
            return default
        v = m[key]
        if isinstance(v, bool) or not isinstance(v, int | float) or (lo is not None and v < lo) or (
                hi is not None and v > hi):
            raise self.d.err(path + (key,), f"{key} must be a number"
                             + (f" in [{lo:g}, {hi:g}]" if lo is not None and hi is not None else "") + f", not {v!r}")
        return float(v)

    def boolean(self, m: dict[str, Any], key: str, path: tuple[Any, ...], default: bool) -> bool:
        if key not in m:
            return default
        if not isinstance(m[key], bool):
            raise self.d.err(path + (key,), f"{key} must be true or false, not {m[key]!r}")
        return bool(m[key])

    def string(self, m: dict[str, Any], key: str, path: tuple[Any, ...], default: str | None = None,
               required: bool = False) -> str | None:
        if key not in m:
            if required:
                raise self.d.err(path, f"missing required key {key!r}")
            return default
        v = m[key]
        if not isinstance(v, str) or not v.strip():
            raise self.d.err(path + (key,), f"{key} must be a non-empty string, not {v!r}")
        return v

    # sections ---------------------------------------------------------------------------------
    def settings(self, v: Any) -> Settings:
        p: tuple[Any, ...] = ("settings",)
        m = self.mapping(v, p, ("dry_run", "namespaces", "max_actions_per_hour", "max_in_flight", "breaker",
                                "evaluate_interval", "dedupe_retention", "engine_id", "kubernetes",
                                "leader_election", "workers", "slo_file", "node_names", "node_selector"), "settings")
        ns = m.get("namespaces", [])
        if not isinstance(ns, list) or not all(isinstance(x, str) and _NAME.match(x) for x in ns):
            raise self.d.err(p + ("namespaces",), "namespaces must be a list of namespace names")
        bm = self.mapping(m.get("breaker"), p + ("breaker",),
                          ("window", "max_targets", "max_percent", "min_population"), "breaker")
        bp = p + ("breaker",)
        breaker = BreakerSettings(
            window_s=self.duration(bm, "window", bp, 900.0), max_targets=self.integer(bm, "max_targets", bp, 5, 1),
            max_percent=self.number(bm, "max_percent", bp, 50.0, 1.0, 100.0),
            min_population=self.integer(bm, "min_population", bp, 4, 1))
        km = self.mapping(m.get("kubernetes"), p + ("kubernetes",),
                          ("mode", "kubeconfig", "context", "url", "token_file", "ca_file", "verify_ssl", "events",
                           "events_namespace"), "kubernetes")
        kp = p + ("kubernetes",)
        mode = self.string(km, "mode", kp, "none") or "none"
        if mode not in ("none", "kubeconfig", "in-cluster", "url"):
            raise self.d.err(kp + ("mode",), f"mode must be none, kubeconfig, in-cluster or url, not {mode!r}")
        if mode == "url" and not km.get("url"):
            raise self.d.err(kp, "mode url needs url: https://HOST:PORT")
        kube = KubeSettings(mode=mode, kubeconfig=self.string(km, "kubeconfig", kp), context=self.string(km, "context", kp),
                            url=self.string(km, "url", kp), token_file=self.string(km, "token_file", kp),
                            ca_file=self.string(km, "ca_file", kp), verify_ssl=self.boolean(km, "verify_ssl", kp, True),
                            events=self.boolean(km, "events", kp, True),
                            events_namespace=self.string(km, "events_namespace", kp, "default") or "default")
        lm = self.mapping(m.get("leader_election"), p + ("leader_election",),
                          ("enabled", "namespace", "lease", "lease_duration", "renew_every"), "leader_election")
        lp = p + ("leader_election",)
        leader = LeaderSettings(enabled=self.boolean(lm, "enabled", lp, False),
                                namespace=self.string(lm, "namespace", lp, "default") or "default",
                                lease=self.string(lm, "lease", lp, "triscope-remediation") or "triscope-remediation",
                                lease_duration_s=self.duration(lm, "lease_duration", lp, 15.0),
                                renew_every_s=self.duration(lm, "renew_every", lp, 5.0))
        if leader.renew_every_s >= leader.lease_duration_s:
            raise self.d.err(lp, "renew_every must be shorter than lease_duration")
        if leader.enabled and kube.mode == "none":
            raise self.d.err(lp + ("enabled",), "leader election needs a Kubernetes API (settings.kubernetes.mode)")
        engine_id = self.string(m, "engine_id", p, "") or f"{socket.gethostname()}-{os.getpid()}"
        return Settings(
            dry_run=self.boolean(m, "dry_run", p, False), namespaces=tuple(ns),
            max_actions_per_hour=self.integer(m, "max_actions_per_hour", p, 30, 1),
            max_in_flight=self.integer(m, "max_in_flight", p, 4, 1), breaker=breaker,
            evaluate_interval_s=max(0.2, self.duration(m, "evaluate_interval", p, 15.0)),
            dedupe_retention_s=self.duration(m, "dedupe_retention", p, 7 * 86400.0),
            engine_id=engine_id, kubernetes=kube, leader_election=leader,
            workers=self.integer(m, "workers", p, 8, 1, 64), slo_file=self.slo_file(m, p),
            node_names=self.node_names(m, p), node_selector=self.node_selector(m, p))

    def node_names(self, m: dict[str, Any], p: tuple[Any, ...]) -> tuple[str, ...]:
        if "node_names" not in m:
            return ()
        v, path = m["node_names"], p + ("node_names",)
        if not isinstance(v, list) or not v:
            raise self.d.err(path, "node_names must be a non-empty list of node names or glob patterns (gpu-*)")
        out = []
        for i, pat in enumerate(v):
            if not isinstance(pat, str) or not _NODE_PATTERN.match(pat):
                raise self.d.err(path + (i,), f"node_names: {pat!r} is not a node name or glob pattern "
                                 "(lower-case letters, digits, '-', '.', and * ? [...])")
            if not re.sub(r"\[[^\]]*\]|[*?]", "", pat):
                raise self.d.err(path + (i,), f"node_names: {pat!r} matches any node name: name the nodes or a "
                                 "prefix such as gpu-*")
            out.append(pat)
        return tuple(out)

    def node_selector(self, m: dict[str, Any], p: tuple[Any, ...]) -> tuple[tuple[str, str], ...]:
        if "node_selector" not in m:
            return ()
        v, path = m["node_selector"], p + ("node_selector",)
        if not isinstance(v, dict) or not v:
            raise self.d.err(path, "node_selector must be a non-empty mapping of node label: value "
                             "(e.g. {triscope.io/remediation: allowed})")
        out = []
        for key, val in v.items():
            val = "true" if val is True else "false" if val is False else val
            if not isinstance(key, str) or not _LABEL_KEY.match(key):
                raise self.d.err(path + (key,), f"node_selector: {key!r} is not a label key")
            if not isinstance(val, str | int) or not _LABEL_VALUE.match(str(val)):
                raise self.d.err(path + (key,), f"node_selector: {key}: {val!r} is not a label value")
            out.append((key, str(val)))
        return tuple(sorted(out))

    def slo_file(self, m: dict[str, Any], p: tuple[Any, ...]) -> str:
        v = self.string(m, "slo_file", p, "") or ""
        if not v:
            return ""
        path = Path(v).expanduser()
        if not path.is_absolute():
            path = (Path(self.d.file).resolve().parent / path) if self.d.file and not self.d.file.startswith("<") \
                else path.resolve()
        if not path.is_file():
            raise self.d.err(p + ("slo_file",), f"slo_file {v!r}: no such file ({path})")
        try:
            from triscope.analysis.slo import load_slo_file
        except ImportError:
            return str(path)
        try:
            self.slos = {s.id: s for s in load_slo_file(path)}
            self.slos.update({s.name: s for s in self.slos.values()})
        except Exception as e:
            raise self.d.err(p + ("slo_file",), f"slo_file {v!r}: {e}") from None
        return str(path)

    def matchers(self, v: Any, path: tuple[Any, ...]) -> tuple[Matcher, ...]:
        if v is None:
            return ()
        items: list[tuple[Any, tuple[Any, ...]]] = []
        if isinstance(v, dict):
            items = [(f"{k}={val}", path + (k,)) for k, val in v.items()]
        elif isinstance(v, list):
            items = [(x, path + (i,)) for i, x in enumerate(v)]
        else:
            raise self.d.err(path, "matchers must be a list like ['severity=page', 'namespace=~inf.*'] or a mapping")
        out = []
        for text, p in items:
            m = _MATCHER.match(str(text)) if isinstance(text, str) else None
            if not m:
                raise self.d.err(p, f"matcher {text!r} is not LABEL=VALUE, LABEL!=VALUE, LABEL=~REGEX or LABEL!~REGEX")
            if m.group(2) in ("=~", "!~"):
                try:
                    re.compile(m.group(3))
                except re.error as e:
                    raise self.d.err(p, f"matcher {text!r}: bad regular expression: {e}") from None
            out.append(Matcher(m.group(1), m.group(2), m.group(3)))
        return tuple(out)

    def trigger(self, v: Any, path: tuple[Any, ...]) -> Trigger:
        m = self.mapping(v, path, ("alert", "matchers", "metric", "labels", "op", "threshold", "for", "mismatch",
                                   "slo", "status", "xid", "within", "nodes"), "trigger")
        kinds = [k for k in TRIGGER_KINDS if k in m]
        if len(kinds) != 1:
            raise self.d.err(path, "a trigger needs exactly one of: alert, metric, mismatch, slo, xid"
                             + (f" (found {', '.join(kinds)})" if kinds else ""))
        kind = kinds[0]
        extra = {"alert": ("matchers",), "metric": ("labels", "op", "threshold", "for", "nodes"),
                 "mismatch": ("for", "nodes"), "slo": ("status", "for", "nodes"), "xid": ("within", "nodes")}[kind]
        for k in m:
            if k != kind and k not in extra:
                raise self.d.err(path + (k,), f"key {k!r} does not apply to a {kind} trigger")
        nodes = self.matchers(m.get("nodes"), path + ("nodes",))
        if kind == "alert":
            return Trigger("alert", alert=self.string(m, "alert", path, required=True) or "",
                           matchers=self.matchers(m.get("matchers"), path + ("matchers",)))
        if kind == "metric":
            metric = self.string(m, "metric", path, required=True) or ""
            if not re.fullmatch(r"[a-zA-Z_:][a-zA-Z0-9_:]*", metric):
                raise self.d.err(path + ("metric",), f"{metric!r} is not a metric name")
            labels = m.get("labels") or {}
            if not isinstance(labels, dict):
                raise self.d.err(path + ("labels",), "labels must be a mapping of label: value")
            op = str(m.get("op", ">"))
            if op not in OPS:
                raise self.d.err(path + ("op",), f"op must be one of {', '.join(OPS)}, not {op!r}")
            return Trigger("metric", metric=metric, labels=tuple(sorted((str(k), str(v)) for k, v in labels.items())),
                           op=op, threshold=self.number(m, "threshold", path, None),
                           for_s=self.duration(m, "for", path, 0.0), nodes=nodes)
        if kind == "mismatch":
            return Trigger("mismatch", state=self.string(m, "mismatch", path, required=True) or "",
                           for_s=self.duration(m, "for", path, 0.0), nodes=nodes)
        if kind == "slo":
            status = self.string(m, "status", path, "page") or "page"
            if status not in ("page", "ticket"):
                raise self.d.err(path + ("status",), f"status must be page or ticket, not {status!r}")
            name = self.string(m, "slo", path, required=True) or ""
            if self.slos is None and not self.slo_path:
                raise self.d.err(path + ("slo",), "slo triggers need settings.slo_file (the SLO spec file)")
            if self.slos is not None and name not in self.slos:
                raise self.d.err(path + ("slo",), f"no SLO {name!r} in {self.slo_path} "
                                 f"(there are: {', '.join(sorted({s.id for s in self.slos.values()}))})")
            return Trigger("slo", slo=name, slo_status=status, for_s=self.duration(m, "for", path, 0.0), nodes=nodes,
                           slo_file=self.slo_path)
        codes = m["xid"] if isinstance(m["xid"], list) else [m["xid"]]
        if not codes or not all(isinstance(c, int) and not isinstance(c, bool) and c > 0 for c in codes):
            raise self.d.err(path + ("xid",), "xid must be an XID code or a list of codes (positive integers)")
        return Trigger("xid", xid_codes=tuple(codes), within_s=self.duration(m, "within", path, 300.0), nodes=nodes)

    def target(self, v: Any, path: tuple[Any, ...], action: str) -> dict[str, TargetField]:
        m = self.mapping(v, path, TARGET_FIELDS, "target")
        out: dict[str, TargetField] = {}
        for k, spec in m.items():
            p = path + (k,)
            if isinstance(spec, str):
                if not _NAME.match(spec):
                    raise self.d.err(p, f"{k}: {spec!r} is not a valid Kubernetes name")
                out[k] = TargetField(literal=spec)
            elif isinstance(spec, dict):
                sm = self.mapping(spec, p, ("label", "default"), f"target.{k}")
                label = self.string(sm, "label", p, required=True)
                default = self.string(sm, "default", p)
                if default is not None and not _NAME.match(default):
                    raise self.d.err(p + ("default",), f"default {default!r} is not a valid Kubernetes name")
                out[k] = TargetField(label=label, default=default)
            else:
                raise self.d.err(p, f"{k} must be a name or {{label: LABEL, default: NAME}}")
        for need in ACTION_TARGETS[action]:
            if need not in out:
                raise self.d.err(path, f"action {action} needs target.{need} (a name or {{label: LABEL}})")
        return out

    def params(self, v: Any, path: tuple[Any, ...], action: str) -> dict[str, Any]:
        if action == "rolling_restart":
            m = self.mapping(v, path, ("timeout", "follow"), "params")
            return {"timeout": self.duration(m, "timeout", path, 300.0), "follow": self.boolean(m, "follow", path, True)}
        if action == "dependency_fallback":
            m = self.mapping(v, path, ("configmap", "key", "value", "ttl", "hold"), "params")
            for k in ("configmap", "key"):
                if k not in m:
                    raise self.d.err(path, f"dependency_fallback needs params.{k}")
            cm = self.string(m, "configmap", path, required=True) or ""
            if not _NAME.match(cm):
                raise self.d.err(path + ("configmap",), f"{cm!r} is not a valid ConfigMap name")
            key = self.string(m, "key", path, required=True) or ""
            if not re.fullmatch(r"[-._a-zA-Z0-9]{1,253}", key):
                raise self.d.err(path + ("key",), f"{key!r} is not a valid ConfigMap key")
            value = m.get("value", "fallback")
            if not isinstance(value, str | int | float) or isinstance(value, bool):
                raise self.d.err(path + ("value",), "value must be a string")
            ttl = self.duration(m, "ttl", path, 1800.0)
            hold = self.duration(m, "hold", path, 300.0)
            if ttl <= 0:
                raise self.d.err(path + ("ttl",), "ttl must be positive")
            return {"configmap": cm, "key": key, "value": str(value), "ttl": ttl, "hold": hold}
        if action == "reschedule":
            m = self.mapping(v, path, ("weights", "eviction_timeout", "affinity_weight", "cordon"), "params")
            wm = self.mapping(m.get("weights"), path + ("weights",), ("compute", "link", "storage"), "weights")
            wp = path + ("weights",)
            weights = {k: self.number(wm, k, wp, 1.0, 0.0, 1000.0) for k in ("compute", "link", "storage")}
            if not any(weights.values()):
                raise self.d.err(wp, "at least one weight must be positive")
            return {"weights": weights, "eviction_timeout": self.duration(m, "eviction_timeout", path, 120.0),
                    "affinity_weight": self.integer(m, "affinity_weight", path, 100, 1, 100),
                    "cordon": self.boolean(m, "cordon", path, True)}
        m = self.mapping(v, path, ("argv", "timeout"), "params")
        argv = m.get("argv")
        if not isinstance(argv, list) or not argv or not all(isinstance(a, str | int | float) and not isinstance(a, bool)
                                                             for a in argv):
            raise self.d.err(path + ("argv",), "command needs params.argv: a non-empty list of arguments "
                             "(fixed in the policy, no shell)")
        return {"argv": [str(a) for a in argv], "timeout": self.duration(m, "timeout", path, 30.0)}

    def rule(self, v: Any, i: int) -> Rule:
        path: tuple[Any, ...] = ("rules", i)
        m = self.mapping(v, path, ("name", "trigger", "action", "target", "params", "limits", "dry_run"), "a rule")
        name = self.string(m, "name", path, required=True) or ""
        if not _NAME.match(name):
            raise self.d.err(path + ("name",), f"rule name {name!r}: use lower-case letters, digits, '-', '_', '.'")
        if "trigger" not in m:
            raise self.d.err(path, f"rule {name}: missing trigger")
        trigger = self.trigger(m["trigger"], path + ("trigger",))
        action = self.string(m, "action", path, required=True) or ""
        if action not in ACTIONS:
            raise self.d.err(path + ("action",), f"unknown action {action!r} (one of: {', '.join(ACTIONS)})")
        target = self.target(m.get("target"), path + ("target",), action)
        params = self.params(m.get("params"), path + ("params",), action)
        lp = path + ("limits",)
        lm = self.mapping(m.get("limits"), lp, ("cooldown", "max_actions", "per"), "limits")
        return Rule(name=name, trigger=trigger, action=action, target=target, params=params,
                    cooldown_s=self.duration(lm, "cooldown", lp, 600.0), max_actions=self.integer(lm, "max_actions", lp, 6, 1),
                    per_s=max(1.0, self.duration(lm, "per", lp, 3600.0)), dry_run=self.boolean(m, "dry_run", path, False),
                    line=self.d.line(path) or 0)


def parse_policy(text: str, file: str = "<policy>") -> Policy:
    doc = _Doc(text, file)
    root = doc.root
    if not isinstance(root, dict):
        raise PolicyError(file, doc.line(()) or 1, "the policy must be a mapping with 'rules' (and optional 'settings')")
    p = _Parser(doc)
    p.mapping(root, (), ("version", "settings", "rules"), "the policy")
    if root.get("version", 1) != 1:
        raise doc.err(("version",), f"unsupported policy version {root.get('version')!r} (this triscope reads version 1)")
    settings = p.settings(root.get("settings"))
    p.slo_path = settings.slo_file
    rules_v = root.get("rules")
    if not isinstance(rules_v, list) or not rules_v:
        raise doc.err(("rules",), "rules must be a non-empty list")
    rules = []
    seen: dict[str, int] = {}
    for i, rv in enumerate(rules_v):
        r = p.rule(rv, i)
        if r.name in seen:
            raise doc.err(("rules", i, "name"), f"duplicate rule name {r.name!r} (first on line {seen[r.name]})")
        seen[r.name] = doc.line(("rules", i, "name")) or 0
        needs_ns = r.action in ("rolling_restart", "dependency_fallback", "reschedule")
        ns = r.target.get("namespace")
        if needs_ns and settings.namespaces and ns and ns.literal and ns.literal not in settings.namespaces:
            raise doc.err(("rules", i, "target", "namespace"),
                          f"namespace {ns.literal!r} is not in settings.namespaces {list(settings.namespaces)}")
        if r.action in NODE_ACTIONS:
            if not settings.nodes_bounded:
                raise doc.err(("rules", i, "action"),
                              f"rule {r.name}: {r.action} cordons and drains nodes: settings.node_names or "
                              "settings.node_selector (the node allow-list) is required")
            node = r.target.get("node")
            if node and node.literal and not settings.node_name_allowed(node.literal):
                raise doc.err(("rules", i, "target", "node"),
                              f"node {node.literal!r} is not in settings.node_names {list(settings.node_names)}")
            if node and node.default and not settings.node_name_allowed(node.default):
                raise doc.err(("rules", i, "target", "node", "default"),
                              f"node {node.default!r} is not in settings.node_names {list(settings.node_names)}")
        rules.append(r)
    if any(r.action != "command" for r in rules) and not settings.namespaces:
        raise doc.err(("settings",), "settings.namespaces (the namespace allow-list) is required when a rule "
                      "acts on Kubernetes")
    return Policy(file, settings, tuple(rules))


def load_policy(path: str | os.PathLike[str]) -> Policy:
    try:
        text = yamlsafe.read_text(path)
    except yamlsafe.YAMLFileError as e:
        raise PolicyError(str(path), e.line, e.reason) from None
    return parse_policy(text, str(path))
