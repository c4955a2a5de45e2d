"""Files triscope's defaults need, shipped as package data so an installed triscope (the server
image, a wheel) finds them without the repository: the example remediation policy and SLO files
(kept in ``deploy/``, where the manifests and docs point) and the recorded H200 demo trace (kept
in ``examples/traces/``).  In a source tree these are symlinks to those files."""

from __future__ import annotations

from pathlib import Path

_HERE = Path(__file__).parent

POLICY = _HERE / "policy.example.yaml"
SLO = _HERE / "slo.example.yaml"
SLO_DEMO = _HERE / "slo.demo.yaml"        # the demo's: a 1h period its recordings of minutes cover
TRACES = _HERE / "traces"
