"""A small Kubernetes API server for tests: the real REST protocol over HTTP, in-memory state.

No API server can be installed on the test machines, and nothing on PyPI serves the Kubernetes
REST API faithfully enough for the official ``kubernetes`` client (the candidates need a real
cluster).  This server speaks the same URLs, verbs, content types, ``Status`` error objects and
``resourceVersion`` rules as kube-apiserver for the resources the remediation engine touches:

* ``apps/v1`` deployments: get / list / create / replace (409 on a stale ``resourceVersion``) /
  patch with ``application/strategic-merge-patch+json``, ``merge-patch+json`` and
  ``json-patch+json`` (a JSON object sent as json-patch is refused with 400, as the real server
  does).  A tiny deployment controller: a pod-template change bumps ``metadata.generation`` and,
  after ``rollout_delay`` seconds, replaces the pods (scheduled on uncordoned nodes, honouring a
  preferred node affinity) and updates ``status`` (``observedGeneration``, ``updatedReplicas``,
  ``availableReplicas``...).  ``spec.paused`` stops it; ``stuck_rollouts`` makes rollouts hang.
* ``apps/v1`` replicasets: get / list.  As the real deployment controller does, each pod template
  of a Deployment gets a ReplicaSet ``NAME-HASH`` (``pod-template-hash`` label, an ownerReference
  to the Deployment with ``controller: true``) and its pods an ownerReference to that ReplicaSet;
  a rollout creates the new template's ReplicaSet and scales the old one to 0.
* ``v1`` pods: get / list (``labelSelector`` equality terms, ``fieldSelector=spec.nodeName=``) /
  create / delete (``add_pod``: a pod with any ownerReference, e.g. a StatefulSet's, or none), and the ``pods/eviction`` subresource (``policy/v1`` Eviction): a
  PodDisruptionBudget whose ``status.disruptionsAllowed`` is 0 answers 429 ``TooManyRequests``.
* ``policy/v1`` poddisruptionbudgets: get / list / create / replace.
* ``v1`` nodes: get / list / create / replace / patch (cordon = ``spec.unschedulable``), with
  labels and taints (``add_node(control_plane=True)``: kubeadm's control-plane label and taint); the
  controller places new pods only on uncordoned nodes whose NoSchedule / NoExecute taints the pod
  template tolerates.
* ``v1`` configmaps, ``coordination.k8s.io/v1`` leases, ``v1`` events: get / list / create (409
  AlreadyExists) / replace (409 Conflict) / patch / delete.
* ``resource.k8s.io`` (DRA): ``resourceslices`` (get / list with the ``spec.nodeName`` field selector /
  create / replace / delete) and cluster-scoped ``devicetaintrules`` (get / list by label / create /
  replace / delete with a ``uid`` precondition), served as ``v1`` (``kubernetes="1.37"``, the default)
  or, as in 1.36, ``devicetaintrules`` in ``v1beta2`` only (``kubernetes="1.36"``), or not at all
  (``kubernetes="1.33"``: a device-plugin cluster); their discovery documents (``/apis/resource.k8s.io/v1``).
  Every object written is validated against the published OpenAPI schema of that release
  (``kubernetes-validate``'s ``1.37.0`` / ``1.36.0``, strict) and the API server's own checks the
  schema cannot say (a taint's effect, key and value; one of ``nodeName`` / ``nodeSelector`` /
  ``allNodes`` / ``perDeviceNodeSelection``; a DNS-subdomain name): 422 ``Invalid`` otherwise.  A stand-in
  for kube-controller-manager's device taint eviction controller: pods registered as holding a device
  (``allocate``, what a ResourceClaim's allocation says) are deleted when a ``NoExecute`` rule selects
  it, and an ``effect: None`` rule's ``status.conditions`` says how many would be.
* ``v1`` ``nodes/status``: get / patch (strategic merge: conditions by ``type``).
* Bearer-token authentication (401 ``Unauthorized``) when a token is set; with ``users`` (token ->
  user name, e.g. ``system:serviceaccount:triscope:triscope-engine``) and ``rbac`` (a
  ``kube_rbac.Rbac`` of ClusterRoles / Roles / bindings, e.g. the shipped ones), every request is
  authorised as kube-apiserver's RBAC authorizer does and a denial answers its 403 ``Forbidden``
  ``Status`` (``tests/kube_rbac.py``).

Every request is logged in ``server.requests`` (method, path, query, content type, body) so tests
can assert what went over the wire.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
import random
import re
import socket
import string
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from kube_rbac import Rbac, forbidden, request_attributes

# resource -> (group/version, kind, namespaced)
RESOURCES: dict[str, tuple[str, str, bool]] = {
    "deployments": ("apps/v1", "Deployment", True),
    "replicasets": ("apps/v1", "ReplicaSet", True),
    "pods": ("v1", "Pod", True),
    "nodes": ("v1", "Node", False),
    "configmaps": ("v1", "ConfigMap", True),
    "events": ("v1", "Event", True),
    "namespaces": ("v1", "Namespace", False),
    "leases": ("coordination.k8s.io/v1", "Lease", True),
    "poddisruptionbudgets": ("policy/v1", "PodDisruptionBudget", True),
    "resourceslices": ("resource.k8s.io/v1", "ResourceSlice", False),
    "devicetaintrules": ("resource.k8s.io/v1", "DeviceTaintRule", False),
}
DRA = ("resourceslices", "devicetaintrules")
# the resource.k8s.io versions each release serves these two in (what discovery lists)
DRA_SERVED: dict[str, dict[str, tuple[str, ...]]] = {
    "1.37": {"resourceslices": ("v1", "v1beta2"), "devicetaintrules": ("v1", "v1beta2")},
    "1.36": {"resourceslices": ("v1", "v1beta2"), "devicetaintrules": ("v1beta2",)},
    "1.33": {},
}
SCHEMA_RELEASE = {"1.37": "1.37.0", "1.36": "1.36.0"}
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_NAME = re.compile(r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")

# lists merged by key in a strategic merge patch (subset of the Kubernetes patchMergeKey tags)
MERGE_KEYS = {
    "containers": "name", "initContainers": "name", "volumes": "name", "env": "name",
    "volumeMounts": "mountPath", "ports": "containerPort", "conditions": "type", "imagePullSecrets": "name",
    "taints": "key", "tolerations": "key",
}

_PATH = re.compile(
    r"^/(?:api/(?P<cv>v1)|apis/(?P<group>[^/]+)/(?P<gv>[^/]+))"
    r"(?:/namespaces/(?P<ns>[^/]+))?/(?P<res>[a-z]+)(?:/(?P<name>[^/]+))?(?:/(?P<sub>[a-z]+))?/?$"
)


class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details or {}

    def status(self) -> dict[str, Any]:
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": self.message, "reason": self.reason, "details": self.details, "code": self.code}


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def strategic_merge(original: Any, patch: Any, key: str | None = None) -> Any:
    """Apply a strategic merge patch (the subset real clients send: maps, null deletes, keyed lists)."""
    if isinstance(patch, dict) and isinstance(original, dict):
        if patch.get("$patch") == "replace":
            return {k: v for k, v in patch.items() if k != "$patch"}
        out = dict(original)
        for k, v in patch.items():
            if k.startswith("$"):
                continue
            if v is None:
                out.pop(k, None)
            elif k in out:
                out[k] = strategic_merge(out[k], v, k)
            else:
                out[k] = strategic_merge({}, v, k) if isinstance(v, dict) else copy.deepcopy(v)
        return out
    if isinstance(patch, list) and isinstance(original, list) and key in MERGE_KEYS:
        mk = MERGE_KEYS[key]
        out_list = [copy.deepcopy(x) for x in original]
        for item in patch:
            if not isinstance(item, dict) or mk not in item:
                out_list.append(copy.deepcopy(item))
                continue
            idx = next((i for i, x in enumerate(out_list) if isinstance(x, dict) and x.get(mk) == item[mk]), None)
            if item.get("$patch") == "delete":
                if idx is not None:
                    out_list.pop(idx)
            elif idx is None:
                out_list.append(copy.deepcopy(item))
            else:
                out_list[idx] = strategic_merge(out_list[idx], item, None)
        return out_list
    return copy.deepcopy(patch)


def merge_patch(original: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(original) if isinstance(original, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v)
    return out


def json_patch(doc: Any, ops: list[dict[str, Any]]) -> Any:
    """RFC 6902 JSON patch (add / replace / remove / test)."""
    doc = copy.deepcopy(doc)
    for op in ops:
        parts = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        parent = doc
        for p in parts[:-1]:
            parent = parent[int(p)] if isinstance(parent, list) else parent.setdefault(p, {})
        last = parts[-1]
        kind = op["op"]
        if kind == "test":
            cur = parent[int(last)] if isinstance(parent, list) else parent.get(last)
            if cur != op.get("value"):
                raise ApiError(422, "Invalid", f"test operation failed at {op['path']}")
        elif kind in ("add", "replace"):
            if isinstance(parent, list):
                if last == "-":
                    parent.append(op["value"])
                elif kind == "add":
                    parent.insert(int(last), op["value"])
                else:
                    parent[int(last)] = op["value"]
            else:
                if kind == "replace" and last not in parent:
                    raise ApiError(422, "Invalid", f"replace operation does not apply: doc is missing path: {op['path']}")
                parent[last] = op["value"]
        elif kind == "remove":
            if isinstance(parent, list):
                parent.pop(int(last))
            elif last in parent:
                del parent[last]
            else:
                raise ApiError(422, "Invalid", f"remove operation does not apply: doc is missing path: {op['path']}")
        else:
            raise ApiError(400, "BadRequest", f"unsupported JSON patch op {kind!r}")
    return doc


def _match_labels(selector: str, labels: dict[str, str]) -> bool:
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if "!=" in term:
            k, v = term.split("!=", 1)
            if labels.get(k.strip()) == v.strip():
                return False
        elif "=" in term:
            k, v = term.replace("==", "=").split("=", 1)
            if labels.get(k.strip()) != v.strip():
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


def _match_fields(selector: str, obj: dict[str, Any]) -> bool:
    for term in filter(None, (t.strip() for t in selector.split(","))):
        neg = "!=" in term
        k, v = term.split("!=" if neg else "=", 1)
        cur: Any = obj
        for p in k.replace("==", "").strip().split("."):
            cur = cur.get(p) if isinstance(cur, dict) else None
        if (str(cur or "") == v.strip().lstrip("=")) == neg:
            return False
    return True


def _tolerated(tolerations: list[dict[str, Any]], taint: dict[str, Any]) -> bool:
    """The scheduler's toleration rule (key / operator Equal|Exists / value / effect)."""
    for t in tolerations:
        if t.get("effect") and t["effect"] != taint.get("effect"):
            continue
        op = t.get("operator") or "Equal"
        if not t.get("key"):
            if op == "Exists":
                return True
            continue
        if t["key"] == taint.get("key") and (op == "Exists" or (t.get("value") or "") == (taint.get("value") or "")):
            return True
    return False


