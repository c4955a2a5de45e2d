"""The component ids of each page: one class per page, a constant per id that its layout and its
callbacks share.  A page writes ``NodeIds.GRAPH``, never ``"node-graph"``: a misspelt id is an
AttributeError when the page is imported, not a callback that silently never fires.  The strings are
the ones the browser tests select on (tests/e2e/test_dashboard_*.py)."""

from __future__ import annotations

from typing import Final, NamedTuple


class RangeIds(NamedTuple):
    """A page's time-range picker (``components.range_picker``): the presets, the custom start and
    end fields and their Apply button."""

    prefix: str
    range: str
    start: str
    end: str
    apply: str


def range_ids(prefix: str) -> RangeIds:
    return RangeIds(prefix, f"{prefix}-range", f"{prefix}-start", f"{prefix}-end", f"{prefix}-apply")


class FleetIds:
    TABLE: Final = "fleet-table"
    NAV: Final = "fleet-nav"               # the location a row or cell click navigates
    EMPTY: Final = "fleet-empty"
    LEGEND: Final = "fleet-legend"
    RECORDINGS: Final = "fleet-recordings"


class NodeIds:
    PICKER: Final = range_ids("node")
    NAME: Final = "node-name"
    GRAPH: Final = "node-graph"
    META: Final = "node-meta"               # the rendered figure's node, range and trace keys (live mode, export)
    INTERVAL: Final = "node-interval"
    LIVE: Final = "node-live"
    ACCEL: Final = "node-accel"             # the accelerator picked (a store)
    ACCELS: Final = "node-accels"           # the accelerator picker
    EXPLAIN: Final = "node-explain"
    EXPLAIN_LINK: Final = "node-explain-link"
    STATUS: Final = "node-status"
    RECORDING: Final = "node-recording"
    RECORDING_NOTE: Final = "node-recording-note"
    TOPOLOGY: Final = "node-topology"
    TOPOLOGY_NONE: Final = "node-topology-none"
    WAITFOR: Final = "node-waitfor"
    WAITFOR_INTERVAL: Final = "node-waitfor-interval"
    WAITFOR_NONE: Final = "node-waitfor-none"
    WAITFOR_PANEL: Final = "node-waitfor-panel"
    WINDOW_NOTE: Final = "node-window-note"
    WORKLOADS: Final = "node-workloads"
    WORKLOAD_TABLE: Final = "node-workload-table"
    WORKLOADS_NONE: Final = "node-workloads-none"

    @staticmethod
    def waitfor_accel(slug: str) -> str:
        """One accelerator's part of the wait-for panel (``waitfor_view.accel_slug``)."""
        return f"node-waitfor-accel-{slug}"

    @staticmethod
    def waitfor_graph(slug: str) -> str:
        return f"node-waitfor-{slug}"

    @staticmethod
    def waitfor_reasons(slug: str) -> str:
        return f"node-waitfor-reasons-{slug}"

    @staticmethod
    def waitfor_untraced(slug: str) -> str:
        return f"node-waitfor-untraced-{slug}"


class MismatchIds:
    PICKER: Final = range_ids("mismatch")
    NODE: Final = "mismatch-node"
    META: Final = "mismatch-meta"
    NOTE: Final = "mismatch-note"
    LEGEND: Final = "mismatch-legend"
    SCATTER: Final = "mismatch-scatter"
    SHARE: Final = "mismatch-share"
    WORKLOADS: Final = "mismatch-workloads"
    WORKLOAD_NOTE: Final = "mismatch-workload-note"


class SlosIds:
    PICKER: Final = range_ids("slos")
    BODY: Final = "slos-body"
    NOTE: Final = "slos-note"
    EMPTY: Final = "slos-empty"
    NO_SERIES: Final = "slos-no-series"


class RemediationIds:
    PICKER: Final = range_ids("remediation")
    BODY: Final = "remediation-body"
    NOTE: Final = "remediation-note"
    EMPTY: Final = "remediation-empty"
    RECORDED: Final = "remediation-recorded"
    TABLE: Final = "remediation-table"


class RootcauseIds:
    NODE: Final = "rootcause-node"
    START: Final = "rootcause-start"
    END: Final = "rootcause-end"
    GO: Final = "rootcause-go"
    BODY: Final = "rootcause-body"
    LOOKBACKS: Final = "rootcause-lookbacks"
    NODELINK: Final = "rootcause-nodelink"
    RECORDING_NOTE: Final = "rootcause-recording-note"
    WINDOW_NOTE: Final = "rootcause-window-note"
    TIMELINE: Final = "rootcause-timeline"
    EPISODES: Final = "rootcause-episodes"
    NOEPISODES: Final = "rootcause-noepisodes"
    CAUSES: Final = "rootcause-causes"
    NOCAUSES: Final = "rootcause-nocauses"
    CONTEXT: Final = "rootcause-context"
    STATES: Final = "rootcause-states"
    NOSTATES: Final = "rootcause-nostates"
    BASELINE_STATES: Final = "rootcause-baseline-states"
