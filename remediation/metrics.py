"""The engine's Prometheus metrics (served on the webhook listener's ``/metrics``)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

REGISTRY = CollectorRegistry(auto_describe=True)

ACTIONS_TOTAL = Counter(
    "triscope_remediation_actions", "Remediation decisions by action and outcome "
    "(acted, dry_run, suppressed, failed).", ["action", "outcome"], registry=REGISTRY)
BREAKER_OPEN = Gauge("triscope_remediation_breaker_open", "1 while the remediation circuit breaker is open.",
                     registry=REGISTRY)
IN_FLIGHT = Gauge("triscope_remediation_actions_in_flight", "Remediation actions running now.", registry=REGISTRY)
LEADER = Gauge("triscope_remediation_leader", "1 while this engine holds the leader lease (or runs alone).",
               registry=REGISTRY)
VERDICT_EVENTS = Counter(
    "triscope_remediation_verdict_events", "Kubernetes Events about the verdict (remediation/verdict_events.py) by "
    "outcome: posted, deduplicated (the same Event within 10 minutes), rate_limited (the object's token bucket), "
    "failed.", ["outcome"], registry=REGISTRY)
