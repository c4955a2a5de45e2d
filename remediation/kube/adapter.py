"""The Kubernetes adapter: the only module of triscope that imports ``kubernetes``.

A small set of verbs (``restart_deployment``, ``rollout_status``, ``cordon``, ``uncordon``,
``evict``, ``set_preferred_node``, ``set_configmap_keys``, ``post_event``, leases, DRA's
``resource_slices`` and ``DeviceTaintRule``s, a node condition) over the official client.  Callers
never see ``ApiException`` or urllib3 errors (``kube.errors``), nor the client's untyped JSON: objects
read come back as typed views and verbs answer typed results (``kube.views``).  Writes that depend on
what was read carry the ``resourceVersion`` they read, so a concurrent change answers 409 and the
verb re-reads and tries again (``errors.retry_on_conflict``, the one loop for all of them).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from triscope.core.timeparse import format_rfc3339
from triscope.remediation import dra
from triscope.remediation.kube.errors import (
    AlreadyExists,
    DegradedDeployment,
    EvictionBlocked,
    Forbidden,
    NotConfigured,
    NotFound,
    NotOurCordon,
    PausedDeployment,
    RolloutTimeout,
    TooManyRequests,
    Unavailable,
    from_api_exception,
    retry_on_conflict,
)
from triscope.remediation.kube.views import (
    CORDONED_AT,
    CORDONED_BY,
    RESTARTED_AT,
    ConfigMap,
    ConfigMapWrite,
    CordonResult,
    Deployment,
    EvictionResult,
    Node,
    NodeConditionWrite,
    PreferredNode,
    RestartResult,
    RolloutStatus,
    RuleWrite,
)

log = logging.getLogger("triscope.remediation.kube")   # one log for the Kubernetes adapter's parts

HOSTNAME_LABEL = "kubernetes.io/hostname"
SMP = "application/strategic-merge-patch+json"


def _now_rfc3339() -> str:
    return format_rfc3339(time.time())


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

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._api.close()

    # plumbing --------------------------------------------------------------------------------------
    def _call(self, fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
        from kubernetes.client.exceptions import ApiException  # lazy: see __init__

        try:
            resp = fn(*args, _preload_content=False, _request_timeout=self.timeout, **kw)
        except ApiException as e:
            err = from_api_exception(e)
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
