"""The one vocabulary (triscope/core/vocabulary.py): each state's facts beside it, and the roll-up's
tie-break that follows the states' order."""

from __future__ import annotations

from triscope.core.vocabulary import (
    IO_STATES,
    QUIET_STATES,
    STATES,
    WORST_FIRST,
    AcceleratorId,
    State,
    is_healthy,
)
from triscope.dashboard.workload_data import AccelNow, rollup


def is_io(state: str | None) -> bool:
    """Whether ``state`` (as stored or published) is an I/O state."""
    st = State.of(state)
    return st is not None and st.io


def test_each_state_has_its_facts_and_the_text_sets_are_read_off_them() -> None:
    assert STATES == ("idle", "demand-limited", "compute-bound", "balanced", "io-saturated", "staging-bound",
                      "network-bound")
    assert {"io-saturated", "staging-bound", "network-bound"} == IO_STATES
    assert {"idle", "demand-limited"} == QUIET_STATES
    assert WORST_FIRST == ("io-saturated", "staging-bound", "network-bound", "balanced", "compute-bound",
                           "demand-limited", "idle")
    assert State.STAGING_BOUND == "staging-bound" and State.of("staging-bound") is State.STAGING_BOUND
    assert State.of("?") is None and State.of("") is None
    assert len({s.colour for s in State}) == len(State) and len({s.order for s in State}) == len(State)
    assert is_io("network-bound") and not is_io("balanced") and not is_io("?")
    assert is_healthy("idle") and not is_healthy("io-saturated") and not is_healthy("?")


def test_the_roll_up_breaks_an_equal_score_by_the_states_order() -> None:
    """Two accelerators in I/O states with the same score: the one first in ``WORST_FIRST`` is the node's."""
    net = AccelNow(AcceleratorId("gpu", "0"), "network-bound", 0.5)
    io = AccelNow(AcceleratorId("gpu", "1"), "io-saturated", 0.5)
    staged = AccelNow(AcceleratorId("gpu", "2"), "staging-bound", 0.5)
    assert rollup([net, staged, io]) is io
    assert rollup([net, staged]) is staged
    # a higher score still wins, and any I/O state wins over a healthy one
    assert rollup([AccelNow(AcceleratorId("gpu", "0"), "network-bound", 0.6), io]).state == "network-bound"
    assert rollup([AccelNow(AcceleratorId("gpu", "0"), "compute-bound", 0.9), net]) is net
