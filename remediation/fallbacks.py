"""The end of a dependency fallback: each active fallback is put back once its trigger has been
clear for its ``hold``, or its ``ttl`` ran out.

A fallback is switched by ``actions.dependency_fallback`` (a ConfigMap's key) or by
``filefallback.switch`` (a knobs file off Kubernetes); both leave a row in the store's fallback
table (``triscope.store.audit``).  This module reverts either kind from those rows (the engine's
``revert_fallbacks`` job, leader only), audits each revert and posts a Kubernetes Event on the
ConfigMap.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from triscope.remediation import filefallback, metrics
from triscope.remediation.actions import ActionResult, revert_fallback
from triscope.remediation.kube.adapter import KubeAdapter
from triscope.remediation.kube.errors import KubeError
from triscope.store import audit

if TYPE_CHECKING:
    from triscope.store.api import Store

log = logging.getLogger("triscope.remediation.actions")


def _due(fb: audit.FallbackRow, now: float) -> str:
    """Why ``fb`` is reverted now ('' when it is not due)."""
    if now >= fb.expires_at:
        return f"time-to-live ran out ({fb.expires_at - fb.switched_at:g}s)"
    if fb.clear_since is not None and now - fb.clear_since >= fb.hold_s:
        return f"trigger clear for {now - fb.clear_since:.0f}s (hold {fb.hold_s:g}s)"
    return ""


def _revert(fb: audit.FallbackRow, kube: KubeAdapter | None, why: str) -> ActionResult:
    try:
        return filefallback.revert(fb, why) if filefallback.is_file_row(fb) else revert_fallback(fb, kube, why)
    except KubeError as e:
        return ActionResult("failed", f"revert of {fb.namespace}/{fb.configmap}:{fb.key} failed: {e}",
                            {"error": e.answer(), "fallback_id": fb.id})
    except OSError as e:
        return ActionResult("failed", f"revert of {fb.configmap} failed: {e.strerror or e}",
                            {"error": str(e), "fallback_id": fb.id})


def revert_due_fallbacks(store: Store, kube: KubeAdapter | None, now: float, engine_id: str,
                         event_rules: set[str]) -> int:
    """Revert each active fallback whose trigger has been clear for its hold period, or whose TTL ran out.

    Every revert is audited; a Kubernetes Event on the ConfigMap is posted for fallbacks of
    ``event_rules``.  Returns how many were reverted.
    """
    done = 0
    for fb in audit.active_fallbacks(store):
        why = _due(fb, now)
        if not why:
            continue
        on_file = filefallback.is_file_row(fb)
        what = f"knobs file {fb.configmap}" if on_file else f"configmap {fb.namespace}/{fb.configmap} key {fb.key}"
        res = _revert(fb, kube, why)
        if res.outcome in ("acted", "dry_run"):
            audit.end_fallback(store, fb.id, "reverted", now, why)
            done += 1
        audit_id = audit.record_decision(store, audit.AuditRow(
            ts=time.time(), engine_id=engine_id, rule=fb.rule, trigger_kind="revert", trigger=f"revert: {why}",
            trigger_key=f"revert:{fb.id}", action="dependency_fallback", target=what, target_key=fb.target_key,
            namespace=fb.namespace, outcome=res.outcome, reason=res.reason, dry_run=fb.dry_run,
            params={"revert": True, "restore": fb.previous_value}, response=res.response, issued_ts=res.issued_ts,
            finished_ts=time.time()))
        metrics.ACTIONS_TOTAL.labels("dependency_fallback", res.outcome).inc()
        log.info("remediation revert %s: %s", res.outcome, res.reason)
        if fb.rule in event_rules and kube is not None and not on_file:
            try:
                kube.post_event(fb.namespace, {"kind": "ConfigMap", "apiVersion": "v1", "namespace": fb.namespace,
                                               "name": fb.configmap},
                                reason="RemediationReverted" if res.outcome != "failed" else "RemediationFailed",
                                message=f"{fb.rule}: {res.reason} (audit {audit_id})")
            except KubeError as e:
                log.info("remediation: cannot post the Kubernetes Event: %s", e)
    return done


__all__ = ["revert_due_fallbacks"]