class _Objects(dict):  # type: ignore[type-arg]
    """Objects keyed (resource, namespace, name), also indexed per resource (``of``) so that
    controllers and list calls do not scan every object of every kind."""

    def __init__(self) -> None:
        super().__init__()
        self.by_res: dict[str, dict[tuple[str, str, str], dict[str, Any]]] = {r: {} for r in RESOURCES}

    def __setitem__(self, key: tuple[str, str, str], value: dict[str, Any]) -> None:
        super().__setitem__(key, value)
        self.by_res[key[0]][key] = value

    def __delitem__(self, key: tuple[str, str, str]) -> None:
        super().__delitem__(key)
        del self.by_res[key[0]][key]

    def of(self, res: str) -> list[tuple[tuple[str, str, str], dict[str, Any]]]:
        return sorted(self.by_res[res].items(), key=lambda kv: kv[0])


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, list[str]]
    content_type: str
    body: Any
    code: int = 0     # the HTTP status the server answered (0 while it is being handled)
    user: str = ""    # the authenticated user (with users / rbac)
    verb: str = ""    # the authorizer's verb and resource (with rbac): e.g. create, pods/eviction
    resource: str = ""


class KubeTestServer:
    """Start with ``KubeTestServer().start()``; ``url`` for the client, ``stop()`` at the end."""

    def __init__(self, token: str | None = None, host: str = "127.0.0.1", port: int = 0,
                 rollout_delay: float = 0.2, *, users: dict[str, str] | None = None, rbac: Rbac | None = None,
                 kubernetes: str = "1.37") -> None:
        self.token = token
        self.release = kubernetes
        self.dra_served = DRA_SERVED[kubernetes]
        self.holders: dict[tuple[str, str, str], list[tuple[str, str]]] = {}   # device -> pods its claims allocate
        self.users = dict(users or {})   # bearer token -> user (with rbac)
        self.rbac = rbac
        self.rollout_delay = rollout_delay
        self.stuck_rollouts = False
        self.lock = threading.RLock()
        self.objects = _Objects()
        self.requests: list[Request] = []
        self._rv = itertools.count(1000)
        self._timers: list[threading.Timer] = []
        self._node_rr = itertools.count()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a: Any) -> None:  # quiet
                pass

            def setup(self) -> None:
                super().setup()
                self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                code, payload = server.dispatch(self.command, self.path, dict(self.headers.items()), raw)
                data = json.dumps(payload).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _handle

        class Server(ThreadingHTTPServer):
            def handle_error(self, request: Any, client_address: Any) -> None:
                import sys

                if not isinstance(sys.exc_info()[1], ConnectionError):  # a client killed mid-request: not news
                    super().handle_error(request, client_address)

        self.httpd = Server((host, port), Handler)
        self.httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    # lifecycle -----------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> KubeTestServer:
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="kube-test-server", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        for t in self._timers:
            t.cancel()
        self.httpd.shutdown()
        self.httpd.server_close()

    # state helpers for tests ---------------------------------------------------------------------
    def next_rv(self) -> str:
        return str(next(self._rv))

    def get(self, resource: str, namespace: str, name: str) -> dict[str, Any] | None:
        with self.lock:
            obj = self.objects.get((resource, namespace if RESOURCES[resource][2] else "", name))
            return copy.deepcopy(obj) if obj else None

    def list(self, resource: str, namespace: str | None = None) -> list[dict[str, Any]]:
        with self.lock:
            return [copy.deepcopy(o) for (_, ns, _), o in self.objects.of(resource)
                    if namespace is None or ns == namespace]

    def put(self, resource: str, obj: dict[str, Any]) -> dict[str, Any]:
        """Create or overwrite an object directly (test setup), bumping its resourceVersion."""
        gv, kind, namespaced = RESOURCES[resource]
        with self.lock:
            obj = copy.deepcopy(obj)
            obj.setdefault("apiVersion", gv)
            obj.setdefault("kind", kind)
            meta = obj.setdefault("metadata", {})
            meta.setdefault("uid", hashlib.sha1(f"{resource}/{meta.get('namespace')}/{meta['name']}".encode()).hexdigest())
            meta.setdefault("creationTimestamp", _now())
            meta.setdefault("generation", 1)
            if namespaced:
                meta.setdefault("namespace", "default")
            meta["resourceVersion"] = self.next_rv()
            self.objects[(resource, meta.get("namespace", "") if namespaced else "", meta["name"])] = obj
            return copy.deepcopy(obj)

    def add_node(self, name: str, labels: dict[str, str] | None = None, unschedulable: bool = False,
                 annotations: dict[str, str] | None = None, taints: list[dict[str, str]] | None = None,
                 control_plane: bool = False) -> dict[str, Any]:
        """A Ready node; ``control_plane`` gives it kubeadm's control-plane role label and NoSchedule taint."""
        lab = {"kubernetes.io/hostname": name, **(labels or {})}
        taint_list = list(taints or [])
        if control_plane:
            lab["node-role.kubernetes.io/control-plane"] = ""
            taint_list.append({"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"})
        spec: dict[str, Any] = {"unschedulable": True} if unschedulable else {}
        if taint_list:
            spec["taints"] = taint_list
        return self.put("nodes", {"metadata": {"name": name, "labels": lab, "annotations": annotations or {}},
                                  "spec": spec, "status": {"conditions": [{"type": "Ready", "status": "True"}]}})

    def add_deployment(self, namespace: str, name: str, replicas: int = 2, paused: bool = False,
                       nodes: list[str] | None = None, available: int | None = None,
                       tolerations: list[dict[str, str]] | None = None) -> dict[str, Any]:
        """A Deployment with its pods (placed round-robin on ``nodes`` or the schedulable nodes)."""
        labels = {"app": name}
        pod_spec: dict[str, Any] = {"containers": [{"name": "app", "image": "registry.local/app:1"}]}
        if tolerations:
            pod_spec["tolerations"] = tolerations
        dep = {
            "metadata": {"name": name, "namespace": namespace, "labels": labels, "annotations": {}},
            "spec": {"replicas": replicas, "paused": paused, "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels, "annotations": {}}, "spec": pod_spec}},
        }
        with self.lock:
            dep = self.put("deployments", dep)
            self._replace_pods(dep, nodes)
            avail = replicas if available is None else available
            self._set_status(namespace, name, updated=replicas, available=avail)
            return self.get("deployments", namespace, name) or {}

    def add_pod(self, namespace: str, name: str, node: str, labels: dict[str, str] | None = None,
                owner: dict[str, str] | None = None) -> dict[str, Any]:
        """A running pod on ``node``; ``owner`` (``{"kind": "StatefulSet", "name": "db"}``) becomes its
        controller ownerReference, as that kind's controller would set it; without one it is a bare pod."""
        meta: dict[str, Any] = {"name": name, "namespace": namespace, "labels": dict(labels or {})}
        if owner:
            group = {"Job": "batch/v1", "CronJob": "batch/v1"}.get(owner["kind"], "apps/v1")
            meta["ownerReferences"] = [{"apiVersion": owner.get("apiVersion", group), "kind": owner["kind"],
                                        "name": owner["name"], "uid": owner.get("uid", f"uid-{owner['name']}"),
                                        "controller": True, "blockOwnerDeletion": True}]
        return self.put("pods", {"metadata": meta,
                                 "spec": {"containers": [{"name": "app", "image": "registry.local/app:1"}],
                                          "nodeName": node},
                                 "status": {"phase": "Running"}})

    def pods_of(self, namespace: str, deployment: str) -> list[dict[str, Any]]:
        """The pods whose ReplicaSet the Deployment owns (through ownerReferences, as the API reads them)."""
        rs = {o["metadata"]["name"] for o in self.list("replicasets", namespace)
              if any(r.get("kind") == "Deployment" and r.get("name") == deployment
                     for r in o["metadata"].get("ownerReferences", []))}
        return [p for p in self.list("pods", namespace)
                if any(r.get("kind") == "ReplicaSet" and r.get("name") in rs
                       for r in p["metadata"].get("ownerReferences", []))]

    def add_pdb(self, namespace: str, name: str, match_labels: dict[str, str], disruptions_allowed: int) -> None:
        self.put("poddisruptionbudgets", {
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"selector": {"matchLabels": match_labels}, "minAvailable": 1},
            "status": {"disruptionsAllowed": disruptions_allowed, "currentHealthy": 0, "desiredHealthy": 0,
                       "expectedPods": 0, "observedGeneration": 1},
        })

    def set_pdb_allowed(self, namespace: str, name: str, allowed: int) -> None:
        with self.lock:
            self.objects[("poddisruptionbudgets", namespace, name)]["status"]["disruptionsAllowed"] = allowed

    def pods_on(self, node: str, namespace: str | None = None) -> list[dict[str, Any]]:
        return [p for p in self.list("pods", namespace) if p.get("spec", {}).get("nodeName") == node]

    def forbidden(self) -> list[Request]:
        """The requests the RBAC authorizer refused."""
        with self.lock:
            return [r for r in self.requests if r.code == 403]

    def calls(self, method: str | None = None, path_contains: str = "") -> list[Request]:
        with self.lock:
            return [r for r in self.requests if (method is None or r.method == method) and path_contains in r.path]

    # DRA (resource.k8s.io) ------------------------------------------------------------------------
    def add_resource_slice(self, node: str, driver: str, pool: str, devices: list[dict[str, Any]],
                           generation: int = 1, name: str | None = None) -> dict[str, Any]:
        """A ``ResourceSlice`` as a DRA driver publishes it for ``node`` (validated like a create)."""
        body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                "metadata": {"name": name or f"{node}-{driver.split('.')[0]}-{pool}-{generation}".lower()},
                "spec": {"driver": driver, "nodeName": node, "devices": devices,
                         "pool": {"name": pool, "generation": generation, "resourceSliceCount": 1}}}
        with self.lock:
            self._validate_dra("resourceslices", "resource.k8s.io/v1", body)
            return self.put("resourceslices", body)

    def allocate(self, namespace: str, pod: str, driver: str, pool: str, device: str) -> None:
        """``pod`` holds the device (what its ResourceClaim's ``status.allocation`` would say): the device
        taint eviction controller stand-in evicts it under a ``NoExecute`` rule."""
        with self.lock:
            self.holders.setdefault((driver, pool, device), []).append((namespace, pod))

    def _served(self, res: str) -> tuple[str, ...]:
        if res in DRA:
            return tuple(f"resource.k8s.io/{v}" for v in self.dra_served.get(res, ()))
        return (RESOURCES[res][0],)

    def _discovery(self, path: str) -> dict[str, Any] | None:
        """``/apis/resource.k8s.io`` (APIGroup) and ``/apis/resource.k8s.io/VERSION`` (APIResourceList)."""
        p = path.rstrip("/")
        versions = sorted({v for vs in self.dra_served.values() for v in vs}, key=("v1", "v1beta2").index)
        if p == "/apis/resource.k8s.io" and versions:
            gvs = [{"groupVersion": f"resource.k8s.io/{v}", "version": v} for v in versions]
            return {"kind": "APIGroup", "apiVersion": "v1", "name": "resource.k8s.io", "versions": gvs,
                    "preferredVersion": gvs[0]}
        m = re.fullmatch(r"/apis/resource\.k8s\.io/(v1|v1beta2)", p)
        if m is None or m[1] not in versions:
            return None
        listed = [{"name": res, "singularName": RESOURCES[res][1].lower(), "namespaced": False,
                   "kind": RESOURCES[res][1], "verbs": ["create", "delete", "deletecollection", "get", "list", "patch",
                                                        "update", "watch"]}
                  for res in DRA if m[1] in self.dra_served.get(res, ())]
        return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": f"resource.k8s.io/{m[1]}",
                "resources": listed}

    @staticmethod
    def _as_version(obj: dict[str, Any], gv: str) -> dict[str, Any]:
        """An object as the version asked for answers it (DeviceTaintRule and ResourceSlice have the same
        fields in v1 and v1beta2)."""
        if obj.get("apiVersion", "").startswith("resource.k8s.io/"):
            obj = {**obj, "apiVersion": gv}
        return obj

    def _validate_dra(self, res: str, gv: str, body: Any) -> dict[str, Any]:
        """The published OpenAPI schema of this release (kubernetes-validate, strict), then the API server's
        own validation of what the schema does not say; 422 Invalid with the reason otherwise."""
        import kubernetes_validate

        body = self._validate(res, body)
        body = {**body, "apiVersion": gv, "kind": RESOURCES[res][1]}
        try:
            kubernetes_validate.validate(copy.deepcopy(body), SCHEMA_RELEASE[self.release], strict=True)
        except kubernetes_validate.ValidationError as e:
            raise ApiError(422, "Invalid", f'{RESOURCES[res][1]}.resource.k8s.io "{body["metadata"].get("name")}" '
                           f"is invalid: {'.'.join(map(str, e.path))}: {e.message}") from None
        name = str(body["metadata"].get("name") or "")
        problems = [] if _DNS_SUBDOMAIN.match(name) and len(name) <= 253 else [
            f"metadata.name: Invalid value: {name!r}: a lowercase RFC 1123 subdomain"]
        spec = body.get("spec") or {}
        if res == "devicetaintrules":
            taint = spec.get("taint") or {}
            if taint.get("effect") not in ("None", "NoSchedule", "NoExecute"):
                problems.append(f"spec.taint.effect: Unsupported value: {taint.get('effect')!r}: supported values: "
                                '"NoExecute", "NoSchedule", "None"')
            if not _LABEL_NAME.match(str(taint.get("key") or "")):
                problems.append(f"spec.taint.key: Invalid value: {taint.get('key')!r}: a qualified name")
            if not _LABEL_VALUE.match(str(taint.get("value") or "")) or len(str(taint.get("value") or "")) > 63:
                problems.append(f"spec.taint.value: Invalid value: {taint.get('value')!r}: a valid label value")
        else:
            where = [k for k in ("nodeName", "nodeSelector", "allNodes", "perDeviceNodeSelection") if spec.get(k)]
            if len(where) != 1:
                problems.append("spec: Invalid value: exactly one of `nodeName`, `nodeSelector`, `allNodes`, "
                                "`perDeviceNodeSelection` is required")
            names = [d.get("name") for d in spec.get("devices") or []]
            if len(names) != len(set(names)):
                problems.append("spec.devices: Duplicate value: a device name is unique in its pool")
        if problems:
            raise ApiError(422, "Invalid", f'{RESOURCES[res][1]}.resource.k8s.io "{name}" is invalid: '
                           + "; ".join(problems))
        return body

    def _published(self) -> list[tuple[str, str, str]]:
        """(driver, pool, device) of every device published in the newest generation of its pool."""
        slices = [o for _, o in self.objects.of("resourceslices")]
        newest: dict[tuple[str, str], int] = {}
        for o in slices:
            key = (o["spec"]["driver"], o["spec"]["pool"]["name"])
            newest[key] = max(newest.get(key, 0), int(o["spec"]["pool"]["generation"]))
        return [(o["spec"]["driver"], o["spec"]["pool"]["name"], d["name"]) for o in slices
                if int(o["spec"]["pool"]["generation"]) == newest[(o["spec"]["driver"], o["spec"]["pool"]["name"])]
                for d in o["spec"].get("devices") or []]

    def _device_taint_controller(self, name: str) -> dict[str, Any]:
        """kube-controller-manager's part, as far as the tests need it: ``timeAdded`` set; the pods holding a
        selected device evicted under ``NoExecute``; the ``EvictionInProgress`` condition."""
        rule = self.objects[("devicetaintrules", "", name)]
        spec = rule["spec"]
        spec["taint"].setdefault("timeAdded", _now())
        sel = spec.get("deviceSelector") or {}
        chosen = [d for d in self._published()
                  if all(not sel.get(f) or sel[f] == v for f, v in zip(("driver", "pool", "device"), d, strict=True))]
        pods = sorted({p for d in chosen for p in self.holders.get(d, [])
                       if ("pods", p[0], p[1]) in self.objects})
        effect = spec["taint"]["effect"]
        if effect == "NoExecute":
            for ns, pod in pods:
                obj = self.objects[("pods", ns, pod)]
                del self.objects[("pods", ns, pod)]
                self._replace_evicted(obj)
            message = f"{len(pods)} pods evicted, 0 pending"
        elif effect == "None":
            message = (f"{len(pods)} pods would be evicted with effect NoExecute"
                       + (": " + ", ".join(f"{a}/{b}" for a, b in pods) if pods else ""))
        else:
            message = "no eviction: effect NoSchedule"
        rule["status"] = {"conditions": [{"type": "EvictionInProgress", "status": "False", "reason": "Completed"
                                          if effect == "NoExecute" else "NotEvicting", "message": message,
                                          "lastTransitionTime": _now(), "observedGeneration":
                                          rule["metadata"].get("generation", 1)}]}
        return copy.deepcopy(rule)

    # deployment controller -----------------------------------------------------------------------
    def _schedulable_nodes(self, template_spec: dict[str, Any] | None = None) -> list[str]:
        """Uncordoned nodes whose NoSchedule / NoExecute taints the pod template tolerates (the scheduler's filter)."""
        tolerations = (template_spec or {}).get("tolerations") or []
        return [o["metadata"]["name"] for _, o in self.objects.of("nodes")
                if not o.get("spec", {}).get("unschedulable")
                and all(_tolerated(tolerations, t) for t in o.get("spec", {}).get("taints") or []
                        if t.get("effect") in ("NoSchedule", "NoExecute"))]

    def _pick_node(self, template_spec: dict[str, Any], candidates: list[str]) -> str | None:
        if not candidates:
            return None
        pref = (template_spec.get("affinity", {}).get("nodeAffinity", {})
                .get("preferredDuringSchedulingIgnoredDuringExecution", []))
        best: tuple[int, str] | None = None
        for node in candidates:
            nobj = self.objects.get(("nodes", "", node), {})
            nlabels = nobj.get("metadata", {}).get("labels", {})
            score = 0
            for term in pref:
                exprs = term.get("preference", {}).get("matchExpressions", [])
                if all(e.get("operator") == "In" and nlabels.get(e["key"]) in e.get("values", []) for e in exprs):
                    score += int(term.get("weight", 0))
            if best is None or score > best[0]:
                best = (score, node)
        if best and best[0] > 0:
            return best[1]
        return candidates[next(self._node_rr) % len(candidates)]

    def _template_hash(self, dep: dict[str, Any]) -> str:
        return hashlib.sha1(json.dumps(dep["spec"]["template"], sort_keys=True).encode()).hexdigest()[:10]

    def _replace_pods(self, dep: dict[str, Any], nodes: list[str] | None = None) -> None:
        ns = dep["metadata"]["namespace"]
        sel = dep["spec"]["selector"]["matchLabels"]
        for key in [k for k, o in self.objects.of("pods") if k[1] == ns
                    and all(o["metadata"].get("labels", {}).get(a) == b for a, b in sel.items())]:
            del self.objects[key]
        current = f"{dep['metadata']['name']}-{self._template_hash(dep)}"
        for (_, rns, rname), rs in self.objects.of("replicasets"):   # older templates' ReplicaSets scale to 0
            if rns == ns and rname != current and any(
                    r.get("uid") == dep["metadata"]["uid"] for r in rs["metadata"].get("ownerReferences", [])):
                rs["spec"]["replicas"] = 0
                rs["status"] = {"replicas": 0, "readyReplicas": 0, "availableReplicas": 0,
                                "observedGeneration": rs["metadata"].get("generation", 1)}
                rs["metadata"]["resourceVersion"] = self.next_rv()
        self._create_pods(dep, dep["spec"].get("replicas", 1), nodes)

    def _replicaset(self, dep: dict[str, Any], h: str) -> dict[str, Any]:
        """The ReplicaSet of the Deployment's current template (created like the deployment controller does)."""
        ns, name = dep["metadata"]["namespace"], dep["metadata"]["name"]
        rs = self.objects.get(("replicasets", ns, f"{name}-{h}"))
        replicas = dep["spec"].get("replicas", 1)
        tmpl = copy.deepcopy(dep["spec"]["template"])
        tmpl.setdefault("metadata", {}).setdefault("labels", {})["pod-template-hash"] = h
        if rs is None:
            rs = self.put("replicasets", {
                "metadata": {"name": f"{name}-{h}", "namespace": ns,
                             "labels": {**tmpl["metadata"]["labels"]},
                             "annotations": {"deployment.kubernetes.io/revision": str(dep["metadata"].get("generation", 1))},
                             "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": name,
                                                  "uid": dep["metadata"]["uid"], "controller": True,
                                                  "blockOwnerDeletion": True}]},
                "spec": {"replicas": replicas,
                         "selector": {"matchLabels": {**dep["spec"]["selector"]["matchLabels"], "pod-template-hash": h}},
                         "template": tmpl},
                "status": {"replicas": replicas, "readyReplicas": replicas, "availableReplicas": replicas,
                           "observedGeneration": 1}})
        return rs

    def _create_pods(self, dep: dict[str, Any], n: int, nodes: list[str] | None = None) -> None:
        ns, name = dep["metadata"]["namespace"], dep["metadata"]["name"]
        h = self._template_hash(dep)
        tmpl = dep["spec"]["template"]
        rs = self._replicaset(dep, h)
        for i in range(n):
            if nodes:
                node: str | None = nodes[i % len(nodes)]
            else:
                node = self._pick_node(tmpl.get("spec", {}), self._schedulable_nodes(tmpl.get("spec", {})))
            suffix = "".join(random.choices(string.ascii_lowercase + string.digits, k=5))
            self.put("pods", {
                "metadata": {"name": f"{name}-{h}-{suffix}", "namespace": ns,
                             "labels": {**tmpl["metadata"].get("labels", {}), "pod-template-hash": h},
                             "annotations": dict(tmpl["metadata"].get("annotations", {})),
                             "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                                                  "name": rs["metadata"]["name"], "uid": rs["metadata"]["uid"],
                                                  "controller": True, "blockOwnerDeletion": True}]},
                "spec": {**copy.deepcopy(tmpl.get("spec", {})), "nodeName": node},
                "status": {"phase": "Running" if node else "Pending"},
            })

    def _set_status(self, ns: str, name: str, updated: int, available: int) -> None:
        dep = self.objects[("deployments", ns, name)]
        replicas = dep["spec"].get("replicas", 1)
        dep["status"] = {
            "observedGeneration": dep["metadata"].get("generation", 1), "replicas": replicas,
            "updatedReplicas": updated, "readyReplicas": available, "availableReplicas": available,
            "unavailableReplicas": max(0, replicas - available),
            "conditions": [{"type": "Available", "status": "True" if available >= replicas else "False"},
                           {"type": "Progressing", "status": "True",
                            "reason": "NewReplicaSetAvailable" if updated >= replicas else "ReplicaSetUpdated"}],
        }
        dep["metadata"]["resourceVersion"] = self.next_rv()

    def _start_rollout(self, ns: str, name: str) -> None:
        dep = self.objects[("deployments", ns, name)]
        dep["metadata"]["generation"] = dep["metadata"].get("generation", 1) + 1
        if dep["spec"].get("paused"):
            return
        st = dep.setdefault("status", {})
        st["observedGeneration"] = dep["metadata"]["generation"]
        st["updatedReplicas"] = 0
        if self.stuck_rollouts:
            return

        def finish() -> None:
            with self.lock:
                cur = self.objects.get(("deployments", ns, name))
                if cur is None or self.stuck_rollouts:
                    return
                self._replace_pods(cur)
                r = cur["spec"].get("replicas", 1)
                self._set_status(ns, name, updated=r, available=r)

        t = threading.Timer(self.rollout_delay, finish)
        t.daemon = True
        self._timers.append(t)
        t.start()

    def _replace_evicted(self, pod: dict[str, Any]) -> None:
        """The ReplicaSet controller: an evicted pod of a deployment gets a replacement."""
        ns = pod["metadata"]["namespace"]
        labels = pod["metadata"].get("labels", {})
        for (_, dns, _), dep in self.objects.of("deployments"):
            if dns == ns and all(
                    labels.get(a) == b for a, b in dep["spec"]["selector"]["matchLabels"].items()):
                def recreate(dep: dict[str, Any] = dep) -> None:
                    with self.lock:
                        self._create_pods(dep, 1)
                t = threading.Timer(self.rollout_delay, recreate)
                t.daemon = True
                self._timers.append(t)
                t.start()

    # HTTP dispatch -------------------------------------------------------------------------------
    def dispatch(self, method: str, raw_path: str, headers: dict[str, str], raw: bytes) -> tuple[int, Any]:
        parts = urlsplit(raw_path)
        query = parse_qs(parts.query)
        ctype = next((v for k, v in headers.items() if k.lower() == "content-type"), "").split(";")[0].strip()
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
            if method in ("POST", "PUT", "PATCH"):
                return 400, ApiError(400, "BadRequest", "the request body is not valid JSON").status()
        req = Request(method, parts.path, query, ctype, body)
        with self.lock:
            self.requests.append(req)
        if self.token is not None:
            auth = next((v for k, v in headers.items() if k.lower() == "authorization"), "")
            if auth != f"Bearer {self.token}":
                req.code = 401
                return 401, ApiError(401, "Unauthorized", "Unauthorized").status()
        if self.rbac is not None or self.users:
            auth = next((v for k, v in headers.items() if k.lower() == "authorization"), "")
            user = self.users.get(auth.removeprefix("Bearer ")) if auth.startswith("Bearer ") else None
            if user is None:
                req.code = 401
                return 401, ApiError(401, "Unauthorized", "Unauthorized").status()
            req.user = user
            if self.rbac is not None:
                attrs = request_attributes(method, parts.path, query, _PATH.match(parts.path))
                req.verb, req.resource = attrs.verb, attrs.combined_resource
                allowed, why = self.rbac.authorize(user, attrs)
                if not allowed:
                    req.code = 403
                    return 403, forbidden(user, attrs, why)
        try:
            with self.lock:
                code, payload = self._route(method, parts.path, query, ctype, body)
        except ApiError as e:
            code, payload = e.code, e.status()
        req.code = code
        return code, payload

    def _route(self, method: str, path: str, query: dict[str, list[str]], ctype: str, body: Any) -> tuple[int, Any]:
        if path in ("/api", "/api/"):
            return 200, {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}
        if path in ("/version", "/version/"):
            return 200, {"major": "1", "minor": "31", "gitVersion": "v1.31.0-triscope-test"}
        discovery = self._discovery(path)
        if discovery is not None:
            return 200, discovery
        m = _PATH.match(path)
        if not m:
            raise ApiError(404, "NotFound", f"the server could not find the requested resource ({path})")
        gv = m["cv"] or f"{m['group']}/{m['gv']}"
        res, ns, name, sub = m["res"], m["ns"] or "", m["name"], m["sub"]
        if res not in RESOURCES or gv not in self._served(res):
            raise ApiError(404, "NotFound", f"the server could not find the requested resource ({gv} {res})")
        _, kind, namespaced = RESOURCES[res]
        if not namespaced:
            ns = ""
        if sub:
            return self._subresource(method, res, ns, name or "", sub, body, ctype)
        if res in DRA and method in ("POST", "PUT"):
            body = self._validate_dra(res, gv, body)
        if name is None:
            return self._collection(method, res, ns, kind, gv, query, body)
        if method == "GET":
            return 200, self._as_version(self._must(res, ns, name), gv)
        if method == "PUT":
            code, obj = self._replace(res, ns, name, body)
            return code, self._as_version(obj, gv)
        if method == "PATCH":
            return self._patch(res, ns, name, ctype, body)
        if method == "DELETE":
            return 200, self._as_version(self._delete(res, ns, name, body), gv)
        raise ApiError(405, "MethodNotAllowed", f"{method} not allowed")

    def _collection(self, method: str, res: str, ns: str, kind: str, gv: str, query: dict[str, list[str]],
                    body: Any) -> tuple[int, Any]:
        if method == "GET":
            return 200, self._list(res, ns, kind, gv, query)
        if method == "POST":
            code, obj = self._create(res, ns, body)
            return code, self._as_version(obj, gv)
        raise ApiError(405, "MethodNotAllowed", f"{method} not allowed on a collection")

    def _delete(self, res: str, ns: str, name: str, body: Any) -> dict[str, Any]:
        """Delete, honouring a ``DeleteOptions`` body's ``preconditions.uid`` (409 when it is another object)."""
        obj = self._must(res, ns, name)
        want = ((body or {}).get("preconditions") or {}).get("uid") if isinstance(body, dict) else None
        if want and want != obj["metadata"].get("uid"):
            raise ApiError(409, "Conflict", f'Operation cannot be fulfilled on {res} "{name}": Precondition failed: '
                           f'UID in precondition: {want}, UID in object meta: {obj["metadata"].get("uid")}',
                           {"name": name, "kind": res})
        del self.objects[(res, ns, name)]
        return obj

    def _subresource(self, method: str, res: str, ns: str, name: str, sub: str, body: Any,
                     ctype: str = "") -> tuple[int, Any]:
        """The subresources served: a pod's eviction, a deployment's status and scale (read), a node's status."""
        if res == "pods" and sub == "eviction" and method == "POST":
            return self._evict(ns, name, body)
        if res == "deployments" and sub in ("status", "scale") and method == "GET":
            return 200, self._must(res, ns, name)
        if res == "nodes" and sub == "status" and method == "GET":
            return 200, self._must(res, ns, name)
        if res == "nodes" and sub == "status" and method == "PATCH":
            # the status subresource: only status changes (metadata.resourceVersion still checked)
            if ctype != "application/strategic-merge-patch+json" and ctype != "application/merge-patch+json":
                raise ApiError(415, "UnsupportedMediaType", f"unsupported patch type {ctype!r} in this test server")
            old = self._must(res, ns, name)
            merged = (strategic_merge if ctype.startswith("application/strategic") else merge_patch)(old, body)
            new = {**old, "status": merged.get("status", {})}
            return 200, self._store_update(res, ns, name, old, new)
        raise ApiError(404, "NotFound", f"subresource {sub} not served")

    def _list(self, res: str, ns: str, kind: str, gv: str, query: dict[str, list[str]]) -> dict[str, Any]:
        """A collection (in one namespace, or all), filtered by its label and field selectors."""
        items = [copy.deepcopy(o) for (_, ons, _), o in self.objects.of(res) if not ns or ons == ns]
        if "labelSelector" in query:
            items = [o for o in items if _match_labels(query["labelSelector"][0], o["metadata"].get("labels", {}))]
        if "fieldSelector" in query:
            items = [o for o in items if _match_fields(query["fieldSelector"][0], o)]
        return {"kind": f"{kind}List", "apiVersion": gv, "metadata": {"resourceVersion": self.next_rv()},
                "items": [self._as_version(o, gv) for o in items]}

    def _must(self, res: str, ns: str, name: str) -> dict[str, Any]:
        obj = self.objects.get((res, ns, name))
        if obj is None:
            kind = RESOURCES[res][1]
            raise ApiError(404, "NotFound", f'{res} "{name}" not found',
                           {"name": name, "kind": res, "group": kind and RESOURCES[res][0].split("/")[0]})
        return copy.deepcopy(obj)

    def _validate(self, res: str, body: Any) -> dict[str, Any]:
        if not isinstance(body, dict) or not isinstance(body.get("metadata"), dict):
            raise ApiError(400, "BadRequest", "the object has no metadata")
        kind = RESOURCES[res][1]
        if body.get("kind") not in (None, kind):
            raise ApiError(400, "BadRequest", f"the kind {body.get('kind')!r} does not match {kind}")
        return body

    def _create(self, res: str, ns: str, body: Any) -> tuple[int, Any]:
        body = self._validate(res, body)
        meta = body["metadata"]
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + "".join(random.choices(string.ascii_lowercase, k=5))
        if not meta.get("name"):
            raise ApiError(422, "Invalid", "metadata.name: Required value")
        if ns:
            if meta.get("namespace", ns) != ns:
                raise ApiError(400, "BadRequest", "the namespace of the object does not match the request")
            meta["namespace"] = ns
        if (res, ns, meta["name"]) in self.objects:
            raise ApiError(409, "AlreadyExists", f'{res} "{meta["name"]}" already exists',
                           {"name": meta["name"], "kind": res})
        meta.pop("resourceVersion", None)
        if res in DRA:
            meta["uid"] = str(uuid.uuid4())       # a name re-created is another object
        obj = self.put(res, body)
        if res == "devicetaintrules":
            obj = self._device_taint_controller(meta["name"])
        if res == "deployments":
            self._replace_pods(self.objects[(res, ns, meta["name"])])
            r = obj["spec"].get("replicas", 1)
            self._set_status(ns, meta["name"], updated=r, available=r)
            obj = self._must(res, ns, meta["name"])
        return 201, obj

    def _store_update(self, res: str, ns: str, name: str, old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
        meta = new.setdefault("metadata", {})
        for k in ("uid", "creationTimestamp", "generation"):
            if k in old["metadata"]:
                meta[k] = old["metadata"][k]
        meta["name"], meta["resourceVersion"] = name, self.next_rv()
        if ns:
            meta["namespace"] = ns
        new["apiVersion"], new["kind"] = RESOURCES[res][0], RESOURCES[res][1]
        if res == "deployments":
            new["status"] = old.get("status", {})
        self.objects[(res, ns, name)] = new
        if res == "devicetaintrules":
            self._device_taint_controller(name)
        if res == "deployments" and (new["spec"].get("template") != old["spec"].get("template")
                                     or (old["spec"].get("paused") and not new["spec"].get("paused"))):
            self._start_rollout(ns, name)
        return copy.deepcopy(self.objects[(res, ns, name)])

    def _replace(self, res: str, ns: str, name: str, body: Any) -> tuple[int, Any]:
        body = self._validate(res, body)
        old = self._must(res, ns, name)
        rv = body["metadata"].get("resourceVersion")
        if rv and rv != old["metadata"]["resourceVersion"]:
            raise ApiError(409, "Conflict",
                           f'Operation cannot be fulfilled on {res} "{name}": the object has been modified; '
                           "please apply your changes to the latest version and try again",
                           {"name": name, "kind": res})
        return 200, self._store_update(res, ns, name, old, copy.deepcopy(body))

    def _patch(self, res: str, ns: str, name: str, ctype: str, body: Any) -> tuple[int, Any]:
        old = self._must(res, ns, name)
        if ctype == "application/json-patch+json":
            if not isinstance(body, list):
                raise ApiError(400, "BadRequest",
                               "json: cannot unmarshal object into Go value of type []handlers.jsonPatchOp")
            new = json_patch(old, body)
        elif ctype == "application/merge-patch+json":
            new = merge_patch(old, body)
        elif ctype == "application/strategic-merge-patch+json":
            if not isinstance(body, dict):
                raise ApiError(400, "BadRequest", "a strategic merge patch must be a JSON object")
            new = strategic_merge(old, body)
        else:
            raise ApiError(415, "UnsupportedMediaType", f"the body of the request was in an unknown format - "
                           f"accepted media types include: application/json-patch+json, application/merge-patch+json, "
                           f"application/apply-patch+yaml, application/strategic-merge-patch+json ({ctype!r})")
        rv = (body.get("metadata") or {}).get("resourceVersion") if isinstance(body, dict) else None
        if rv and rv != old["metadata"]["resourceVersion"]:
            raise ApiError(409, "Conflict", f'Operation cannot be fulfilled on {res} "{name}": the object has been '
                           "modified; please apply your changes to the latest version and try again",
                           {"name": name, "kind": res})
        return 200, self._store_update(res, ns, name, old, new)

    def _evict(self, ns: str, name: str, body: Any) -> tuple[int, Any]:
        if not isinstance(body, dict) or body.get("kind") != "Eviction":
            raise ApiError(400, "BadRequest", "the body of an eviction must be a policy/v1 Eviction")
        pod = self._must("pods", ns, name)
        labels = pod["metadata"].get("labels", {})
        for (_, pns, pname), pdb in self.objects.of("poddisruptionbudgets"):
            if pns != ns:
                continue
            sel = pdb["spec"].get("selector", {}).get("matchLabels", {})
            if all(labels.get(k) == v for k, v in sel.items()):
                if pdb["status"].get("disruptionsAllowed", 0) <= 0:
                    raise ApiError(429, "TooManyRequests",
                                   "Cannot evict pod as it would violate the pod's disruption budget.",
                                   {"causes": [{"reason": "DisruptionBudget",
                                                "message": f"The disruption budget {pname} needs 1 healthy pods "
                                                           "and has 1 currently"}]})
                pdb["status"]["disruptionsAllowed"] -= 1
        del self.objects[("pods", ns, name)]
        self._replace_evicted(pod)
        return 201, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}


