"""The data types every part passes around: samples (one value of one series), events and
ticks (what one sampling interval produced).

Collectors yield samples and events, the sampler batches them into a ``Tick`` per interval, the
store persists ticks and the exporter renders them.  They carry no behaviour and import nothing
of the project.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

MetricKind = Literal["gauge", "counter"]


@dataclass(slots=True)
class Sample:
    """One value of one series at the tick it was collected in.

    ``name`` is the full Prometheus-style metric name (``triscope_tcp_retransmits_total``).
    Counters carry the cumulative value the source reports; rates are computed at query time.
    """

    name: str
    value: float
    labels: Mapping[str, str] = field(default_factory=dict)
    kind: MetricKind = "gauge"


@dataclass(slots=True)
class EventRecord:
    """A discrete happening: an XID error, an AER error, a retransmit burst, a state change...

    ``kind`` is a short machine name (see ``EVENT_KINDS``); ``details`` is JSON-serialisable.
    ``ts`` of 0 means "stamp with the tick's time".
    """

    kind: str
    message: str = ""
    severity: Literal["info", "warning", "error", "critical"] = "info"
    details: dict[str, Any] = field(default_factory=dict)
    ts: float = 0.0


@dataclass(slots=True)
class Tick:
    """Everything one sampling interval produced on one node: its samples and events, stamped
    with the tick's time ``ts`` (float epoch seconds).  The unit the agent spools and the store
    writes (``Store.write_ticks(node, ticks)``)."""

    ts: float
    samples: Sequence[Sample] = ()
    events: Sequence[EventRecord] = ()


# Event kinds used across the project (free-form strings are allowed, these are the known ones).
EVENT_KINDS = {
    "xid": "NVIDIA XID error reported by NVML",
    "aer": "PCIe Advanced Error Reporting error",
    "iommu_fault": "IOMMU I/O page fault",
    "retransmit_burst": "TCP retransmits above the burst threshold in one tick (top peers in details)",
    "mismatch_state": "the node's coordination-mismatch state changed",
    "accelerator_state": "one accelerator's verdict changed (its workload, the verdict's reasons in details)",
    "remediation": "a remediation decision (acted, dry-run, suppressed, failed)",
    "collector": "a collector or probe changed state (went down, came back)",
    "gpu_lost": "a GPU fell off the bus / stopped answering",
    "npu_health": "an Ascend NPU chip's npu-smi health changed (OK/Warning/Alarm/Critical)",
    "phase": "a workload phase boundary (recorded traces)",
}


def label_key(labels: Mapping[str, str]) -> str:
    """The normalised, canonical text form of a label set: JSON with sorted keys, no spaces.

    Together with the metric name it is the identity of a series (``series.labels``).
    """

    return json.dumps({str(k): str(v) for k, v in labels.items()}, sort_keys=True, separators=(",", ":"))


def parse_label_key(key: str) -> dict[str, str]:
    return dict(json.loads(key)) if key else {}
