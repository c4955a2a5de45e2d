"""Which workload a trigger is about: the pod's owner through ownerReferences, cached, kept in the store.

The agent labels per-accelerator series (and so the alerts built on them) with ``namespace``,
``pod``, ``container`` and ``workload``; on Kubernetes it leaves ``workload`` empty, because it has
no API access (docs/workloads.md).  A rule whose target says ``deployment: {from: workload}``
acts on:

1. the trigger's ``workload`` label when it names a Kubernetes workload (``Deployment/web``);
2. else its ``pod`` label, resolved to the owning workload through ownerReferences
   (:meth:`WorkloadResolver.resolve`: Pod -> ReplicaSet -> Deployment, ``StatefulSet``,
   ``DaemonSet``, ``Job``, else ``Pod``), in the trigger's namespace;
3. else nothing: the decision is suppressed by the ``target`` rail, with the reason.  There is
   no default workload.

A resolution is cached for ``settings.workload_ttl`` and written to the store's ``workloads``
table (``triscope.store.workloads``), which the dashboard reads and which answers for a pod the
API no longer knows (it was replaced since the alert fired: a pod's name belongs to one owner).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from triscope.remediation.kube.adapter import KubeAdapter
from triscope.remediation.kube.errors import Forbidden, KubeError, NotFound, Unauthorized
from triscope.remediation.targets import TargetField
from triscope.store import workloads as wstore

if TYPE_CHECKING:
    from triscope.store.api import Store

log = logging.getLogger(__name__)

SHARED_WORKLOADS = frozenset({"shared", "other"})      # the agent's labels for "several workloads"
NEGATIVE_TTL_S = 30.0                                  # a pod the API did not know is asked again after this


@dataclass(frozen=True)
class Owner:
    """The workload a target resolved to, and how it was found."""

    namespace: str
    kind: str
    name: str
    pod: str = ""
    via: str = ""      # label | ownerReferences | cache | store

    @property
    def workload(self) -> str:
        return f"{self.kind}/{self.name}"

    def as_dict(self) -> dict[str, str]:
        return {"namespace": self.namespace, "workload": self.workload, "kind": self.kind, "name": self.name,
                "pod": self.pod, "via": self.via}


class ResolveError(Exception):
    """The target's workload cannot be told; ``transient`` when asking again later may succeed (API down)."""

    def __init__(self, reason: str, transient: bool = False) -> None:
        super().__init__(reason)
        self.reason, self.transient = reason, transient


def controller_of(obj: Mapping[str, Any]) -> tuple[str, str] | None:
    """(kind, name) of the object's managing controller: the ownerReference with ``controller: true``
    (at most one, the API server enforces it), else the only ownerReference; None when it has none."""
    refs = [r for r in (obj.get("metadata") or {}).get("ownerReferences") or [] if r.get("kind") and r.get("name")]
    ctl = [r for r in refs if r.get("controller")]
    ref = ctl[0] if ctl else refs[0] if len(refs) == 1 else None
    return None if ref is None else (str(ref["kind"]), str(ref["name"]))


def pod_owner(kube: KubeAdapter, namespace: str, pod: str) -> tuple[str, str]:
    """The workload owning ``pod`` as (kind, name), through ownerReferences, as the controllers set them.

    Pod -> ReplicaSet -> Deployment (a ReplicaSet nobody owns is the workload itself);
    ``StatefulSet``, ``DaemonSet``, ``Job`` (and any other controller kind) from the pod's own
    controller reference; a pod with no owner is ``("Pod", name)``.  Reads the pod and, for a
    ReplicaSet owner, the ReplicaSet (RBAC: ``get`` on pods and replicasets).  Raises
    ``NotFound`` when the pod does not exist.
    """
    owner = controller_of(kube.get_pod(namespace, pod))
    if owner is None:
        return "Pod", pod
    kind, name = owner
    if kind == "ReplicaSet":
        try:
            rs_owner = controller_of(kube.get_replicaset(namespace, name))
        except NotFound:   # the ReplicaSet went (a rollout finished) while its pod lingers
            return kind, name
        if rs_owner is not None and rs_owner[0] == "Deployment":
            return rs_owner
    return kind, name


