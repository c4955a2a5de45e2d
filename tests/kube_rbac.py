"""RBAC for the Kubernetes test server: kube-apiserver's authorizer over the shipped RBAC objects.

``Rbac`` holds ClusterRoles, Roles, ClusterRoleBindings and RoleBindings (dicts as in the
manifests) and answers ``authorize(user, groups, attrs)`` with the rules of kube-apiserver's RBAC
authorizer (``plugin/pkg/auth/authorizer/rbac``):

* a ClusterRoleBinding grants its ClusterRole everywhere (cluster-scoped requests and every
  namespace); a RoleBinding grants its Role, or a ClusterRole it references, only in its own
  namespace;
* a rule matches when its ``verbs``, ``apiGroups`` and ``resources`` name the request's (``*``
  matches anything, ``*/sub`` any resource's subresource ``sub``) and, when it lists
  ``resourceNames``, the request names one of them (a ``create`` on a collection or a ``list``
  has no name, so a rule with ``resourceNames`` never grants them);
* subjects: ``ServiceAccount`` (name + namespace, the user ``system:serviceaccount:NS:NAME``),
  ``User`` and ``Group`` by name; a service account is in the groups ``system:serviceaccounts``,
  ``system:serviceaccounts:NS`` and ``system:authenticated``;
* a binding whose role does not exist grants nothing and the denial's message ends with
  ``RBAC: clusterrole.rbac.authorization.k8s.io "NAME" not found``, as the real server's does.

``request_attributes`` turns an HTTP request into the authorizer's attributes the way
kube-apiserver's ``RequestInfoFactory`` does (verb from the method and path: ``get``/``list``/
``watch``/``create``/``update``/``patch``/``delete``/``deletecollection``; ``pods/NAME/eviction``
is ``create`` on ``pods/eviction``), and ``forbidden`` builds the 403 ``Status`` the real server
answers (``responsewriters.forbiddenMessage`` + ``apierrors.NewForbidden``).

``shipped_rbac`` reads the RBAC objects of ``deploy/kustomize`` (base + targets) straight from the
YAML files, applying each kustomization's ``namespace`` the way kustomize does for these kinds;
``tests/integration/test_deploy_manifests.py`` checks the result equals what ``kubectl kustomize`` renders.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
KUSTOMIZE = REPO / "deploy" / "kustomize"
RBAC_KINDS = ("ClusterRole", "Role", "ClusterRoleBinding", "RoleBinding")
ENGINE_USER = "system:serviceaccount:triscope:triscope-engine"
AGENT_USER = "system:serviceaccount:triscope:triscope-agent"
# what every authenticated user may read without a binding of ours (the bootstrap roles
# system:discovery and system:public-info-viewer)
DISCOVERY_PATHS = ("/api", "/apis", "/version", "/healthz", "/livez", "/readyz", "/openapi")


@dataclass(frozen=True)
class Attributes:
    """What the authorizer sees of one request (``authorizer.AttributesRecord``)."""

    verb: str
    resource_request: bool
    path: str = ""
    api_group: str = ""
    api_version: str = ""
    resource: str = ""
    subresource: str = ""
    namespace: str = ""
    name: str = ""

    @property
    def combined_resource(self) -> str:
        return f"{self.resource}/{self.subresource}" if self.subresource else self.resource


def request_attributes(method: str, path: str, query: dict[str, list[str]], m: Any) -> Attributes:
    """Attributes of a request, ``m`` the server's path match (groups cv, group, gv, ns, res, name, sub).

    ``m`` None: a non-resource path (``/api``, ``/version``...).
    """
    if m is None:
        return Attributes(verb={"GET": "get", "HEAD": "get", "POST": "post", "PUT": "put", "PATCH": "patch",
                                "DELETE": "delete"}.get(method, method.lower()), resource_request=False, path=path)
    name = m["name"] or ""
    watch = (query.get("watch") or [""])[0] in ("1", "true")
    verb = {"POST": "create", "PUT": "update", "PATCH": "patch"}.get(method, "")
    if method in ("GET", "HEAD"):
        verb = "watch" if watch else ("get" if name else "list")
    elif method == "DELETE":
        verb = "delete" if name else "deletecollection"
    return Attributes(verb=verb, resource_request=True, path=path, api_group=m["group"] or "",
                      api_version=m["cv"] or m["gv"] or "", resource=m["res"], subresource=m["sub"] or "",
                      namespace=m["ns"] or "", name=name)


def forbidden_message(user: str, a: Attributes) -> str:
    """``responsewriters.forbiddenMessage``."""
    if not a.resource_request:
        return f'User "{user}" cannot {a.verb} path "{a.path}"'
    if a.namespace:
        return (f'User "{user}" cannot {a.verb} resource "{a.combined_resource}" in API group "{a.api_group}" '
                f'in the namespace "{a.namespace}"')
    return f'User "{user}" cannot {a.verb} resource "{a.combined_resource}" in API group "{a.api_group}" at the cluster scope'


def forbidden(user: str, a: Attributes, reason: str = "") -> dict[str, Any]:
    """The 403 ``Status`` body (``apierrors.NewForbidden`` of the group-resource and name)."""
    msg = forbidden_message(user, a)
    if reason:
        msg = f"{msg}: {reason}"
    gr = f"{a.resource}.{a.api_group}" if a.api_group else a.resource
    if not a.resource:
        message = f"forbidden: {msg}"
    elif a.name:
        message = f'{gr} "{a.name}" is forbidden: {msg}'
    else:
        message = f"{gr} is forbidden: {msg}"
    details: dict[str, Any] = {}     # Go's omitempty: only the fields that are set, in struct order
    if a.name:
        details["name"] = a.name
    if a.api_group:
        details["group"] = a.api_group
    if a.resource:
        details["kind"] = a.resource
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": "Forbidden", "details": details, "code": 403}


def service_account_user(namespace: str, name: str) -> str:
    return f"system:serviceaccount:{namespace}:{name}"


def groups_of(user: str) -> list[str]:
    """The groups the service-account token authenticator puts a service account in."""
    parts = user.split(":")
    if len(parts) == 4 and parts[:2] == ["system", "serviceaccount"]:
        return ["system:serviceaccounts", f"system:serviceaccounts:{parts[2]}", "system:authenticated"]
    return ["system:authenticated"]


def _has(items: Iterable[str] | None, value: str) -> bool:
    items = list(items or [])
    return "*" in items or value in items


def _resource_matches(rule: dict[str, Any], a: Attributes) -> bool:
    for r in rule.get("resources") or []:
        if r == "*" or r == a.combined_resource:
            return True
        if a.subresource and r == f"*/{a.subresource}":
            return True
    return False


def rule_allows(rule: dict[str, Any], a: Attributes) -> bool:
    """``rbac.RuleAllows`` for a resource request."""
    if not _has(rule.get("verbs"), a.verb) or not _has(rule.get("apiGroups"), a.api_group):
        return False
    if not _resource_matches(rule, a):
        return False
    names = rule.get("resourceNames") or []
    return not names or a.name in names


class Rbac:
    """The RBAC objects of a cluster, and kube-apiserver's authorization over them."""

    def __init__(self, objects: Iterable[dict[str, Any]]) -> None:
        self.objects = [copy.deepcopy(o) for o in objects if o.get("kind") in RBAC_KINDS]

    def _of(self, kind: str) -> list[dict[str, Any]]:
        return [o for o in self.objects if o["kind"] == kind]

    def _role(self, kind: str, name: str, namespace: str) -> dict[str, Any] | None:
        for o in self._of(kind):
            if o["metadata"]["name"] == name and (kind == "ClusterRole" or o["metadata"].get("namespace") == namespace):
                return o
        return None

    @staticmethod
    def _subject_matches(s: dict[str, Any], user: str, groups: list[str], binding_ns: str) -> bool:
        kind = s.get("kind")
        if kind == "ServiceAccount":
            return user == service_account_user(s.get("namespace") or binding_ns, s.get("name", ""))
        if kind == "User":
            return user == s.get("name")
        if kind == "Group":
            return s.get("name") in groups
        return False

    def _bound_rules(self, user: str, groups: list[str], namespace: str) -> tuple[list[dict[str, Any]], list[str]]:
        """The rules that apply to ``user`` in ``namespace`` ("" = cluster scope), and the errors met."""
        rules: list[dict[str, Any]] = []
        errors: list[str] = []
        bindings = [(b, "") for b in self._of("ClusterRoleBinding")]
        if namespace:
            bindings += [(b, namespace) for b in self._of("RoleBinding") if b["metadata"].get("namespace") == namespace]
        for b, ns in bindings:
            if not any(self._subject_matches(s, user, groups, ns) for s in b.get("subjects") or []):
                continue
            ref = b["roleRef"]
            if b["kind"] == "ClusterRoleBinding" and ref["kind"] != "ClusterRole":
                continue
            role = self._role(ref["kind"], ref["name"], ns)
            if role is None:
                errors.append(f'{ref["kind"].lower()}.rbac.authorization.k8s.io "{ref["name"]}" not found')
                continue
            rules += role.get("rules") or []
        return rules, errors

    def authorize(self, user: str, a: Attributes, groups: list[str] | None = None) -> tuple[bool, str]:
        """(allowed, reason); the reason of a denial as the RBAC authorizer words it ("" when none)."""
        groups = groups_of(user) if groups is None else groups
        if not a.resource_request:
            return any(a.path == p or a.path.startswith(p + "/") for p in DISCOVERY_PATHS), ""
        rules, errors = self._bound_rules(user, groups, a.namespace)
        if any(rule_allows(r, a) for r in rules):
            return True, ""
        return False, (f"RBAC: [{', '.join(errors)}]" if len(errors) > 1 else f"RBAC: {errors[0]}") if errors else ""

    # editing, for the tests that take one permission away --------------------------------------
    def atoms(self) -> list[tuple[str, str, int, str, str, str]]:
        """Every (kind, name, rule index, apiGroup, resource, verb) the roles grant."""
        out = []
        for o in self._of("ClusterRole") + self._of("Role"):
            for i, r in enumerate(o.get("rules") or []):
                for g in r.get("apiGroups") or []:
                    for res in r.get("resources") or []:
                        for v in r.get("verbs") or []:
                            out.append((o["kind"], o["metadata"]["name"], i, g, res, v))
        return out

    def without(self, kind: str, name: str, rule_index: int, group: str, resource: str, verb: str) -> Rbac:
        """A copy with ``verb`` on ``group``/``resource`` taken out of one rule of one role (the rule
        split so that the rest of it stays granted)."""
        out = Rbac(self.objects)
        for o in out._of(kind):
            if o["metadata"]["name"] != name:
                continue
            rule = o["rules"].pop(rule_index)
            kept = []
            for g in rule.get("apiGroups") or []:
                for res in rule.get("resources") or []:
                    verbs = [v for v in rule["verbs"] if not (g == group and res == resource and v == verb)]
                    if verbs:
                        kept.append({**copy.deepcopy(rule), "apiGroups": [g], "resources": [res], "verbs": verbs})
            o["rules"][rule_index:rule_index] = kept
        return out


def _kustomize_objects(root: Path) -> list[dict[str, Any]]:
    """The objects of a kustomization's ``resources`` files with its ``namespace`` applied (the subset
    of kustomize these directories use: plain files, ``namespace``; RBAC subjects of kind
    ServiceAccount keep theirs, as kustomize only rewrites those naming the default namespace)."""
    k = yaml.safe_load((root / "kustomization.yaml").read_text())
    out: list[dict[str, Any]] = []
    for entry in k.get("resources") or []:
        p = root / entry
        if p.is_dir():
            out += _kustomize_objects(p)
            continue
        for doc in yaml.safe_load_all(p.read_text()):
            if not doc:
                continue
            if k.get("namespace") and doc["kind"] not in ("ClusterRole", "ClusterRoleBinding", "Namespace", "Node"):
                doc["metadata"]["namespace"] = k["namespace"]
            out.append(doc)
    return out


def shipped_rbac_objects() -> list[dict[str, Any]]:
    """The RBAC objects ``deploy/kustomize`` base + targets render to."""
    return [o for root in ("base", "targets") for o in _kustomize_objects(KUSTOMIZE / root) if o["kind"] in RBAC_KINDS]


def shipped_rbac() -> Rbac:
    return Rbac(shipped_rbac_objects())
