"""A producer the chain could not follow (not traced yet, past the chain's depth) is evidence of
nothing: it is left out of every share, not counted as demand (``waitfor_seen_floor``).  The
recorded case is h200-lab-15's pool_pod_limit (tests/unit/test_recording_verdicts.py): a driving
thread waiting 55-62 % of its time on a pool of decoder processes the chain did not follow, and a
third of it for a CPU under the pod's limit, read idle while the unfollowed part counted as demand."""

from __future__ import annotations

from triscope.analysis.config import MismatchThresholds
from triscope.analysis.features import WaitEvidence, WorkloadEvidence
from triscope.analysis.waitverdict import DEMAND, UNSEEN, chain_finding

ME = ("lab", "lab-a", "lab-a", "")


def _finding(chain: dict[tuple[str, ...], float]) -> tuple[str, dict[str, float]]:
    ev = WaitEvidence(10.0, {"lock": 0.6, "cpu_wait": 0.33, "cpu": 0.07}, chain, 0.0, 0.05, "driver_calls")  # type: ignore[arg-type]
    f = chain_finding(WorkloadEvidence(ME, wait=ev), engaged=0.02, th=MismatchThresholds())
    assert f is not None
    return f.state, f.groups


def _key(cause: str, relation: str) -> tuple[str, ...]:
    return (cause, relation, "lab-a", *ME)


def test_a_driving_thread_starved_beside_an_unfollowed_producer_is_staging_bound() -> None:
    state, groups = _finding({_key("producer", "workload"): 0.6, _key("cpu_wait", "self"): 0.33,
                              _key("cpu", "self"): 0.07})
    assert state == "staging-bound"
    assert groups[UNSEEN] == 0.6 and groups[DEMAND] == 0.0


def test_the_seen_part_still_has_to_be_work() -> None:
    # the rest of its time seen waiting for requests (a server's side of a lossless connection)
    state, _ = _finding({_key("producer", "workload"): 0.6, ("network", "inbound", "10.0.0.9:50000", *ME): 0.3,
                         _key("cpu_wait", "self"): 0.1})
    assert state == ""


def test_too_little_seen_decides_nothing() -> None:
    state, groups = _finding({_key("producer", "workload"): 0.8, _key("cpu_wait", "self"): 0.2})
    assert groups[UNSEEN] == 0.8
    assert state == ""
