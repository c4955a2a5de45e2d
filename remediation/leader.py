"""Leader election through a ``coordination.k8s.io/v1`` Lease (what client-go's leaderelection does).

Every engine replica tries to acquire or renew the Lease every ``renew_every``; the holder stays
leader while its renewals succeed.  A replica takes over only once ``renewTime +
leaseDurationSeconds`` has passed.  Every write carries the ``resourceVersion`` it read, so two
replicas racing for an expired lease cannot both win (the loser gets 409).  Only the leader acts;
the others answer the webhook with 503 and record ``suppressed`` with rail ``leader`` for what
reached them while losing the lease, leaving it in the store's inbox for the leader, which
resumes the inbox and the actions left in progress when it takes over.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from triscope.core.timeparse import TimeParseError, parse_rfc3339
from triscope.remediation.kube.adapter import KubeAdapter
from triscope.remediation.kube.errors import AlreadyExists, Conflict, KubeError, NotFound

log = logging.getLogger(__name__)


def _parse_micro(v: str | None) -> float | None:
    if not v:
        return None
    try:
        return parse_rfc3339(v)
    except TimeParseError:
        return None


class LeaderElector:
    def __init__(self, kube: KubeAdapter, namespace: str, name: str, identity: str,
                 lease_duration_s: float = 15.0) -> None:
        self.kube, self.namespace, self.name, self.identity = kube, namespace, name, identity
        self.lease_duration_s = lease_duration_s
        self._valid_until = 0.0  # monotonic
        self._lock = threading.Lock()
        self.last_error = ""

    @property
    def is_leader(self) -> bool:
        return time.monotonic() < self._valid_until

    def step(self) -> bool:
        """One acquire-or-renew attempt; returns whether this replica holds the lease now."""
        with self._lock:
            t0 = time.monotonic()
            try:
                won = self._try()
                self.last_error = ""
            except KubeError as e:
                self.last_error = str(e)
                log.warning("leader election: %s", e)
                won = False
            if won:
                self._valid_until = t0 + self.lease_duration_s * 0.9
            elif not self.last_error:
                self._valid_until = 0.0  # someone else holds it
            # on an API error keep the current term: it runs out by itself before anyone can take over
            return self.is_leader

    def _spec(self, transitions: int, acquire: str | None = None) -> dict[str, Any]:
        now = KubeAdapter.micro_time()
        return {"holderIdentity": self.identity, "leaseDurationSeconds": int(max(1, round(self.lease_duration_s))),
                "acquireTime": acquire or now, "renewTime": now, "leaseTransitions": transitions}

    def _try(self) -> bool:
        try:
            lease = self.kube.get_lease(self.namespace, self.name)
        except NotFound:
            try:
                self.kube.create_lease(self.namespace, self.name, self._spec(0))
                log.info("leader election: %s acquired new lease %s/%s", self.identity, self.namespace, self.name)
                return True
            except AlreadyExists:
                return False
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity")
        transitions = int(spec.get("leaseTransitions") or 0)
        if holder == self.identity:
            lease["spec"] = self._spec(transitions, spec.get("acquireTime"))
        else:
            renew = _parse_micro(spec.get("renewTime")) or 0.0
            duration = float(spec.get("leaseDurationSeconds") or self.lease_duration_s)
            if holder and time.time() < renew + duration:
                return False
            lease["spec"] = self._spec(transitions + 1)
        try:
            self.kube.replace_lease(self.namespace, self.name, lease)
        except Conflict:
            return False
        if holder != self.identity:
            log.info("leader election: %s took over lease %s/%s from %s", self.identity, self.namespace, self.name,
                     holder or "nobody")
        return True

    def release(self) -> None:
        """Give the lease up on shutdown so another replica can take over at once."""
        if not self.is_leader:
            return
        try:
            lease = self.kube.get_lease(self.namespace, self.name)
            if (lease.get("spec") or {}).get("holderIdentity") == self.identity:
                lease["spec"]["holderIdentity"] = None
                lease["spec"]["renewTime"] = None
                self.kube.replace_lease(self.namespace, self.name, lease)
        except KubeError as e:
            log.info("leader election: release failed: %s", e)
        self._valid_until = 0.0


__all__ = ["LeaderElector"]
