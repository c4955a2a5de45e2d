"""The Kubernetes adapter's errors: what a verb raises instead of ``ApiException`` or urllib3's errors.

``KubeError`` carries the HTTP status (0: no answer); each status the engine acts on has its own
class (``NotFound``, ``Conflict``, ``Forbidden``: a 403 as one line naming what the shipped RBAC
grants and what to add), and the verbs' own refusals theirs (``PausedDeployment``,
``EvictionBlocked``...).  :func:`retry_on_conflict` is the one loop every read-modify-write runs in.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any, TypedDict, TypeVar

from triscope.remediation.kube.rbac import LEADER, RBAC_FILE, SHIPPED_GRANTS, WORKLOADS
from triscope.remediation.kube.views import RolloutStatus


class ErrorAnswer(TypedDict):
    """A ``KubeError`` as the audit row's response keeps it."""

    status: int
    reason: str
    message: str


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
    leader = any(w.startswith(LEADER) for w in granted)
    if not granted:
        todo = (f"add {verb} on {gr} to the engine's role in {RBAC_FILE}: the engine calls it and the shipped "
                "RBAC does not grant it")
    elif leader and ns and ns == own_ns:
        todo = (f"re-apply {RBAC_FILE}: Role triscope-engine-leader and its RoleBinding in namespace {ns} (the "
                "engine's own) grant this; do not bind triscope-engine-workloads there")
    elif any(w == WORKLOADS for w in granted) and ns:
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


def from_api_exception(e: Any) -> KubeError:
    """The error a ``kubernetes.client`` ``ApiException`` (its status, reason and JSON body) means."""
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
