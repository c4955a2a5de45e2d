"""Which accelerator, which workload, which state: the one vocabulary every part speaks.

* An **accelerator** is named by its labels: ``gpu`` (NVML index) for a GPU, ``npu`` and ``chip``
  for an Ascend NPU (``ACCELERATOR_LABELS``).  As one string (a dictionary key, a track, a
  verdict's ``accelerator``) it is ``accelerator_name``: ``gpu=0``, ``chip=0,npu=1`` (label names
  sorted), read back with ``accelerator_labels``.
* A **workload** is ``(namespace, pod, container, workload)`` (``WORKLOAD_LABELS``,
  ``WorkloadKey``): empty strings where unknown, never missing; off Kubernetes ``workload`` holds
  ``unit:<name>.service`` or ``cmd:<comm>``.  ``NO_WORKLOAD`` is all four empty.
* A **state** is one of ``STATES``; ``IO_STATES`` page, ``QUIET_STATES`` never do.
"""

from __future__ import annotations

from collections.abc import Mapping

ACCELERATOR_LABELS: tuple[str, ...] = ("chip", "gpu", "npu")     # sorted: the order of accelerator_name
WORKLOAD_LABELS: tuple[str, str, str, str] = ("namespace", "pod", "container", "workload")
WorkloadKey = tuple[str, str, str, str]
"""(namespace, pod, container, workload): empty strings when unknown."""
NO_WORKLOAD: WorkloadKey = ("", "", "", "")

STATES: tuple[str, ...] = ("idle", "demand-limited", "compute-bound", "balanced", "io-saturated", "staging-bound",
                           "network-bound")
IO_STATES = frozenset({"io-saturated", "staging-bound", "network-bound"})
QUIET_STATES = frozenset({"idle", "demand-limited"})
WORST_FIRST: tuple[str, ...] = ("io-saturated", "staging-bound", "network-bound", "balanced", "compute-bound",
                                "demand-limited", "idle")
"""Which state a mixed window or an equal score takes: I/O states first, then the busiest."""


def accelerator_name(labels: Mapping[str, str]) -> str | None:
    """``gpu=0``, ``chip=0,npu=1`` from a series' labels; None when it carries no accelerator label."""
    parts = [f"{k}={labels[k]}" for k in ACCELERATOR_LABELS if labels.get(k) not in (None, "")]
    return ",".join(parts) if parts else None


def accelerator_labels(name: str) -> dict[str, str]:
    """``gpu=0`` -> {"gpu": "0"}; ``chip=0,npu=1`` -> {"chip": "0", "npu": "1"}."""
    out: dict[str, str] = {}
    for part in name.split(","):
        k, _, v = part.partition("=")
        if k:
            out[k] = v
    return out


def workload_key(labels: Mapping[str, str]) -> WorkloadKey:
    """(namespace, pod, container, workload) of a series' labels; empty strings when unknown."""
    g = labels.get
    return (g("namespace", ""), g("pod", ""), g("container", ""), g("workload", ""))


def workload_labels(key: WorkloadKey) -> dict[str, str]:
    return dict(zip(WORKLOAD_LABELS, key, strict=True))
