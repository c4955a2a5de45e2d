"""What a stored series or event is evidence of: the cause families (stable keys), their roles, and
the keys that are context beside an episode, never ranked causes.

``categorize(metric, labels)`` puts a series in the first family whose ``match`` accepts it
(``CATEGORIES``, in order).  Roles weigh what moved (``ROLE_WEIGHT``): a cause 1, load on a link 0.8,
a symptom 0.6, triscope's own analysis 0.3.

**Context, not causes** (``CONTEXT_KEYS``): the application's own SLIs (a symptom of whatever held
the accelerator back: latency rises *because* of the cause), the remediation engine's actions (the
engine's answer to the episode) and the agent itself (its collectors, spool and store writes: a
gap in the evidence, not a reason the accelerator waited) are shown beside an episode as context
lines (``triscope.analysis.rca.context``), never ranked among its causes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from triscope.analysis.rca.inputs import DERIVED_PREFIX
from triscope.analysis.rca.noise import is_agent_metric

ROLE_WEIGHT = {"cause": 1.0, "load": 0.8, "symptom": 0.6, "self": 0.3, "context": 0.0}


@dataclass(frozen=True, slots=True)
class Category:
    key: str
    title: str
    role: str                   # cause | load | symptom | self | context
    match: Callable[[str, Mapping[str, str]], bool]

    @property
    def ranked(self) -> bool:
        """Whether the family is ranked as a cause (context families are shown, not ranked)."""
        return self.key not in CONTEXT_KEYS and self.key != "derived"


def _res(labels: Mapping[str, str], *names: str) -> bool:
    return labels.get("resource") in names


# the agent's per-workload host evidence (docs/workloads.md): its feeders, CPU wait and pressure, CPU time
HOST_WORKLOAD_METRICS = frozenset({"triscope_workload_feeder_busy_ratio", "triscope_workload_cpu_wait_ratio",
                                   "triscope_workload_cpu_pressure_ratio", "triscope_workload_cpu_seconds_total"})

CONTEXT_KEYS = frozenset({"application", "remediation", "agent"})

CATEGORIES: tuple[Category, ...] = (
    Category("derived", "triscope's own analysis", "self", lambda m, lab: m.startswith(DERIVED_PREFIX)),
    Category("network", "Network retransmits", "cause",
             lambda m, lab: m.startswith(("triscope_tcp_retransmits", "triscope_tcp_synack_retransmits"))),
    Category("network_traffic", "Network traffic", "load", lambda m, lab: m.startswith("triscope_tcp_")),
    Category("iommu_faults", "IOMMU faults / DMA mapping errors", "cause",
             lambda m, lab: m in ("triscope_iommu_page_faults_total", "triscope_dma_map_errors_total")),
    Category("dma_mapping", "DMA mapping / host memory pin churn", "cause",
             lambda m, lab: m.startswith(("triscope_dma_", "triscope_iommu_map", "triscope_iommu_unmap"))),
    Category("pcie_errors", "PCIe link errors / degraded link", "cause",
             lambda m, lab: m.startswith(("triscope_pcie_aer", "triscope_pcie_link_degraded",
                                          "triscope_pcie_link_speed", "triscope_pcie_link_width"))
             or m == "triscope_gpu_pcie_replays_total"),
    Category("pcie_load", "PCIe link load (host <-> device copies)", "load",
             lambda m, lab: m.startswith(("triscope_gpu_pcie_rx", "triscope_gpu_pcie_tx", "triscope_gpu_nvlink_"))),
    Category("numa_locality", "NUMA locality (the workload runs or keeps its pages off its accelerator's socket)",
             "cause", lambda m, lab: m in ("triscope_workload_cpu_local_ratio", "triscope_workload_memory_local_ratio")),
    Category("host_staging", "Host staging (CPU copying / CPU pressure)", "cause",
             lambda m, lab: m == "triscope_cpu_busy_ratio"
             or (m == "triscope_cpu_seconds_total" and lab.get("mode") in ("user", "system", "nice", "irq", "softirq"))
             or (m.startswith("triscope_pressure_") and _res(lab, "cpu"))
             or m in HOST_WORKLOAD_METRICS),
    Category("host_memory", "Host memory pressure", "cause",
             lambda m, lab: m.startswith("triscope_memory_") or (m.startswith("triscope_pressure_") and _res(lab, "memory"))),
    Category("host_io", "Host I/O pressure", "cause",
             lambda m, lab: m.startswith("triscope_pressure_") and _res(lab, "io")),
    Category("gpu_health", "Accelerator health (XID, lost GPU, thermal/throttle)", "cause",
             lambda m, lab: m.startswith(("triscope_gpu_xid", "triscope_gpu_up", "triscope_gpu_temperature",
                                          "triscope_gpu_throttle", "triscope_npu_health", "triscope_npu_temperature"))),
    Category("accelerator_activity", "Accelerator activity", "symptom",
             lambda m, lab: m.startswith(("triscope_gpu_", "triscope_npu_", "triscope_workload_",
                                          "triscope_accelerator_workload"))),
    Category("agent", "triscope agent itself", "context", lambda m, lab: is_agent_metric(m)),
    Category("host_other", "Other host metrics", "symptom", lambda m, lab: m.startswith("triscope_")),
    Category("application", "Application SLIs", "context", lambda m, lab: True),
)
REMEDIATION = Category("remediation", "Remediation actions", "context", lambda m, lab: False)
CATEGORY_BY_KEY = {c.key: c for c in (*CATEGORIES, REMEDIATION)}

# events -> family
EVENT_CATEGORY = {"xid": "gpu_health", "gpu_lost": "gpu_health", "npu_health": "gpu_health", "aer": "pcie_errors",
                  "iommu_fault": "iommu_faults", "retransmit_burst": "network", "remediation": "remediation",
                  "collector": "agent"}
# the detector's state -> the family it points at (pin churn: dma_mapping)
MISMATCH_CATEGORY = {"staging-bound": "host_staging", "io-saturated": "pcie_load", "network-bound": "network"}

# metrics where a fall is the bad direction (for all others a rise is)
DOWN_IS_BAD = frozenset({"triscope_memory_available_bytes", "triscope_gpu_up", "triscope_pcie_link_speed_gts",
                         "triscope_pcie_link_width", "triscope_collector_up", "triscope_probe_attached"})


def bad_direction(metric: str) -> str:
    return "down" if metric in DOWN_IS_BAD else "up"


def categorize(metric: str, labels: Mapping[str, str]) -> Category:
    for c in CATEGORIES:
        if c.match(metric, labels):
            return c
    return CATEGORIES[-1]
