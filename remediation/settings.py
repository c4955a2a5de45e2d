"""The policy's ``settings:`` block: the engine-wide rails (dry-run, namespaces, caps, breaker),
the Kubernetes API, leader election, the node allow-list — the file's models and what the engine
reads (``Settings``).  ``triscope.remediation.policy`` loads the file; this is one part of it."""

from __future__ import annotations

import fnmatch
import os
import re
import socket
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, PlainValidator, model_validator

from triscope.core.configfile import ConfigModel, problem, show, str_map
from triscope.core.durations import Duration
from triscope.remediation.targets import KubeName, Text

_NODE_PATTERN = re.compile(r"^[a-z0-9.*?\[\]!-]{1,253}$")
_LABEL_KEY = re.compile(r"^([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")


def _node_pattern(value: str) -> str:
    if not _NODE_PATTERN.match(value):
        raise ValueError(f"{show(value)} is not a node name or glob pattern "
                         "(lower-case letters, digits, '-', '.', and * ? [...])")
    if not re.sub(r"\[[^\]]*\]|[*?]", "", value):
        raise ValueError(f"{show(value)} matches any node name: name the nodes or a prefix such as gpu-*")
    return value


def _positive_duration(seconds: float) -> float:
    if seconds <= 0:
        raise ValueError("must be longer than 0s")
    return seconds


def _label_value(value: Any) -> str:
    text = "true" if value is True else "false" if value is False else value
    if not isinstance(text, str | int) or not _LABEL_VALUE.match(str(text)):
        raise ValueError(f"{show(value)} is not a label value")
    return str(text)


def _node_selector(value: Any) -> tuple[tuple[str, str], ...]:
    if not isinstance(value, dict) or not value:
        raise problem("must be a non-empty mapping of node label: value (e.g. {triscope.io/remediation: allowed})")
    return tuple(sorted(str_map(value, _LABEL_KEY, "label key", _label_value).items()))


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
    verdict_events: bool = True     # Events on the pod and node when a verdict would page (verdict_events.py)
    node_condition: bool = True     # the AcceleratorCoordinationDegraded node condition (node_condition.py)


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
    workload_ttl_s: float = 600.0                          # how long a pod's resolved owner is trusted

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


# the file: settings ------------------------------------------------------------------------------
class BreakerModel(ConfigModel):
    window: Duration = 900.0
    max_targets: Annotated[int, Field(ge=1)] = 5
    max_percent: Annotated[float, Field(ge=1.0, le=100.0)] = 50.0
    min_population: Annotated[int, Field(ge=1)] = 4


class KubernetesModel(ConfigModel):
    mode: Literal["none", "kubeconfig", "in-cluster", "url"] = "none"
    kubeconfig: Text | None = None
    context: Text | None = None
    url: Text | None = None
    token_file: Text | None = None
    ca_file: Text | None = None
    verify_ssl: bool = True
    events: bool = True
    events_namespace: Text = "default"
    verdict_events: bool = True
    node_condition: bool = True

    @model_validator(mode="after")
    def _url_given(self) -> KubernetesModel:
        if self.mode == "url" and not self.url:
            raise problem("mode url needs url: https://HOST:PORT")
        return self


class LeaderElectionModel(ConfigModel):
    enabled: bool = False
    namespace: Text = "default"
    lease: Text = "triscope-remediation"
    lease_duration: Duration = 15.0
    renew_every: Duration = 5.0

    @model_validator(mode="after")
    def _renew_first(self) -> LeaderElectionModel:
        if self.renew_every >= self.lease_duration:
            raise problem("renew_every must be shorter than lease_duration")
        return self


class SettingsModel(ConfigModel):
    dry_run: bool = False
    namespaces: list[KubeName] = Field(default_factory=list)
    max_actions_per_hour: Annotated[int, Field(ge=1)] = 30
    max_in_flight: Annotated[int, Field(ge=1)] = 4
    breaker: BreakerModel = BreakerModel()
    evaluate_interval: Duration = 15.0
    dedupe_retention: Duration = 7 * 86400.0
    engine_id: Text | None = None
    kubernetes: KubernetesModel = KubernetesModel()
    leader_election: LeaderElectionModel = LeaderElectionModel()
    workers: Annotated[int, Field(ge=1, le=64)] = 8
    slo_file: Text | None = None
    node_names: Annotated[list[Annotated[str, AfterValidator(_node_pattern)]], Field(min_length=1)] | None = None
    node_selector: Annotated[tuple[tuple[str, str], ...], PlainValidator(_node_selector)] = ()
    workload_ttl: Annotated[Duration, AfterValidator(_positive_duration)] = 600.0

    @model_validator(mode="after")
    def _leader_needs_api(self) -> SettingsModel:
        if self.leader_election.enabled and self.kubernetes.mode == "none":
            raise problem("leader election needs a Kubernetes API (settings.kubernetes.mode)", "leader_election",
                          "enabled")
        return self

    def to_settings(self, slo_file: str) -> Settings:
        b, k, le = self.breaker, self.kubernetes, self.leader_election
        return Settings(
            dry_run=self.dry_run, namespaces=tuple(self.namespaces), max_actions_per_hour=self.max_actions_per_hour,
            max_in_flight=self.max_in_flight,
            breaker=BreakerSettings(b.window, b.max_targets, b.max_percent, b.min_population),
            evaluate_interval_s=max(0.2, self.evaluate_interval), dedupe_retention_s=self.dedupe_retention,
            engine_id=self.engine_id or f"{socket.gethostname()}-{os.getpid()}",
            kubernetes=KubeSettings(k.mode, k.kubeconfig, k.context, k.url, k.token_file, k.ca_file, k.verify_ssl,
                                    k.events, k.events_namespace, k.verdict_events, k.node_condition),
            leader_election=LeaderSettings(le.enabled, le.namespace, le.lease, le.lease_duration, le.renew_every),
            workers=self.workers, slo_file=slo_file, node_names=tuple(self.node_names or ()),
            node_selector=self.node_selector, workload_ttl_s=self.workload_ttl)