def parse_workload(value: str) -> tuple[str, str] | None:
    """``Deployment/web`` -> ("Deployment", "web"); None for anything else (``unit:x.service``, ``cmd:x``, "")."""
    kind, sep, name = value.partition("/")
    if not sep or not kind[:1].isupper() or not kind.isalnum() or not name or "/" in name:
        return None
    return kind, name


class WorkloadResolver:
    """(namespace, pod) -> owning workload, through the API, cached for ``ttl_s`` and kept in the store."""

    def __init__(self, store: Store, kube: KubeAdapter | None, ttl_s: float = 600.0) -> None:
        self.store, self.kube, self.ttl_s = store, kube, ttl_s
        self._lock = threading.Lock()
        self._cache: dict[tuple[str, str], tuple[float, Owner | None, str]] = {}
        self.api_lookups = 0

    def _remember(self, key: tuple[str, str], at: float, owner: Owner | None, why: str = "") -> None:
        with self._lock:
            self._cache[key] = (at, owner, why)
            if len(self._cache) > 50_000:   # bounded: forget the oldest half
                for kk, _ in sorted(self._cache.items(), key=lambda kv: kv[1][0])[:25_000]:
                    del self._cache[kk]

    def cached(self, namespace: str, pod: str, now: float | None = None) -> Owner | None:
        """The in-memory answer while it is fresh (no store, no API)."""
        now = time.time() if now is None else now
        with self._lock:
            hit = self._cache.get((namespace, pod))
        if hit is None or hit[1] is None or now - hit[0] >= self.ttl_s:
            return None
        return Owner(namespace, hit[1].kind, hit[1].name, pod, "cache")

    def resolve(self, namespace: str, pod: str, now: float | None = None) -> Owner:
        """The workload owning ``namespace/pod``; raises :class:`ResolveError` with the reason when it cannot."""
        now = time.time() if now is None else now
        key = (namespace, pod)
        with self._lock:
            hit = self._cache.get(key)
        if hit is not None:
            at, owner, why = hit
            if owner is not None and now - at < self.ttl_s:
                return Owner(namespace, owner.kind, owner.name, pod, "cache")
            if owner is None and now - at < NEGATIVE_TTL_S:
                raise ResolveError(why)
        row = wstore.get_workload(self.store, namespace, pod)
        if row is not None and now - row.resolved_at < self.ttl_s:
            owner = Owner(namespace, row.kind, row.name, pod, "store")
            self._remember(key, row.resolved_at, owner)
            return owner
        if self.kube is None:
            if row is not None:
                return Owner(namespace, row.kind, row.name, pod, "store")
            raise ResolveError(f"pod {namespace}/{pod}: no Kubernetes API configured to resolve its owner "
                               "(settings.kubernetes.mode is none) and the store has no record of it")
        try:
            self.api_lookups += 1
            kind, name = pod_owner(self.kube, namespace, pod)
        except NotFound:
            if row is not None:   # replaced since the trigger was raised: its owner is remembered
                return Owner(namespace, row.kind, row.name, pod, "store")
            why = f"pod {namespace}/{pod} does not exist and was never resolved: cannot tell its workload"
            self._remember(key, now, None, why)
            raise ResolveError(why) from None
        except Unauthorized as e:
            if row is not None:
                return Owner(namespace, row.kind, row.name, pod, "store")
            why = (f"not allowed to read pod {namespace}/{pod} or its ReplicaSet: {e}" if isinstance(e, Forbidden)
                   else f"not allowed to read pod {namespace}/{pod} or its ReplicaSet ({e.status}): the engine needs "
                   f"get on pods and replicasets in {namespace} (a RoleBinding in deploy/kustomize/targets)")
            self._remember(key, now, None, why)
            raise ResolveError(why) from None
        except KubeError as e:
            if row is not None:
                return Owner(namespace, row.kind, row.name, pod, "store")
            raise ResolveError(f"cannot resolve pod {namespace}/{pod} to its workload: {e}", transient=True) from None
        owner = Owner(namespace, kind, name, pod, "ownerReferences")
        self._remember(key, now, owner)
        try:
            wstore.upsert_workloads(self.store, [wstore.WorkloadRow(namespace, pod, kind, name, now)])
        except Exception as e:  # noqa: BLE001 - the answer stands; the dashboard's copy waits for the next refresh
            log.warning("remediation: cannot store the workload of %s/%s: %s", namespace, pod, e)
        return owner

    def refresh(self, pods: Iterable[tuple[str, str]], now: float | None = None, limit: int = 200) -> int:
        """Resolve the pods whose stored row is missing or older than the TTL (at most ``limit`` API
        lookups); returns how many were resolved.  Failures are remembered briefly, not raised."""
        now = time.time() if now is None else now
        pairs = sorted(set(pods))
        if not pairs or self.kube is None:
            return 0
        fresh = {(w.namespace, w.pod) for w in wstore.workloads(self.store, pods=pairs)
                 if now - w.resolved_at < self.ttl_s}
        done = 0
        for ns, pod in pairs:
            if (ns, pod) in fresh:
                continue
            with self._lock:
                hit = self._cache.get((ns, pod))
            if hit is not None and hit[1] is None and now - hit[0] < NEGATIVE_TTL_S:
                continue
            if done >= limit:
                break
            try:
                self.resolve(ns, pod, now)
                done += 1
            except ResolveError as e:
                log.debug("remediation: %s", e.reason)
                if e.transient:
                    break   # the API is not answering: try again next time
        return done


