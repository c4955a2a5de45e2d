"""A spinning driving thread on a node with every CPU busy: it runs a third of its time and waits for
a CPU the rest, never blocking, while its workload waits for requests.  That is polling, not a
starved feeder (``waitfor_polling_runnable``); a thread that blocks between requests and waits for a
CPU longer than it runs is still starved.  The real-kernel test of the same service is
tests/integration/test_waitfor.py::test_a_spinning_thread_nobody_waits_on_is_no_cause."""

from __future__ import annotations

from triscope.analysis.config import MismatchThresholds
from triscope.analysis.features import WaitEvidence, WorkloadEvidence
from triscope.analysis.waitverdict import chain_finding


def _finding(states: dict[str, float], chain: dict[tuple[str, ...], float], requests: float, waited: float) -> str:
    ev = WaitEvidence(10.0, states, chain, requests, waited, "driver_calls")  # type: ignore[arg-type]
    f = chain_finding(WorkloadEvidence(("", "", "", "cmd:svc"), wait=ev), engaged=0.02, th=MismatchThresholds())
    assert f is not None
    return f.state


def test_a_spinner_on_a_saturated_node_is_polling() -> None:
    chain = {("cpu", "self", "svc", "", "", "", ""): 0.33, ("cpu_wait", "self", "svc", "", "", "", ""): 0.67}
    assert _finding({"cpu": 0.33, "cpu_wait": 0.66, "lock": 0.01}, chain, requests=1.5, waited=0.05) == ""


def test_a_starved_thread_that_others_wait_on_is_no_poller() -> None:
    # never blocking too, but its handlers wait on it longer than the intake waits for requests (a
    # backlog): its wait for a CPU is starvation, as before
    chain = {("cpu", "self", "svc", "", "", "", ""): 0.25, ("cpu_wait", "self", "svc", "", "", "", ""): 0.75}
    assert _finding({"cpu": 0.25, "cpu_wait": 0.74, "lock": 0.01}, chain, requests=1.5, waited=3.0) == "staging-bound"
