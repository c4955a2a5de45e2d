"""The Kubernetes adapter: the only module of triscope that imports ``kubernetes``.

A small set of verbs (``restart_deployment``, ``rollout_status``, ``cordon``, ``uncordon``,
``evict``, ``set_preferred_node``, ``set_configmap_keys``, ``post_event``, ``pod_owner``, leases, DRA's
``resource_slices`` and ``DeviceTaintRule``s, a node condition) over
the official client, and the project's own error types so callers never see ``ApiException`` or
urllib3 errors.  The client's untyped JSON stays in this module: objects read come back as typed
views (``Deployment``, ``Node``, ``ConfigMap``) and verbs answer typed results (``TypedDict``s, so
an action can put them in its audit response as they are).  Writes that depend on what was read
carry the ``resourceVersion`` they read, so a concurrent change answers 409 and the verb re-reads
and tries again (:func:`retry_on_conflict`, the one loop for all of them).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NotRequired, TypedDict, TypeVar

from triscope.core.timeparse import format_rfc3339
from triscope.remediation import dra

log = logging.getLogger(__name__)

RESTARTED_AT = "kubectl.kubernetes.io/restartedAt"  # what `kubectl rollout restart` sets
CORDONED_BY = "triscope.io/cordoned-by"
CORDONED_AT = "triscope.io/cordoned-at"
HOSTNAME_LABEL = "kubernetes.io/hostname"
CONTROL_PLANE_KEYS = ("node-role.kubernetes.io/control-plane", "node-role.kubernetes.io/master")
BLOCKING_EFFECTS = ("NoSchedule", "NoExecute")
SMP = "application/strategic-merge-patch+json"
MERGE = "application/merge-patch+json"


class KubeError(Exception):
    """A Kubernetes API call failed; ``status`` is the HTTP status (0: no answer)."""

    def __init__(self, message: str, status: int = 0, reason: str = "", body: object = None) -> None:
        super().__init__(message)
        self.status, self.reason, self.body = status, reason, body

    def answer(self) -> ErrorAnswer:
        return {"status": self.status, "reason": self.reason, "message": str(self)}


class NotFound(KubeError):
    pass


class Conflict(KubeError):
    pass


class AlreadyExists(KubeError):
    pass


class Unauthorized(KubeError):
    pass


class Forbidden(Unauthorized):
    """403: the API server's authorizer (RBAC) refused the call.

    ``verb``, ``resource`` (``pods/eviction``), ``group`` and ``namespace`` ("" at the cluster scope)
    are those of the refused request, read from the server's message; ``str()`` is one line naming
    them, what the shipped RBAC grants on that resource and what to add."""

    def __init__(self, message: str, status: int = 403, reason: str = "Forbidden", body: object = None, *,
                 verb: str = "", resource: str = "", group: str = "", namespace: str = "", user: str = "") -> None:
        super().__init__(message, status, reason, body)
        self.verb, self.resource, self.group, self.namespace, self.user = verb, resource, group, namespace, user


class TooManyRequests(KubeError):
    pass


class Unavailable(KubeError):
    """No answer from the API server (refused, timed out, TLS...)."""


class NotConfigured(KubeError):
    """No Kubernetes API configured for this engine."""


class PausedDeployment(KubeError):
    pass


class DegradedDeployment(KubeError):
    """The workload is already below its desired available replicas: a restart would deepen the outage."""


class RolloutTimeout(KubeError):
    """The rollout was not complete in time; ``rollout``: where it stood."""

    def __init__(self, message: str, rollout: RolloutStatus) -> None:
        super().__init__(message, body=rollout)
        self.rollout = rollout


class EvictionBlocked(KubeError):
    """Eviction kept answering 429 (a PodDisruptionBudget) until the timeout."""


class NotOurCordon(KubeError):
    """The node was cordoned by someone else: triscope leaves it alone."""


def _now_rfc3339() -> str:
    return format_rfc3339(time.time())


T = TypeVar("T")


def retry_on_conflict(attempt: Callable[[], T], what: str, *, tries: int = 5,
                      also: tuple[type[KubeError], ...] = ()) -> T:
    """``attempt`` (a read-modify-write carrying the ``resourceVersion`` it read) again while it
    raises ``Conflict`` (409: the object changed between the read and the write) or one of ``also``,
    at most ``tries`` times; then ``Conflict`` saying ``what`` kept changing."""
    again: tuple[type[KubeError], ...] = (Conflict, *also)
    for _ in range(tries):
        try:
            return attempt()
        except again:
            continue
    raise Conflict(f"{what} kept changing (409 {tries} times)", status=409)


# typed results: what the verbs answer (JSON-able as they are, for the audit row's response) -------------
class ErrorAnswer(TypedDict):
    status: int
    reason: str
    message: str


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


# RBAC: what the shipped manifests grant the engine, to say what is missing when the API refuses ----------
RBAC_FILE = "deploy/kustomize/base/engine-rbac.yaml"
_WORKLOADS = "ClusterRole triscope-engine-workloads, bound per namespace by deploy/kustomize/targets"
_NODES = "ClusterRole triscope-engine-nodes, bound cluster-wide"
_LEADER = "Role triscope-engine-leader in the engine's namespace"
# (apiGroup, resource) -> [(verbs, where)]: the engine's RBAC as shipped (tests/integration/test_deploy_manifests.py
# checks this table against the rendered manifests, so it cannot drift from them)
SHIPPED_GRANTS: dict[tuple[str, str], list[tuple[tuple[str, ...], str]]] = {
    ("apps", "deployments"): [(("get", "patch"), _WORKLOADS)],
    ("apps", "replicasets"): [(("get",), _WORKLOADS)],
    ("", "pods"): [(("get", "list"), _WORKLOADS)],
    ("", "pods/eviction"): [(("create",), _WORKLOADS)],
    ("", "configmaps"): [(("get", "create", "update"), _WORKLOADS)],
    ("", "events"): [(("create",), _WORKLOADS), (("create",), _LEADER)],
    ("", "nodes"): [(("get", "list", "update"), _NODES)],
    ("", "nodes/status"): [(("patch",), _NODES)],
    ("resource.k8s.io", "resourceslices"): [(("list",), _NODES)],
    ("resource.k8s.io", "devicetaintrules"): [(("get", "list", "create", "delete"), _NODES)],
    ("coordination.k8s.io", "leases"): [(("create",), _LEADER),
                                        (("get", "update"), _LEADER + " (the Lease triscope-remediation only)")],
}
_FORBIDDEN = re.compile(r'User "(?P<user>[^"]*)" cannot (?P<verb>\S+) resource "(?P<res>[^"]*)" in API group '
                        r'"(?P<group>[^"]*)"(?: in the namespace "(?P<ns>[^"]*)"| at the cluster scope)')


def forbidden_explained(message: str, body: object = None) -> Forbidden:
    """A 403 as one line: the refused verb and resource, where, for whom, what the shipped RBAC grants
    on that resource, and what to add."""
    m = _FORBIDDEN.search(message or "")
    if m is None:
        return Forbidden(f"Kubernetes refused the call (403 Forbidden): {message}", body=body)
    verb, res, group, ns, user = m["verb"], m["res"], m["group"], m["ns"] or "", m["user"]
    gr = f"{res}.{group}" if group else res
    where = f"in namespace {ns}" if ns else "at the cluster scope"
    grants = SHIPPED_GRANTS.get((group, res), [])
    granted = [w for verbs, w in grants if verb in verbs]
    said = " and ".join(f"{', '.join(verbs)} on {gr} ({w})" for verbs, w in grants) or f"nothing on {gr}"
    # the engine's own namespace (its ServiceAccount's): there the leader Role grants, never the
    # workloads' role (binding that one there would hand the engine its own namespace's pods)
    own_ns = user.split(":")[2] if user.startswith("system:serviceaccount:") and user.count(":") >= 3 else ""
    leader = any(w.startswith(_LEADER) for w in granted)
    if not granted:
        todo = (f"add {verb} on {gr} to the engine's role in {RBAC_FILE}: the engine calls it and the shipped "
                "RBAC does not grant it")
    elif leader and ns and ns == own_ns:
        todo = (f"re-apply {RBAC_FILE}: Role triscope-engine-leader and its RoleBinding in namespace {ns} (the "
                "engine's own) grant this; do not bind triscope-engine-workloads there")
    elif any(w == _WORKLOADS for w in granted) and ns:
        todo = (f"add a RoleBinding of triscope-engine-workloads in namespace {ns} (copy "
                "deploy/kustomize/targets/rolebinding-inference.yaml and list it in that kustomization), or "
                f"remove {ns} from the policy's namespaces; if it is bound there, re-apply {RBAC_FILE}")
    elif leader:
        todo = (f"re-apply {RBAC_FILE}; the policy's leader_election.namespace and kubernetes.events_namespace "
                "must be the engine's own namespace, where that Role is bound")
    else:
        todo = f"re-apply {RBAC_FILE} (the cluster's copy of the role or its binding lacks it)"
    text = (f"Kubernetes refused {verb} on {gr} {where} for {user or 'the engine'}: the shipped RBAC "
            f"({RBAC_FILE}) grants {said}; {todo}")
    return Forbidden(text, body=body, verb=verb, resource=res, group=group, namespace=ns, user=user)


# nodes, taints, tolerations: what the scheduler would do ------------------------------------------
def node_labels(node: Mapping[str, Any]) -> dict[str, str]:
    return dict((node.get("metadata") or {}).get("labels") or {})


def node_taints(node: Mapping[str, Any]) -> list[dict[str, Any]]:
    return list((node.get("spec") or {}).get("taints") or [])


def is_control_plane(node: dict[str, Any]) -> bool:
    """A control-plane node (a Node's JSON): see :attr:`Node.control_plane`."""
    return Node.of(node).control_plane


def tolerates(tolerations: list[dict[str, Any]], taint: dict[str, Any]) -> bool:
    """Does one of ``tolerations`` tolerate ``taint`` (the rules of the Kubernetes scheduler)?"""
    t = Taint.of(taint)
    return any(Toleration.of(tol).tolerates(t) for tol in tolerations or [])


def controller_of(obj: dict[str, Any]) -> tuple[str, str] | None:
    """(kind, name) of the object's managing controller: the ownerReference with ``controller: true``
    (at most one, the API server enforces it), else the only ownerReference; None when it has none."""
    refs = [r for r in (obj.get("metadata") or {}).get("ownerReferences") or [] if r.get("kind") and r.get("name")]
    ctl = [r for r in refs if r.get("controller")]
    ref = ctl[0] if ctl else refs[0] if len(refs) == 1 else None
    return None if ref is None else (str(ref["kind"]), str(ref["name"]))


def _apply(into: dict[str, Any], changes: Mapping[str, str | None]) -> None:
    """Set each key of ``changes`` in ``into``; ``None`` removes it."""
    for k, v in changes.items():
        if v is None:
            into.pop(k, None)
        else:
            into[k] = v


class KubeAdapter:
    """Verbs over one API server.  Build it with :meth:`connect`."""

    def __init__(self, api_client: Any, *, describe: str = "") -> None:
        # lazy: the client costs ~0.2 s to import, and an engine without an API never needs it
        from kubernetes import client

        self._api = api_client
        self.core = client.CoreV1Api(api_client)
        self.apps = client.AppsV1Api(api_client)
        self.coord = client.CoordinationV1Api(api_client)
        self.describe = describe
        self.timeout = (3.0, 15.0)
        self._refused: dict[str, float] = {}     # each refusal's line, logged once a minute at most
        self._refused_lock = threading.Lock()
        self._dra: dict[str, str] | None = None  # resource.k8s.io resource -> version served (dra_versions)

    # construction ----------------------------------------------------------------------------------
    @classmethod
    def connect(cls, *, url: str | None = None, token: str | None = None, kubeconfig: str | None = None,
                context: str | None = None, in_cluster: bool = False, verify_ssl: bool = True,
                ca_file: str | None = None) -> KubeAdapter:
        """An adapter for ``url`` (+ bearer ``token``), a kubeconfig file, or the in-cluster service account."""
        from kubernetes import client, config  # lazy: see __init__

        cfg = client.Configuration()
        try:
            if url:
                cfg.host = url.rstrip("/")
                if token:
                    cfg.api_key = {"BearerToken": token}
                    cfg.api_key_prefix = {"BearerToken": "Bearer"}
                cfg.verify_ssl = verify_ssl
                if ca_file:
                    cfg.ssl_ca_cert = ca_file
                describe = cfg.host
            elif in_cluster:
                config.load_incluster_config(client_configuration=cfg)
                describe = "in-cluster"
            else:
                path = kubeconfig or os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")
                config.load_kube_config(config_file=path, context=context, client_configuration=cfg)
                describe = f"kubeconfig {path}"
        except Exception as e:  # noqa: BLE001 - ConfigException, FileNotFoundError, yaml errors: one NotConfigured line
            raise NotConfigured(f"cannot load Kubernetes configuration: {e}") from None
        cfg.retries = 1
        return cls(client.ApiClient(cfg), describe=describe)

    @classmethod
    def from_settings(cls, ks: Any) -> KubeAdapter | None:
        """The adapter a policy's ``settings.kubernetes`` asks for (None for mode ``none``)."""
        if ks.mode == "none":
            return None
        token = None
        if ks.token_file:
            try:
                with open(ks.token_file) as f:
                    token = f.read().strip()
            except OSError as e:
                raise NotConfigured(f"cannot read the Kubernetes token file {ks.token_file}: {e}") from None
        return cls.connect(url=ks.url if ks.mode == "url" else None, token=token,
                           kubeconfig=ks.kubeconfig if ks.mode == "kubeconfig" else None, context=ks.context,
                           in_cluster=ks.mode == "in-cluster", verify_ssl=ks.verify_ssl, ca_file=ks.ca_file)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._api.close()

    # plumbing --------------------------------------------------------------------------------------
    def _call(self, fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
        from kubernetes.client.exceptions import ApiException  # lazy: see __init__

        try:
            resp = fn(*args, _preload_content=False, _request_timeout=self.timeout, **kw)
        except ApiException as e:
            err = self._translate(e)
            if isinstance(err, Forbidden):
                self._log_refusal(err)
            raise err from None
        except Exception as e:  # noqa: BLE001 - urllib3 MaxRetryError, timeouts, refused connections: Unavailable
            raise Unavailable(f"Kubernetes API {self.describe} unreachable: {type(e).__name__}: {e}") from None
        data = resp.data
        return json.loads(data) if data else {}

    def _log_refusal(self, err: Forbidden) -> None:
        """One line per refused (verb, resource, namespace), not a traceback; repeated at most once a minute."""
        now = time.monotonic()
        line = str(err)
        with self._refused_lock:
            if now - self._refused.get(line, -1e9) < 60.0:
                return
            self._refused[line] = now
        log.error("remediation: %s", line)

    @staticmethod
    def _translate(e: Any) -> KubeError:
        body: Any = None
        message = str(e.reason or "")
        reason = ""
        try:
            body = json.loads(e.body) if e.body else None
            if isinstance(body, dict):
                message = body.get("message") or message
                reason = body.get("reason") or ""
        except (ValueError, TypeError):
            body = e.body
        status = int(e.status or 0)
        if status == 403:
            return forbidden_explained(message, body)
        cls: type[KubeError] = {404: NotFound, 401: Unauthorized, 403: Unauthorized, 429: TooManyRequests}.get(
            status, KubeError)
        if status == 409:
            cls = AlreadyExists if reason == "AlreadyExists" else Conflict
        return cls(f"{status} {reason or e.reason}: {message}", status=status, reason=reason, body=body)

    # deployments -----------------------------------------------------------------------------------
    def get_deployment(self, namespace: str, name: str) -> Deployment:
        return Deployment.of(self._call(self.apps.read_namespaced_deployment, name, namespace))

    def restart_deployment(self, namespace: str, name: str, *, stamp: str | None = None,
                           allow_degraded: bool = False) -> RestartResult:
        """``kubectl rollout restart``: stamp the pod template's ``restartedAt`` annotation.

        Re-reads the live object first and refuses a paused Deployment or one already below its
        desired available replicas.  The patch carries the ``resourceVersion`` that was checked, so
        a change in between answers 409 and the check runs again.  ``stamp`` (default: now) is the
        value written; a template that already carries it was restarted by this same decision (an
        engine that crashed after the patch and re-runs it): nothing is written again
        (``"already": True``), so the same decision never starts a second rollout.
        """
        def attempt() -> RestartResult:
            dep = self.get_deployment(namespace, name)
            h = dep.health
            if stamp is not None and dep.restarted_at == stamp:
                return {"restartedAt": stamp, "already": True, "generation": h["generation"],
                        "resourceVersion": dep.resource_version}
            if h["paused"]:
                raise PausedDeployment(f"deployment {namespace}/{name} is paused: not restarting it")
            if not allow_degraded and h["available"] < h["desired"]:
                raise DegradedDeployment(
                    f"deployment {namespace}/{name} has {h['available']}/{h['desired']} available replicas: "
                    "not restarting a workload that is already degraded")
            value = stamp or _now_rfc3339()
            patch = {"metadata": {"resourceVersion": dep.resource_version},
                     "spec": {"template": {"metadata": {"annotations": {RESTARTED_AT: value}}}}}
            out = self._call(self.apps.patch_namespaced_deployment, name, namespace, patch, _content_type=SMP)
            meta = out.get("metadata", {})
            return {"restartedAt": value, "generation": meta.get("generation"),
                    "resourceVersion": meta.get("resourceVersion")}

        return retry_on_conflict(attempt, f"deployment {namespace}/{name} (restarting it)", tries=3)

    def rollout_status(self, namespace: str, name: str, *, generation: int | None = None, timeout: float = 300.0,
                       poll: float = 0.5, stop: Callable[[], bool] | None = None) -> RolloutStatus:
        """Follow a rollout the way ``kubectl rollout status`` does, until complete or ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            dep = self.get_deployment(namespace, name)
            h = dep.health
            gen = generation or h["generation"]
            complete = (h["observed_generation"] >= gen and h["updated"] >= h["desired"] and dep.replicas <= h["updated"]
                        and h["available"] >= h["updated"])
            status: RolloutStatus = {**h, "complete": complete}
            if complete:
                return status
            if time.monotonic() >= deadline or (stop and stop()):
                raise RolloutTimeout(f"rollout of {namespace}/{name} not complete after {timeout:g}s "
                                     f"({h['updated']}/{h['desired']} updated, {h['available']} available)", status)
            time.sleep(poll)

    def set_preferred_node(self, namespace: str, name: str, node: str, weight: int = 100) -> PreferredNode:
        """Steer new pods of a Deployment toward ``node`` with a preferred node affinity (keeps other terms).
        A read-modify-write: the Deployment changing in between (its status, a scale) is read again."""

        def attempt() -> PreferredNode:
            dep = self._call(self.apps.read_namespaced_deployment, name, namespace)
            aff = dep.get("spec", {}).get("template", {}).get("spec", {}).get("affinity") or {}
            terms = [t for t in (aff.get("nodeAffinity", {}) or {}).get("preferredDuringSchedulingIgnoredDuringExecution", [])
                     or [] if not any(e.get("key") == HOSTNAME_LABEL
                                      for e in t.get("preference", {}).get("matchExpressions", []) or [])]
            terms.append({"weight": int(weight), "preference": {"matchExpressions": [
                {"key": HOSTNAME_LABEL, "operator": "In", "values": [node]}]}})
            patch = {"metadata": {"resourceVersion": dep["metadata"]["resourceVersion"]},
                     "spec": {"template": {"spec": {"affinity": {"nodeAffinity": {
                         "preferredDuringSchedulingIgnoredDuringExecution": terms}}}}}}
            out = self._call(self.apps.patch_namespaced_deployment, name, namespace, patch, _content_type=SMP)
            return {"preferred_node": node, "weight": weight, "generation": out.get("metadata", {}).get("generation")}

        return retry_on_conflict(attempt, f"deployment {namespace}/{name} (steering it to {node})")

    # pods and their owners ---------------------------------------------------------------------------
    def get_pod(self, namespace: str, name: str) -> dict[str, Any]:
        return self._call(self.core.read_namespaced_pod, name, namespace)

    def get_replicaset(self, namespace: str, name: str) -> dict[str, Any]:
        return self._call(self.apps.read_namespaced_replica_set, name, namespace)

    def pod_owner(self, namespace: str, pod: str) -> tuple[str, str]:
        """The workload owning ``pod`` as (kind, name), through ownerReferences, as the controllers set them.

        Pod -> ReplicaSet -> Deployment (a ReplicaSet nobody owns is the workload itself);
        ``StatefulSet``, ``DaemonSet``, ``Job`` (and any other controller kind) from the pod's own
        controller reference; a pod with no owner is ``("Pod", name)``.  Reads the pod and, for a
        ReplicaSet owner, the ReplicaSet (RBAC: ``get`` on pods and replicasets).  Raises
        ``NotFound`` when the pod does not exist.
        """
        owner = controller_of(self.get_pod(namespace, pod))
        if owner is None:
            return "Pod", pod
        kind, name = owner
        if kind == "ReplicaSet":
            try:
                rs_owner = controller_of(self.get_replicaset(namespace, name))
            except NotFound:   # the ReplicaSet went (a rollout finished) while its pod lingers
                return kind, name
            if rs_owner is not None and rs_owner[0] == "Deployment":
                return rs_owner
        return kind, name

    def pod_names(self, namespace: str, *, label_selector: str | None = None, node: str | None = None) -> list[str]:
        """The names of the pods of ``namespace`` (matching ``label_selector``, on ``node``)."""
        kw: dict[str, Any] = {}
        if label_selector:
            kw["label_selector"] = label_selector
        if node:
            kw["field_selector"] = f"spec.nodeName={node}"
        items = self._call(self.core.list_namespaced_pod, namespace, **kw).get("items", [])
        return [str(p["metadata"]["name"]) for p in items]

    def evict(self, namespace: str, pod: str, *, timeout: float = 60.0, backoff: float = 0.5,
              max_backoff: float = 5.0) -> EvictionResult:
        """Evict through the Eviction API; a 429 (PodDisruptionBudget) backs off and retries until ``timeout``.

        Never deletes a pod directly.  A pod already gone counts as evicted.
        """
        from kubernetes import client  # lazy: see __init__

        body = client.V1Eviction(api_version="policy/v1", kind="Eviction",
                                 metadata=client.V1ObjectMeta(name=pod, namespace=namespace))
        deadline = time.monotonic() + timeout
        attempts, delay = 0, backoff
        while True:
            attempts += 1
            try:
                self._call(self.core.create_namespaced_pod_eviction, pod, namespace, body)
                return {"pod": pod, "evicted": True, "attempts": attempts}
            except NotFound:
                return {"pod": pod, "evicted": True, "attempts": attempts, "note": "already gone"}
            except TooManyRequests as e:
                if time.monotonic() + delay > deadline:
                    raise EvictionBlocked(f"eviction of {namespace}/{pod} blocked by a disruption budget for "
                                          f"{timeout:g}s ({attempts} attempts): {e}", status=429,
                                          reason="TooManyRequests", body=e.body) from None
                time.sleep(delay)
                delay = min(max_backoff, delay * 2)

    # nodes -----------------------------------------------------------------------------------------
    def _node(self, name: str) -> dict[str, Any]:
        return self._call(self.core.read_node, name)

    def get_node(self, name: str) -> Node:
        return Node.of(self._node(name))

    def list_nodes(self) -> list[Node]:
        return [Node.of(n) for n in self._call(self.core.list_node).get("items", [])]

    def cordon(self, name: str, *, by: str) -> CordonResult:
        """Mark a node unschedulable, annotated as cordoned by ``by``.

        A node someone else already cordoned is left as it is (``cordoned_by_other``).
        """
        def attempt() -> CordonResult:
            node = self._node(name)
            ann = node.get("metadata", {}).get("annotations") or {}
            if node.get("spec", {}).get("unschedulable"):
                return {"node": name, "result": "already_ours" if ann.get(CORDONED_BY) == by else "cordoned_by_other",
                        "cordoned_by": ann.get(CORDONED_BY)}
            node.setdefault("spec", {})["unschedulable"] = True
            node["metadata"]["annotations"] = {**ann, CORDONED_BY: by, CORDONED_AT: _now_rfc3339()}
            self._call(self.core.replace_node, name, node)
            return {"node": name, "result": "cordoned"}

        return retry_on_conflict(attempt, f"node {name} (cordoning it)")

    def uncordon(self, name: str, *, by: str) -> CordonResult:
        """Undo our own cordon; never uncordons a node cordoned by someone else."""
        def attempt() -> CordonResult:
            node = self._node(name)
            ann = dict(node.get("metadata", {}).get("annotations") or {})
            if not node.get("spec", {}).get("unschedulable"):
                return {"node": name, "result": "not_cordoned"}
            if ann.get(CORDONED_BY) != by:
                raise NotOurCordon(f"node {name} was cordoned by {ann.get(CORDONED_BY) or 'someone else'}, "
                                   "not by triscope: leaving it cordoned")
            node["spec"]["unschedulable"] = False
            ann.pop(CORDONED_BY, None)
            ann.pop(CORDONED_AT, None)
            node["metadata"]["annotations"] = ann
            self._call(self.core.replace_node, name, node)
            return {"node": name, "result": "uncordoned"}

        return retry_on_conflict(attempt, f"node {name} (uncordoning it)")

    def set_node_condition(self, name: str, type_: str, status: str, reason: str, message: str) -> NodeConditionWrite:
        """Set a condition of the node's ``status.conditions``, Node Problem Detector style: a strategic
        merge patch of ``nodes/status`` (conditions merge by ``type``: the others are left as they are).
        ``lastTransitionTime`` moves only when ``status`` changes; nothing is written when status, reason
        and message are already those (RBAC: ``get`` on nodes, ``patch`` on ``nodes/status``)."""
        cur = self.get_node(name).conditions.get(type_)
        if cur is not None and (cur.get("status"), cur.get("reason"), cur.get("message")) == (status, reason, message):
            return {"node": name, "type": type_, "status": status, "reason": reason, "changed": False}
        now = _now_rfc3339()
        moved = cur is None or cur.get("status") != status
        cond = {"type": type_, "status": status, "reason": reason, "message": message[:1024],
                "lastHeartbeatTime": now,
                "lastTransitionTime": now if moved else (cur or {}).get("lastTransitionTime") or now}
        self._call(self.core.patch_node_status, name, {"status": {"conditions": [cond]}}, _content_type=SMP)
        return {"node": name, "type": type_, "status": status, "reason": reason, "changed": True}

    # DRA: ResourceSlices and DeviceTaintRules (resource.k8s.io) --------------------------------------
    def _resource_api(self, version: str) -> Any:
        from kubernetes import client  # lazy: see __init__

        return client.ResourceV1Api(self._api) if version == "v1" else client.ResourceV1beta2Api(self._api)

    def dra_versions(self) -> dict[str, str]:
        """{resource: version}: the ``resource.k8s.io`` version (``dra.VERSIONS``, preferred first) that
        serves ``resourceslices`` and ``devicetaintrules``, from API discovery (open to every
        authenticated user); a resource no version serves is missing.  Asked once per adapter."""
        with self._refused_lock:
            known = self._dra
        if known is not None:
            return known
        found: dict[str, str] = {}
        for version in dra.VERSIONS:
            try:
                listed = self._call(self._resource_api(version).get_api_resources)
            except NotFound:
                continue
            for r in listed.get("resources") or []:
                if r.get("name") in ("resourceslices", "devicetaintrules"):
                    found.setdefault(str(r["name"]), version)
        with self._refused_lock:
            self._dra = found
        return found

    def resource_slices(self, node: str) -> list[dict[str, Any]]:
        """The ``ResourceSlice``s of ``node`` (field selector ``spec.nodeName``); [] where DRA is not served."""
        version = self.dra_versions().get("resourceslices")
        if version is None:
            return []
        api = self._resource_api(version)
        return list(self._call(api.list_resource_slice, field_selector=f"spec.nodeName={node}").get("items") or [])

    def _rules_api(self) -> tuple[Any, str]:
        version = self.dra_versions().get("devicetaintrules")
        if version is None:
            raise NotFound("this API server serves no DeviceTaintRule (resource.k8s.io v1 from Kubernetes 1.37, "
                           "v1beta2 in 1.36 with the DRADeviceTaintRules feature gate)", status=404,
                           reason="NotFound")
        return self._resource_api(version), version

    def create_device_taint_rule(self, body: dict[str, Any]) -> RuleWrite:
        """Create the rule ``body`` (``dra.rule_body``); a rule of that name already there (409) is read:
        the engine's own (its labels) is adopted as it is, anyone else's is left alone (``not_ours``)."""
        api, version = self._rules_api()
        body = {**body, "apiVersion": f"{dra.GROUP}/{version}"}
        name = body["metadata"]["name"]
        try:
            self._call(api.create_device_taint_rule, body)
            return {"name": name, "result": "created", "effect": body["spec"]["taint"]["effect"],
                    "api_version": version}
        except AlreadyExists:
            found = self.get_device_taint_rule(name)
            return {"name": name, "result": "adopted" if found.ours else "not_ours", "effect": found.effect,
                    "api_version": version}

    def get_device_taint_rule(self, name: str) -> dra.TaintRule:
        api, _ = self._rules_api()
        return dra.TaintRule.of(self._call(api.read_device_taint_rule, name))

    def device_taint_rules(self) -> list[dra.TaintRule]:
        """The rules the engine wrote (listed by its labels); [] where DeviceTaintRules are not served."""
        if "devicetaintrules" not in self.dra_versions():
            return []
        api, _ = self._rules_api()
        items = self._call(api.list_device_taint_rule, label_selector=dra.RULE_SELECTOR).get("items") or []
        return [dra.TaintRule.of(r) for r in items]

    def delete_device_taint_rule(self, name: str, uid: str = "") -> bool:
        """Delete the rule (with ``uid`` as a precondition: never a rule re-created by someone else since it
        was read); False when it was already gone."""
        from kubernetes import client  # lazy: see __init__

        api, _ = self._rules_api()
        opts = client.V1DeleteOptions(preconditions=client.V1Preconditions(uid=uid)) if uid else None
        try:
            self._call(api.delete_device_taint_rule, name, body=opts)
        except NotFound:
            return False
        return True

    # configmaps ------------------------------------------------------------------------------------
    def get_configmap(self, namespace: str, name: str) -> ConfigMap:
        return ConfigMap.of(self._call(self.core.read_namespaced_config_map, name, namespace))

    def set_configmap_keys(self, namespace: str, name: str, data: dict[str, str | None],
                           annotations: dict[str, str | None] | None = None, *, create: bool = True,
                           previous_annotation: str | None = None) -> ConfigMapWrite:
        """Set (or with ``None`` remove) keys of a ConfigMap; read-modify-replace with resourceVersion, retried on 409.

        Returns ``previous`` (the old values of those keys) and the new ``resourceVersion``.  With
        ``previous_annotation``, the old values (JSON) are also written to that annotation, from the
        same read as the write, so whoever finds the change later knows what to restore.  A ConfigMap
        that does not exist is created (``create``); one created meanwhile by someone else is read again.
        """
        def attempt() -> ConfigMapWrite:
            try:
                cm = self._call(self.core.read_namespaced_config_map, name, namespace)
            except NotFound:
                if not create:
                    raise
                return self._create_configmap(namespace, name, data, annotations, previous_annotation)
            cur = dict(cm.get("data") or {})
            previous = {k: cur.get(k) for k in data}
            _apply(cur, data)
            ann = dict(cm.get("metadata", {}).get("annotations") or {})
            _apply(ann, annotations or {})
            if previous_annotation:
                ann[previous_annotation] = json.dumps(previous, sort_keys=True)
            cm["data"] = cur
            cm["metadata"]["annotations"] = ann
            out = self._call(self.core.replace_namespaced_config_map, name, namespace, cm)
            return {"previous": previous, "resourceVersion": out["metadata"]["resourceVersion"], "created": False}

        return retry_on_conflict(attempt, f"configmap {namespace}/{name} (updating it)", tries=8,
                                 also=(AlreadyExists,))

    def _create_configmap(self, namespace: str, name: str, data: dict[str, str | None],
                          annotations: dict[str, str | None] | None, previous_annotation: str | None) -> ConfigMapWrite:
        ann0 = {k: v for k, v in (annotations or {}).items() if v is not None}
        if previous_annotation:
            ann0[previous_annotation] = json.dumps({k: None for k in data}, sort_keys=True)
        body = {"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": name, "namespace": namespace, "annotations": ann0},
                "data": {k: v for k, v in data.items() if v is not None}}
        out = self._call(self.core.create_namespaced_config_map, namespace, body)
        return {"previous": {k: None for k in data}, "resourceVersion": out["metadata"]["resourceVersion"],
                "created": True}

    # events ----------------------------------------------------------------------------------------
    def post_event(self, namespace: str, involved: dict[str, str], *, reason: str, message: str,
                   type_: str = "Normal", component: str = "triscope-remediation") -> None:
        """A core/v1 Event about ``involved`` (kind, name, namespace, apiVersion)."""
        now = _now_rfc3339()
        body = {"apiVersion": "v1", "kind": "Event",
                "metadata": {"generateName": f"{involved.get('name', 'triscope')}.", "namespace": namespace},
                "involvedObject": involved, "reason": reason, "message": message[:1024], "type": type_,
                "source": {"component": component}, "reportingComponent": component,
                "reportingInstance": os.uname().nodename, "firstTimestamp": now, "lastTimestamp": now, "count": 1}
        self._call(self.core.create_namespaced_event, namespace, body)

    # leases ----------------------------------------------------------------------------------------
    def get_lease(self, namespace: str, name: str) -> dict[str, Any]:
        return self._call(self.coord.read_namespaced_lease, name, namespace)

    def create_lease(self, namespace: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
        body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": name, "namespace": namespace}, "spec": spec}
        return self._call(self.coord.create_namespaced_lease, namespace, body)

    def replace_lease(self, namespace: str, name: str, lease: dict[str, Any]) -> dict[str, Any]:
        return self._call(self.coord.replace_namespaced_lease, name, namespace, lease)

    @staticmethod
    def micro_time() -> str:
        return format_rfc3339(time.time(), micro=True)