if __name__ == "__main__":  # manual use: python tests/kube_server.py
    srv = KubeTestServer().start()
    srv.add_node("node-a")
    srv.add_node("node-b")
    srv.add_deployment("default", "demo")
    print("serving on", srv.url)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        srv.stop()


# helpers shared by the remediation tests ---------------------------------------------------------
def open_store(url: str):  # type: ignore[no-untyped-def]
    """A migrated store at ``url``."""
    from triscope.store import Store

    st = Store.open(url)
    st.upgrade()
    return st


BASE_SETTINGS = ("  namespaces: [inference, default]\n  evaluate_interval: 1s\n  max_in_flight: 4\n"
                 "  breaker: {window: 15m, max_targets: 50, max_percent: 100, min_population: 1000}\n")


def policy_text(rules: str, settings: str = "") -> str:
    """A policy document: ``settings`` and ``rules`` are YAML blocks indented by two spaces."""
    return f"version: 1\nsettings:\n{settings or BASE_SETTINGS}rules:\n{rules}"


def alert_payload(alerts: list[dict[str, Any]], status: str = "firing") -> dict[str, Any]:
    """An Alertmanager webhook v4 payload for ``alerts`` (each: labels, status, startsAt, fingerprint)."""
    out = []
    for a in alerts:
        labels = a["labels"]
        out.append({"status": a.get("status", status), "labels": labels, "annotations": a.get("annotations", {}),
                    "startsAt": a.get("startsAt", "2026-11-29T18:00:00.123456789Z"),
                    "endsAt": a.get("endsAt", "0001-01-01T00:00:00Z"), "generatorURL": "http://prometheus/graph",
                    "fingerprint": a.get("fingerprint") or hashlib.sha1(json.dumps(labels, sort_keys=True).encode()).hexdigest()[:16]})
    return {"version": "4", "groupKey": "{}:{alertname=\"x\"}", "truncatedAlerts": 0, "status": status,
            "receiver": "triscope", "groupLabels": {}, "commonLabels": {}, "commonAnnotations": {},
            "externalURL": "http://alertmanager", "alerts": out}


def webhook_payload(alerts: list[dict[str, Any]], status: str = "firing") -> Any:
    """``alert_payload`` as the engine takes it: validated by the webhook's model (``WebhookPayload``)."""
    from triscope.remediation.webhook import validate_payload

    return validate_payload(alert_payload(alerts, status))