def target_owner(spec: TargetField, labels: Mapping[str, str], namespace: str, resolver: WorkloadResolver | None,
                 *, kind: str = "Deployment", now: float | None = None) -> Owner:
    """The workload a ``{from: workload}`` target names, from the trigger's labels (see the module doc)."""
    wl = labels.get(spec.workload_label, "") or ""
    pod = labels.get(spec.pod_label, "") or ""
    if wl in SHARED_WORKLOADS:
        raise ResolveError(f"label {spec.workload_label}={wl!r}: the accelerator is shared by several workloads, "
                           "so no single one can be named")
    if wl:
        parsed = parse_workload(wl)
        if parsed is None:
            raise ResolveError(f"label {spec.workload_label}={wl!r} is not a Kubernetes workload (Kind/name)")
        owner = Owner(namespace, parsed[0], parsed[1], pod, "label")
    elif pod:
        if resolver is None:
            raise ResolveError(f"pod {namespace}/{pod}: no workload resolver (no store)")
        owner = resolver.resolve(namespace, pod, now)
    else:
        raise ResolveError(f"the trigger carries neither a {spec.workload_label!r} nor a {spec.pod_label!r} label: "
                           "no workload to act on (there is no default)")
    if owner.kind != kind:
        of = f"pod {namespace}/{pod} belongs to" if owner.via != "label" else "the trigger names"
        raise ResolveError(f"{of} {owner.workload}, not a {kind}: this action acts on a {kind} only")
    return owner


def pods_in_series(labels_list: Iterable[Mapping[str, str]]) -> set[tuple[str, str]]:
    """The (namespace, pod) pairs of per-accelerator series whose workload the agent left to the engine."""
    out = set()
    for lab in labels_list:
        ns, pod = lab.get("namespace") or "", lab.get("pod") or ""
        if ns and pod and not lab.get("workload"):
            out.add((ns, pod))
    return out


__all__ = ["Owner", "ResolveError", "WorkloadResolver", "parse_workload", "pod_owner", "pods_in_series",
           "target_owner"]
